"""The depth of the queue, in its one layout: every model's own lists (exact counts per model and priority) and
the ingress, where plain Celery producers' messages wait until a worker moves them to their model's lists.

Counts are of messages (a chunk of a bulk job counts once, as it is one message to fetch). Per-model counts of the
ingress need each message's body, so at most ``sample`` messages per priority level are decoded there (the next
ones to be moved); beyond that those counts are scaled up from the sample and marked as estimates.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aredis

from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import PRIORITY_STEPS, message_args

__all__ = ["DEFAULT_SAMPLE", "QueueDepth", "aread_queue_depth", "message_model", "read_queue_depth"]

#: Messages decoded per priority level to split the queue by model, by default.
DEFAULT_SAMPLE = 200


@dataclass(frozen=True)
class QueueDepth:
    """Jobs waiting in Redis (not yet fetched by any worker), per priority level and per model.

    Attributes:
        queue: the queue name.
        by_priority: messages per priority level (0 is served first), the models' lists and the ingress: exact.
        by_model: messages per model: its own lists', exact, and the ingress's, estimates when ``sampled``.
        sampled: an ingress level held more than ``sample`` messages, so ``by_model`` is partly scaled up.
        sample: ingress messages decoded per priority level at most.
        unreadable: sampled ingress messages whose model could not be read.
        ingress: messages waiting in the ingress (not yet moved to a model's lists).
    """

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


def message_model(raw: bytes | str) -> str | None:
    """The model id a queued kombu message (a job or a chunk) is for; None when it cannot be read."""
    try:
        args = message_args(json.loads(raw))
    except ValueError:
        return None
    return args[0] if args is not None and isinstance(args[0], str) else None


def _depth(
    keyspace: Keyspace, model_ids: Sequence[str], replies: Sequence[Any], sample: int,
    known: Mapping[str, Mapping[int, int]] | None = None,
) -> QueueDepth:
    """The depth from the replies of ``_commands``: per model its four list lengths (unless ``known``), then per
    ingress level its length and its sample."""
    width = len(PRIORITY_STEPS)
    by_priority = dict.fromkeys(PRIORITY_STEPS, 0)
    estimated: dict[str, float] = {}
    if known is not None:
        replies = [*(known.get(m, {}).get(p, 0) for m in model_ids for p in PRIORITY_STEPS), *replies]
    for index, model_id in enumerate(model_ids):
        lengths = [int(n) for n in replies[index * width : (index + 1) * width]]
        for priority, n in zip(PRIORITY_STEPS, lengths, strict=True):
            by_priority[priority] += n
        if sum(lengths):
            estimated[model_id] = float(sum(lengths))
    rest = replies[len(model_ids) * width :]
    sampled = False
    unreadable = 0
    ingress = 0
    for priority, length, messages in zip(PRIORITY_STEPS, rest[0::2], rest[1::2], strict=True):
        by_priority[priority] += int(length)
        ingress += int(length)
        if not length or not messages:
            continue
        scale = length / len(messages)
        sampled = sampled or length > len(messages)
        counts: Counter[str] = Counter()
        for message in messages:
            counts[message_model(message) or ""] += 1
        unreadable += round(counts.pop("", 0) * scale)
        for model_id, n in counts.items():
            estimated[model_id] = estimated.get(model_id, 0.0) + n * scale
    by_model = {model_id: round(n) for model_id, n in sorted(estimated.items(), key=lambda item: -item[1])}
    return QueueDepth(queue=keyspace.queue, by_priority=by_priority, by_model=by_model, sampled=sampled,
                      sample=sample, unreadable=unreadable, ingress=ingress)


def _commands(pipe: Any, keyspace: Keyspace, model_ids: Sequence[str], sample: int) -> None:
    """``LLEN`` of each of ``model_ids``' lists (none: their lengths are known), then each ingress level's."""
    for model_id in model_ids:
        for key in keyspace.model(model_id).lists:
            pipe.llen(key)
    for key in keyspace.ingress_lists.lists:
        pipe.llen(key)
        pipe.lrange(key, -sample, -1)  # the oldest: kombu pushes left and pops right


def read_queue_depth(
    client: redis.Redis, keyspace: Keyspace, model_ids: Sequence[str], sample: int = DEFAULT_SAMPLE,
    known: Mapping[str, Mapping[int, int]] | None = None,
) -> QueueDepth:
    """The queue's depth in one round trip (``LLEN`` of every model's lists, ``LLEN`` and a bounded ``LRANGE`` of
    each ingress level). ``known``: each model's list lengths by priority, read already (``ModelPlacement.queued``):
    not read again."""
    pipe = client.pipeline(transaction=False)
    _commands(pipe, keyspace, model_ids if known is None else (), sample)
    return _depth(keyspace, model_ids, pipe.execute(), sample, known)


async def aread_queue_depth(
    client: aredis.Redis, keyspace: Keyspace, model_ids: Sequence[str], sample: int = DEFAULT_SAMPLE,
    known: Mapping[str, Mapping[int, int]] | None = None,
) -> QueueDepth:
    """``read_queue_depth`` for asyncio code."""
    pipe = client.pipeline(transaction=False)
    _commands(pipe, keyspace, model_ids if known is None else (), sample)
    return _depth(keyspace, model_ids, await pipe.execute(), sample, known)
