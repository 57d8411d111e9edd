"""Intake: the lean path from a fetched message to the scheduler, for the worker's own two tasks.

Messages that need none of Celery's ``Request`` (JSON, no ETA, task events off) skip it; any other message takes
Celery's own path.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from kombu.exceptions import ContentDisallowed, DecodeError

from swapless.config.describe import kind
from swapless.config.errors import InputError
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.protocol import CHUNK_TASK, PREDICT_TASK, SENT_AT_HEADER

__all__ = ["Intake", "LeanRequest", "answer_malformed", "eligible"]

logger = logging.getLogger(__name__)

_TASKS = frozenset((PREDICT_TASK, CHUNK_TASK))


def eligible(payload: dict[str, Any]) -> bool:
    """Whether a message (as kombu's transport delivers it) may take the lean path."""
    headers = payload.get("headers")
    return (
        isinstance(headers, dict)
        and headers.get("task") in _TASKS
        and headers.get("eta") is None
        and payload.get("content-type") == "application/json"
        and payload.get("content-encoding") in (None, "utf-8")
    )


def answer_malformed(results: ResultStore, message: Any, err: Exception) -> None:
    """Store an ``InputError`` under a message's id when the message is not a job (it is dropped)."""
    job_id = (getattr(message, "headers", None) or {}).get("id")
    if not isinstance(job_id, str):
        return
    if isinstance(err, ContentDisallowed):
        problem = f"message refused, nothing in it was decoded: {err}; send JSON"
    elif isinstance(err, DecodeError):
        problem = f"message body is not valid JSON ({err})"
    else:
        problem = f"malformed job message: expected args [model_id, input] ({type(err).__name__}: {err})"
    try:
        results.store([(job_id, None, InputError("?", problem))])
    except Exception:  # best effort: the message is dropped either way
        logger.warning("could not store the error of malformed message %s", job_id, exc_info=True)


class LeanRequest:
    """What the scheduler needs of a Celery request, and no more.

    Args:
        message: the kombu message (acks and rejects go through it, on the consumer thread).
        args: the task's positional args.
        kwargs: its keyword args.
        embed: Celery's canvas fields (None: none).
        defer: runs a callable on the consumer thread (kombu channels are not thread-safe).
    """

    __slots__ = ("acknowledged", "args", "defer", "delivery_info", "embed", "id", "kwargs", "message", "name",
                 "request_dict")

    def __init__(self, message: Any, args: Any, kwargs: Any, defer: Callable[[Callable[[], Any]], Any],
                 embed: Any = None) -> None:
        headers = message.headers
        self.message = message
        self.id: str = headers["id"]
        self.name: str = headers["task"]
        self.args = args
        self.kwargs = kwargs
        #: the message's embed (``callbacks``, ``errbacks``, ``chain``, ``chord``: ``swapless.tasks.worker.canvas``)
        self.embed = embed
        self.request_dict: dict[str, Any] = headers
        info = dict(message.delivery_info or {})
        info.setdefault("priority", (message.properties or {}).get("priority"))
        self.delivery_info = info
        self.acknowledged = False
        self.defer = defer

    def acknowledge(self) -> None:
        """Ack the message (the scheduler's ``AckQueue`` acks in bulk instead, when it has the consumer's thread)."""
        if not self.acknowledged:
            self.acknowledged = True
            self.defer(self.message.ack)

    def reject(self, requeue: bool = False) -> None:
        """Reject the message: back to the head of its list with ``requeue``, else dropped."""
        if not self.acknowledged:
            self.acknowledged = True
            self.defer(lambda: self.message.reject(requeue=requeue))

    def send_event(self, kind: str, **fields: Any) -> None:
        """Task events are off on the lean path (a worker with them on uses Celery's)."""


class Intake:
    """Turns fetched messages into ``LeanRequest``s for the scheduler.

    Args:
        submit: the scheduler's ``submit``.
        record_sent_at: told the ``(job id, send time)`` pairs of one hand-over's stamped jobs.
        answer_malformed: answers a message whose body is not a job with its error.
    """

    eligible = staticmethod(eligible)

    def __init__(
        self,
        submit: Callable[[Sequence[Any]], None],
        record_sent_at: Callable[[list[tuple[str, float]]], None],
        answer_malformed: Callable[[Any, Exception], None],
    ) -> None:
        self.submit = submit
        self.record_sent_at = record_sent_at
        self.answer_malformed = answer_malformed
        self.defer: Callable[[Callable[[], Any]], Any] = lambda call: call()

    def bind(self, call_soon: Callable[..., Any]) -> None:
        """Run acks and rejects on this consumer's thread from now on."""
        self.defer = call_soon

    def __call__(self, messages: Sequence[Any]) -> None:
        requests = []
        stamps: list[tuple[str, float]] = []
        for message in messages:
            try:
                body = json.loads(message.body)
            except ValueError as err:
                self._drop(message, DecodeError(str(err)))
                continue
            if not (
                isinstance(body, list) and len(body) == 3 and isinstance(body[0], list) and isinstance(body[1], dict)
            ):
                self._drop(message, TypeError(f"the body is {kind(body)}, not [args, kwargs, embed]"))
                continue
            args, kwargs, embed = body
            request = LeanRequest(message, args, kwargs, self.defer, embed or None)
            sent_at = request.request_dict.get(SENT_AT_HEADER)
            if isinstance(sent_at, (int, float)):
                stamps.append((request.id, float(sent_at)))
            requests.append(request)
        if stamps:
            self.record_sent_at(stamps)
        if requests:
            self.submit(requests)

    def _drop(self, message: Any, err: Exception) -> None:
        """Answer a message that is not a job with its error, and drop it."""
        self.answer_malformed(message, err)
        self.defer(message.ack)
