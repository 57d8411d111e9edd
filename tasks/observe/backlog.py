"""The cluster's backlog per model for autoscaling: read from Redis into plain data (``read_records``), then
estimated in device seconds by pure functions (``estimate``)."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from swapless.tasks.cluster.members import Heartbeat, read_heartbeats
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.waiting import ModelWaiting, QueueWaiting, count_waiting, waiting_commands

#: Per model, per device kind, what workers learned of it there.
Learned = dict[str, dict[str, dict[str, Any]]]

__all__ = [
    "DEFAULT_SAMPLE",
    "ClusterReading",
    "ClusterRecords",
    "ModelBacklog",
    "estimate",
    "job_seconds",
    "read_cluster",
    "read_records",
]

#: Messages read per list (from its oldest end) to count jobs and find the oldest job.
DEFAULT_SAMPLE = 100


def job_seconds(costs: Mapping[int, float], jobs: int) -> float | None:
    """Device seconds per job for a backlog of ``jobs``: at the largest measured batch size it fills (else the
    smallest); None when nothing is measured."""
    if not costs:
        return None
    sizes = sorted(costs)
    filled = [size for size in sizes if size <= jobs]
    return costs[filled[-1] if filled else sizes[0]]


@dataclass(frozen=True)
class ModelBacklog:
    """One model's work in the cluster now.

    Attributes:
        job_s: device seconds per job, or the unknown default.
        load_s: seconds before its first group runs (0 when on a live worker's device).
        measured: ``job_s`` and ``load_s`` come from measurements.
        oldest_age_s: per priority level, the oldest waiting job's age.
    """

    model_id: str
    waiting_jobs: int
    held: int
    job_s: float
    load_s: float
    measured: bool
    oldest_age_s: dict[int, float] = field(default_factory=dict)

    @property
    def jobs(self) -> int:
        return self.waiting_jobs + self.held

    @property
    def seconds(self) -> float:
        """Device seconds: its jobs, plus the load when it has any."""
        return self.jobs * self.job_s + (self.load_s if self.jobs else 0.0)


@dataclass(frozen=True)
class ClusterReading:
    """The cluster's work at one reading: each model with work or a record, and the live workers."""

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
        """Per live worker: its start time and the device seconds it spent since."""
        return {
            beat.worker_id or beat.hostname: (
                beat.started_at,
                sum(a.run_s_total + a.load_s_total + a.swap_s_total for a in beat.models.values()),
            )
            for beat in self.workers
        }


@dataclass(frozen=True)
class ClusterRecords:
    """What one read of Redis found, as plain data."""

    now: float
    waiting: QueueWaiting
    workers: list[Heartbeat]
    learned: Learned


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_learned(client: redis.Redis, keyspace: Keyspace, kinds: Sequence[str]) -> Learned:
    """Per model, per device kind of ``kinds``, the learned record (unreadable ones left out)."""
    records: Learned = {}
    if not kinds:
        return records
    pipe = client.pipeline(transaction=False)
    for kind in kinds:
        pipe.hgetall(keyspace.learned(kind))
    for kind, stored in zip(kinds, pipe.execute(), strict=True):
        for raw_model, raw in stored.items():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            records.setdefault(_text(raw_model), {})[kind] = record
    return records


def read_records(
    client: redis.Redis, keyspace: Keyspace, model_ids: Sequence[str], *, sample: int = DEFAULT_SAMPLE,
    now: float | None = None,
) -> ClusterRecords:
    """Read the cluster in three round trips: the waiting work, the heartbeats, what was learned.

    Raises:
        redis.RedisError: Redis could not be read.
    """
    pipe = client.pipeline(transaction=False)
    waiting_commands(pipe, keyspace, model_ids, sample)
    pipe.smembers(keyspace.learned_devices)
    *replies, stored_kinds = pipe.execute()
    workers = [beat for beat in read_heartbeats(client, keyspace) if beat.queue == keyspace.queue]
    now = time.time() if now is None else now
    kinds = {_text(k) for k in stored_kinds}
    live_kinds = {beat.device for beat in workers if beat.device}
    use = sorted(live_kinds & kinds if live_kinds & kinds else kinds)
    return ClusterRecords(now, count_waiting(model_ids, replies, sample), workers,
                          _read_learned(client, keyspace, use))


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


@dataclass
class _Fleet:
    """What the live workers' heartbeats say, summed per model."""

    held: collections.Counter[str] = field(default_factory=collections.Counter)
    ran: dict[str, tuple[float, int]] = field(default_factory=dict)
    on_device: set[str] = field(default_factory=set)
    in_host: set[str] = field(default_factory=set)


def _fleet(workers: Sequence[Heartbeat]) -> _Fleet:
    fleet = _Fleet()
    for beat in workers:
        for model_id, activity in beat.models.items():
            fleet.held[model_id] += activity.backlog
            run_s, done = fleet.ran.get(model_id, (0.0, 0))
            fleet.ran[model_id] = (run_s + activity.run_s_total, done + activity.jobs_done)
        fleet.on_device.update(e.model_id for e in beat.loaded)
        fleet.in_host.update(e.model_id for e in beat.host)
    return fleet


def _first_cost(model_id: str, fleet: _Fleet, load_s: float | None, host_s: float | None) -> float | None:
    """What the model's first group costs before it runs; None when unknown."""
    if model_id in fleet.on_device:
        return 0.0
    if model_id in fleet.in_host and host_s is not None:
        return host_s
    return load_s


def _model_backlog(
    model_id: str, waiting: ModelWaiting, fleet: _Fleet, learned: Mapping[str, Mapping[str, Any]], now: float,
    unknown_job_s: float, unknown_load_s: float,
) -> ModelBacklog:
    costs, load_s, host_s = _learned_costs(learned)
    per_job = job_seconds(costs, waiting.waiting_jobs + fleet.held[model_id])
    run_s, done = fleet.ran.get(model_id, (0.0, 0))
    if per_job is None and done:
        per_job = run_s / done  # what the live workers measured
    first = _first_cost(model_id, fleet, load_s, host_s)
    return ModelBacklog(
        model_id=model_id, waiting_jobs=waiting.waiting_jobs, held=fleet.held[model_id],
        job_s=per_job if per_job is not None else unknown_job_s,
        load_s=first if first is not None else unknown_load_s, measured=per_job is not None and first is not None,
        oldest_age_s={level: max(0.0, now - sent) for level, sent in waiting.oldest_sent_at.items()},
    )


def estimate(
    records: ClusterRecords, model_ids: Sequence[str], *, unknown_job_s: float, unknown_load_s: float
) -> ClusterReading:
    """The cluster's work in device seconds per model of ``model_ids``, from what was read."""
    fleet = _fleet(records.workers)
    found = records.waiting.by_model
    models = {
        model_id: _model_backlog(model_id, found.get(model_id, ModelWaiting(model_id, 0, 0)), fleet,
                                 records.learned.get(model_id, {}), records.now, unknown_job_s, unknown_load_s)
        for model_id in sorted((set(found) | set(fleet.held)) & set(model_ids))
    }
    return ClusterReading(now=records.now, models=models, workers=records.workers,
                          estimated=records.waiting.jobs_estimated)


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
    """The cluster's work now: ``read_records``, then ``estimate``."""
    return estimate(read_records(client, keyspace, model_ids, sample=sample, now=now), model_ids,
                    unknown_job_s=unknown_job_s, unknown_load_s=unknown_load_s)
