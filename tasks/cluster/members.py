"""The cluster's members: each worker's ``Heartbeat`` as published to Redis and read back (a reader for
``redis.Redis`` and one for ``redis.asyncio``). A heartbeat expires after ``TTL_INTERVALS`` intervals;
``Keyspace.heartbeats`` lists the worker ids, so readers never scan the database.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aredis
from pydantic import BaseModel, ConfigDict, ValidationError

from swapless.tasks.keyspace import Keyspace

__all__ = [
    "INDEX_FORGET_S",
    "TTL_INTERVALS",
    "CacheInfo",
    "Heartbeat",
    "LoadedEntry",
    "ModelActivity",
    "WaitSummary",
    "aread_heartbeats",
    "parse_heartbeats",
    "read_heartbeats",
]

logger = logging.getLogger(__name__)

#: A heartbeat key lives this many intervals: one or two missed beats do not hide a live worker.
TTL_INTERVALS = 3
#: Hostnames without a heartbeat for this long are dropped from the index (seconds).
INDEX_FORGET_S = 3600.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class LoadedEntry(_Model):
    """A model in a worker's cache now, on the device or in its host tier (``load_s``: its last arrival on the
    device)."""

    model_id: str
    bytes: int
    load_s: float
    hits: int
    remote: bool
    busy: bool
    loaded_at: float
    #: ``device`` or ``host`` (``swapless.manager.cache.entries.Tier``)
    tier: str = "device"
    #: Resident: it served interactive jobs lately (``SWAPLESS_KEEP_INTERACTIVE_S``) or its spec keeps it loaded
    #: (``keep_loaded``); either way its next callers would wait for its load.
    interactive: bool = False


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
    #: swap-ins from the host tier (copies back to the device, not counted in ``loads``) and their seconds
    swap_ins: int = 0
    swap_s_total: float = 0.0
    backlog: int = 0
    #: seconds its groups took in all, model loads and swap-ins excluded
    run_s_total: float = 0.0
    #: when its last group ran (epoch seconds)
    last_run_at: float | None = None
    #: this worker holds a claim on it: it fetches its jobs (placement)
    claimed: bool = False


class WaitSummary(_Model):
    """Queue wait of the last ``window`` jobs, from send to the start of their group."""

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
    #: the host tier (0 and 0: none), what it holds, and its moves: swap-ins, moves there, drops to disk
    host_max_models: int = 0
    host_budget_bytes: int = 0
    host_used_bytes: int = 0
    swap_ins: int = 0
    swap_outs: int = 0
    host_evictions: int = 0


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
    #: the models in its host tier, least recently stored first
    host: list[LoadedEntry] = []
    models: dict[str, ModelActivity]
    jobs_done: int
    jobs_failed: int
    backlog: int
    queue_wait: WaitSummary
    #: What is wrong with Redis as this worker sees it (``Redis refusing writes: OOM``), while it lasts.
    redis_problem: str | None = None
    #: ``placement`` or ``shared`` (``SWAPLESS_ROUTING``)
    routing: str = "shared"
    #: the kind of device it computes on (``swapless.tasks.worker.learned.device_label``): whose learned costs apply
    #: to it
    device: str = ""

    def age_s(self, now: float | None = None) -> float:
        """Seconds since this heartbeat was sent."""
        return max(0.0, (time.time() if now is None else now) - self.sent_at)


def parse_heartbeats(values: Sequence[bytes | str | None]) -> list[Heartbeat]:
    """Heartbeats from raw key values (expired and unreadable ones skipped), sorted by hostname."""
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


def read_heartbeats(client: redis.Redis, keyspace: Keyspace) -> list[Heartbeat]:
    """The live workers' heartbeats (two round trips)."""
    hostnames = _names(client.zrange(keyspace.heartbeats, 0, -1))
    if not hostnames:
        return []
    values: list[bytes | None] = client.mget([keyspace.heartbeat(h) for h in hostnames])  # type: ignore[assignment]
    return parse_heartbeats(values)


async def aread_heartbeats(client: aredis.Redis, keyspace: Keyspace) -> list[Heartbeat]:
    """``read_heartbeats`` for asyncio code."""
    hostnames = _names(await client.zrange(keyspace.heartbeats, 0, -1))  # type: ignore[misc]
    if not hostnames:
        return []
    return parse_heartbeats(await client.mget([keyspace.heartbeat(h) for h in hostnames]))
