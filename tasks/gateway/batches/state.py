"""A batch's state and its driver's lease, kept in Redis so every gateway process and runner agrees (``BatchStore``)."""

from __future__ import annotations

import json
import secrets
import time
from enum import Enum
from typing import Any

import redis

from swapless.tasks.keyspace import Keyspace

__all__ = ["FINAL", "BatchStatus", "BatchStore", "new_batch_id", "public_batch"]


class BatchStatus(str, Enum):  # noqa: UP042 - stored as the plain string
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


#: Statuses a batch never leaves.
FINAL = frozenset({BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})

# KEYS: the batch's hash, the active set. ARGV: the new status, its timestamp field, now, the batch id, the seconds
# a final batch's record is kept.
_SET_STATUS = """
local now = redis.call('HGET', KEYS[1], 'status')
if not now then return false end
if now == 'completed' or now == 'failed' or now == 'expired' or now == 'cancelled' then return now end
if now == 'cancelling' and ARGV[1] ~= 'cancelled' and ARGV[1] ~= 'cancelling' then return now end
redis.call('HSET', KEYS[1], 'status', ARGV[1])
if ARGV[2] ~= '' and redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0 then redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]) end
if ARGV[1] == 'completed' or ARGV[1] == 'failed' or ARGV[1] == 'expired' or ARGV[1] == 'cancelled' then
  redis.call('SREM', KEYS[2], ARGV[4])
  redis.call('EXPIRE', KEYS[1], ARGV[5])
end
return ARGV[1]
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_STAMPS = {
    BatchStatus.IN_PROGRESS: "in_progress_at", BatchStatus.FINALIZING: "finalizing_at",
    BatchStatus.COMPLETED: "completed_at", BatchStatus.FAILED: "failed_at", BatchStatus.EXPIRED: "expired_at",
    BatchStatus.CANCELLING: "cancelling_at", BatchStatus.CANCELLED: "cancelled_at",
}
_TIMES = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
          "cancelling_at", "cancelled_at")


def new_batch_id() -> str:
    """A fresh, unguessable batch id."""
    return "batch_" + secrets.token_hex(12)


class BatchStore:
    """Every batch of one deployment, in Redis.

    Args:
        client: a synchronous Redis client.
        keyspace: the deployment's keys.
        retention_s: how long a batch's record is kept after it ended.
        max_window_s: the longest completion window.
    """

    def __init__(self, client: redis.Redis, keyspace: Keyspace, retention_s: int = 30 * 24 * 3600,
                 max_window_s: int = 24 * 3600) -> None:
        self.redis = client
        self.keys = keyspace
        self.retention_s = retention_s
        self.max_window_s = max_window_s
        self._set_status = client.register_script(_SET_STATUS)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def create(self, batch_id: str, fields: dict[str, Any]) -> None:
        """Record a new batch (``validating``), listed and active."""
        now = time.time()
        stored = {name: json.dumps(value) if isinstance(value, (dict, list)) else str(value)
                  for name, value in fields.items() if value is not None}
        window_s = max(0, int(fields.get("expires_at") or now) - int(now))
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.batch(batch_id), mapping={**stored, "status": BatchStatus.VALIDATING.value,
                                                      "created_at": str(int(now))})
        pipe.expire(self.keys.batch(batch_id), window_s + self.retention_s)
        pipe.zadd(self.keys.batches, {batch_id: now})
        # the listing forgets the ids whose records have surely expired
        pipe.zremrangebyscore(self.keys.batches, "-inf", now - self.retention_s - self.max_window_s)
        pipe.sadd(self.keys.active_batches, batch_id)
        pipe.execute()

    def get(self, batch_id: str) -> dict[str, str] | None:
        """The batch's fields as stored; None when there is no such batch."""
        if not batch_id.startswith("batch_") or len(batch_id) > 128:
            return None
        raw = self.redis.hgetall(self.keys.batch(batch_id))
        return {k.decode(): v.decode() for k, v in raw.items()} if raw else None  # type: ignore[union-attr]

    def update(self, batch_id: str, **fields: Any) -> None:
        """Set fields (counts, file ids) of a batch, whatever its status."""
        self.redis.hset(self.keys.batch(batch_id), mapping={k: str(v) for k, v in fields.items()})

    def set_status(self, batch_id: str, status: BatchStatus) -> BatchStatus | None:
        """Move the batch to ``status`` unless it is final or cancelling; returns its status then (None: no batch)."""
        stamp = _STAMPS.get(status, "")
        now = self._set_status(keys=[self.keys.batch(batch_id), self.keys.active_batches],
                               args=[status.value, stamp, int(time.time()), batch_id, self.retention_s])
        return BatchStatus(now.decode() if isinstance(now, bytes) else now) if now else None

    def page(self, after: str | None, limit: int, owner: str | None) -> tuple[list[dict[str, str]], bool]:
        """Batches newest first after ``after``, of ``owner`` (None: all), up to ``limit``; and whether more exist."""
        start = 0
        if after is not None:
            rank = self.redis.zrevrank(self.keys.batches, after)
            start = int(rank) + 1 if rank is not None else 0  # type: ignore[arg-type]
        found: list[dict[str, str]] = []
        step = max(limit * 2, 50)
        while len(found) <= limit:
            ids = self.redis.zrevrange(self.keys.batches, start, start + step - 1)
            if not ids:
                break
            start += len(ids)  # type: ignore[arg-type]
            for raw_id in ids:  # type: ignore[union-attr]
                batch = self.get(raw_id.decode())
                if batch is not None and (owner is None or batch.get("owner") == owner):
                    batch["id"] = raw_id.decode()
                    found.append(batch)
        return found[:limit], len(found) > limit

    def active(self) -> list[str]:
        """The ids of the batches not final yet."""
        return sorted(m.decode() for m in self.redis.smembers(self.keys.active_batches))  # type: ignore[union-attr]

    def forget_active(self, batch_id: str) -> None:
        """Take an id whose hash is gone out of the active set."""
        self.redis.srem(self.keys.active_batches, batch_id)

    # -- leases ------------------------------------------------------------------------------------------------

    def take_lease(self, batch_id: str, runner_id: str, lease_s: float) -> bool:
        """Whether ``runner_id`` now holds the batch's lease (it was free)."""
        return bool(self.redis.set(self.keys.batch_lease(batch_id), runner_id, nx=True, px=int(lease_s * 1000)))

    def renew_lease(self, batch_id: str, runner_id: str, lease_s: float) -> bool:
        """Renew the lease; False when ``runner_id`` no longer holds it (it lapsed and another took it)."""
        return bool(self._renew(keys=[self.keys.batch_lease(batch_id)], args=[runner_id, int(lease_s * 1000)]))

    def release_lease(self, batch_id: str, runner_id: str) -> None:
        """Give the lease up, if ``runner_id`` holds it."""
        self._release(keys=[self.keys.batch_lease(batch_id)], args=[runner_id])

    def lease_holder(self, batch_id: str) -> str | None:
        held = self.redis.get(self.keys.batch_lease(batch_id))
        return held.decode() if isinstance(held, bytes) else None


def public_batch(batch: dict[str, str], batch_id: str) -> dict[str, Any]:
    """A stored batch in the shape of OpenAI's batch object."""
    def stamp(name: str) -> int | None:
        value = batch.get(name)
        return int(float(value)) if value else None

    errors = json.loads(batch["errors"]) if batch.get("errors") else None
    return {
        "id": batch_id, "object": "batch", "endpoint": batch.get("endpoint", "/predict"),
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": batch.get("input_file_id", ""), "completion_window": batch.get("completion_window", "24h"),
        "status": batch.get("status", "validating"),
        "output_file_id": batch.get("output_file_id") or None, "error_file_id": batch.get("error_file_id") or None,
        **{name: stamp(name) for name in _TIMES},
        "request_counts": {"total": int(batch.get("total", 0)), "completed": int(batch.get("completed", 0)),
                           "failed": int(batch.get("failed", 0))},
        "metadata": json.loads(batch["metadata"]) if batch.get("metadata") else None,
    }
