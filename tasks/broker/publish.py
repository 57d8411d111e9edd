"""Publishing jobs: Celery protocol-2 messages built directly and pushed in one pipeline, each job still its own
message (docs/concepts/delivery.md, "Publishing").
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr

from swapless.config.errors import InputError
from swapless.tasks.broker.connection import ReplicaWait
from swapless.tasks.keyspace import ModelKeys
from swapless.tasks.protocol import CHUNK_TASK, ITEMS_HEADER, PREDICT_TASK, SENT_AT_HEADER, new_ids

__all__ = [
    "ModelPush", "apush", "apush_to_models", "argsrepr", "build_messages", "check_messages", "push", "push_to_models",
]

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_ARGSREPR_MAX = 1024  # Celery's argsrepr_maxsize
#: Longest ``repr`` of a job's arguments taken as its ``argsrepr`` as it is (Celery's saferepr only shortens past
#: ``_ARGSREPR_MAX``).
_PLAIN_REPR_MAX = 1000


def _plain(text: object) -> bool:
    """Whether ``repr`` writes ``text`` as Celery's saferepr does."""
    return type(text) is str and text.isprintable() and "'" not in text and "\\" not in text


def argsrepr(args: list[Any]) -> str:
    """The ``argsrepr`` header of a job's ``[model_id, value]``, as ``send_task`` writes it."""
    if all(_plain(arg) for arg in args):
        text = repr(args)
        if len(text) <= _PLAIN_REPR_MAX:
            return text
    return saferepr(args, _ARGSREPR_MAX)


def build_messages(
    app: Celery, queue: str, jobs: Sequence[tuple[str, Any]], priority: int, task: str = PREDICT_TASK,
    expires: str | None = None, ids: Sequence[str] | None = None, headers: Sequence[dict[str, Any]] | None = None,
    max_bytes: int | None = None, bodies: Sequence[str] | None = None,
) -> list[tuple[str, str]]:
    """``(job id, message JSON)`` per ``(model_id, value)``, as ``send_task(task, args=[model_id, value])`` sends it.

    Args:
        expires: the deadline, as an ISO time.
        ids: the job ids (default: new ones).
        headers: extra headers per job.
        max_bytes: the largest message (``SWAPLESS_MAX_MESSAGE_BYTES``).
        bodies: the bodies ``check_messages`` encoded.

    Raises:
        ValueError: an input JSON cannot encode (its index is named).
        InputError: a message is over ``max_bytes`` (nothing is returned).
    """
    origin = anon_nodename()  # what send_task puts in "origin"
    reply_to = app.thread_oid
    sent_at = time.time()
    tags = new_ids(len(jobs))
    ids = ids if ids is not None else new_ids(len(jobs))
    out = []
    for index, (model_id, value) in enumerate(jobs):
        job_id = ids[index]
        args = [model_id, value]
        body = bodies[index] if bodies is not None else _body(index, model_id, value)
        message = {
            "body": base64.b64encode(body.encode()).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py",
                "task": task,
                "id": job_id,
                "shadow": None,
                "eta": None,
                "expires": expires,
                "group": None,
                "group_index": None,
                "retries": 0,
                "timelimit": [None, None],
                "root_id": job_id,
                "parent_id": None,
                "argsrepr": argsrepr(args),
                "kwargsrepr": "{}",
                "origin": origin,
                "ignore_result": False,
                "replaced_task_nesting": 0,
                "stamped_headers": None,
                "stamps": {},
                SENT_AT_HEADER: sent_at,
                **({ITEMS_HEADER: len(value)} if task == CHUNK_TASK and isinstance(value, list) else {}),
                **(headers[index] if headers is not None else {}),
            },
            "properties": {
                "correlation_id": job_id,
                "reply_to": reply_to,
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": priority,
                "body_encoding": "base64",
                "delivery_tag": tags[index],
            },
        }
        encoded = json.dumps(message)
        if max_bytes is not None and len(encoded) > max_bytes:
            what = "chunk of inputs" if isinstance(value, list) and task != PREDICT_TASK else "input"
            raise InputError(model_id, f"the job's queue message would be {len(encoded)} bytes, over the limit of "
                             f"{max_bytes} bytes (SWAPLESS_MAX_MESSAGE_BYTES): send a smaller {what}"
                             + (" (fewer inputs per chunk: --chunk-size)" if what != "input" else ""))
        out.append((job_id, encoded))
    return out


#: What a message holds besides its base64 body and its extra headers, at most: Celery's header and property
#: names, two ids, the argsrepr (``_ARGSREPR_MAX``), the origin, the queue's name twice (``check_messages``).
_MESSAGE_OVERHEAD_BYTES = 8192


