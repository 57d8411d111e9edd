"""Sentinel URLs and the replica wait, without Redis: how a ``sentinel://`` URL is read, printed and handed to
kombu and Celery, and what a setting that is missing or a replica that is behind says."""

from __future__ import annotations

import re

import pytest

from swapless.config.errors import ConfigError, QueueUnavailable
from swapless.config.settings import load_settings
from swapless.tasks.app import make_app
from swapless.tasks.broker.connection import ReplicasBehind, ReplicaWait, redact, redis_client, translate
from swapless.tasks.broker.sentinel import SentinelOptions, SentinelURL
from swapless.tasks.broker.transport import broker_connection

URL = "sentinel://app:s3cret@10.0.0.1:26380/2;sentinel://10.0.0.2;sentinel://10.0.0.3:26381"


def test_a_sentinel_url_names_every_sentinel_and_the_primarys_database_and_credentials() -> None:
    parsed = SentinelURL.parse(URL)
    assert parsed.sentinels == (("10.0.0.1", 26380), ("10.0.0.2", 26379), ("10.0.0.3", 26381))
    assert (parsed.db, parsed.username, parsed.password) == (2, "app", "s3cret")


def test_a_sentinel_url_prints_without_any_password() -> None:
    assert redact(URL) == "sentinel://app:***@10.0.0.1:26380/2;sentinel://10.0.0.2;sentinel://10.0.0.3:26381"


def test_kombu_gets_every_sentinel_with_the_primarys_credentials_under_the_swapless_scheme() -> None:
    url, transport = broker_connection(URL)
    assert transport is None  # the scheme names the transport, for every failover URL kombu switches to
    assert url == ("swapless-sentinel://app:s3cret@10.0.0.1:26380/2;swapless-sentinel://app:s3cret@10.0.0.2;"
                   "swapless-sentinel://app:s3cret@10.0.0.3:26381")


def test_a_part_that_is_no_sentinel_url_is_named() -> None:
    with pytest.raises(ConfigError, match=re.escape("'redis://10.0.0.9:6379' is no sentinel://host:port URL")):
        SentinelURL.parse("sentinel://10.0.0.1;redis://10.0.0.9:6379")


def test_sentinels_without_a_master_name_say_which_setting_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPLESS_REDIS_URL", URL)
    with pytest.raises(ConfigError, match="set SWAPLESS_REDIS_SENTINEL_MASTER to the name they know the primary by"):
        load_settings()
    with pytest.raises(ConfigError, match="names sentinels: set SWAPLESS_REDIS_SENTINEL_MASTER"):
        redis_client(URL)


def test_the_celery_app_reaches_the_sentinels_for_broker_and_results() -> None:
    settings = load_settings(redis_url=URL, redis_sentinel_master="swapless", redis_sentinel_password="x",
                             key_prefix="p:")
    conf = make_app(settings).conf
    assert conf.broker_url.startswith("swapless-sentinel://")
    assert conf.result_backend == "swapless.tasks.broker.failover:SentinelBackend+" + URL
    for options in (conf.broker_transport_options, conf.result_backend_transport_options):
        assert options["master_name"] == "swapless"
        assert options["sentinel_kwargs"]["password"] == "x"
        assert options["global_keyprefix"] == "p:"
    assert SentinelOptions.of(settings) == SentinelOptions("swapless", None, "x", False)


def test_a_plain_url_keeps_todays_configuration() -> None:
    conf = make_app(load_settings(redis_url="redis://127.0.0.1:6379/3")).conf
    assert (conf.broker_url, conf.result_backend) == ("redis://127.0.0.1:6379/3", "redis://127.0.0.1:6379/3")
    assert "master_name" not in conf.broker_transport_options
    assert load_settings(redis_url="redis://127.0.0.1:6379/3").redis.failover_wait_s == 0


def test_too_few_replicas_is_a_retryable_queue_unavailable_saying_what_happened() -> None:
    wait = ReplicaWait(1, 0.2)
    assert wait.command() == ("WAIT", 1, 200)
    wait.check(1)
    with pytest.raises(ReplicasBehind) as behind:
        wait.check(0)
    error = translate(behind.value, URL)
    assert isinstance(error, QueueUnavailable)
    assert str(error) == (
        "cannot reach Redis at sentinel://app:***@10.0.0.1:26380/2;sentinel://10.0.0.2;sentinel://10.0.0.3:26381: "
        "only 0 of the 1 replica(s) SWAPLESS_REDIS_MIN_REPLICAS asks for confirmed the write within 0.2 s "
        "(SWAPLESS_REDIS_REPLICA_TIMEOUT_S); the job is on the primary only and may still run: send it again (or "
        "check the replicas, or lower SWAPLESS_REDIS_MIN_REPLICAS)"
    )
    assert ReplicaWait.of(load_settings().redis) is None
