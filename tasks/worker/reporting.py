"""What a worker tells the world: its heartbeat, its Prometheus metrics and Celery's task events.

``WorkerReporting`` is built at ``worker_init`` before the scheduler, whose ``observer`` it provides (every group
feeds the heartbeat's per-model activity, the metrics and the task events); ``start(scheduler)`` then starts the
heartbeat thread and, when ``metrics_port`` is set, the metrics endpoint; ``stop`` (``worker_shutdown``) stops
both and deletes the heartbeat. The parts themselves live in ``tasks.observe``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import signals

from config.errors import MetricsUnavailable
from tasks.broker.connection import redis_client, worker_health
from tasks.observe.accounting import GroupAccounting, GroupReport, Observers, SentTimes
from tasks.observe.events import TaskEvents
from tasks.observe.heartbeat import HeartbeatPublisher, WorkerStats, build_heartbeat
from tasks.observe.memory import WriteRefusals
from tasks.protocol import SENT_AT_HEADER
from tasks.worker.runtime import Runtime
from tasks.worker.scheduler import BatchScheduler

if TYPE_CHECKING:
    from tasks.observe.metrics import WorkerMetrics  # prometheus-client: imported only when metrics are asked for

__all__ = ["WorkerReporting"]

logger = logging.getLogger(__name__)


class WorkerReporting:
    """One worker's heartbeat, metrics and task events.

    Args:
        runtime: the worker's runtime (settings and cache).
        hostname: the worker's node name (default ``celery@<host>``).

    ``worker_id`` (``hostname:pid``) names it in Redis: its heartbeat, its claims, the jobs it holds.

    Raises:
        SwaplessError: ``metrics_port`` is set and ``prometheus-client`` is missing, or the port cannot be opened
            (``MetricsUnavailable``): the worker stops, as on a bad models file.
    """

    def __init__(self, runtime: Runtime, hostname: str | None = None) -> None:
        self.runtime = runtime
        self.hostname = hostname or f"celery@{socket.gethostname()}"
        self.worker_id = f"{self.hostname}:{os.getpid()}"
        #: the models this worker claimed (placement; set by the worker's start-up)
        self.claimed: Callable[[], list[str]] = list
        #: run on the heartbeat thread after each beat (saving what the worker learned); each may raise
        self.on_beat: list[Callable[[], Any]] = []
        self.stats = WorkerStats()
        self._scheduler: BatchScheduler | None = None
        self._stop_metrics: Callable[[], None] | None = None
        self._publisher: HeartbeatPublisher | None = None
        settings = runtime.settings
        listeners: list[Callable[[GroupReport], None]] = [self.stats]
        skipped: list[Callable[[str, str, int], None]] = [self.stats.skipped]
        shadowed: list[Callable[[str, str, str, bool, int], None]] = []
        if settings.metrics_port is not None:
            metrics = self._serve_metrics(settings.metrics_host, settings.metrics_port)
            listeners.append(metrics.observe)
            skipped.append(metrics.skipped)
            shadowed.append(metrics.shadowed)
        remembered = max(10_000, 4 * settings.prefetch)
        self.sent_times = SentTimes(max_entries=remembered)
        self.events = TaskEvents(max_entries=remembered)
        self.observer = Observers(
            [GroupAccounting(runtime.manager, listeners, self.sent_times, skipped=skipped, shadowed=shadowed), self.events]
        )

    def _backlog(self) -> dict[str, int]:
        return self._scheduler.backlog_counts() if self._scheduler is not None else {}

    def _serve_metrics(self, host: str, port: int) -> WorkerMetrics:
        try:
            from tasks.observe.metrics import (
                WorkerMetrics,  # prometheus-client: only when asked for
            )
        except ImportError as err:
            raise MetricsUnavailable(host, port, f"{err.name} is not installed: pip install prometheus-client") from None
        metrics = WorkerMetrics(self.runtime.manager, self._backlog, claimed=lambda: self.claimed())
        self._stop_metrics = metrics.serve(host, port)
        logger.info("metrics on http://%s:%d/metrics", host, port)
        return metrics

    def _on_received(self, request: Any = None, **_: Any) -> None:
        sent_at = (getattr(request, "request_dict", None) or {}).get(SENT_AT_HEADER)
        if isinstance(sent_at, (int, float)):
            self.sent_times.record(request.id, float(sent_at))
        self.events.on_received(request)

    def start(self, scheduler: BatchScheduler) -> None:
        """Start beating for ``scheduler``'s worker and listen to Celery's ``task_received``."""
        self._scheduler = scheduler
        settings = self.runtime.settings
        signals.task_received.connect(self._on_received, weak=False, dispatch_uid="swapless-status-received")
        started_at = time.time()
        refusals = WriteRefusals()

        def build() -> Any:
            for hook in self.on_beat:
                try:
                    hook()
                except Exception as err:  # noqa: BLE001 - a hook never stops the heartbeat
                    logger.warning("after-beat work failed: %s", err)
            problem = worker_health.describe()
            if problem is None and self._publisher is not None:
                problem = refusals.check(self._publisher.client)
            return build_heartbeat(
                hostname=self.hostname,
                worker_id=self.worker_id,
                queue=settings.queue,
                started_at=started_at,
                interval_s=settings.heartbeat_interval_s,
                manager=scheduler.runtime.manager,
                stats=self.stats,
                backlog=scheduler.backlog_counts(),
                jobs_done=scheduler.jobs_done,
                jobs_failed=scheduler.jobs_failed,
                redis_problem=problem,
                routing=settings.routing,
                claimed=self.claimed(),
            )

        self._publisher = HeartbeatPublisher(
            redis_client(settings.broker_url, connect_timeout_s=5, socket_timeout_s=5),
            settings.key_prefix,
            self.worker_id,
            build,
            settings.heartbeat_interval_s,
            worker_health,
        )
        self._publisher.start()
        logger.info("heartbeat: %s every %.1f s", self._publisher.key, settings.heartbeat_interval_s)

    def stop(self) -> None:
        """Stop the heartbeat (deleting it) and the metrics endpoint. Safe to call twice."""
        signals.task_received.disconnect(self._on_received, dispatch_uid="swapless-status-received")
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.stop()
        stop_metrics, self._stop_metrics = self._stop_metrics, None
        if stop_metrics is not None:
            stop_metrics()
