"""The cluster-wide autoscaling signals: how many seconds of device work wait per model, how old the oldest job
is, whether work waits with no worker to do it, and how many workers the fleet should have.

Read from what Redis holds (every model's lists and the ingress, the live workers' heartbeats, what workers
learned of each model on their kind of device: ``swapless.tasks.worker.learned``), never from one worker's view, so an
autoscaler sees the whole queue under placement routing (jobs wait in per-model lists, which a Redis list-length
scaler never sees) and the jobs workers hold. Exported by ``swapless serve``'s ``GET /metrics`` and by
``swapless exporter``:

    swapless_queued_jobs{model}                      gauge  jobs waiting in Redis and held by live workers
    swapless_backlog_seconds{model}                  gauge  those jobs' device seconds, plus the model's load
                                                            where no live worker has it on its device
    swapless_oldest_job_age_seconds{model,priority}  gauge  age of the oldest job waiting in Redis
    swapless_backlog_without_capacity                gauge  1 while jobs wait and no worker is live (scale from 0)
    swapless_workers_live                            gauge  live workers of the queue
    swapless_workers_busy                            gauge  live workers with SWAPLESS_SCALE_BUSY_S of work of their own
    swapless_demand_workers                          gauge  device seconds of work arriving per second, over the
                                                            last SWAPLESS_SCALE_WINDOW_S (workers' worth)
    swapless_workers_desired                         gauge  the fleet size the formula below asks for
    swapless_signals_up                              gauge  0 while Redis cannot be read (then nothing else)

The formula (``desired_workers``)::

    desired = ceil(demand / SWAPLESS_SCALE_TARGET_UTILIZATION + backlog_seconds / SWAPLESS_SCALE_DRAIN_S)

and never below ``busy``, the live workers with at least ``SWAPLESS_SCALE_BUSY_S`` of work of their own (the jobs
they fetched, and their share of the jobs waiting for the models they claim, in device seconds), kept between
``SWAPLESS_SCALE_MIN_WORKERS`` and ``SWAPLESS_SCALE_MAX_WORKERS``, and at least 1 while any job waits. Removing a
busy worker saves nothing: its work moves to the others, with the loads of its models on top, and they finish
later; the fleet shrinks as workers run out of work.

``demand`` is the work arriving, not the work done: the device seconds the fleet spent over the window
(loads included) plus what the backlog grew by, without the window's largest step (a burst is backlog). A fleet
draining a backlog is busy, yet that work arrived earlier: counting busy time alone would ask for more workers the
more there are. Loads that recur count: a fleet too small for the models in use reloads them.

A job's device seconds are its model's measured seconds per input at the largest batch size the backlog fills
(``job_seconds``), from what workers learned on the device kind of the live workers (with none live, the most
expensive kind measured); a model never measured there counts ``SWAPLESS_SCALE_UNKNOWN_JOB_S`` per job and
``SWAPLESS_SCALE_UNKNOWN_LOAD_S`` per load. Counts of chunk messages (bulk jobs) are their items. Each list is read
up to ``sample`` messages from its oldest end; a longer list's job count is scaled up from that sample.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from swapless.config.settings import Settings
from swapless.tasks.cluster.members import Heartbeat, read_heartbeats
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import CHUNK_TASK, PRIORITIES, PRIORITY_STEPS, SENT_AT_HEADER, message_args

__all__ = [
    "DEFAULT_SAMPLE",
    "SIGNALS",
    "ClusterReading",
    "DemandTracker",
    "ModelBacklog",
    "RemovalCost",
    "ScalingCollector",
    "ScalingSignals",
    "Signals",
    "busy_workers",
    "desired_workers",
    "job_seconds",
    "read_cluster",
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
#: Messages read per list (from its oldest end) to count items and find the oldest job.
DEFAULT_SAMPLE = 100

_LEVEL_NAMES = {level: name for name, level in PRIORITIES.items()}


def priority_name(level: int) -> str:
    """``interactive``, ``bulk``, or the level's number for the others."""
    return _LEVEL_NAMES.get(level, str(level))


