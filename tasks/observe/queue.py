"""The depth of the queue, read from the Redis transport's lists: the queue and its priority sub-queues.

Per-model counts need each message's body, so at most ``sample`` messages per priority level are decoded (the
next ones to be served); beyond that the counts are scaled up from the sample and marked as estimates.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis

from config.settings import Settings
from tasks.protocol import PRIORITY_STEPS, message_args, queue_key

__all__ = ["DEFAULT_SAMPLE", "QueueDepth", "aread_queue_depth", "message_jobs", "queue_keys", "read_queue_depth"]

#: Messages decoded per priority level to split the queue by model, by default.
DEFAULT_SAMPLE = 200


@dataclass(frozen=True)
class QueueDepth:
    """Jobs waiting in Redis (not yet fetched by any worker), per priority level and per model.

    Attributes:
        queue: the queue name.
        by_priority: messages per priority level (0 is served first): exact list lengths.
        by_model: jobs per model (a chunk message counts its items); estimates when ``sampled``.
        sampled: some level held more than ``sample`` messages, so ``by_model`` is scaled up from a sample.
        sample: messages decoded per priority level at most.
        unreadable: sampled messages whose model could not be read.
    """

    queue: str
    by_priority: dict[int, int]
    by_model: dict[str, int]
    sampled: bool
    sample: int
    unreadable: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_priority.values())


def queue_keys(settings: Settings) -> list[tuple[int, str]]:
    """``(priority, Redis key)`` of the queue's lists; kombu's key prefix is applied here."""
    return [(p, queue_key(settings.queue, p, settings.key_prefix)) for p in PRIORITY_STEPS]


def message_jobs(raw: bytes | str) -> tuple[str, int] | None:
    """``(model id, jobs)`` of one queued kombu message: one job for ``[model_id, input]``, one per input for a
    chunk ``[model_id, [input, ...]]``. None when the message cannot be read."""
    try:
        args = message_args(json.loads(raw))
    except ValueError:
        return None
    if args is None or not isinstance(args[0], str):
        return None
    return args[0], len(args[1]) if isinstance(args[1], list) else 1


def _depth(
    queue: str, priorities: Sequence[int], lengths: Sequence[int], samples: Sequence[Sequence[Any]], sample: int
) -> QueueDepth:
    estimated: dict[str, float] = {}
    sampled = False
    unreadable = 0
    for length, messages in zip(lengths, samples, strict=True):
        if not length or not messages:
            continue
        scale = length / len(messages)
        sampled = sampled or length > len(messages)
        counts: Counter[str] = Counter()
        for message in messages:
            found = message_jobs(message)
            if found is None:
                counts[""] += 1
            else:
                counts[found[0]] += found[1]
        unreadable += round(counts.pop("", 0) * scale)
        for model_id, n in counts.items():
            estimated[model_id] = estimated.get(model_id, 0.0) + n * scale
    by_model = {model_id: round(n) for model_id, n in sorted(estimated.items(), key=lambda item: -item[1])}
    return QueueDepth(
        queue=queue,
        by_priority=dict(zip(priorities, (int(n) for n in lengths), strict=True)),
        by_model=by_model,
        sampled=sampled,
        sample=sample,
        unreadable=unreadable,
    )


def read_queue_depth(client: redis.Redis, settings: Settings, sample: int = DEFAULT_SAMPLE) -> QueueDepth:
    """The queue's depth in one round trip (``LLEN`` and a bounded ``LRANGE`` per priority level)."""
    keys = queue_keys(settings)
    pipe = client.pipeline(transaction=False)
    for _, key in keys:
        pipe.llen(key)
        pipe.lrange(key, -sample, -1)  # the oldest: kombu pushes left and pops right
    replies = pipe.execute()
    return _depth(settings.queue, [p for p, _ in keys], replies[0::2], replies[1::2], sample)


async def aread_queue_depth(client: aredis.Redis, settings: Settings, sample: int = DEFAULT_SAMPLE) -> QueueDepth:
    """``read_queue_depth`` for asyncio code."""
    keys = queue_keys(settings)
    pipe = client.pipeline(transaction=False)
    for _, key in keys:
        pipe.llen(key)
        pipe.lrange(key, -sample, -1)
    replies = await pipe.execute()
    return _depth(settings.queue, [p for p, _ in keys], replies[0::2], replies[1::2], sample)
