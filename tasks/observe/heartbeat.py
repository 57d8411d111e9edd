"""Worker heartbeats: what each live worker has loaded and has done, published to Redis and read back.

Every worker publishes a ``Heartbeat`` (what its cache holds, its counters, its queue wait) as JSON under
``{key_prefix}swapless:worker:{worker_id}`` (``hostname:pid``) every ``SWAPLESS_HEARTBEAT_INTERVAL_S`` seconds, from a daemon thread
(``HeartbeatPublisher.start``; ``tasks.worker.reporting`` starts it on ``worker_init``). The key expires
after three intervals, so a worker that dies vanishes by itself; one that stops cleanly deletes it. A sorted set,
``{key_prefix}swapless:workers``, lists the worker ids, so readers never SCAN the database (which holds every result).

Readers come in pairs, one for ``redis.Redis`` and one for ``redis.asyncio`` (the gateway), around one parser.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio as aredis
from pydantic import BaseModel, ConfigDict, ValidationError

from manager import ModelManager
from tasks.broker.connection import RedisHealth
from tasks.observe.accounting import GroupReport

__all__ = [
    "CacheInfo",
    "Heartbeat",
    "HeartbeatPublisher",
    "LoadedEntry",
    "ModelActivity",
    "WaitSummary",
    "WorkerStats",
    "aread_heartbeats",
    "build_heartbeat",
    "parse_heartbeats",
    "read_heartbeats",
    "worker_key",
    "workers_index_key",
]

logger = logging.getLogger(__name__)

#: A heartbeat key lives this many intervals: one or two missed beats do not hide a live worker.
TTL_INTERVALS = 3
#: Hostnames without a heartbeat for this long are dropped from the index (seconds).
INDEX_FORGET_S = 3600.0


def worker_key(key_prefix: str | None, worker_id: str) -> str:
    """The Redis key of one worker's heartbeat."""
    return f"{key_prefix or ''}swapless:worker:{worker_id}"


def workers_index_key(key_prefix: str | None) -> str:
    """The sorted set of worker ids (score: time of the last heartbeat)."""
    return f"{key_prefix or ''}swapless:workers"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class LoadedEntry(_Model):
    """A model in a worker's cache now."""

    model_id: str
    bytes: int
    load_s: float
    hits: int
    remote: bool
    busy: bool
    loaded_at: float


class ModelActivity(_Model):
    """What one worker did with one model since it started."""

    groups: int = 0
    jobs_done: int = 0
    jobs_failed: int = 0
    #: jobs answered JobExpired without running (counted in ``jobs_failed`` too: their result is a failure)
    jobs_expired: int = 0
    #: jobs found cancelled before they ran (acked, never run)
    jobs_cancelled: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    loads: int = 0
    load_failures: int = 0
    load_s_total: float = 0.0
    load_s_last: float | None = None
    backlog: int = 0
    #: seconds its groups took in all, model loads excluded
    run_s_total: float = 0.0
    #: when its last group ran (epoch seconds)
    last_run_at: float | None = None
    #: this worker holds a claim on it: it fetches its jobs (placement)
    claimed: bool = False


class WaitSummary(_Model):
    """Queue wait of the last ``window`` jobs (seconds from send to the start of their group)."""

    count: int = 0
    window: int = 0
    mean_s: float = 0.0
    p50_s: float = 0.0
    p95_s: float = 0.0
    max_s: float = 0.0


class CacheInfo(_Model):
    """The cache's limits and counters."""

    max_models: int
    memory_budget_bytes: int | None
    used_bytes: int
    hits: int
    misses: int
    loads: int
    evictions: int
    load_failures: int