def job_seconds(costs: Mapping[int, float], jobs: int) -> float | None:
    """Device seconds per job for a backlog of ``jobs``: the measured seconds per input at the largest measured
    batch size the backlog fills (the smallest measured size when it fills none); None when nothing is measured."""
    if not costs:
        return None
    sizes = sorted(costs)
    filled = [size for size in sizes if size <= jobs]
    return costs[filled[-1] if filled else sizes[0]]


@dataclass(frozen=True)
class ModelBacklog:
    """One model's work in the cluster now.

    Attributes:
        model_id: the model.
        waiting: jobs waiting in Redis (its lists and its share of the ingress); chunk messages count their items.
        held: jobs live workers hold, waiting for their group.
        job_s: device seconds per job (``job_seconds``), or the unknown default.
        load_s: what the model's first group costs before it runs: 0 when a live worker has it on its device, its
            swap-in from a worker's host tier, else its load from disk.
        measured: ``job_s`` and ``load_s`` come from measurements.
        oldest_age_s: per priority level, the age of the oldest job waiting in Redis whose send time is known.
    """

    model_id: str
    waiting: int
    held: int
    job_s: float
    load_s: float
    measured: bool
    oldest_age_s: dict[int, float] = field(default_factory=dict)

    @property
    def jobs(self) -> int:
        return self.waiting + self.held

    @property
    def seconds(self) -> float:
        """The backlog's device seconds: its jobs, plus the load where it has any job."""
        return self.jobs * self.job_s + (self.load_s if self.jobs else 0.0)


@dataclass(frozen=True)
class ClusterReading:
    """What one read of Redis found.

    Attributes:
        now: when (epoch seconds).
        models: each model with work or a record, by model id.
        workers: the live workers' heartbeats (of this queue).
        estimated: some list held more than the sample, so its counts are scaled up.
    """

    now: float
    models: dict[str, ModelBacklog]
    workers: list[Heartbeat]
    estimated: bool = False

    @property
    def backlog_s(self) -> float:
        return sum(m.seconds for m in self.models.values())

    @property
    def jobs(self) -> int:
        return sum(m.jobs for m in self.models.values())

    def busy_s(self) -> dict[str, tuple[float, float]]:
        """Per live worker: its start time and the device seconds it spent since (groups, loads, swap-ins)."""
        return {
            beat.worker_id or beat.hostname: (
                beat.started_at,
                sum(a.run_s_total + a.load_s_total + a.swap_s_total for a in beat.models.values()),
            )
            for beat in self.workers
        }


def _items(raw: bytes | str) -> tuple[int, float | None, str | None]:
    """A queued message's model, its number of jobs (a chunk's items) and its send time; (1, None, None) when
    unreadable."""
    try:
        message = json.loads(raw)
        headers = message.get("headers") or {}
        args = message_args(message)
    except (ValueError, AttributeError):
        return 1, None, None
    if args is None or not isinstance(headers, dict):
        return 1, None, None
    model_id = args[0] if isinstance(args[0], str) else None
    chunk = headers.get("task") == CHUNK_TASK and isinstance(args[1], list)
    sent_at = headers.get(SENT_AT_HEADER)
    return max(len(args[1]), 1) if chunk else 1, float(sent_at) if isinstance(sent_at, (int, float)) else None, model_id


@dataclass
class _Count:
    jobs: float = 0.0
    oldest: dict[int, float] = field(default_factory=dict)


