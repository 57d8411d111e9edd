"""Chunk messages: many inputs of one model in one queue message, one stored result for all of them.

A bulk producer sends ``swapless.predict_chunk`` messages whose args are ``[model_id, [input, ...]]``. The worker
expands each chunk into one ``Job`` per input (ids ``"<chunk id>:<index>"``) in the same backlog as single jobs, so
grouping, caching and failure isolation are exactly those of single jobs; one bad input fails alone. When every
item of a chunk has an outcome, the chunk's result is stored once, as a list in input order::

    [{"ok": <prediction>}, {"error": "bad input for model 'sentiment': empty text ...", "type": "InputError",
      "args": ["sentiment", "empty text ..."]}, ...]

and only then is the chunk's message acked. A chunk whose payload is malformed, or that names an unknown model,
fails as a whole (its stored result is that error, like a single job's).

Everything here is plain data: no Redis, no Celery, no torch. ``ChunkAssembler`` is what the batch scheduler holds;
``encode_outcome`` / ``decode_outcome`` are shared by the worker and the client.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from manager import errors as _errors
from manager.errors import InputError, JobFailed, SwaplessError
from manager.runner import Job, Outcome
from manager.store import ModelStore

__all__ = [
    "CHUNK_TASK",
    "ChunkAssembler",
    "decode_outcome",
    "encode_outcome",
    "item_id",
    "jobs_from_chunk",
    "read_payload",
    "split_item_id",
]

#: The task name chunk messages are sent to; args are ``[model_id, [input, ...]]``.
CHUNK_TASK = "swapless.predict_chunk"
#: Celery's priority at or above which a message is bulk work (tasks.app.PRIORITY_BULK; repeated to stay pure).
_PRIORITY_BULK = 6


def item_id(chunk_id: str, index: int) -> str:
    """The id of item ``index`` of a chunk: ``"<chunk id>:<index>"`` (Celery ids never contain a colon)."""
    return f"{chunk_id}:{index}"


def split_item_id(job_id: str) -> tuple[str, int] | None:
    """``(chunk id, index)`` for an item id made by ``item_id``, else None."""
    chunk_id, sep, index = job_id.rpartition(":")
    if not sep or not chunk_id or not index.isdigit():
        return None
    return chunk_id, int(index)


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


def decode_outcome(item: Any, job_id: str = "?") -> tuple[bool, Any]:
    """``(True, prediction)`` or ``(False, error)`` for one stored item outcome.

    The error is rebuilt as the very Swapless error the worker raised when its type and args are known here
    (``InputError``, ``PredictionFailed``, ...), else it is a ``JobFailed`` naming the type and message.
    """
    if isinstance(item, dict) and "ok" in item:
        return True, item["ok"]
    if not isinstance(item, dict) or "error" not in item:
        return False, JobFailed(job_id, "MalformedResult", f"unexpected item outcome {item!r:.200}")
    error_type = str(item.get("type", "Error"))
    cls = getattr(_errors, error_type, None)
    args = item.get("args")
    if isinstance(cls, type) and issubclass(cls, SwaplessError) and isinstance(args, list):
        try:
            return False, cls(*args)
        except TypeError:
            pass  # a worker of another version with other args: fall through
    return False, JobFailed(job_id, error_type, str(item["error"]))


def read_payload(request: Any, kind: str, expected: str) -> tuple[str, Any, bool]:
    """``(model_id, value, urgent)`` of a job or chunk request whose args must be ``[model_id, value]``.

    Args:
        request: a Celery request (or anything with ``args``, ``kwargs``, ``delivery_info``).
        kind: ``job`` or ``chunk``, for the message.
        expected: the args' shape, for the message (``[model_id, input]``).

    Raises:
        InputError: the args are not two values, there are kwargs, or the model id is not a string.
    """
    args = request.args
    if not isinstance(args, (list, tuple)) or len(args) != 2 or request.kwargs:
        raise InputError("?", f"malformed {kind} payload: expected args {expected} and no kwargs")
    model_id, value = args
    if not isinstance(model_id, str):
        raise InputError("?", f"malformed {kind} payload: model id must be a string, not {type(model_id).__name__}")
    priority = (getattr(request, "delivery_info", None) or {}).get("priority")
    return model_id, value, priority is None or priority < _PRIORITY_BULK


def jobs_from_chunk(request: Any, store: ModelStore, received_s: float) -> list[Job]:
    """The item Jobs of one chunk request (a Celery request or anything with ``id``, ``args``, ``kwargs``).

    Raises:
        InputError: the payload is not ``[model_id, [input, ...]]`` with at least one input.
        UnknownModel: the model id is not in the registry.
    """
    model_id, values, urgent = read_payload(request, "chunk", "[model_id, [input, ...]]")
    if not isinstance(values, (list, tuple)) or not values:
        raise InputError(model_id, "malformed chunk payload: inputs must be a non-empty list")
    spec = store.get(model_id)
    return [
        Job(id=item_id(request.id, index), model_id=spec.id, input=value, received_s=received_s, urgent=urgent)
        for index, value in enumerate(values)
    ]


@dataclass
class _Pending:
    requests: list[Any]
    outcomes: list[dict[str, Any] | None]
    missing: int = field(init=False)

    def __post_init__(self) -> None:
        self.missing = len(self.outcomes)


class ChunkAssembler:
    """Chunks in progress in one worker: expands chunk requests into Jobs, collects their Outcomes back.

    Thread-safe: ``expand`` runs in the consumer thread, ``collect`` in the scheduler thread.

    A second delivery of a chunk that is still in progress here (same id) adds no jobs: it is acked together with
    the first when the chunk completes.
    """

    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Chunks in progress."""
        with self._lock:
            return len(self._pending)

    def expand(self, request: Any, store: ModelStore, received_s: float) -> list[Job]:
        """Register a chunk request and return its item Jobs for the backlog.

        Raises:
            InputError, UnknownModel: the whole chunk fails (see ``jobs_from_chunk``); nothing is registered.
        """
        jobs = jobs_from_chunk(request, store, received_s)
        with self._lock:
            pending = self._pending.get(request.id)
            if pending is not None:
                pending.requests.append(request)
                return []
            self._pending[request.id] = _Pending([request], [None] * len(jobs))
        return jobs

    def owns(self, job_id: str) -> bool:
        """Whether ``job_id`` is an item of a chunk in progress here."""
        parts = split_item_id(job_id)
        if parts is None:
            return False
        with self._lock:
            return parts[0] in self._pending

    def collect(self, outcomes: Sequence[Outcome]) -> tuple[list[Outcome], list[tuple[Any, Any, SwaplessError | None]]]:
        """Take the outcomes of chunk items; return the other outcomes and the chunks now complete.

        Returns:
            ``(others, done)``: ``others`` are the outcomes of plain jobs, in order; ``done`` holds one
            ``(request, chunk_result, None)`` per request of each chunk that has all its outcomes now, ready to be
            stored and acked like a plain job's ``(request, result, error)``.
        """
        others: list[Outcome] = []
        done: list[tuple[Any, Any, SwaplessError | None]] = []
        with self._lock:
            for outcome in outcomes:
                parts = split_item_id(outcome.job.id)
                pending = self._pending.get(parts[0]) if parts is not None else None
                if parts is None or pending is None:
                    others.append(outcome)
                    continue
                chunk_id, index = parts
                if pending.outcomes[index] is None:
                    pending.missing -= 1
                pending.outcomes[index] = encode_outcome(outcome.result, outcome.error)
                if pending.missing == 0:
                    del self._pending[chunk_id]
                    done.extend((request, pending.outcomes, None) for request in pending.requests)
        return others, done
