"""The result store writes what Celery's own result backend writes, and Celery reads it back."""

from __future__ import annotations

import json
import uuid

import redis

from tasks.app import make_app
from tasks.broker.results import ResultStore
from tasks.errors import JobFailed


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