def _count_list(length: int, messages: Sequence[bytes | str], level: int, found: dict[str, _Count],
                fixed_model: str | None) -> bool:
    """Add one list's jobs (scaled up from its sample) to ``found``; True when it was scaled."""
    if not length or not messages:
        return False
    scale = length / len(messages)
    for raw in messages:
        count, sent_at, model_id = _items(raw)
        model_id = fixed_model or model_id
        if model_id is None:
            continue
        entry = found.setdefault(model_id, _Count())
        entry.jobs += count * scale
        if sent_at is not None:
            entry.oldest[level] = min(entry.oldest.get(level, sent_at), sent_at)
    return length > len(messages)


def _learned_costs(records: Mapping[str, Mapping[str, Any]]) -> tuple[dict[int, float], float | None, float | None]:
    costs: dict[int, float] = {}
    load_s = host_s = None
    for record in records.values():  # the most expensive device kind of those given
        for size, seconds in (record.get("batch_costs_s") or {}).items():
            costs[int(size)] = max(costs.get(int(size), 0.0), float(seconds))
        if isinstance(record.get("load_s"), (int, float)):
            load_s = max(load_s or 0.0, float(record["load_s"]))
        if isinstance(record.get("host_load_s"), (int, float)):
            host_s = max(host_s or 0.0, float(record["host_load_s"]))
    return costs, load_s, host_s


def read_cluster(
    client: redis.Redis,
    keyspace: Keyspace,
    model_ids: Sequence[str],
    *,
    unknown_job_s: float,
    unknown_load_s: float,
    sample: int = DEFAULT_SAMPLE,
    now: float | None = None,
) -> ClusterReading:
    """The cluster's work now (three round trips: the lists and the index, the heartbeats, what was learned)."""
    pipe = client.pipeline(transaction=False)
    for model_id in model_ids:
        for key in keyspace.model(model_id).lists:
            pipe.llen(key)
            pipe.lrange(key, -sample, -1)  # the oldest: pushed left, popped right
    for key in keyspace.ingress_lists.lists:
        pipe.llen(key)
        pipe.lrange(key, -sample, -1)
    pipe.smembers(keyspace.learned_devices)
    replies = pipe.execute()
    workers = [beat for beat in read_heartbeats(client, keyspace) if beat.queue == keyspace.queue]
    now = time.time() if now is None else now

    found: dict[str, _Count] = {}
    estimated = False
    at = 0
    for model_id in model_ids:
        for level in PRIORITY_STEPS:
            estimated |= _count_list(int(replies[at]), replies[at + 1], level, found, model_id)
            at += 2
    for level in PRIORITY_STEPS:
        estimated |= _count_list(int(replies[at]), replies[at + 1], level, found, None)
        at += 2
    kinds = {k.decode() if isinstance(k, bytes) else str(k) for k in replies[at]}
    live_kinds = {beat.device for beat in workers if beat.device}
    use = sorted(live_kinds & kinds if live_kinds & kinds else kinds)
    records: dict[str, dict[str, dict[str, Any]]] = {}  # model -> device kind -> record
    if use:
        pipe = client.pipeline(transaction=False)
        for kind in use:
            pipe.hgetall(keyspace.learned(kind))
        for kind, stored in zip(use, pipe.execute(), strict=True):
            for raw_model, raw in stored.items():
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                name = raw_model.decode() if isinstance(raw_model, bytes) else str(raw_model)
                records.setdefault(name, {})[kind] = record

    held: collections.Counter[str] = collections.Counter()
    on_device: set[str] = set()
    in_host: set[str] = set()
    ran: dict[str, tuple[float, int]] = {}
    for beat in workers:
        for model_id, activity in beat.models.items():
            held[model_id] += activity.backlog
            run_s, done = ran.get(model_id, (0.0, 0))
            ran[model_id] = (run_s + activity.run_s_total, done + activity.jobs_done)
        on_device.update(e.model_id for e in beat.loaded)
        in_host.update(e.model_id for e in beat.host)

    known = set(model_ids)
    models: dict[str, ModelBacklog] = {}
    for model_id in sorted((set(found) | set(held)) & known):
        count = found.get(model_id, _Count())
        jobs = round(count.jobs) + held[model_id]
        costs, load_s, host_s = _learned_costs(records.get(model_id, {}))
        per_job = job_seconds(costs, jobs)
        run_s, done = ran.get(model_id, (0.0, 0))
        if per_job is None and done:
            per_job = run_s / done  # what the live workers measured
        measured = per_job is not None
        if model_id in on_device:
            first = 0.0
        elif model_id in in_host and host_s is not None:
            first = host_s
        elif load_s is not None:
            first = load_s
        else:
            first, measured = unknown_load_s, False
        models[model_id] = ModelBacklog(
            model_id=model_id, waiting=round(count.jobs), held=held[model_id],
            job_s=per_job if per_job is not None else unknown_job_s, load_s=first, measured=measured,
            oldest_age_s={level: max(0.0, now - sent) for level, sent in sorted(count.oldest.items())},
        )
    return ClusterReading(now=now, models=models, workers=workers, estimated=estimated)


