"""What a client's messages carry on their way out: trace context, webhook headers, and chunks sent one by one."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from swapless.config.errors import DeadlinePassed
from swapless.config.settings import Settings
from swapless.tasks.client.publisher import Publisher, Routed
from swapless.tasks.protocol import CALLBACK_URL_HEADER, CHUNK_TASK, KEYS_HEADER, expires_header
from swapless.tasks.tracing import sending
from swapless.tasks.webhooks import allowed_hosts, check_target

__all__ = ["ChunkSender", "batched", "callback_headers", "deadline_of", "message_id", "one_model", "traced"]


def batched(values: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """``values`` in lists of ``size`` (the last one shorter)."""
    if size < 1:
        raise ValueError(f"chunk_size must be at least 1, not {size}")
    iterator = iter(values)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def traced(headers: Sequence[dict[str, Any]] | None, trace: dict[str, str] | None, count: int
           ) -> Sequence[dict[str, Any]] | None:
    """``count`` jobs' message headers with the trace context ``trace`` (None: none to carry) added."""
    if trace is None:
        return headers
    if headers is None:
        return [trace] * count
    return [{**h, **trace} for h in headers]


def one_model(model_ids: Iterable[str]) -> str | None:
    """The model every job addresses, when they all address one."""
    ids = set(model_ids)
    return next(iter(ids)) if len(ids) == 1 else None


def message_id(routed: Sequence[Routed]) -> dict[str, str] | None:
    """The ``messaging.message.id`` of a send of one job."""
    return {"messaging.message.id": routed[0].job_id} if len(routed) == 1 else None


def callback_headers(settings: Settings, callback_url: str | None, count: int) -> list[dict[str, Any]] | None:
    """The message headers of ``count`` jobs with ``callback_url``, or None without one. The URL is checked here
    without DNS; the worker's sender checks it again before each attempt.

    Raises:
        WebhookRefused: the URL is not http(s) or names a host the allow-list does not.
    """
    if callback_url is None:
        return None
    check_target(callback_url, allowed_hosts(settings.webhooks.webhook_allowed_hosts))
    return [{CALLBACK_URL_HEADER: callback_url} for _ in range(count)]


def deadline_of(expires: float | datetime | None) -> datetime | None:
    """``expires`` fixed now as a datetime, for every chunk sent under it."""
    header = expires_header(expires)
    return datetime.fromisoformat(header) if header is not None else None


class ChunkSender:
    """Sends the chunks of one model, one message each; a ``ChunkStream``'s ``send``.

    Args:
        publisher: publishes the messages.
        queue: the queue's name, for the send's trace span.
        model_id: the model every chunk addresses.
        level: the priority level of every chunk.
        deadline: one deadline for every chunk (None: none); no chunk is sent after it.
        callback: the webhook header of every chunk (empty: none).
    """

    def __init__(self, publisher: Publisher, queue: str, model_id: str, level: int, deadline: datetime | None,
                 callback: dict[str, Any]) -> None:
        self.publisher = publisher
        self.queue = queue
        self.model_id = model_id
        self.level = level
        self.deadline = deadline
        self.callback = callback

    def __call__(self, inputs: list[Any], keys: list[str | None] | None = None) -> str:
        """Send one chunk of ``inputs`` (with one sticky key each, if any). Returns its message id.

        Raises:
            DeadlinePassed: the deadline has passed.
        """
        deadline = self.deadline
        if deadline is not None and deadline <= datetime.now(UTC):
            raise DeadlinePassed(deadline.isoformat(timespec="seconds"))
        extra = {**self.callback, **({KEYS_HEADER: keys} if keys is not None and any(k is not None for k in keys)
                                     else {})}
        with sending(self.queue, 1, self.model_id, {"swapless.chunk.inputs": len(inputs)}) as trace:
            headers = traced([extra] if extra else None, trace, 1)
            return self.publisher.publish(CHUNK_TASK, [(self.model_id, inputs)], self.level, headers=headers,
                                          expires=deadline)[0]
