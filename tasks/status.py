"""Live status: the depth of the queue, and the worker-side wiring of heartbeats and metrics.

Queue depth is read from the Redis transport's lists: the queue and its priority sub-queues. Per-model counts
need each message's body, so at most ``sample`` messages per priority level are decoded (the next ones to be
served); beyond that the counts are scaled up from the sample and marked as estimates.

``start_worker_reporting`` (on ``worker_init``) sets the scheduler's observer, starts the heartbeat
(``tasks.heartbeat``), the Celery task events (``tasks.events``) and, when ``metrics_port`` is set, the
Prometheus endpoint (``tasks.metrics``);
``stop_worker_reporting`` (on ``worker_shutdown``) stops both. The heartbeat names are re-exported here.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aredis
from celery import signals

from config.settings import Settings
from tasks.app import PRIORITY_STEPS, SENT_AT_HEADER
from tasks.events import TaskEvents
from tasks.heartbeat import (
    CacheInfo,
    Heartbeat,
    HeartbeatPublisher,
    LoadedEntry,
    ModelActivity,
    WaitSummary,
    WorkerStats,
    aread_heartbeats,
    backlog_counts,
    build_heartbeat,
    client_url,
    read_heartbeats,
    worker_key,
    workers_index_key,
)
from tasks.observe import GroupAccounting, GroupReport, Observers, SentTimes
from tasks.publish import queue_key

if TYPE_CHECKING:
    from tasks.scheduler import BatchScheduler

__all__ = [
    "CacheInfo",
    "Heartbeat",
    "HeartbeatPublisher",
    "LoadedEntry",
    "ModelActivity",
    "QueueDepth",
    "WaitSummary",
    "WorkerStats",
    "aread_heartbeats",
    "aread_queue_depth",
    "backlog_counts",
    "client_url",
    "message_jobs",
    "read_heartbeats",
    "read_queue_depth",
    "start_worker_reporting",
    "stop_worker_reporting",
    "worker_key",
    "workers_index_key",
]

logger = logging.getLogger(__name__)

#: Messages decoded per priority level to split the queue by model, by default.
DEFAULT_SAMPLE = 200


@dataclass(frozen=True)
class QueueDepth:
    """Jobs waiting in Redis (not yet fetched by any worker), per priority level and per model.

    Attributes:
        queue: the queue name.
        by_priority: messages per priority level (0 is served first): exact list lengths.
        by_model: jobs per model (a chunk message counts its items); estimates when ``sampled``.
        sampled: some level held more than ``sample`` messages, so ``by_model`` is scaled up from a sample.
        sample: messages decoded per priority level at most.
        unreadable: sampled messages whose model could not be read.
    """

    queue: str
    by_priority: dict[int, int]
    by_model: dict[str, int]
    sampled: bool
    sample: int
    unreadable: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_priority.values())


def queue_keys(settings: Settings) -> list[tuple[int, str]]:
    """``(priority, Redis key)`` of the queue's lists; kombu's key prefix is applied here."""
    return [(p, queue_key(settings, p)) for p in PRIORITY_STEPS]


def message_jobs(raw: bytes | str) -> tuple[str, int] | None:
    """``(model id, jobs)`` of one queued kombu message (``{"body": base64 of [args, kwargs, embed], ...}``).

    A job message is ``[model_id, input]`` (one job); a chunk message ``[model_id, [input, ...]]`` (one job per
    input). None when the message cannot be read.
    """
    try:
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        model_id, value = args[0], args[1]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(model_id, str):
        return None
    return model_id, len(value) if isinstance(value, list) else 1


def _depth(
    queue: str, priorities: Sequence[int], lengths: Sequence[int], samples: Sequence[Sequence[Any]], sample: int
) -> QueueDepth:
    estimated: dict[str, float] = {}
    sampled = False
    unreadable = 0
    for length, messages in zip(lengths, samples, strict=True):
        if not length or not messages:
            continue
        scale = length / len(messages)
        sampled = sampled or length > len(messages)
        counts: Counter[str] = Counter()
        for message in messages:
            found = message_jobs(message)
            if found is None:
                counts[""] += 1
            else:
                counts[found[0]] += found[1]
        unreadable += round(counts.pop("", 0) * scale)
        for model_id, n in counts.items():
            estimated[model_id] = estimated.get(model_id, 0.0) + n * scale
    by_model = {model_id: round(n) for model_id, n in sorted(estimated.items(), key=lambda item: -item[1])}
    return QueueDepth(
        queue=queue,
        by_priority=dict(zip(priorities, (int(n) for n in lengths), strict=True)),
        by_model=by_model,
        sampled=sampled,
        sample=sample,
        unreadable=unreadable,
    )


def read_queue_depth(client: redis.Redis, settings: Settings, sample: int = DEFAULT_SAMPLE) -> QueueDepth:
    """The queue's depth in one round trip (``LLEN`` and a bounded ``LRANGE`` per priority level)."""
    keys = queue_keys(settings)
    pipe = client.pipeline(transaction=False)
    for _, key in keys:
        pipe.llen(key)
        pipe.lrange(key, -sample, -1)  # the oldest: kombu pushes left and pops right
    replies = pipe.execute()
    return _depth(settings.queue, [p for p, _ in keys], replies[0::2], replies[1::2], sample)


