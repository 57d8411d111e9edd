"""Where Redis's memory goes (``swapless status``): used and limit, the queue's share, and the stored results,
read in one round trip without scanning the keyspace (the results estimated from ``RANDOMKEY`` draws).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from swapless.config.describe import format_bytes
from swapless.tasks.keyspace import Keyspace

__all__ = ["DEFAULT_KEY_SAMPLE", "RedisMemory", "WriteRefusals", "read_redis_memory"]

#: Random keys drawn to estimate the stored results.
DEFAULT_KEY_SAMPLE = 200
_RESULT_MARK = "celery-task-meta-"


@dataclass(frozen=True)
class RedisMemory:
    """Redis's memory as one reading saw it.

    Attributes:
        max_bytes: ``maxmemory``; 0: none.
        policy: ``maxmemory-policy`` (``noeviction`` refuses writes).
        queue_bytes: every model's and the ingress's lists and records, estimated.
        results, result_bytes: stored results and their memory, estimated from a sample of keys.
    """

    used_bytes: int
    max_bytes: int
    policy: str
    keys: int
    queue_bytes: int
    results: int
    result_bytes: int

    @property
    def used_share(self) -> float | None:
        """``used_bytes`` over ``max_bytes``; None without a limit."""
        return self.used_bytes / self.max_bytes if self.max_bytes else None


def _queue_keys(keyspace: Keyspace, model_ids: Sequence[str]) -> list[str]:
    every = [*(keyspace.model(m) for m in model_ids), keyspace.ingress_lists]
    return [key for lists in every for key in lists.queue_and_records]


def _estimate(keys: int, draws: Sequence[bytes | str | None], result_prefix: str) -> tuple[list[str], float]:
    names = [d.decode() if isinstance(d, bytes) else d for d in draws if d is not None]
    results = [name for name in names if name.startswith(result_prefix)]
    return results, (keys * len(results) / len(names) if names else 0.0)


def read_redis_memory(
    client: redis.Redis, keyspace: Keyspace, model_ids: Sequence[str], sample: int = DEFAULT_KEY_SAMPLE
) -> RedisMemory:
    """One reading of Redis's memory, in two round trips."""
    queue_keys = _queue_keys(keyspace, model_ids)
    pipe = client.pipeline(transaction=False)
    pipe.info("memory")
    pipe.dbsize()
    for key in queue_keys:
        pipe.memory_usage(key)
    for _ in range(sample):
        pipe.randomkey()
    replies = pipe.execute()
    info, keys = replies[0], int(replies[1])
    queue_bytes = sum(int(n or 0) for n in replies[2 : 2 + len(queue_keys)])
    results, estimated = _estimate(keys, replies[2 + len(queue_keys) :], f"{keyspace.prefix}{_RESULT_MARK}")
    mean_bytes = 0.0
    if results:
        pipe = client.pipeline(transaction=False)
        for name in results[:50]:
            pipe.memory_usage(name)
        sizes = [int(n) for n in pipe.execute() if n]
        mean_bytes = sum(sizes) / len(sizes) if sizes else 0.0
    return RedisMemory(
        used_bytes=int(info.get("used_memory", 0)),
        max_bytes=int(info.get("maxmemory", 0)),
        policy=str(info.get("maxmemory_policy", "")),
        keys=keys,
        queue_bytes=queue_bytes,
        results=round(estimated),
        result_bytes=round(estimated * mean_bytes),
    )


class WriteRefusals:
    """Whether Redis refuses writes for lack of memory: a new ``OOM`` error in ``INFO errorstats`` since the last
    check, held for ``hold_s``."""

    def __init__(self, hold_s: float = 10.0) -> None:
        self.hold_s = hold_s
        self._refused: int | None = None
        self._refused_at = -math.inf

    def check(self, client: redis.Redis) -> str | None:
        """``"Redis refusing writes: OOM (...)"`` while it does, else None. Two ``INFO`` calls."""
        memory: dict[str, Any] = client.info("memory")  # type: ignore[assignment]  # a sync client's reply
        errors: dict[str, Any] = client.info("errorstats")  # type: ignore[assignment]
        info = {**memory, **errors}
        used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
        refused = int((info.get("errorstat_OOM") or {}).get("count", 0))
        new, self._refused = (0 if self._refused is None else refused - self._refused), refused
        now = time.monotonic()
        if new > 0:
            self._refused_at = now
        recent = now - self._refused_at < self.hold_s
        if not limit or info.get("maxmemory_policy") != "noeviction" or (used < limit and not recent):
            return None
        lately = (f"; {new} write(s) refused since the last look" if new > 0
                  else f"; writes refused {now - self._refused_at:.0f} s ago" if recent else "")
        return f"Redis refusing writes: OOM ({format_bytes(used)} used of maxmemory {format_bytes(limit)}{lately})"

