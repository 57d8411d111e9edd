"""WorkerStats: one worker's job counts, activity per model and recent queue waits (its heartbeat's numbers)."""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque

from swapless.tasks.cluster.members import ModelActivity, WaitSummary
from swapless.tasks.observe.accounting import GroupReport

__all__ = ["WorkerStats"]


class WorkerStats:
    """The one count of a worker's jobs: per model from each ``GroupReport``, and the requests refused outside one.

    Args:
        window: queue waits kept for the summary (the most recent jobs).
    """

    def __init__(self, window: int = 1000) -> None:
        self.window = window
        self._lock = threading.Lock()
        self._models: dict[str, ModelActivity] = {}
        self._waits: deque[float] = deque(maxlen=window)
        self._wait_count = 0
        self._refused = 0

    def __call__(self, report: GroupReport) -> None:
        with self._lock:
            model = self._models.setdefault(report.model_id, ModelActivity())
            model.groups += 1
            model.jobs_done += report.succeeded
            model.jobs_failed += report.failed
            model.hits += report.hits
            model.misses += report.misses
            model.loads += len(report.load_s)
            model.load_failures += report.load_failures
            model.load_s_total += sum(report.load_s)
            if report.load_s:
                model.load_s_last = report.load_s[-1]
            model.swap_ins += len(report.swap_s)
            model.swap_s_total += sum(report.swap_s)
            model.run_s_total += max(0.0, report.run_s - sum(report.load_s) - sum(report.swap_s))
            model.last_run_at = time.time()
            for victim in report.evicted:
                self._models.setdefault(victim, ModelActivity()).evictions += 1
            self._waits.extend(report.queue_wait_s)
            self._wait_count += len(report.queue_wait_s)

    def skipped(self, model_id: str, reason: str, jobs: int) -> None:
        """Jobs answered without running (a ``GroupAccounting`` ``skipped`` listener)."""
        with self._lock:
            model = self._models.setdefault(model_id, ModelActivity())
            if reason == "expired":
                model.jobs_expired += jobs
                model.jobs_failed += jobs
            elif reason == "cancelled":
                model.jobs_cancelled += jobs

    def refused(self, jobs: int) -> None:
        """Requests answered with an error outside any group report (malformed, unknown model, poison)."""
        with self._lock:
            self._refused += jobs

    def totals(self) -> tuple[int, int]:
        """Jobs done and jobs failed since the worker started, refused requests among the failed."""
        with self._lock:
            done = sum(model.jobs_done for model in self._models.values())
            failed = sum(model.jobs_failed for model in self._models.values()) + self._refused
        return done, failed

    def models(self) -> dict[str, ModelActivity]:
        with self._lock:
            return {model_id: activity.model_copy() for model_id, activity in self._models.items()}

    def queue_wait(self) -> WaitSummary:
        with self._lock:
            waits = sorted(self._waits)
            count = self._wait_count
        if not waits:
            return WaitSummary(count=count)
        return WaitSummary(
            count=count,
            window=len(waits),
            mean_s=statistics.fmean(waits),
            p50_s=waits[len(waits) // 2],
            p95_s=waits[min(len(waits) - 1, int(len(waits) * 0.95))],
            max_s=waits[-1],
        )
