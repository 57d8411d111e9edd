"""The work waiting in Redis, read once: per model in messages and in jobs (a chunk counts its inputs as jobs).
docs/concepts/several-workers.md says who reads which.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio as aredis

from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import CHUNK_TASK, PRIORITY_STEPS, SENT_AT_HEADER, message_args

__all__ = ["ModelWaiting", "QueueWaiting", "aread_waiting", "count_waiting", "message_model", "read_waiting",
           "waiting_commands"]


@dataclass(frozen=True)
class ModelWaiting:
    """One model's work waiting in Redis, in its own lists and the ingress.

    Attributes:
        waiting_messages: exact for its own lists, sampled for the ingress's.
        waiting_jobs: a chunk counts its inputs; sampled.
        oldest_sent_at: per priority level, the oldest sampled send time (epoch seconds).
    """

    model_id: str
    waiting_messages: int
    waiting_jobs: int
    oldest_sent_at: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueWaiting:
    """The queue's waiting work: each model's, and the messages per priority level (exact) and in the ingress.

    Attributes:
        messages_estimated: an ingress level was longer than the sample.
        jobs_estimated: some list was longer than the sample.
    """

    by_model: dict[str, ModelWaiting]
    messages_by_priority: dict[int, int]
    ingress_messages: int
    unreadable_messages: int
    messages_estimated: bool
    jobs_estimated: bool
    sample: int


def message_model(raw: bytes | str) -> str | None:
    """The model id a queued kombu message (a job or a chunk) is for; None when it cannot be read."""
    try:
        args = message_args(json.loads(raw))
    except ValueError:
        return None
    return args[0] if args is not None and isinstance(args[0], str) else None


def _items(raw: bytes | str) -> tuple[int, float | None]:
    """A queued message's number of jobs (a chunk's inputs) and its send time; (1, None) when unreadable."""
    try:
        message = json.loads(raw)
        headers = message.get("headers") or {}
        args = message_args(message)
    except (ValueError, AttributeError):
        return 1, None
    if args is None or not isinstance(headers, dict):
        return 1, None
    chunk = headers.get("task") == CHUNK_TASK and isinstance(args[1], list)
    sent_at = headers.get(SENT_AT_HEADER)
    return max(len(args[1]), 1) if chunk else 1, float(sent_at) if isinstance(sent_at, (int, float)) else None


@dataclass
class _Tally:
    messages: float = 0.0
    jobs: float = 0.0
    oldest: dict[int, float] = field(default_factory=dict)


def _sample_list(tallies: dict[str, _Tally], level: int, length: int, messages: Sequence[Any],
                 model_id: str | None) -> int:
    """Add one list's sample, scaled to its ``length``, to ``tallies`` (``model_id`` None: the ingress); returns the
    sampled messages whose model could not be read."""
    scale = length / len(messages)
    unreadable = 0
    for raw in messages:
        owner = model_id or message_model(raw)
        if not owner:
            unreadable += 1
            continue
        jobs, sent_at = _items(raw)
        tally = tallies.setdefault(owner, _Tally())
        tally.jobs += jobs * scale
        if model_id is None:
            tally.messages += scale
        if sent_at is not None:
            tally.oldest[level] = min(tally.oldest.get(level, sent_at), sent_at)
    return unreadable


def waiting_commands(pipe: Any, keyspace: Keyspace, model_ids: Sequence[str], sample: int,
                     known: Mapping[str, Mapping[int, int]] | None = None) -> None:
    """Queue the reads of ``count_waiting`` on ``pipe``: each list's ``LLEN`` (unless ``known``) and a sample of
    its oldest messages."""
    for model_id in model_ids:
        for level, key in zip(PRIORITY_STEPS, keyspace.model(model_id).lists, strict=True):
            if known is None:
                pipe.llen(key)
                pipe.lrange(key, -sample, -1)  # the oldest: kombu pushes left and pops right
            elif known.get(model_id, {}).get(level, 0):
                pipe.lrange(key, -sample, -1)
    for key in keyspace.ingress_lists.lists:
        pipe.llen(key)
        pipe.lrange(key, -sample, -1)


def count_waiting(model_ids: Sequence[str], replies: Sequence[Any], sample: int,
                  known: Mapping[str, Mapping[int, int]] | None = None) -> QueueWaiting:
    """The waiting work from the replies of ``waiting_commands`` given the same arguments."""
    reply = iter(replies)
    tallies: dict[str, _Tally] = {}
    by_priority = dict.fromkeys(PRIORITY_STEPS, 0)
    jobs_estimated = messages_estimated = False
    for model_id in model_ids:
        for level in PRIORITY_STEPS:
            length = int(next(reply)) if known is None else known.get(model_id, {}).get(level, 0)
            messages = next(reply) if known is None or length else []
            by_priority[level] += length
            if length:
                tallies.setdefault(model_id, _Tally()).messages += length
            if length and messages:
                _sample_list(tallies, level, length, messages, model_id)
                jobs_estimated |= length > len(messages)
    ingress = unreadable = 0
    for level in PRIORITY_STEPS:
        length, messages = int(next(reply)), next(reply)
        by_priority[level] += length
        ingress += length
        if length and messages:
            unreadable += round(_sample_list(tallies, level, length, messages, None) * length / len(messages))
            messages_estimated |= length > len(messages)
    jobs_estimated |= messages_estimated
    by_model = {
        model_id: ModelWaiting(model_id, round(t.messages), round(t.jobs), dict(sorted(t.oldest.items())))
        for model_id, t in sorted(tallies.items(), key=lambda item: -item[1].messages)
    }
    return QueueWaiting(by_model, by_priority, ingress, unreadable, messages_estimated, jobs_estimated, sample)


def read_waiting(client: redis.Redis, keyspace: Keyspace, model_ids: Sequence[str], sample: int,
                 known: Mapping[str, Mapping[int, int]] | None = None) -> QueueWaiting:
    """The waiting work in one round trip (``known``: list lengths read already, per model and priority).

    Raises:
        redis.RedisError: Redis could not be read.
    """
    pipe = client.pipeline(transaction=False)
    waiting_commands(pipe, keyspace, model_ids, sample, known)
    return count_waiting(model_ids, pipe.execute(), sample, known)


async def aread_waiting(client: aredis.Redis, keyspace: Keyspace, model_ids: Sequence[str], sample: int,
                        known: Mapping[str, Mapping[int, int]] | None = None) -> QueueWaiting:
    """``read_waiting`` for asyncio code."""
    pipe = client.pipeline(transaction=False)
    waiting_commands(pipe, keyspace, model_ids, sample, known)
    return count_waiting(model_ids, await pipe.execute(), sample, known)
