"""The Celery app factory, configured from Settings under Celery's own setting names; producers and workers each
build their own app. Importing this module builds none; the worker's app is ``swapless.tasks.worker.task.app``.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence

from celery import Celery

from swapless.config.settings import Settings, get_settings
from swapless.tasks.broker.sentinel import SentinelOptions, is_sentinel_url
from swapless.tasks.broker.transport import broker_connection
from swapless.tasks.protocol import (
    CHUNK_TASK,
    PREDICT_TASK,
    PRIORITY_INTERACTIVE,
    PRIORITY_STEPS,
)

__all__ = ["configure", "make_app"]


def make_app(settings: Settings | None = None, include: Sequence[str] = ()) -> Celery:
    """A Celery app for ``settings`` (the environment's by default); connects to nothing until used.

    Args:
        include: modules a worker imports to register its tasks.
    """
    app = Celery("swapless", include=list(include))
    configure(app, settings or get_settings())
    return app


def configure(app: Celery, s: Settings) -> None:
    """Apply ``s`` to ``app``'s configuration (the CLI calls this again after reading its flags)."""
    broker_url, broker_transport = broker_connection(s.redis.broker_url)
    prefix = {"global_keyprefix": s.jobs.key_prefix} if s.jobs.key_prefix else {}
    sentinel = _sentinel_options(s)
    app.conf.update(
        # tasks.broker.transport: kombu's Redis transport with an atomic fetch (no job lost between BRPOP and its
        # unacked record) that takes many messages per round trip.
        broker_url=broker_url,
        broker_transport=broker_transport,
        result_backend=_result_backend(s.redis.broker_url),
        # JSON only: a message with any other content type is rejected before anything is decoded.
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        # A job is acked only once its result is stored: a worker that dies loses nothing.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        result_expires=s.jobs.result_expires_s,
        task_default_queue=s.jobs.queue,
        task_routes={PREDICT_TASK: {"queue": s.jobs.queue}, CHUNK_TASK: {"queue": s.jobs.queue}},
        task_default_priority=PRIORITY_INTERACTIVE,
        # One process, one scheduler thread per worker: the pool is not used by the batch task (see tasks.worker.task),
        # so `celery -A swapless worker` gets these defaults too.
        worker_pool="solo",
        worker_concurrency=1,
        # How many unacked jobs one worker holds (the backlog its scheduler sees).
        worker_prefetch_multiplier=s.worker.prefetch,
        broker_transport_options={
            # A dead worker's jobs come back after the timeout, found by a sweep every restore_sweep_s
            # (kombu's default sweep runs only every 100 s); live workers refresh theirs (tasks.broker.acks).
            "visibility_timeout": s.worker.visibility_timeout_s,
            "unacked_restore_interval": s.worker.restore_sweep_s,
            "unacked_restore_throttle": 1,
            "queue_order_strategy": "priority",
            "priority_steps": list(PRIORITY_STEPS),
            **prefix,
            **sentinel,
            # how long a connection rides out a failover (tasks.broker.failover.SentinelTransport)
            **({"failover_wait_s": s.redis.redis_failover_wait_s} if sentinel else {}),
        },
        result_backend_transport_options={**prefix, **sentinel},
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        result_backend_always_retry=True,
        result_backend_max_retries=20,
        redis_backend_health_check_interval=10,
        broker_heartbeat=0,
        # Per-job events for Flower (SWAPLESS_TASK_EVENTS / --task-events): off by default, as in Celery; they cost
        # 10-25 % of single-model throughput here.
        worker_send_task_events=s.observe.task_events,
        worker_hijack_root_logger=False,
        # the Swapless settings themselves, for the worker's composition root (tasks.worker.context)
        swapless_settings=s,
    )
    if is_sentinel_url(s.redis.broker_url) and s.redis.redis_sentinel_tls:
        app.conf.update(broker_use_ssl={"ssl_cert_reqs": ssl.CERT_REQUIRED},
                        redis_backend_use_ssl={"ssl_cert_reqs": ssl.CERT_REQUIRED})


def _result_backend(url: str) -> str:
    """Celery's result backend for ``url``: Swapless's Sentinel backend for sentinel URLs (tasks.broker.failover)."""
    return f"swapless.tasks.broker.failover:SentinelBackend+{url}" if is_sentinel_url(url) else url


def _sentinel_options(s: Settings) -> dict[str, object]:
    """The transport options of kombu's and Celery's Sentinel clients (none without sentinels)."""
    options = SentinelOptions.of(s)
    if options is None or not is_sentinel_url(s.redis.broker_url):
        return {}
    return {"master_name": options.master,
            "sentinel_kwargs": options.sentinel_kwargs(s.redis.connect_timeout_s, 10.0)}

