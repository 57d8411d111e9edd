"""The result store writes what Celery's own result backend writes, and Celery reads it back."""

from __future__ import annotations

import json
import os
import threading
import uuid
from typing import Any

import redis

from swapless.config.errors import JobFailed
from swapless.tasks.app import make_app
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.client.consumer import ResultConsumer
from tests.stack import pubsub_connections


def test_a_success_is_stored_as_celery_s_backend_would_store_it(swapless_env: dict[str, str], redis_url: str) -> None:
    app = make_app()
    store = ResultStore(app)
    job_id = str(uuid.uuid4())
    result = [{"label": "POSITIVE", "score": 0.9998}, {"label": "NEGATIVE", "score": 0.0002}]
    assert store.store([(job_id, result, None)]) == [True]
    raw = redis.Redis.from_url(redis_url).get(store.key(job_id))
    ours = json.loads(raw)
    celery = json.loads(app.backend.encode({**app.backend._get_result_meta(result, "SUCCESS", None, None),
                                            "task_id": job_id}))
    assert ours.keys() == celery.keys() and {**ours, "date_done": None} == {**celery, "date_done": None}
    assert ours["date_done"].endswith("+00:00")
    assert app.AsyncResult(job_id).get(timeout=5) == result  # Celery's own reader
    assert store.store([(job_id, "another", None)]) == [False]  # first result wins
    app.AsyncResult(job_id).forget()


def test_a_result_plain_json_cannot_hold_goes_through_celery_s_encoder(swapless_env: dict[str, str]) -> None:
    app = make_app()
    store = ResultStore(app)
    job_id = str(uuid.uuid4())
    value = {"when": uuid.UUID(int=7)}  # a type kombu's encoder writes (tagged) and reads back
    store.store([(job_id, value, None)])
    assert store.fetch([job_id])[0].value == value
    unstorable = str(uuid.uuid4())
    store.store([(unstorable, {1, 2}, None)])
    failed = store.fetch([unstorable])[0]
    assert failed.state == "FAILURE" and isinstance(failed.value, JobFailed) and "cannot be stored as JSON" in str(
        failed.value)
    store.forget([job_id, unstorable])


def test_a_wait_is_woken_by_the_publish_itself_and_reuses_its_pub_sub_connection(swapless_env: dict[str, str]) -> None:
    app = make_app()
    client = redis.Redis.from_url(app.conf.result_backend)
    store = ResultStore(app, client=client)
    consumer = ResultConsumer(client, store)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    value = store._encode(first, {"label": "POSITIVE"}, None, "2026-01-01T00:00:00+00:00")
    serving: list[set[str]] = []  # at each publish: this process's pub/sub connections

    def publish_later(job_id: str, raw: Any, delay_s: float) -> threading.Timer:
        def publish() -> None:
            serving.append({c["id"] for c in pubsub_connections(client, os.getpid())})
            client.publish(store.key(job_id), raw)

        timer = threading.Timer(delay_s, publish)
        timer.start()
        return timer

    # published, never SET: only the publish's own payload can answer the wait
    publish_later(first, value, 0.2)
    stored = consumer.wait(first, timeout_s=5)
    assert stored.state == "SUCCESS" and stored.value == {"label": "POSITIVE"}
    # a late message on the first job's channel does not answer the second job's wait
    publish_later(first, value, 0.1)
    assert consumer.wait(second, timeout_s=1).state == "PENDING"
    assert len(serving) == 2 and len(serving[0]) == 1 and serving[0] == serving[1], serving  # one, for both waits
    consumer.close()


def test_the_reads_before_a_group_count_the_first_attempt_of_fresh_jobs_only(swapless_env: dict[str, str]) -> None:
    app = make_app()
    client = redis.Redis.from_url(app.conf.result_backend)
    store = ResultStore(app, client=client)
    fresh, rerun, done = (str(uuid.uuid4()) for _ in range(3))
    store.start([rerun])  # in flight once already, when a worker died
    store.store([(done, "ok", None)])
    ids = [fresh, rerun, done]
    assert store.prior(ids, start=ids) == ({done}, {rerun: 1})  # read before counting
    assert client.get(store.attempts_key(fresh)) == b"1"  # its first attempt, in the same round trip
    assert client.get(store.attempts_key(rerun)) == b"1"  # left for start() to raise when it runs
    assert client.ttl(store.attempts_key(fresh)) > 0
    assert store.prior(ids) == ({done}, {fresh: 1, rerun: 1})
    store.forget([done])
    store.clear_attempts([fresh, rerun, done])
