"""Per-group accounting: the scheduler reports each group, and ``GroupAccounting`` turns it into a
``GroupReport`` with the cache activity it caused, for its listeners (heartbeat statistics, Prometheus).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from swapless.manager import Job, ModelManager, Outcome

__all__ = [
    "NULL_OBSERVER",
    "GroupAccounting",
    "GroupReport",
    "NullObserver",
    "Observers",
    "SchedulerObserver",
    "SentTimes",
]

logger = logging.getLogger(__name__)


class SchedulerObserver(Protocol):
    """Told about every group a scheduler runs. Called in the scheduler thread; must be quick and never raise."""

    def on_group(self, model_id: str, jobs: Sequence[Job], outcomes: Sequence[Outcome], run_s: float) -> None:
        """One group ran.

        Args:
            model_id: the model the group ran on.
            jobs: the jobs of the group, as run.
            outcomes: one per job: a result or an error.
            run_s: seconds the group took, model load included.
        """

    def on_skipped(self, model_id: str, reason: str, jobs: int) -> None:
        """Jobs of ``model_id`` were answered without running: ``reason`` is ``"expired"`` (their deadline passed
        first) or ``"cancelled"``; ``jobs`` counts them (a chunk's items each)."""

    def on_shadow(self, route_id: str, served: str, shadow: str, agreed: bool, jobs: int) -> None:
        """``jobs`` shadow copies of ``route_id``'s jobs ran on ``shadow`` and were compared with ``served``'s."""


class NullObserver:
    """The default observer: ignores everything."""

    def on_group(self, model_id: str, jobs: Sequence[Job], outcomes: Sequence[Outcome], run_s: float) -> None:
        return None

    def on_skipped(self, model_id: str, reason: str, jobs: int) -> None:
        return None

    def on_shadow(self, route_id: str, served: str, shadow: str, agreed: bool, jobs: int) -> None:
        return None


NULL_OBSERVER = NullObserver()


class Observers:
    """Several observers as one; one that raises is logged and the others still run."""

    def __init__(self, observers: Sequence[SchedulerObserver]) -> None:
        self.observers = list(observers)

    def on_group(self, model_id: str, jobs: Sequence[Job], outcomes: Sequence[Outcome], run_s: float) -> None:
        for observer in self.observers:
            try:
                observer.on_group(model_id, jobs, outcomes, run_s)
            except Exception:  # an observer must never cost a group its results
                logger.exception("observer %r failed on a group of %s", observer, model_id)

    def on_skipped(self, model_id: str, reason: str, jobs: int) -> None:
        for observer in self.observers:
            try:
                observer.on_skipped(model_id, reason, jobs)
            except Exception:  # as on_group
                logger.exception("observer %r failed on %d %s job(s) of %s", observer, jobs, reason, model_id)

    def on_shadow(self, route_id: str, served: str, shadow: str, agreed: bool, jobs: int) -> None:
        for observer in self.observers:
            try:
                observer.on_shadow(route_id, served, shadow, agreed, jobs)
            except Exception:  # as on_group
                logger.exception("observer %r failed on shadow jobs of %s", observer, route_id)


@dataclass(frozen=True)
class GroupReport:
    """One group, with the cache activity it caused.

    Attributes:
        errors: failed jobs per error type name.
        run_s: seconds the group took, load included.
        queue_wait_s: per job, seconds from its send (or receipt) to the start of the group.
        hits, misses, load_failures: the cache's, during the group.
        load_s, swap_s: seconds of each load, and of each swap-in from the host tier, of ``model_id``.
        evicted: the models that left the device to make room.
    """

    model_id: str
    succeeded: int
    errors: dict[str, int]
    run_s: float
    queue_wait_s: tuple[float, ...]
    hits: int
    misses: int
    load_s: tuple[float, ...]
    load_failures: int
    evicted: tuple[str, ...]
    swap_s: tuple[float, ...] = ()

    @property
    def size(self) -> int:
        """Jobs in the group."""
        return self.succeeded + sum(self.errors.values())

    @property
    def failed(self) -> int:
        return sum(self.errors.values())


class SentTimes:
    """Producers' send times by job id, recorded at receipt and taken when the job's group runs; at most
    ``max_entries`` kept (the oldest forgotten)."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._times: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()  # recorded in the consumer thread, taken in the scheduler thread

    def record(self, job_id: str, sent_at: float) -> None:
        self.record_many([(job_id, sent_at)])

    def record_many(self, stamps: Iterable[tuple[str, float]]) -> None:
        """``record`` for many jobs at once (one fetch round's), under one acquisition of the lock."""
        with self._lock:
            self._times.update(stamps)
            while len(self._times) > self.max_entries:
                self._times.popitem(last=False)

    def take(self, job_id: str) -> float | None:
        """The send time of ``job_id``, forgotten once taken; the items of a chunk (``<chunk id>:<index>``)
        share their chunk's, which stays until it ages out."""
        with self._lock:
            sent_at = self._times.pop(job_id, None)
            if sent_at is None and ":" in job_id:
                sent_at = self._times.get(job_id.rpartition(":")[0])
            return sent_at

    def __len__(self) -> int:
        return len(self._times)


class GroupAccounting:
    """The worker's observer: builds a ``GroupReport`` per group and hands it to each listener.

    Args:
        manager: the worker's cache (read after each group, never changed).
        listeners: called with each report, in order.
        skipped: called as ``on_skipped`` is.
        shadowed: called as ``on_shadow`` is.
        sent_times: producers' send times of received jobs (empty: queue wait is measured from receipt).
        clock: wall clock (epoch seconds); ``monotonic``: the clock of ``Job.received_s``.
    """

    def __init__(
        self,
        manager: ModelManager,
        listeners: Sequence[Callable[[GroupReport], None]] = (),
        sent_times: SentTimes | None = None,
        skipped: Sequence[Callable[[str, str, int], None]] = (),
        shadowed: Sequence[Callable[[str, str, str, bool, int], None]] = (),
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.manager = manager
        self.listeners = list(listeners)
        self.skipped = list(skipped)
        self.shadowed = list(shadowed)
        self.sent_times = sent_times if sent_times is not None else SentTimes()
        self.clock = clock
        self.monotonic = monotonic
        self._hits = 0
        self._misses = 0
        self._load_failures = 0
        self._loads_seen: dict[str, int] = {}
        self._swaps_seen: dict[str, int] = {}
        self._loaded: set[str] = set()

    def on_group(self, model_id: str, jobs: Sequence[Job], outcomes: Sequence[Outcome], run_s: float) -> None:
        try:
            report = self.report(model_id, jobs, outcomes, run_s)
            for listener in self.listeners:
                listener(report)
        except Exception:  # accounting must never cost a group its results
            logger.exception("could not account for a group of %d job(s) on %s", len(jobs), model_id)

    def on_skipped(self, model_id: str, reason: str, jobs: int) -> None:
        for listener in self.skipped:
            try:
                listener(model_id, reason, jobs)
            except Exception:  # as on_group
                logger.exception("could not account for %d %s job(s) of %s", jobs, reason, model_id)

    def on_shadow(self, route_id: str, served: str, shadow: str, agreed: bool, jobs: int) -> None:
        for listener in self.shadowed:
            try:
                listener(route_id, served, shadow, agreed, jobs)
            except Exception:  # as on_group
                logger.exception("could not account for shadow jobs of %s", route_id)

    def report(self, model_id: str, jobs: Sequence[Job], outcomes: Sequence[Outcome], run_s: float) -> GroupReport:
        """The report of one group (also advances the accounting: call it once per group)."""
        started_wall = self.clock() - run_s
        started_mono = self.monotonic() - run_s
        waits = []
        for job in jobs:
            sent_at = self.sent_times.take(job.id)
            wait = started_wall - sent_at if sent_at is not None else started_mono - job.received_s
            waits.append(max(0.0, wait))

        stats = self.manager.stats
        hits, self._hits = stats.hits - self._hits, stats.hits
        misses, self._misses = stats.misses - self._misses, stats.misses
        load_failures, self._load_failures = stats.load_failures - self._load_failures, stats.load_failures
        all_loads = stats.load_seconds.get(model_id, [])
        new_loads = tuple(all_loads[self._loads_seen.get(model_id, 0) :])
        self._loads_seen[model_id] = len(all_loads)
        all_swaps = stats.swap_in_seconds.get(model_id, [])
        new_swaps = tuple(all_swaps[self._swaps_seen.get(model_id, 0) :])
        self._swaps_seen[model_id] = len(all_swaps)
        loaded = set(self.manager.loaded_ids())
        evicted = tuple(sorted(self._loaded - loaded))
        self._loaded = loaded

        errors = Counter(type(o.error).__name__ for o in outcomes if o.error is not None)
        return GroupReport(
            model_id=model_id,
            succeeded=sum(1 for o in outcomes if o.error is None),
            errors=dict(errors),
            run_s=run_s,
            queue_wait_s=tuple(waits),
            hits=hits,
            misses=misses,
            load_s=new_loads,
            load_failures=load_failures,
            evicted=evicted,
            swap_s=new_swaps,
        )
