"""Where each model stands across the workers: the messages waiting in its own lists (exact), the jobs workers
hold, and its holders, read in one call inside Redis (by the placer, the status and ``GET /models``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis

from swapless.tasks.keyspace import Keyspace, ModelKeys
from swapless.tasks.protocol import PRIORITY_STEPS

__all__ = ["ModelPlacement", "aread_placement", "read_placement"]


@dataclass(frozen=True)
class ModelPlacement:
    """One model's place in the cluster now.

    Attributes:
        queued: messages waiting in its lists, per priority level (exact).
        held: jobs workers have fetched and not yet finished.
        holders: the workers holding a live claim, sorted by id, each with when its lease ends (epoch seconds).
    """

    model_id: str
    queued: dict[int, int]
    held: int
    holders: tuple[tuple[str, float], ...]

    @property
    def waiting_messages(self) -> int:
        """Messages waiting in its lists (a chunk is one message)."""
        return sum(self.queued.values())

    @property
    def holder_ids(self) -> tuple[str, ...]:
        return tuple(worker for worker, _ in self.holders)


#: Reads every model's counts inside Redis and answers only for the models with anything queued, held or claimed
#: (an idle registry costs one call and an empty answer). KEYS: per model,
#: its priority lists, its held hash and its holders zset (ARGV[2] keys each, in that order); ARGV[1]: now, in ms.
#: Answer: a flat list of (model's index, [list lengths..., held, holders with scores]).
_READ = """
local width = tonumber(ARGV[2])
local found = {}
for base = 0, #KEYS - 1, width do
  local row = {}
  local busy = false
  for i = 1, width - 1 do
    local n
    if i < width - 1 then n = redis.call('LLEN', KEYS[base + i]) else n = redis.call('HLEN', KEYS[base + i]) end
    row[i] = n
    if n > 0 then busy = true end
  end
  local holders = redis.call('ZRANGEBYSCORE', KEYS[base + width], ARGV[1], '+inf', 'WITHSCORES')
  row[width] = holders
  if busy or #holders > 0 then
    found[#found + 1] = base / width
    found[#found + 1] = row
  end
end
return found
"""

_WIDTH = len(PRIORITY_STEPS) + 2


def _keys(keyspace: Keyspace, model_ids: Sequence[str]) -> tuple[list[ModelKeys], list[str]]:
    keys = [keyspace.model(m) for m in model_ids]
    return keys, [name for k in keys for name in (*k.lists, k.held, k.holders)]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse(keys: Sequence[ModelKeys], answer: Sequence[Any]) -> list[ModelPlacement]:
    busy: dict[int, list[Any]] = {}
    for index, row in zip(answer[::2], answer[1::2], strict=True):
        busy[int(index)] = row
    idle = dict.fromkeys(PRIORITY_STEPS, 0)
    found = []
    for index, k in enumerate(keys):
        row = busy.get(index)
        if row is None:
            found.append(ModelPlacement(k.model_id, dict(idle), 0, ()))
            continue
        lengths = [int(n) for n in row[: len(PRIORITY_STEPS)]]
        flat = row[-1]
        holders = tuple((_text(worker), float(score) / 1000)
                        for worker, score in zip(flat[::2], flat[1::2], strict=True))
        # order of claim: a lease is renewed as a whole, so the earliest claim is not the smallest score;
        # by name then, which every reader sees the same way
        found.append(ModelPlacement(k.model_id, dict(zip(PRIORITY_STEPS, lengths, strict=True)),
                                    int(row[len(PRIORITY_STEPS)]), tuple(sorted(holders))))
    return found


def read_placement(client: redis.Redis, keyspace: Keyspace, model_ids: Sequence[str]) -> list[ModelPlacement]:
    """Every model's place now, in one call read inside Redis."""
    if not model_ids:
        return []
    keys, names = _keys(keyspace, model_ids)
    answer = client.register_script(_READ)(keys=names, args=[int(time.time() * 1000), _WIDTH])
    return _parse(keys, answer)  # type: ignore[arg-type]


async def aread_placement(client: aredis.Redis, keyspace: Keyspace, model_ids: Sequence[str]) -> list[ModelPlacement]:
    """``read_placement`` for asyncio code."""
    if not model_ids:
        return []
    keys, names = _keys(keyspace, model_ids)
    answer = await client.register_script(_READ)(keys=names, args=[int(time.time() * 1000), _WIDTH])
    return _parse(keys, answer)
