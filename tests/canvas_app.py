"""A plain Celery app beside Swapless, as a Celery user writes one: its own follow-up tasks (``post.*``), the same
Redis as the Swapless worker for broker and results (under the test's key prefix), ``swapless.*`` routed to the
Swapless queue. Its worker: ``celery -A tests.canvas_app worker -Q <SWAPLESS_CANVAS_QUEUE> --pool solo``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery import Celery
from celery.result import AsyncResult


def make_app(env: Mapping[str, str]) -> Celery:
    """A plain Celery app on the Swapless environment ``env`` (its Redis, key prefix and queues)."""
    prefix = {"global_keyprefix": env.get("SWAPLESS_KEY_PREFIX", "")}
    plain = Celery("post", broker=env.get("SWAPLESS_REDIS_URL"), backend=env.get("SWAPLESS_REDIS_URL"))
    plain.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"],
        broker_transport_options=prefix, result_backend_transport_options=prefix,
        task_default_queue=env.get("SWAPLESS_CANVAS_QUEUE", "celery"),
        task_routes={"swapless.*": {"queue": env.get("SWAPLESS_QUEUE", "swapless")}},
        worker_hijack_root_logger=False,
    )
    return plain


app = make_app(os.environ)


@app.task(name="post.top")
def top(prediction: list[dict[str, Any]]) -> str:
    """The top label of one Swapless prediction."""
    return str(prediction[0]["label"])


@app.task(name="post.summarise")
def summarise(predictions: list[list[dict[str, Any]]]) -> list[str]:
    """The top labels of a chord's header, in order."""
    return [str(p[0]["label"]) for p in predictions]


@app.task(name="post.failed")
def failed(task_id: str) -> dict[str, str]:
    """An errback: the failed job's own error, read back from the result backend."""
    error = AsyncResult(task_id, app=app).result
    return {"job": task_id, "type": type(error).__name__, "message": str(error)}


@app.task(name="post.chunk_top")
def chunk_top(outcomes: list[dict[str, Any]]) -> list[str]:
    """The top label of each item of a Swapless chunk's result."""
    return [str(o["ok"][0]["label"]) for o in outcomes]
