"""What producers and workers share: task names, priorities, headers, chunk item ids, the payload of a job
message, and the encoding of one item's outcome in a chunk's result. Plain data and pure functions.

A job is a Celery protocol-2 message to ``PREDICT_TASK`` with args ``[model_id, input]``; a chunk one to
``CHUNK_TASK`` with args ``[model_id, [input, ...]]``, its items ``"<chunk id>:<index>"``, its one result a list of
``encode_outcome`` dicts in input order.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from datetime import UTC, datetime, timedelta
from typing import Any

from swapless.config import errors as _errors
from swapless.config.errors import InputError, JobFailed, SwaplessError

__all__ = [
    "CALLBACK_OWNER_HEADER",
    "CALLBACK_URL_HEADER",
    "CHUNK_TASK",
    "KEYS_HEADER",
    "PREDICT_TASK",
    "PRIORITIES",
    "PRIORITY_BULK",
    "PRIORITY_INTERACTIVE",
    "PRIORITY_STEPS",
    "SENT_AT_HEADER",
    "SHADOWED_HEADER",
    "SHADOW_HEADER",
    "decode_outcome",
    "encode_outcome",
    "is_urgent",
    "item_id",
    "message_args",
    "new_ids",
    "normal_args",
    "priority_level",
    "read_payload",
    "split_item_id",
    "storage_id",
]

#: The task single jobs are sent to; args are ``[model_id, input]``.
PREDICT_TASK = "swapless.predict"
#: The task chunk messages are sent to; args are ``[model_id, [input, ...]]``.
CHUNK_TASK = "swapless.predict_chunk"

#: Message priorities (Redis transport: 0 is served first). Interactive jobs overtake queued bulk work.
PRIORITY_INTERACTIVE = 0
PRIORITY_BULK = 6
#: The names producers use for them.
PRIORITIES = {"interactive": PRIORITY_INTERACTIVE, "bulk": PRIORITY_BULK}
#: The Redis transport's priority sub-queues (``queue``, ``queue\x06\x163``, ...), in the order they are served.
PRIORITY_STEPS = (PRIORITY_INTERACTIVE, 3, PRIORITY_BULK, 9)
#: Message header with the producer's wall-clock send time (epoch seconds): the worker measures queue wait from it.
SENT_AT_HEADER = "swapless_sent_at"
#: Header of a job (or chunk) whose final state is to be sent to this URL as a signed webhook (``callback_url``).
CALLBACK_URL_HEADER = "swapless_callback_url"
#: Header of a job sent through the gateway with a ``callback_url``: the API key (its owner label) its webhook
#: counts against (``SWAPLESS_WEBHOOK_MAX_PENDING_PER_KEY``).
CALLBACK_OWNER_HEADER = "swapless_callback_owner"
#: Header of a chunk message: how many inputs it carries (a worker's hold of a model counts jobs, not messages).
ITEMS_HEADER = "swapless_items"
#: Header of a chunk sent to a route with sticky keys: one key (or null) per input, in order.
KEYS_HEADER = "swapless_keys"
#: Header of a shadow copy of a routed job: ``[served job id, route id]`` (``swapless.manager.registry.routing``).
SHADOW_HEADER = "swapless_shadow_of"
#: Header of a routed job that has shadow copies: its worker keeps its top label for them (``shadow_ref_key``).
SHADOWED_HEADER = "swapless_shadowed"


def new_ids(count: int) -> list[str]:
    """``count`` fresh UUID4 strings, from one read of the system's random source."""
    raw = bytearray(os.urandom(16 * count))
    ids = []
    for start in range(0, 16 * count, 16):
        raw[start + 6] = (raw[start + 6] & 0x0F) | 0x40  # version 4
        raw[start + 8] = (raw[start + 8] & 0x3F) | 0x80  # RFC 4122 variant
        h = raw[start : start + 16].hex()
        ids.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return ids


def priority_level(priority: str) -> int:
    """The Redis priority of ``interactive`` or ``bulk``.

    Raises:
        ValueError: another name; the message lists the choices.
    """
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, not {priority!r}")
    return PRIORITIES[priority]


def is_urgent(level: int | None) -> bool:
    """Whether a message of Redis priority ``level`` is interactive work (no priority: interactive)."""
    return level is None or level < PRIORITY_BULK


def normal_args(args: Any, kwargs: Any) -> list[Any] | None:
    """``[model_id, value]`` from a job's or chunk's args and kwargs; None for any other shape.

    ``model_id`` may be a keyword, with the value the one positional arg (a chain's next step) or ``input``.
    """
    if not isinstance(args, (list, tuple)):
        return None
    if not kwargs:
        return list(args) if len(args) == 2 else None
    if not isinstance(kwargs, dict) or set(kwargs) - {"model_id", "input"} or "model_id" not in kwargs:
        return None
    if "input" in kwargs:
        return [kwargs["model_id"], kwargs["input"]] if not args else None
    return [kwargs["model_id"], args[0]] if len(args) == 1 else None


