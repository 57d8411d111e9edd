"""The cluster-wide autoscaling signals (``SIGNALS``) for ``GET /metrics`` and ``swapless exporter``, and what
removing each worker costs. docs/operations/autoscaling.md gives the formula.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from swapless.config.settings import Settings
from swapless.tasks.cluster.members import Heartbeat
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.backlog import ClusterReading, read_cluster
from swapless.tasks.protocol import PRIORITIES

__all__ = [
    "SIGNALS",
    "DemandTracker",
    "RemovalCost",
    "ScalingCollector",
    "ScalingSignals",
    "Signals",
    "busy_workers",
    "desired_workers",
    "removal_costs",
    "signals_registry",
]

logger = logging.getLogger(__name__)

#: The metric names this module exports (the Kubernetes manifests' test checks theirs against it).
SIGNALS = (
    "swapless_queued_jobs",
    "swapless_backlog_seconds",
    "swapless_oldest_job_age_seconds",
    "swapless_backlog_without_capacity",
    "swapless_workers_live",
    "swapless_workers_busy",
    "swapless_demand_workers",
    "swapless_workers_desired",
    "swapless_signals_up",
)

#: Steps between readings the demand's window needs before it says anything.
_MIN_STEPS = 3

_LEVEL_NAMES = {level: name for name, level in PRIORITIES.items()}


def priority_name(level: int) -> str:
    """``interactive``, ``bulk``, or the level's number for the others."""
    return _LEVEL_NAMES.get(level, str(level))


@dataclass(frozen=True)
class RemovalCost:
    """What removing one worker costs: the models only it has loaded (the interactive ones apart), their load
    seconds, and its held jobs."""

    models: tuple[str, ...]
    load_s: float
    held: int
    interactive: tuple[str, ...] = ()
    interactive_load_s: float = 0.0

    @property
    def rank(self) -> tuple[float, bool, float]:
        """Sorts workers cheapest to remove first (interactive loads, then held jobs, then loads)."""
        return self.interactive_load_s, self.held > 0, self.load_s

    def text(self) -> str:
        """One line for the status: ``removing it: 1.3 s of loads elsewhere (a interactive, b); hands back 4 jobs``."""
        if not self.models:
            reload = "removing it: no model only it holds"
        else:
            names = [f"{m} interactive" if m in self.interactive else m for m in self.models]
            reload = f"removing it: {self.load_s:.1f} s of loads elsewhere ({', '.join(names)})"
        return reload + (f"; hands back {self.held} held job(s)" if self.held else "")


def removal_costs(workers: Sequence[Heartbeat]) -> dict[str, RemovalCost]:
    """Per worker id, what removing it costs (``RemovalCost``): remove the lowest ``rank`` first."""
    holders: collections.Counter[str] = collections.Counter()
    for beat in workers:
        holders.update({e.model_id for e in beat.loaded})
    costs = {}
    for beat in workers:
        alone = [e for e in beat.loaded if holders[e.model_id] == 1]
        used = [e for e in alone if e.interactive]
        costs[beat.worker_id or beat.hostname] = RemovalCost(
            tuple(e.model_id for e in alone), sum(e.load_s for e in alone), beat.backlog,
            tuple(e.model_id for e in used), sum(e.load_s for e in used))
    return costs


def busy_workers(reading: ClusterReading, busy_s: float, unknown_job_s: float) -> int:
    """Live workers with at least ``busy_s`` device seconds of work of their own: the jobs they hold, and their
    share of the jobs waiting for the models they claim."""
    claimers = collections.Counter(m for beat in reading.workers for m, a in beat.models.items() if a.claimed)

    def own_s(beat: Heartbeat) -> float:
        total = 0.0
        for model_id, activity in beat.models.items():
            model = reading.models.get(model_id)
            job_s = model.job_s if model is not None else unknown_job_s
            total += activity.backlog * job_s
            if activity.claimed and model is not None:
                total += model.waiting_jobs * job_s / claimers[model_id]
        return total

    return sum(1 for beat in reading.workers if own_s(beat) >= busy_s)