def _body(index: int, model_id: str, value: Any) -> str:
    """A job's body as Celery encodes it, ``[args, kwargs, embed]``.

    Raises:
        ValueError: its input cannot be encoded.
    """
    try:
        return json.dumps([[model_id, value], {}, _EMBED])
    except (TypeError, ValueError) as err:
        raise ValueError(f"job {index} ({model_id}): its input cannot be sent as JSON ({err})") from None


def check_messages(
    app: Celery, queue: str, jobs: Sequence[tuple[str, Any]], priority: int, task: str = PREDICT_TASK,
    expires: str | None = None, headers: Sequence[dict[str, Any]] | None = None, max_bytes: int | None = None,
) -> list[str]:
    """Raise what ``build_messages`` would raise, without building the messages; returns each job's body.

    Raises:
        ValueError: an input JSON cannot encode.
        InputError: a message would be over ``max_bytes``.
    """
    margin = _MESSAGE_OVERHEAD_BYTES + 2 * len(queue) + len(task) + len(expires or "")
    bodies = []
    for index, (model_id, value) in enumerate(jobs):
        body = _body(index, model_id, value)
        bodies.append(body)
        if max_bytes is None:
            continue
        extra = len(json.dumps(headers[index], default=str)) if headers is not None and headers[index] else 0
        if 4 * (len(body.encode()) + 2) // 3 + margin + extra > max_bytes:  # near the limit: build it to know
            build_messages(app, queue, [(model_id, value)], priority, task=task, expires=expires,
                           headers=[headers[index]] if headers is not None else None, max_bytes=max_bytes,
                           bodies=[body])
    return bodies


# KEYS: the list to push to, then every list of the queue (counted). ARGV: the bound, the messages still to come
# in later pushes of the same call (counted against the bound now), then the messages, in order.
# Returns {1, messages queued after the push}, or {0, messages queued} when the push would pass the bound.
_PUSH_BOUNDED = """
local queued = 0
for i = 2, #KEYS do queued = queued + redis.call('LLEN', KEYS[i]) end
local bound = tonumber(ARGV[1])
if queued + #ARGV - 2 + tonumber(ARGV[2]) > bound then return {0, queued} end
for start = 3, #ARGV, 1000 do
  redis.call('LPUSH', KEYS[1], unpack(ARGV, start, math.min(start + 999, #ARGV)))
end
return {1, queued + #ARGV - 2}
"""


def push(
    client: Any,
    key: str,
    messages: Sequence[str],
    per_command: int = 1000,
    *,
    bound: int | None = None,
    counted: Sequence[str] = (),
    replicas: ReplicaWait | None = None,
    coming: int = 0,
) -> tuple[bool, int] | None:
    """LPUSH ``messages`` to ``key`` in order, in one round trip.

    Args:
        key: the queue's list for the messages' priority.
        per_command: most messages per LPUSH.
        bound: most messages the queue may hold (``SWAPLESS_MAX_QUEUED``): all are pushed, or none.
        counted: the lists whose lengths count toward ``bound``.
        replicas: how many replicas must hold the messages before this returns.
        coming: messages the caller will push after these, counted against ``bound`` now.

    Returns:
        None without a bound; else ``(pushed, queued)``.

    Raises:
        ReplicasBehind: the messages were pushed, and too few replicas confirmed them.
    """
    pipe = client.pipeline(transaction=False)
    _push_commands(pipe, key, messages, per_command, bound, counted, replicas, coming)
    return _push_outcome(pipe.execute(), bound, replicas)


async def apush(
    client: Any,
    key: str,
    messages: Sequence[str],
    per_command: int = 1000,
    *,
    bound: int | None = None,
    counted: Sequence[str] = (),
    replicas: ReplicaWait | None = None,
) -> tuple[bool, int] | None:
    """``push`` through an asyncio redis-py client."""
    pipe = client.pipeline(transaction=False)
    _push_commands(pipe, key, messages, per_command, bound, counted, replicas)
    return _push_outcome(await pipe.execute(), bound, replicas)


def _push_commands(pipe: Any, key: str, messages: Sequence[str], per_command: int, bound: int | None,
                   counted: Sequence[str], replicas: ReplicaWait | None, coming: int = 0) -> None:
    if bound is not None:
        pipe.eval(_PUSH_BOUNDED, 1 + len(counted), key, *counted, bound, coming, *messages)
    else:
        for start in range(0, len(messages), per_command):
            pipe.lpush(key, *messages[start : start + per_command])
    if replicas is not None:
        pipe.execute_command(*replicas.command())


