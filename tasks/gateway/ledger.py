"""The gateway's ledger in Redis: who submitted each job, and each caller's jobs in flight.

docs/concepts/gateway.md describes the records and the in-flight count.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aredis

from swapless.tasks.broker.results import ResultStore, StoredResult
from swapless.tasks.keyspace import Keyspace

__all__ = ["JobLedger", "LedgerRecord"]

# KEYS: the owner's in-flight set, then one record per new job. ARGV: now (ms), the cap, the records' life (s), the
# members' score (ms: when the record gives up on them), the owner, the record key's prefix, then the job ids.
# Returns {1, in flight after} or {0, in flight} when the jobs would pass the cap. The first write frees memory.
_ADMIT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local n = #KEYS - 1
local cap = tonumber(ARGV[2])
local count = redis.call('ZCARD', KEYS[1])
if count + n > cap then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    local record = ARGV[6] .. id
    if redis.call('HEXISTS', record, 'done') == 1 or redis.call('EXISTS', record) == 0 then
      redis.call('ZREM', KEYS[1], id)
    end
  end
  count = redis.call('ZCARD', KEYS[1])
  if count + n > cap then
    return {0, count}
  end
end
for i = 1, n do
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[6 + i])
  redis.call('HSET', KEYS[1 + i], 'owner', ARGV[5])
  redis.call('EXPIRE', KEYS[1 + i], ARGV[3])
end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[4]) - tonumber(ARGV[1]) then
  redis.call('PEXPIREAT', KEYS[1], ARGV[4])
end
return {1, count + n}
"""


@dataclass(frozen=True)
class LedgerRecord:
    """What the ledger says of one job: who submitted it, and whether it has finished."""

    owner: str
    done: bool


class JobLedger:
    """Job records and in-flight counts.

    Args:
        redis: the gateway's asyncio Redis client.
        results: where results are kept.
        keyspace: the deployment's keys.
        inflight_cap: ``SWAPLESS_GATEWAY_INFLIGHT_PER_KEY``.
    """

    def __init__(self, redis: aredis.Redis, results: ResultStore, keyspace: Keyspace, inflight_cap: int) -> None:
        self.redis = redis
        self.results = results
        self.keyspace = keyspace
        self.inflight_cap = inflight_cap
        self._admit = redis.register_script(_ADMIT)
        self._record_prefix = results.record_key_prefix

    def inflight_key(self, owner: str) -> str:
        """The sorted set of ``owner``'s jobs in flight."""
        return self.keyspace.gateway_inflight(owner)

    async def admit(self, owner: str, job_ids: Sequence[str], hold_s: float) -> tuple[bool, int]:
        """Record ``job_ids`` as ``owner``'s for at most ``hold_s`` seconds, unless that passes the in-flight cap.

        Returns:
            (admitted, jobs in flight).
        """
        now_ms = int(time.time() * 1000)
        life_s = int(hold_s + self.results.expires_s) + 1
        keys = [self.inflight_key(owner), *(self.results.record_key(job_id) for job_id in job_ids)]
        args: list[str | int] = [now_ms, self.inflight_cap, life_s, now_ms + int(hold_s * 1000), owner,
                                 self._record_prefix, *job_ids]
        admitted, count = await self._admit(keys=keys, args=args)
        return bool(admitted), int(count)

    async def release(self, owner: str, job_ids: Sequence[str]) -> None:
        """Forget jobs that were recorded but never queued (their publish failed)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(self.inflight_key(owner), *job_ids)
            pipe.delete(*(self.results.record_key(job_id) for job_id in job_ids))
            await pipe.execute()

    async def read(self, job_id: str) -> tuple[LedgerRecord | None, StoredResult]:
        """The job's record (None: never accepted here, or long gone) and its stored state, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.results.record_key(job_id))
            pipe.get(self.results.key(job_id))
            fields, raw = await pipe.execute()
        record = None
        if fields:
            owner = fields.get(b"owner", b"")
            record = LedgerRecord(owner.decode() if isinstance(owner, bytes) else str(owner), b"done" in fields)
        return record, self.results.decode(job_id, raw)

    async def remaining_s(self, job_id: str) -> int:
        """Seconds the job's record still lives (0 when it has none)."""
        return max(0, int(await self.redis.ttl(self.results.record_key(job_id))))
