"""Each model's own lists in Redis, and the scripts over them: fetch with a record of the holder, ack, restore,
recover a dead worker's jobs, refresh, and the claims (with leases) that say which workers fetch which model.

Keys (``tasks.protocol.model_key``, hash tag ``{queue/model}``): ``p0 p3 p6 p9`` the jobs waiting, by priority;
``held`` (delivery tag -> the message), ``owner`` (tag -> ``worker|list``) and ``seen`` (tag -> time last
refreshed) the jobs workers have fetched and not yet acked; ``holders`` (worker -> lease expiry, ms) the claims;
``bell`` a one-token list producers ring. Every script here touches one model's keys only.

A job is at every instant in one of the model's lists or in its ``held`` record (or acked with its result
stored): ``FETCH`` pops and records in one step, ``RESTORE`` and ``RECOVER`` put records back at the head of their
list (served next), ``ACK`` deletes them. A worker that dies leaves its records; any live worker's ``RECOVER`` puts
them back as soon as the dead worker's heartbeat has expired (its id is missing from ``live``), or, the last
resort, once a record has not been refreshed for the visibility timeout (a worker cut off from Redis but alive).

Every script starts with a write that takes no memory (``tasks.broker.connection.WRITE_FIRST_NOTE``), so all of
them go through while Redis is over ``maxmemory``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tasks.protocol import PRIORITY_STEPS, model_key

__all__ = [
    "ACK",
    "CLAIM",
    "FETCH",
    "RECOVER",
    "REFRESH",
    "RELEASE",
    "RENEW",
    "RESTORE",
    "Affinity",
    "ModelKeys",
]

#: KEYS: p0 p3 p6 p9 held owner seen. ARGV: most messages, the time, the worker's id.
#: Returns the messages, highest priority first.
FETCH = """
local limit = tonumber(ARGV[1])
local out = {}
local taken = 0
for i = 1, 4 do
  if taken >= limit then break end
  local items = redis.call('RPOP', KEYS[i], limit - taken)
  if items then
    for _, raw in ipairs(items) do
      local ok, msg = pcall(cjson.decode, raw)
      local props = ok and type(msg) == 'table' and msg['properties']
      local tag = type(props) == 'table' and props['delivery_tag']
      if type(tag) == 'string' then
        redis.call('HSET', KEYS[5], tag, raw)
        redis.call('HSET', KEYS[6], tag, ARGV[3] .. '|' .. i)
        redis.call('ZADD', KEYS[7], ARGV[2], tag)
      end
      out[#out + 1] = raw
      taken = taken + 1
    end
  end
end
return out
"""

#: KEYS: held owner seen. ARGV: delivery tags. Deletions only.
ACK = """
for i = 1, #ARGV, 1000 do
  local tags = {unpack(ARGV, i, math.min(i + 999, #ARGV))}
  redis.call('HDEL', KEYS[1], unpack(tags))
  redis.call('HDEL', KEYS[2], unpack(tags))
  redis.call('ZREM', KEYS[3], unpack(tags))
end
return #ARGV
"""

_RESTORE_TAGS = """
local function restore(tags)
  local n = 0
  for _, tag in ipairs(tags) do
    local raw = redis.call('HGET', KEYS[5], tag)
    local owner = redis.call('HGET', KEYS[6], tag)
    redis.call('HDEL', KEYS[6], tag)
    redis.call('HDEL', KEYS[5], tag)
    redis.call('ZREM', KEYS[7], tag)
    if raw then
      local list = owner and tonumber(string.match(owner, '|(%d+)$')) or 1
      redis.call('RPUSH', KEYS[list], raw)
      n = n + 1
    end
  end
  return n
end
"""

#: KEYS: p0 p3 p6 p9 held owner seen. ARGV: delivery tags. Puts them back at the head of their lists.
RESTORE = _RESTORE_TAGS + """
return restore(ARGV)
"""

#: KEYS: p0 p3 p6 p9 held owner seen. ARGV: records not seen since this time are stale, then the live workers' ids.
#: Puts back every job held by a worker not in the list, and every stale one. Returns how many.
RECOVER = _RESTORE_TAGS + """
local live = {}
for i = 2, #ARGV do live[ARGV[i]] = true end
local chosen, seen = {}, {}
local owners = redis.call('HGETALL', KEYS[6])
for i = 1, #owners, 2 do
  local worker = string.match(owners[i + 1], '^(.*)|%d+$') or owners[i + 1]
  if not live[worker] then chosen[#chosen + 1] = owners[i]; seen[owners[i]] = true end
end
for _, tag in ipairs(redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', ARGV[1])) do
  if not seen[tag] then chosen[#chosen + 1] = tag end
end
return restore(chosen)
"""

#: KEYS: seen. ARGV: the time, then delivery tags. XX: an acked job is not added back.
REFRESH = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(-inf')
for i = 2, #ARGV, 500 do
  local batch = {}
  for j = i, math.min(i + 499, #ARGV) do
    batch[#batch + 1] = ARGV[1]
    batch[#batch + 1] = ARGV[j]
  end
  redis.call('ZADD', KEYS[1], 'XX', unpack(batch))
end
return #ARGV - 1
"""

#: KEYS: holders. ARGV: worker, now (ms), lease (ms), most holders, then workers known dead (their claims go first).
#: 1: the worker holds a claim now, 0: refused.
CLAIM = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
for i = 5, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
local expiry = tonumber(ARGV[2]) + tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], expiry, ARGV[1])
  return 1
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], expiry, ARGV[1])
return 1
"""

#: KEYS: holders. ARGV: worker, now (ms), lease (ms). 1: renewed, 0: the claim had lapsed (someone may hold it now).
RENEW = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], tonumber(ARGV[2]) + tonumber(ARGV[3]), ARGV[1])
  return 1
end
return 0
"""

#: KEYS: holders. ARGV: worker, now (ms), 1 to keep the last holder's claim. 1: released.
RELEASE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if ARGV[3] == '1' and redis.call('ZCARD', KEYS[1]) <= 1 then return 0 end
return redis.call('ZREM', KEYS[1], ARGV[1])
"""


@dataclass(frozen=True)
class ModelKeys:
    """The keys of one model under one queue (with the deployment's key prefix)."""

    queue: str
    model_id: str
    key_prefix: str | None = None

    def part(self, name: str) -> str:
        return model_key(self.queue, self.model_id, name, self.key_prefix)

    @property
    def lists(self) -> list[str]:
        """The job lists, in the order they are served (``PRIORITY_STEPS``)."""
        return [self.part(f"p{priority}") for priority in PRIORITY_STEPS]

    @property
    def records(self) -> list[str]:
        """``held``, ``owner``, ``seen``."""
        return [self.part("held"), self.part("owner"), self.part("seen")]

    @property
    def queue_and_records(self) -> list[str]:
        """The keys of ``FETCH``, ``RESTORE`` and ``RECOVER``."""
        return self.lists + self.records

    @property
    def holders(self) -> str:
        return self.part("holders")

    @property
    def bell(self) -> str:
        return self.part("bell")


class Affinity(Protocol):
    """What the transport asks of the worker that consumes with placement (``tasks.worker.placement``)."""

    #: This worker's id (``hostname:pid``), recorded as the owner of what it fetches.
    worker_id: str
    def hold_limit(self, model_id: str) -> int:
        """Most jobs of ``model_id`` this worker holds (fetched, unfinished) at once."""

    def claimed(self) -> Sequence[str]:
        """The models whose lists this worker fetches from now."""

    def route(self, payload: dict[str, Any]) -> str | None:
        """The model a message from the shared queue (a plain Celery producer's) belongs to, as its lists are
        named; None: keep it here (unknown model, malformed: this worker answers it with the error)."""