def _push_outcome(replies: list[Any], bound: int | None, replicas: ReplicaWait | None) -> tuple[bool, int] | None:
    if replicas is not None:
        waited = replies.pop()
        if bound is None or replies[0][0]:  # something was pushed: it must be on the replicas
            replicas.check(waited)
    if bound is None:
        return None
    pushed, queued = replies[0]
    return bool(pushed), int(queued)


# KEYS: the list to push to, the model's four lists (counted), its bell, its holders. ARGV: the bound (-1: none),
# now (ms), the messages still to come in later pushes of the same call (counted against the bound now), then the
# messages, in order. Rings the bell (one token at most). Returns {pushed (1/0), queued after (or now), live holders}.
_PUSH_MODEL = """
local bound = tonumber(ARGV[1])
local queued = 0
for i = 2, 5 do queued = queued + redis.call('LLEN', KEYS[i]) end
local n = #ARGV - 3
if bound >= 0 and queued + n + tonumber(ARGV[3]) > bound then return {0, queued, 0} end
for start = 4, #ARGV, 1000 do
  redis.call('LPUSH', KEYS[1], unpack(ARGV, start, math.min(start + 999, #ARGV)))
end
redis.call('LPUSH', KEYS[6], '1')
redis.call('LTRIM', KEYS[6], 0, 0)
return {1, queued + n, redis.call('ZCOUNT', KEYS[7], ARGV[2], '+inf')}
"""


@dataclass(frozen=True)
class ModelPush:
    """One model's messages for one priority, with those still ``coming`` and whether the bound applies."""

    keys: ModelKeys
    priority: int
    messages: Sequence[str]
    coming: int = 0
    bounded: bool = True


def push_to_models(
    client: Any, pushes: Sequence[ModelPush], *, bound: int | None, placement_bell: str,
    replicas: ReplicaWait | None = None,
) -> list[tuple[bool, int]]:
    """Push each model's messages to its own lists and ring its bell, in one round trip.

    The placement bell rings when a model has no live holder.

    Returns:
        per push, ``(pushed, queued)``.

    Raises:
        ReplicasBehind: messages were pushed, and too few replicas confirmed them.
    """
    pipe = client.pipeline(transaction=False)
    _model_push_commands(pipe, pushes, bound, replicas)
    replies = _checked(pipe.execute(), replicas)
    if _unheld(replies):
        client.pipeline(transaction=False).lpush(placement_bell, "1").ltrim(placement_bell, 0, 0).execute()
    return _model_push_outcomes(replies)


async def apush_to_models(
    client: Any, pushes: Sequence[ModelPush], *, bound: int | None, placement_bell: str,
    replicas: ReplicaWait | None = None,
) -> list[tuple[bool, int]]:
    """``push_to_models`` through an asyncio redis-py client."""
    pipe = client.pipeline(transaction=False)
    _model_push_commands(pipe, pushes, bound, replicas)
    replies = _checked(await pipe.execute(), replicas)
    if _unheld(replies):
        await client.pipeline(transaction=False).lpush(placement_bell, "1").ltrim(placement_bell, 0, 0).execute()
    return _model_push_outcomes(replies)


def _model_push_commands(pipe: Any, pushes: Sequence[ModelPush], bound: int | None,
                         replicas: ReplicaWait | None) -> None:
    now_ms = int(time.time() * 1000)
    for one in pushes:
        keys = one.keys
        pipe.eval(_PUSH_MODEL, 7, keys.list_for(one.priority), *keys.lists, keys.bell, keys.holders,
                  -1 if bound is None or not one.bounded else bound, now_ms, one.coming, *one.messages)
    if replicas is not None:
        pipe.execute_command(*replicas.command())


def _checked(replies: list[Any], replicas: ReplicaWait | None) -> list[Any]:
    """The pushes' replies, the ``WAIT``'s checked (when anything was pushed) and left off."""
    if replicas is None:
        return replies
    waited, replies = replies[-1], replies[:-1]
    if any(pushed for pushed, _, _ in replies):
        replicas.check(waited)
    return replies


def _unheld(replies: list[Any]) -> bool:
    """Whether a model was pushed to that no live worker holds (the placement bell then rings)."""
    return any(pushed and not holders for pushed, _, holders in replies)


def _model_push_outcomes(replies: list[Any]) -> list[tuple[bool, int]]:
    return [(bool(pushed), int(queued)) for pushed, queued, _ in replies]