class DemandTracker:
    """The work arriving, in device seconds per second, over a sliding window of readings: the device seconds the
    live workers spent plus what the backlog grew by, without the window's largest step; 0 until three steps."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: dict[str, float] = {}
        self._done = 0.0
        self._first_at: float | None = None
        self._history: collections.deque[tuple[float, float, float]] = collections.deque()

    def update(self, reading: ClusterReading) -> float:
        """Record ``reading``; the demand over the window now."""
        busy = reading.busy_s()
        for worker, (started_at, spent) in busy.items():
            before = self._last.get(worker)
            if before is None:
                before = 0.0 if self._first_at is not None and started_at >= self._first_at else spent
            self._done += max(0.0, spent - before)
            self._last[worker] = spent
        for gone in set(self._last) - set(busy):
            del self._last[gone]
        if self._first_at is None:
            self._first_at = reading.now
        self._history.append((reading.now, self._done, reading.backlog_s))
        while len(self._history) > 2 and self._history[1][0] <= reading.now - self.window_s:
            self._history.popleft()
        steps = [(b[0] - a[0], b[1] - a[1] + b[2] - a[2]) for a, b in itertools.pairwise(self._history)]
        if len(steps) < _MIN_STEPS:
            return 0.0  # too few readings to tell a rate from a one-off
        steps.remove(max(steps, key=lambda step: step[1]))  # a one-off burst is backlog, not a rate
        span = sum(seconds for seconds, _ in steps)
        if span <= 0:
            return 0.0
        return max(0.0, sum(arrived for _, arrived in steps) / span)


def desired_workers(
    demand: float, backlog_s: float, jobs: int, *, target_utilization: float, drain_s: float, min_workers: int,
    max_workers: int, busy: int = 0,
) -> int:
    """The fleet size the scaling formula asks for (``busy``: the live workers holding work)."""
    wanted = max(math.ceil(demand / target_utilization + backlog_s / drain_s - 1e-9), busy)
    if jobs:
        wanted = max(wanted, 1)
    return max(min_workers, min(max_workers, wanted))


@dataclass(frozen=True)
class Signals:
    """One reading's signals."""

    reading: ClusterReading
    demand: float
    desired: int
    busy: int = 0

    @property
    def without_capacity(self) -> bool:
        return bool(self.reading.jobs) and not self.reading.workers


class ScalingSignals:
    """Reads the cluster and keeps the demand's window: one per exporting process.

    Args:
        settings: the queue, the key prefix and the ``SWAPLESS_SCALE_*`` settings.
        model_ids: the models of the models file.
    """

    def __init__(self, client: redis.Redis, settings: Settings, model_ids: Sequence[str]) -> None:
        self.client = client
        self.settings = settings
        self.keyspace = Keyspace.of(settings)
        self.model_ids = list(model_ids)
        self.tracker = DemandTracker(settings.scaling.scale_window_s)
        self._lock = threading.Lock()  # scrapes may come at once; the demand's window is one

    def read(self, now: float | None = None) -> Signals:
        """Read the cluster now and update the demand's window.

        Raises:
            redis.RedisError: Redis could not be read.
        """
        s = self.settings.scaling
        with self._lock:
            reading = read_cluster(self.client, self.keyspace, self.model_ids, unknown_job_s=s.scale_unknown_job_s,
                                   unknown_load_s=s.scale_unknown_load_s, now=now)
            demand = self.tracker.update(reading)
        busy = busy_workers(reading, s.scale_busy_s, s.scale_unknown_job_s)
        desired = desired_workers(demand, reading.backlog_s, reading.jobs,
                                  target_utilization=s.scale_target_utilization, drain_s=s.scale_drain_s,
                                  min_workers=s.scale_min_workers, max_workers=s.scale_max_workers, busy=busy)
        return Signals(reading, demand, desired, busy)


class ScalingCollector(Collector):
    """The signals as Prometheus gauges, read at scrape time; while Redis cannot be read, only
    ``swapless_signals_up 0`` (and one warning line per failed scrape)."""

    def __init__(self, read: Callable[[], Signals]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("swapless_signals_up", "1 when the last scrape could read Redis.")
        try:
            signals = self.read()
        except redis.RedisError as err:
            logger.warning("autoscaling signals: cannot read Redis (%s); exporting swapless_signals_up 0", err)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        reading = signals.reading
        jobs = GaugeMetricFamily("swapless_queued_jobs", "Jobs waiting in Redis and held by live workers.",
                                 labels=["model"])
        seconds = GaugeMetricFamily(
            "swapless_backlog_seconds", "Device seconds of the jobs waiting and held, plus the model's load where no "
            "live worker has it on its device.", labels=["model"])
        oldest = GaugeMetricFamily("swapless_oldest_job_age_seconds", "Age of the oldest job waiting in Redis.",
                                   labels=["model", "priority"])
        for model in reading.models.values():
            jobs.add_metric([model.model_id], model.jobs)
            seconds.add_metric([model.model_id], model.seconds)
            for level, age in model.oldest_age_s.items():
                oldest.add_metric([model.model_id, priority_name(level)], age)
        without = GaugeMetricFamily("swapless_backlog_without_capacity", "1 while jobs wait and no worker is live.")
        without.add_metric([], 1 if signals.without_capacity else 0)
        live = GaugeMetricFamily("swapless_workers_live", "Live workers of the queue.")
        live.add_metric([], len(reading.workers))
        busy = GaugeMetricFamily("swapless_workers_busy",
                                 "Live workers with SWAPLESS_SCALE_BUSY_S of work of their own (never asked away).")
        busy.add_metric([], signals.busy)
        demand = GaugeMetricFamily("swapless_demand_workers",
                                   "Device seconds of work arriving per second over the window (workers' worth).")
        demand.add_metric([], signals.demand)
        desired = GaugeMetricFamily("swapless_workers_desired", "The fleet size the scaling formula asks for.")
        desired.add_metric([], signals.desired)
        yield from (jobs, seconds, oldest, without, live, busy, demand, desired)


def signals_registry(signals: ScalingSignals) -> CollectorRegistry:
    """A private registry holding only the signals (nothing else registered in the process leaks in)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScalingCollector(signals.read))
    return registry
