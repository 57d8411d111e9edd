"""The depth of the queue in messages (a chunk of a bulk job is one message): per priority level and per model,
from the one reading of the waiting work (``swapless.tasks.observe.waiting``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis
import redis.asyncio as aredis

from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.waiting import QueueWaiting, aread_waiting, message_model, read_waiting

__all__ = ["DEFAULT_SAMPLE", "QueueDepth", "aread_queue_depth", "depth_of", "message_model", "read_queue_depth"]

#: Messages decoded per list to split the ingress by model, by default.
DEFAULT_SAMPLE = 200


@dataclass(frozen=True)
class QueueDepth:
    """Messages waiting in Redis, per priority level (exact) and per model (``QueueWaiting``'s, under the names the
    status JSON has always used: ``sampled`` is ``messages_estimated``)."""

    queue: str
    by_priority: dict[int, int]
    by_model: dict[str, int]
    sampled: bool
    sample: int
    unreadable: int = 0
    ingress: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_priority.values())


def depth_of(queue: str, waiting: QueueWaiting) -> QueueDepth:
    """The depth of ``queue`` from its waiting work."""
    return QueueDepth(
        queue=queue, by_priority=waiting.messages_by_priority,
        by_model={m.model_id: m.waiting_messages for m in waiting.by_model.values()},
        sampled=waiting.messages_estimated, sample=waiting.sample, unreadable=waiting.unreadable_messages,
        ingress=waiting.ingress_messages,
    )


def read_queue_depth(
    client: redis.Redis, keyspace: Keyspace, model_ids: Sequence[str], sample: int = DEFAULT_SAMPLE,
    known: Mapping[str, Mapping[int, int]] | None = None,
) -> QueueDepth:
    """The queue's depth in one round trip (``known``: as for ``read_waiting``)."""
    return depth_of(keyspace.queue, read_waiting(client, keyspace, model_ids, sample, known))


async def aread_queue_depth(
    client: aredis.Redis, keyspace: Keyspace, model_ids: Sequence[str], sample: int = DEFAULT_SAMPLE,
    known: Mapping[str, Mapping[int, int]] | None = None,
) -> QueueDepth:
    """``read_queue_depth`` for asyncio code."""
    return depth_of(keyspace.queue, await aread_waiting(client, keyspace, model_ids, sample, known))