@dataclass(frozen=True)
class RemovalCost:
    """What removing one worker costs the fleet: the models only it has on its device (another worker loads them
    again when their next job comes) and their load seconds, those of them serving interactive traffic (resident:
    their next callers would wait for that load) and their load seconds, and the jobs it holds (handed back on a
    drain).
    """

    models: tuple[str, ...]
    load_s: float
    held: int
    interactive: tuple[str, ...] = ()
    interactive_load_s: float = 0.0

    @property
    def rank(self) -> tuple[float, bool, float]:
        """Sorts workers cheapest to remove first: the fewest load seconds of interactive models only it holds
        (callers would wait for them), then one holding no jobs (a busy worker's work would move, and its models
        load again elsewhere), then the fewest load seconds of the models only it holds."""
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
    share of the jobs waiting in Redis for the models they claim (a worker holds a few seconds of a model's jobs at
    a time; the rest of its work waits in the model's lists)."""
    claimers = collections.Counter(m for beat in reading.workers for m, a in beat.models.items() if a.claimed)

    def own_s(beat: Heartbeat) -> float:
        total = 0.0
        for model_id, activity in beat.models.items():
            model = reading.models.get(model_id)
            job_s = model.job_s if model is not None else unknown_job_s
            total += activity.backlog * job_s
            if activity.claimed and model is not None:
                total += model.waiting * job_s / claimers[model_id]
        return total

    return sum(1 for beat in reading.workers if own_s(beat) >= busy_s)


class DemandTracker:
    """The work arriving, in device seconds per second, over a sliding window of readings: the device seconds the
    live workers spent since the window's start (groups, loads, swap-ins) plus what the backlog grew by, over the
    window's length, leaving out the window's largest step between two readings: a burst of bulk work arrives in
    one step and is counted in the backlog already (counting it as a rate too would ask for its workers twice), and
    so does a one-off load. Loads that recur (a fleet too small for the models in use reloads them) are a rate:
    more workers would spare them. 0 until the window holds three steps.

    A worker first seen after the tracker's first reading counts all it did since it started; one that vanishes
    keeps what it counted (its last seconds before it died are not seen).
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._last: dict[str, float] = {}
        self._done = 0.0
        self._first_at: float | None = None
        self._history: collections.deque[tuple[float, float, float]] = collections.deque()

    def update(self, reading: ClusterReading) -> float:
        """Record ``reading``; the demand over the window now (0 until two readings are apart)."""
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
    """The fleet size the module's formula asks for (``busy``: the live workers holding work)."""
    wanted = max(math.ceil(demand / target_utilization + backlog_s / drain_s - 1e-9), busy)
    if jobs:
        wanted = max(wanted, 1)
    return max(min_workers, min(max_workers, wanted))


@dataclass(frozen=True)
class Signals:
    """One reading's signals (the module docstring lists them)."""

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
        client: the deployment's Redis.
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
