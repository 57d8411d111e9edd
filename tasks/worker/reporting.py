"""WorkerReporting: a worker's heartbeat, Prometheus metrics and Celery task events (``swapless.tasks.observe``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis
from celery import signals

from swapless.config.errors import MetricsUnavailable
from swapless.tasks.broker.connection import RedisHealth
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.accounting import GroupAccounting, GroupReport, Observers, SentTimes
from swapless.tasks.observe.beats import HeartbeatPublisher, build_heartbeat
from swapless.tasks.observe.events import TaskEvents
from swapless.tasks.observe.memory import WriteRefusals
from swapless.tasks.observe.stats import WorkerStats
from swapless.tasks.protocol import SENT_AT_HEADER
from swapless.tasks.worker.runtime import Runtime
from swapless.tasks.worker.scheduler import BatchScheduler

if TYPE_CHECKING:
    from swapless.tasks.observe.metrics import (
        WorkerMetrics,  # prometheus-client: imported only when metrics are asked for
    )

__all__ = ["WorkerReporting"]

logger = logging.getLogger(__name__)


class WorkerReporting:
    """One worker's heartbeat, metrics and task events; ``worker_id`` (``hostname:pid``) names it in Redis.

    Args:
        runtime: the worker's runtime (settings and cache).
        keyspace: the deployment's keys.
        health: what the worker has seen of Redis.
        hostname: the worker's node name (default ``celery@<host>``).

    Raises:
        MetricsUnavailable: ``metrics_port`` is set and the endpoint cannot be served.
    """

    def __init__(self, runtime: Runtime, keyspace: Keyspace, health: RedisHealth, hostname: str | None = None) -> None:
        self.runtime = runtime
        self.keyspace = keyspace
        self.health = health
        self.hostname = hostname or f"celery@{socket.gethostname()}"
        self.worker_id = f"{self.hostname}:{os.getpid()}"
        self._claimed: Callable[[], Sequence[str]] = list
        self.stats = WorkerStats()
        self._scheduler: BatchScheduler | None = None
        self._stop_metrics: Callable[[], None] | None = None
        self._publisher: HeartbeatPublisher | None = None
        settings = runtime.settings
        listeners: list[Callable[[GroupReport], None]] = [self.stats]
        skipped: list[Callable[[str, str, int], None]] = [self.stats.skipped]
        shadowed: list[Callable[[str, str, str, bool, int], None]] = []
        if settings.observe.metrics_port is not None:
            metrics = self._serve_metrics(settings.observe.metrics_host, settings.observe.metrics_port)
            listeners.append(metrics.observe)
            skipped.append(metrics.skipped)
            shadowed.append(metrics.shadowed)
        remembered = max(10_000, 4 * settings.worker.prefetch)
        self.sent_times = SentTimes(max_entries=remembered)
        self.events = TaskEvents(max_entries=remembered)
        self.observer = Observers(
            [
                GroupAccounting(runtime.manager, listeners, self.sent_times, skipped=skipped, shadowed=shadowed),
                self.events,
            ]
        )

    def _backlog(self) -> dict[str, int]:
        return self._scheduler.backlog_counts() if self._scheduler is not None else {}

    def _serve_metrics(self, host: str, port: int) -> WorkerMetrics:
        try:
            from swapless.tasks.observe.metrics import (
                WorkerMetrics,  # prometheus-client: only when asked for
            )
        except ImportError as err:
            raise MetricsUnavailable(
                host, port, f"{err.name} is not installed: pip install prometheus-client"
            ) from None
        metrics = WorkerMetrics(self.runtime.manager, self._backlog, claimed=lambda: list(self._claimed()))
        self._stop_metrics = metrics.serve(host, port)
        logger.info("metrics on http://%s:%d/metrics", host, port)
        return metrics

    def _on_received(self, request: Any = None, **_: Any) -> None:
        sent_at = (getattr(request, "request_dict", None) or {}).get(SENT_AT_HEADER)
        if isinstance(sent_at, (int, float)):
            self.sent_times.record(request.id, float(sent_at))
        self.events.on_received(request)

    def start(
        self,
        scheduler: BatchScheduler,
        client: redis.Redis,
        claimed: Callable[[], Sequence[str]],
        after_beat: Sequence[Callable[[], Any]] = (),
        device: str = "",
    ) -> None:
        """Start the heartbeat and listen to Celery's ``task_received``.

        Args:
            scheduler: the worker's scheduler (its backlog).
            client: the Redis the heartbeat goes to.
            claimed: the models this worker holds a claim on.
            after_beat: run on the heartbeat thread after each beat; each may raise.
            device: the kind of device it computes on.
        """
        self._scheduler = scheduler
        self._claimed = claimed
        settings = self.runtime.settings
        signals.task_received.connect(self._on_received, weak=False, dispatch_uid="swapless-status-received")
        started_at = time.time()
        refusals = WriteRefusals()

        def build() -> Any:
            for hook in after_beat:
                try:
                    hook()
                except Exception as err:  # noqa: BLE001 - a hook never stops the heartbeat
                    logger.warning("after-beat work failed: %s", err)
            problem = self.health.describe()
            if problem is None and self._publisher is not None:
                problem = refusals.check(self._publisher.client)
            jobs_done, jobs_failed = self.stats.totals()
            return build_heartbeat(
                hostname=self.hostname,
                worker_id=self.worker_id,
                queue=settings.jobs.queue,
                started_at=started_at,
                interval_s=settings.observe.heartbeat_interval_s,
                manager=scheduler.runtime.manager,
                stats=self.stats,
                backlog=scheduler.backlog_counts(),
                jobs_done=jobs_done,
                jobs_failed=jobs_failed,
                redis_problem=problem,
                routing=settings.placement.routing,
                claimed=claimed(),
                device=device,
            )

        self._publisher = HeartbeatPublisher(client, self.keyspace, self.worker_id, build,
                                             settings.observe.heartbeat_interval_s, self.health)
        self._publisher.start()
        logger.info("heartbeat: %s every %.1f s", self._publisher.key, settings.observe.heartbeat_interval_s)

    def stop(self) -> None:
        """Stop the heartbeat (deleting it) and the metrics endpoint. Safe to call twice."""
        signals.task_received.disconnect(self._on_received, dispatch_uid="swapless-status-received")
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.stop()
        stop_metrics, self._stop_metrics = self._stop_metrics, None
        if stop_metrics is not None:
            stop_metrics()
