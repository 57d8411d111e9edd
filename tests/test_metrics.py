"""The worker's Prometheus endpoint: the metric families from known reports (no HTTP), then a real worker
scraped over HTTP after a known sequence of jobs."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from swapless.config.errors import InputError
from swapless.config.settings import Settings
from swapless.manager import ModelEngine, ModelManager, ModelStore
from swapless.tasks.client import Client
from swapless.tasks.cluster.members import read_heartbeats
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.accounting import GroupReport
from swapless.tasks.observe.metrics import METRICS, WorkerMetrics
from tests.conftest import WorkerProcess
from tests.fakes import FakeWorker, write_fake_models
from tests.stack import free_port, listening_ports

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def total(found: Samples, name: str) -> float:
    return sum(v for (n, _), v in found.items() if n == name)


def test_the_names_listed_are_the_metrics_a_worker_exports(tmp_path: Path) -> None:
    engine = ModelEngine()
    store = ModelStore.from_file(write_fake_models(tmp_path, {"a": 1000}), engine.frameworks)
    metrics = WorkerMetrics(ModelManager(store, engine), backlog=dict)
    exported = {f.name + ("_total" if f.type == "counter" else "") for f in metrics.registry.collect()}
    assert exported == set(METRICS)


def test_metrics_from_reports(tmp_path: Path) -> None:
    FakeWorker.reset()
    engine = ModelEngine()
    store = ModelStore.from_file(write_fake_models(tmp_path, {"a": 1000}), engine.frameworks)
    manager = ModelManager(store, engine)
    metrics = WorkerMetrics(manager, backlog=dict)
    with manager.use("a") as worker:
        worker.predict(["x"])
    metrics.observe(GroupReport("a", 3, {"InputError": 1}, 0.2, (0.01, 0.02, 3.0, 0.5), 0, 1, (0.3,), 0, ("b",)))
    metrics.observe(GroupReport("a", 2, {}, 0.1, (0.5, 0.5), 1, 0, (), 0, ()))
    metrics.skipped("a", "expired", 4)
    metrics.skipped("a", "cancelled", 2)
    from prometheus_client import generate_latest

    found = samples(generate_latest(metrics.registry).decode())
    assert value(found, "swapless_jobs_total", model="a", outcome="success") == 5
    assert value(found, "swapless_jobs_total", model="a", outcome="failure") == 1 + 4  # expired: a failure
    assert value(found, "swapless_job_errors_total", model="a", error="InputError") == 1
    assert value(found, "swapless_job_errors_total", model="a", error="JobExpired") == 4
    assert value(found, "swapless_jobs_not_run_total", model="a", reason="expired") == 4
    assert value(found, "swapless_jobs_not_run_total", model="a", reason="cancelled") == 2
    assert value(found, "swapless_cache_hits_total", model="a") == 1
    assert value(found, "swapless_cache_misses_total", model="a") == 1
    assert value(found, "swapless_cache_evictions_total", model="b") == 1
    assert value(found, "swapless_model_load_seconds_count", model="a") == 1
    assert value(found, "swapless_model_load_seconds_sum", model="a") == pytest.approx(0.3)
    assert value(found, "swapless_batch_size_count", model="a") == 2  # jobs not run are no batch
    assert value(found, "swapless_batch_size_sum", model="a") == 6
    assert value(found, "swapless_batch_size_bucket", model="a", le="2.0") == 1
    assert value(found, "swapless_job_queue_wait_seconds_count", model="a") == 6
    assert value(found, "swapless_job_queue_wait_seconds_bucket", model="a", le="0.5") == 5
    assert value(found, "swapless_job_run_seconds_sum", model="a") == pytest.approx(4 * 0.2 + 2 * 0.1)
    assert value(found, "swapless_models_loaded") == 1
    assert value(found, "swapless_model_loaded_bytes", model="a") == 1000
    manager.close()
    FakeWorker.reset()


pytest_slow = pytest.mark.slow


@pytest_slow
def test_metrics_endpoint_of_a_real_worker_after_known_jobs(
    start_worker: Callable[..., WorkerProcess], settings: Settings
) -> None:
    port = free_port()
    # a heartbeat TTL of 60 s (3 intervals of 20 s): a heartbeat gone at the stop was taken away, it did not expire
    worker = start_worker("--max-models", "1", "--metrics-port", str(port), "--hostname", "m@%h",
                          env={"SWAPLESS_HEARTBEAT_INTERVAL_S": "20"})
    assert listening_ports(worker.proc.pid) == [("127.0.0.1", port)], "the metrics port, on loopback, and no other"
    client = Client()
    # one job at a time, cache of one: s(miss) s(hit) spam(miss, evicts s) s(miss, evicts spam) s-blank(hit, fails)
    for model_id in ["sentiment", "sentiment", "spam", "sentiment"]:
        client.submit(model_id, "hello there").get(timeout=60)
    with pytest.raises(InputError):
        client.submit("sentiment", "  ").get(timeout=60)
    # a job held in Redis for a second while the worker is frozen: its wait counts from the producer's send
    os.kill(worker.proc.pid, signal.SIGSTOP)
    try:
        held = client.submit("sentiment", "late")
        time.sleep(1.0)
    finally:
        os.kill(worker.proc.pid, signal.SIGCONT)
    held.get(timeout=60)

    found = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
    assert value(found, "swapless_jobs_total", model="sentiment", outcome="success") == 4
    assert value(found, "swapless_jobs_total", model="sentiment", outcome="failure") == 1
    assert value(found, "swapless_jobs_total", model="spam", outcome="success") == 1
    assert value(found, "swapless_job_errors_total", model="sentiment", error="InputError") == 1
    assert value(found, "swapless_cache_hits_total", model="sentiment") == 3
    assert value(found, "swapless_cache_misses_total", model="sentiment") == 2
    assert value(found, "swapless_cache_misses_total", model="spam") == 1
    assert value(found, "swapless_cache_hits_total", model="spam") is None
    assert value(found, "swapless_cache_evictions_total", model="sentiment") == 1
    assert value(found, "swapless_cache_evictions_total", model="spam") == 1
    assert value(found, "swapless_model_load_seconds_count", model="sentiment") == 2
    assert value(found, "swapless_model_load_seconds_count", model="spam") == 1
    assert 0 < value(found, "swapless_model_load_seconds_sum", model="sentiment") < 30  # type: ignore[operator]
    assert total(found, "swapless_batch_size_count") == 6 and total(found, "swapless_batch_size_sum") == 6
    assert total(found, "swapless_job_queue_wait_seconds_count") == 6
    assert total(found, "swapless_job_run_seconds_count") == 6
    waited = value(found, "swapless_job_queue_wait_seconds_sum", model="sentiment")
    assert waited is not None and waited >= 1.0, "the held job waited a second from its send"
    assert value(found, "swapless_models_loaded") == 1
    assert value(found, "swapless_model_loaded_bytes", model="sentiment") > 1_000_000  # type: ignore[operator]

    # a second worker asking for the same metrics port stops at start-up, saying why
    clash = start_worker("--metrics-port", str(port), "--hostname", "clash@%h", ready=False)
    assert clash.proc.wait(60) != 0
    assert (
        f"cannot serve metrics on 127.0.0.1:{port}: Address already in use; pick another --metrics-port" in clash.log()
    )

    # a clean stop takes the heartbeat away at once (not after its TTL) and closes the port
    r = redis.Redis.from_url(settings.redis.broker_url)
    beats = read_heartbeats(r, Keyspace.of(settings))
    assert [b.hostname for b in beats] == [f"m@{os.uname().nodename}"]
    left_ms = r.pttl(Keyspace.of(settings).heartbeat(beats[0].worker_id))
    stopped_at = time.monotonic()
    assert worker.stop() == 0
    assert read_heartbeats(r, Keyspace.of(settings)) == []
    assert (time.monotonic() - stopped_at) * 1000 < left_ms, "it went before it could have expired"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