class Heartbeat(_Model):
    """One worker's status, as published to Redis."""

    hostname: str
    pid: int
    #: the machine's own name (``socket.gethostname()``); ``hostname`` is the Celery node name
    machine: str = ""
    #: ``hostname:pid``: unique per process, so workers that share a hostname stay apart
    worker_id: str = ""
    queue: str
    started_at: float
    sent_at: float
    interval_s: float
    cache: CacheInfo
    loaded: list[LoadedEntry]
    models: dict[str, ModelActivity]
    jobs_done: int
    jobs_failed: int
    backlog: int
    queue_wait: WaitSummary
    #: What is wrong with Redis as this worker sees it (``Redis refusing writes: OOM``), while it lasts.
    redis_problem: str | None = None
    #: ``placement`` or ``shared`` (``SWAPLESS_ROUTING``)
    routing: str = "shared"

    def age_s(self, now: float | None = None) -> float:
        """Seconds since this heartbeat was sent."""
        return max(0.0, (time.time() if now is None else now) - self.sent_at)


class WorkerStats:
    """Per-model activity and recent queue waits, fed with ``GroupReport``s (a ``GroupAccounting`` listener).

    Args:
        window: queue waits kept for the summary (the most recent jobs).
    """

    def __init__(self, window: int = 1000) -> None:
        self.window = window
        self._lock = threading.Lock()
        self._models: dict[str, ModelActivity] = {}
        self._waits: deque[float] = deque(maxlen=window)
        self._wait_count = 0

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
            model.run_s_total += max(0.0, report.run_s - sum(report.load_s))
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


def build_heartbeat(
    *,
    hostname: str,
    worker_id: str,
    queue: str,
    started_at: float,
    interval_s: float,
    manager: ModelManager,
    stats: WorkerStats,
    backlog: dict[str, int],
    jobs_done: int,
    jobs_failed: int,
    redis_problem: str | None = None,
    routing: str = "shared",
    claimed: Sequence[str] = (),
) -> Heartbeat:
    """The heartbeat of a worker now.

    Args:
        hostname: the worker's node name.
        queue: the queue it consumes.
        started_at: when it started (epoch seconds).
        interval_s: seconds between its heartbeats.
        manager: its model cache (read, never changed).
        stats: its per-model activity.
        backlog: jobs it holds per model, waiting for their group.
        jobs_done: jobs answered with a result since it started.
        jobs_failed: jobs answered with an error since it started.
        redis_problem: what is wrong with Redis now, as the worker sees it (None: nothing).
        routing: how it takes jobs (``SWAPLESS_ROUTING``).
        claimed: the models it holds a claim on (placement).
    """
    cache = manager.stats
    models = stats.models()
    for model_id, waiting in backlog.items():
        models.setdefault(model_id, ModelActivity()).backlog = waiting
    for model_id in claimed:
        models.setdefault(model_id, ModelActivity()).claimed = True
    return Heartbeat(
        hostname=hostname,
        machine=socket.gethostname(),
        worker_id=worker_id,
        pid=os.getpid(),
        queue=queue,
        started_at=started_at,
        sent_at=time.time(),
        interval_s=interval_s,
        cache=CacheInfo(
            max_models=manager.max_models,
            memory_budget_bytes=manager.memory_budget_bytes,
            used_bytes=manager.used_bytes(),
            hits=cache.hits,
            misses=cache.misses,
            loads=cache.loads,
            evictions=cache.evictions,
            load_failures=cache.load_failures,
        ),
        loaded=[
            LoadedEntry(
                model_id=e.model_id, bytes=e.size_bytes, load_s=e.load_s, hits=e.hits, remote=e.remote,
                busy=e.pins > 0, loaded_at=e.loaded_at,
            )
            for e in manager.snapshot()
        ],
        models=models,
        jobs_done=jobs_done,
        jobs_failed=jobs_failed,
        backlog=sum(backlog.values()),
        queue_wait=stats.queue_wait(),
        redis_problem=redis_problem,
        routing=routing,
    )


