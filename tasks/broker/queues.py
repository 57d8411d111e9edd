"""The queue's one layout in Redis, the scripts over it, and what the transport asks of the worker that consumes
(docs/concepts/delivery.md, "One queue layout").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from swapless.tasks.broker.connection import RedisHealth

__all__ = ["ACK", "FETCH", "RECOVER", "REFRESH", "RESTORE", "WAKE", "Affinity", "ChannelHooks", "LeanIntake"]

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
#: KEYS: a worker's wake bell. ARGV: its lifetime (ms). Leaves one token in it (a worker that died waiting leaves one
#: short-lived key).
WAKE = """
redis.call('DEL', KEYS[1])
redis.call('RPUSH', KEYS[1], '1')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

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

class Affinity(Protocol):
    """What the transport asks of the worker about placement (``swapless.tasks.cluster.placer.Placer``)."""

    #: This worker's id (``hostname:pid``), recorded as the owner of what it fetches.
    worker_id: str

    def hold_limit(self, model_id: str) -> int:
        """Most jobs of ``model_id`` this worker holds (fetched, unfinished) at once."""

    def claimed(self) -> Sequence[str]:
        """The models whose lists this worker fetches from now."""

    def fetch_first(self) -> Collection[str] | None:
        """Models that get the fetch credit first, one job held of each other (optional; None: all alike)."""

    def wake(self) -> None:
        """Place now: the placement bell rang (optional; the transport calls it when present)."""

    def route(self, payload: dict[str, Any]) -> str | None:
        """The model an ingress message goes to; None: keep it here (this worker runs or answers it)."""


class LeanIntake(Protocol):
    """Takes the messages of one fetch round that need no Celery request (``swapless.tasks.worker.intake``)."""

    def eligible(self, payload: dict[str, Any]) -> bool:
        """Whether this message may skip Celery's request machinery."""

    def __call__(self, messages: Sequence[Any]) -> None:
        """The round's eligible messages, as kombu messages already recorded as delivered."""


@dataclass(frozen=True)
class ChannelHooks:
    """What a worker hands the transport's channels (the transport option ``swapless_hooks``).

    A channel that consumes other queues (Celery's own reply queues) is kombu's own.
    """

    queue: str
    affinity: Affinity
    intake: LeanIntake | None
    health: RedisHealth
