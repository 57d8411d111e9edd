"""The Celery app, configured from Settings (environment, ``SWAPLESS_`` prefix).

Celery's own lowercase setting names are used, so anything here can be overridden the Celery way.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery, signals

from config.settings import Settings, get_settings
from tasks.transport import broker_connection

__all__ = [
    "PREDICT_TASK",
    "PRIORITY_BULK",
    "PRIORITY_INTERACTIVE",
    "PRIORITY_STEPS",
    "SENT_AT_HEADER",
    "app",
    "configure",
    "make_app",
]

#: The one task name jobs are sent to; args are ``[model_id, input]``.
PREDICT_TASK = "swapless.predict"
#: Message priorities (Redis transport: 0 is served first). Interactive jobs overtake queued bulk work.
PRIORITY_INTERACTIVE = 0
PRIORITY_BULK = 6
#: The Redis transport's priority sub-queues (``queue``, ``queue\x06\x163``, ...); tasks.status reads their lengths.
PRIORITY_STEPS = (PRIORITY_INTERACTIVE, 3, PRIORITY_BULK, 9)
#: Message header with the producer's wall-clock send time (epoch seconds): the worker measures queue wait from it.
SENT_AT_HEADER = "swapless_sent_at"


def make_app(settings: Settings | None = None) -> Celery:
    """A Celery app for ``settings`` (the environment's by default). Connects to nothing until used."""
    app = Celery("swapless", include=["tasks.batch", "tasks.chunk_task"])  # issue #5: chunk_task
    configure(app, settings or get_settings())
    return app


def configure(app: Celery, s: Settings) -> None:
    """Apply ``s`` to ``app``'s configuration (the CLI calls this again after reading its flags)."""
    broker_url, broker_transport = broker_connection(s.broker_url)
    app.conf.update(
        # tasks.transport: kombu's Redis transport with an atomic fetch (no job lost between BRPOP and its unacked
        # record) that takes many messages per round trip.
        broker_url=broker_url,
        broker_transport=broker_transport,
        result_backend=s.broker_url,
        # JSON only: a message with any other content type is rejected before anything is decoded.
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        # A job is acked only once its result is stored: a worker that dies loses nothing.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        result_expires=s.result_expires_s,
        task_default_queue=s.queue,
        task_routes={PREDICT_TASK: {"queue": s.queue}},
        task_default_priority=PRIORITY_INTERACTIVE,
        # One process, one scheduler thread per worker: the pool is not used by the batch task (see tasks.batch),
        # so `celery -A tasks worker` gets these defaults too.
        worker_pool="solo",
        worker_concurrency=1,
        # How many unacked jobs one worker holds (the backlog its scheduler sees).
        worker_prefetch_multiplier=s.prefetch,
        broker_transport_options={
            # A dead worker's jobs come back after the timeout, found by a sweep every restore_sweep_s
            # (kombu's default sweep runs only every 100 s); live workers refresh theirs (tasks.acks).
            "visibility_timeout": s.visibility_timeout_s,
            "unacked_restore_interval": s.restore_sweep_s,
            "unacked_restore_throttle": 1,
            "queue_order_strategy": "priority",
            "priority_steps": list(PRIORITY_STEPS),
            **({"global_keyprefix": s.key_prefix} if s.key_prefix else {}),
        },
        result_backend_transport_options={"global_keyprefix": s.key_prefix} if s.key_prefix else {},
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        result_backend_always_retry=True,
        result_backend_max_retries=20,
        redis_backend_health_check_interval=10,
        broker_heartbeat=0,
        # Per-job events for Flower (SWAPLESS_TASK_EVENTS / --task-events): off by default, as in Celery; they cost
        # 10-25 % of single-model throughput here.
        worker_send_task_events=s.task_events,
        worker_hijack_root_logger=False,
    )


@signals.before_task_publish.connect(dispatch_uid="swapless-sent-at")
def _stamp_sent_at(headers: dict[str, Any] | None = None, **_: Any) -> None:
    # Celery messages carry no enqueue time; every producer that imports this module (Client, CLI, gateway) adds one.
    if headers is not None:
        headers.setdefault(SENT_AT_HEADER, time.time())


app = make_app()