# KEYS: the heartbeat, the index. ARGV: payload, TTL (ms), hostname, now, forget-before. DEL first: the new
# heartbeat replaces the old one (a write that takes no memory goes first; see HeartbeatPublisher.beat).
_BEAT = """
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
return 1
"""


class HeartbeatPublisher:
    """Publishes a heartbeat every ``interval_s`` from a daemon thread (started by ``start``, not the constructor).

    Args:
        client: the Redis to publish to.
        key_prefix: the deployment's key prefix.
        worker_id: the worker's id (``hostname:pid``).
        build: makes the heartbeat to publish.
        interval_s: seconds between heartbeats; the key expires after ``TTL_INTERVALS`` of them.
        health: told about each failed and each successful beat.
    """

    def __init__(
        self,
        client: redis.Redis,
        key_prefix: str | None,
        worker_id: str,
        build: Callable[[], Heartbeat],
        interval_s: float,
        health: RedisHealth | None = None,
    ) -> None:
        self.client = client
        self.key = worker_key(key_prefix, worker_id)
        self.index = workers_index_key(key_prefix)
        self.worker_id = worker_id
        self.build = build
        self.interval_s = interval_s
        self.health = health
        self.ttl_ms = max(1000, int(interval_s * TTL_INTERVALS * 1000))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def beat(self) -> None:
        """Publish one heartbeat now (one script: it replaces the last one, so it goes through even while Redis
        is over ``maxmemory``, when the heartbeat has most to say; ``tasks.broker.connection.WRITE_FIRST_NOTE``)."""
        payload = self.build().model_dump_json()
        now = time.time()
        self.client.eval(_BEAT, 2, self.key, self.index, payload, self.ttl_ms, self.worker_id, now, now - INDEX_FORGET_S)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="swapless-heartbeat", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.beat()
                if self.health is not None:
                    self.health.ok()
                if self._failing:
                    logger.info("heartbeat published again")
                self._failing = False
            except Exception as err:  # noqa: BLE001 - keep beating through a Redis outage
                if self.health is not None:
                    self.health.failed(err, "publishing the heartbeat")
                if not self._failing:
                    logger.warning("could not publish the heartbeat (%s); retrying every %.1f s", err, self.interval_s)
                self._failing = True
            if self._stop.wait(self.interval_s):
                return

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop beating and delete the heartbeat, so the worker leaves the status at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(self.key)
            pipe.zrem(self.index, self.worker_id)
            pipe.execute()
        except redis.RedisError as err:
            logger.warning("could not delete the heartbeat %s (%s); it expires by itself", self.key, err)


def parse_heartbeats(values: Sequence[bytes | str | None]) -> list[Heartbeat]:
    """Heartbeats from raw key values, skipping expired (None) and unreadable ones; sorted by hostname."""
    found = []
    for raw in values:
        if raw is None:
            continue
        try:
            found.append(Heartbeat.model_validate_json(raw))
        except ValidationError as err:
            logger.warning("ignoring an unreadable heartbeat: %s", err.errors()[0]["msg"])
    return sorted(found, key=lambda beat: beat.hostname)


def _names(raw: Any) -> list[str]:
    return [h.decode() if isinstance(h, bytes) else str(h) for h in raw]


def read_heartbeats(client: redis.Redis, key_prefix: str | None) -> list[Heartbeat]:
    """The live workers' heartbeats (two round trips)."""
    hostnames = _names(client.zrange(workers_index_key(key_prefix), 0, -1))
    if not hostnames:
        return []
    return parse_heartbeats(client.mget([worker_key(key_prefix, h) for h in hostnames]))


async def aread_heartbeats(client: aredis.Redis, key_prefix: str | None) -> list[Heartbeat]:
    """``read_heartbeats`` for asyncio code."""
    hostnames = _names(await client.zrange(workers_index_key(key_prefix), 0, -1))
    if not hostnames:
        return []
    return parse_heartbeats(await client.mget([worker_key(key_prefix, h) for h in hostnames]))