async def aread_queue_depth(client: aredis.Redis, settings: Settings, sample: int = DEFAULT_SAMPLE) -> QueueDepth:
    """``read_queue_depth`` for asyncio code."""
    keys = queue_keys(settings)
    pipe = client.pipeline(transaction=False)
    for _, key in keys:
        pipe.llen(key)
        pipe.lrange(key, -sample, -1)
    replies = await pipe.execute()
    return _depth(settings.queue, [p for p, _ in keys], replies[0::2], replies[1::2], sample)


# -- the worker side -----------------------------------------------------------------------------------------


@dataclass
class _Reporting:
    publisher: HeartbeatPublisher
    on_received: Callable[..., None]
    stop_metrics: Callable[[], None] | None


_active: _Reporting | None = None


def start_worker_reporting(scheduler: BatchScheduler, hostname: str | None = None) -> None:
    """Start this worker's heartbeat (and its Prometheus endpoint when ``metrics_port`` is set); call on worker_init.

    Sets ``scheduler.observer`` so each group feeds the heartbeat, the metrics and Celery's task events
    (``tasks.events``, for Flower).

    Raises:
        SystemExit: the metrics port cannot be opened (the worker stops, as on a bad models file).
    """
    global _active
    stop_worker_reporting()
    settings = scheduler.runtime.settings
    hostname = hostname or f"celery@{socket.gethostname()}"
    stats = WorkerStats()
    listeners: list[Callable[[GroupReport], None]] = [stats]
    stop_metrics = None
    if settings.metrics_port is not None:
        try:
            from tasks.metrics import (  # prometheus-client: only when asked for
                MetricsUnavailable,
                WorkerMetrics,
            )
        except ImportError as err:
            logger.critical("cannot start: --metrics-port needs %s: pip install 'swapless[gateway]'", err.name)
            raise SystemExit(2) from None
        try:
            metrics = WorkerMetrics(scheduler)
            stop_metrics = metrics.serve(settings.metrics_host, settings.metrics_port)
        except MetricsUnavailable as err:
            logger.critical("cannot start: %s", err)
            raise SystemExit(2) from None
        listeners.append(metrics.observe)
        logger.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
    remembered = max(10_000, 4 * settings.prefetch)
    sent_times = SentTimes(max_entries=remembered)
    events = TaskEvents(max_entries=remembered)
    scheduler.observer = Observers([GroupAccounting(scheduler.runtime.manager, listeners, sent_times), events])

    def on_received(request: Any = None, **_: Any) -> None:
        sent_at = (getattr(request, "request_dict", None) or {}).get(SENT_AT_HEADER)
        if isinstance(sent_at, (int, float)):
            sent_times.record(request.id, float(sent_at))
        events.on_received(request)

    signals.task_received.connect(on_received, weak=False, dispatch_uid="swapless-status-received")
    started_at = time.time()
    publisher = HeartbeatPublisher(
        redis.Redis.from_url(client_url(settings.broker_url), socket_timeout=5, socket_connect_timeout=5),
        settings.key_prefix,
        hostname,
        lambda: build_heartbeat(scheduler, stats, hostname, started_at),
        settings.heartbeat_interval_s,
    )
    publisher.start()
    _active = _Reporting(publisher, on_received, stop_metrics)
    logger.info("heartbeat: %s every %.1f s", publisher.key, settings.heartbeat_interval_s)


def stop_worker_reporting() -> None:
    """Stop the heartbeat (deleting it) and the metrics endpoint; call on worker_shutdown. Safe to call twice."""
    global _active
    active, _active = _active, None
    if active is None:
        return
    signals.task_received.disconnect(active.on_received, dispatch_uid="swapless-status-received")
    active.publisher.stop()
    if active.stop_metrics is not None:
        active.stop_metrics()
