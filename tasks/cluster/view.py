"""Where each model stands across the workers: its jobs waiting in its own lists (exact), the jobs workers hold,
and the workers holding a claim on it, read in one round trip (``swapless.tasks.keyspace`` names the keys).

Read by the worker's placer (``swapless.tasks.cluster.placer``) several times a second, and by ``swapless status`` and
the gateway's ``GET /models``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import redis.asyncio as aredis

from swapless.tasks.keyspace import Keyspace, ModelKeys
from swapless.tasks.protocol import PRIORITY_STEPS

__all__ = ["ModelPlacement", "aread_placement", "read_placement"]


@dataclass(frozen=True)
class ModelPlacement:
    """One model's place in the cluster now.

    Attributes:
        model_id: the model.
        queued: jobs waiting in its lists, per priority level (exact).
        held: jobs workers have fetched and not yet finished.
        holders: the workers holding a live claim, in the order they claimed it, with when each lease ends.
    """

    model_id: str
    queued: dict[int, int]
    held: int
    holders: tuple[tuple[str, float], ...]

    @property
    def waiting(self) -> int:
        """Jobs queued in Redis."""
        return sum(self.queued.values())

    @property
    def holder_ids(self) -> tuple[str, ...]:
        return tuple(worker for worker, _ in self.holders)


def _commands(pipe: object, keys: Sequence[ModelKeys], now_ms: int) -> None:
    for k in keys:
        for key in k.lists:
            pipe.llen(key)  # type: ignore[attr-defined]
        pipe.hlen(k.held)  # type: ignore[attr-defined]
        pipe.zrangebyscore(k.holders, now_ms, "+inf", withscores=True)  # type: ignore[attr-defined]


def _parse(keys: Sequence[ModelKeys], replies: Sequence[object]) -> list[ModelPlacement]:
    width = len(PRIORITY_STEPS) + 2
    found = []
    for index, k in enumerate(keys):
        row = replies[index * width : (index + 1) * width]
        lengths = [int(n) for n in row[: len(PRIORITY_STEPS)]]  # type: ignore[call-overload]
        holders = tuple(
            (worker.decode() if isinstance(worker, bytes) else str(worker), float(score) / 1000)
            for worker, score in row[-1]  # type: ignore[attr-defined]
        )
        # order of claim: a lease is renewed as a whole, so the earliest claim is not the smallest score;
        # by name then, which every reader sees the same way
        found.append(ModelPlacement(k.model_id, dict(zip(PRIORITY_STEPS, lengths, strict=True)),
                                    int(row[len(PRIORITY_STEPS)]), tuple(sorted(holders))))  # type: ignore[call-overload]
    return found


def read_placement(client: redis.Redis, keyspace: Keyspace, model_ids: Sequence[str]) -> list[ModelPlacement]:
    """Every model's place now (one round trip: six commands per model)."""
    keys = [keyspace.model(m) for m in model_ids]
    pipe = client.pipeline(transaction=False)
    _commands(pipe, keys, int(time.time() * 1000))
    return _parse(keys, pipe.execute())


async def aread_placement(client: aredis.Redis, keyspace: Keyspace, model_ids: Sequence[str]) -> list[ModelPlacement]:
    """``read_placement`` for asyncio code."""
    keys = [keyspace.model(m) for m in model_ids]
    pipe = client.pipeline(transaction=False)
    _commands(pipe, keys, int(time.time() * 1000))
    return _parse(keys, await pipe.execute())