def message_args(message: dict[str, Any]) -> list[Any] | None:
    """The task args of a kombu message as it lies in Redis (``normal_args``); None when they cannot be read."""
    try:
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args, kwargs = json.loads(body)[:2]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, binascii.Error):
        return None
    return normal_args(args, kwargs)


def item_id(chunk_id: str, index: int) -> str:
    """The id of item ``index`` of a chunk: ``"<chunk id>:<index>"`` (Celery ids never contain a colon)."""
    return f"{chunk_id}:{index}"


def storage_id(job_id: str) -> str:
    """The id a job's result is stored under: its chunk's id for a chunk item, else its own."""
    parts = split_item_id(job_id)
    return parts[0] if parts is not None else job_id


def split_item_id(job_id: str) -> tuple[str, int] | None:
    """``(chunk id, index)`` for an item id made by ``item_id``, else None."""
    chunk_id, sep, index = job_id.rpartition(":")
    if not sep or not chunk_id or not index.isdigit():
        return None
    return chunk_id, int(index)


def read_payload(request: Any, kind: str, expected: str) -> tuple[str, Any, bool]:
    """``(model_id, value, urgent)`` of a job or chunk request.

    Args:
        request: a Celery request (or anything with ``args``, ``kwargs``, ``delivery_info``).
        kind: ``job`` or ``chunk``, for the message.
        expected: the args' shape, for the message.

    Raises:
        InputError: the args have another shape, or the model id is not a string.
    """
    args = normal_args(request.args, request.kwargs)
    if args is None:
        raise InputError("?", f"malformed {kind} payload: expected args {expected} and no kwargs, or args [value] "
                              "and the keyword model_id")
    model_id, value = args
    if not isinstance(model_id, str):
        raise InputError("?", f"malformed {kind} payload: model id must be a string, not {type(model_id).__name__}")
    priority = (getattr(request, "delivery_info", None) or {}).get("priority")
    return model_id, value, is_urgent(priority)


def deadline_of(request: Any) -> float | None:
    """A job's deadline (epoch seconds) from its ``expires`` header; None: none, or unreadable."""
    headers = getattr(request, "request_dict", None) or {}
    expires = headers.get("expires")
    if expires is None:
        return None
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        return float(expires)
    if isinstance(expires, str):
        try:
            when = datetime.fromisoformat(expires)
        except ValueError:
            return None
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    return None


def expires_header(expires: float | datetime | None) -> str | None:
    """The ``expires`` header for this deadline (seconds from now, or a datetime; naive is UTC), as Celery writes it.

    Raises:
        ValueError: the deadline is not in the future.
    """
    if expires is None:
        return None
    now = datetime.now(UTC)
    if isinstance(expires, datetime):
        when = expires if expires.tzinfo else expires.replace(tzinfo=UTC)
    elif isinstance(expires, (int, float)) and not isinstance(expires, bool):
        when = now + timedelta(seconds=float(expires))
    else:
        # ValueError, as for a datetime in the past: callers catch one error for any unusable ``expires``
        raise ValueError(f"expires must be seconds from now or a datetime, not {type(expires).__name__}")  # noqa: TRY004
    if when <= now:
        raise ValueError(f"expires ({when.isoformat()}) is not in the future: give seconds from now (> 0) or a later "
                         "datetime")
    return when.isoformat()


def deadline_text(deadline: float) -> str:
    """A deadline as a user reads it (ISO, UTC, to the millisecond)."""
    return datetime.fromtimestamp(deadline, UTC).isoformat(timespec="milliseconds")


def encode_outcome(result: Any, error: BaseException | None) -> dict[str, Any]:
    """One item's outcome as stored in a chunk result: ``{"ok": result}`` or ``{"error", "type", "args"}``."""
    if error is None:
        return {"ok": result}
    encoded: dict[str, Any] = {"error": str(error), "type": type(error).__name__}
    try:
        json.dumps(error.args)
        encoded["args"] = list(error.args)
    except (TypeError, ValueError):
        pass  # the message and type still say what went wrong
    return encoded


def _error_class(name: str) -> type[SwaplessError] | None:
    cls = getattr(_errors, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, SwaplessError) else None


def decode_outcome(item: Any, job_id: str = "?") -> tuple[bool, Any]:
    """``(True, prediction)`` or ``(False, error)`` for one stored item outcome, the error rebuilt as raised."""
    if isinstance(item, dict) and "ok" in item:
        return True, item["ok"]
    if not isinstance(item, dict) or "error" not in item:
        return False, JobFailed(job_id, "MalformedResult", f"unexpected item outcome {item!r:.200}")
    error_type = str(item.get("type", "Error"))
    cls = _error_class(error_type)
    args = item.get("args")
    if cls is not None and isinstance(args, list):
        try:
            return False, cls(*args)
        except TypeError:
            pass  # a worker of another version with other args: fall through
    return False, JobFailed(job_id, error_type, str(item["error"]))
