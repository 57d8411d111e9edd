"""The producer side of chunked jobs: send chunks, keep a bounded number in flight, read results back in order.

At most ``max_in_flight`` chunks are sent and not yet yielded, so memory stays flat; each chunk's result is
deleted once read. The wait is on the head chunk only, cut in slices of ``WATCHDOG_S`` to call the ``watchdog``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from celery import states

from swapless.config.errors import JobCancelled, JobFailed, JobTimeout, QueueFull
from swapless.tasks.broker.results import ALREADY_DONE, ResultStore
from swapless.tasks.client.consumer import ResultConsumer
from swapless.tasks.protocol import decode_outcome, item_id

__all__ = ["DEFAULT_CHUNK_SIZE", "DEFAULT_MAX_IN_FLIGHT", "WATCHDOG_S", "ChunkEvent", "ChunkStream"]

logger = logging.getLogger(__name__)

#: Inputs per chunk message (see bench/BULK_RESULTS.md: throughput is flat from about 64 up; 256 matches the
#: scheduler's default group, SWAPLESS_MAX_GROUP, so one chunk is one group).
DEFAULT_CHUNK_SIZE = 256
#: Chunks sent and not yet read back, per producer: enough to keep a few workers busy while results come back.
DEFAULT_MAX_IN_FLIGHT = 8
#: Seconds without the head chunk finishing before a "still waiting" event (is a worker running?).
STALL_NOTICE_S = 30.0
#: Longest time between two calls of the ``watchdog`` while the head chunk is waited for, in seconds.
WATCHDOG_S = 0.5
#: How long a refused chunk (QueueFull: Redis out of memory, or the queue at SWAPLESS_MAX_QUEUED) is sent again
#: before the stream gives up, by default; the pause between tries grows from 0.5 s to 5 s.
DEFAULT_REFUSED_WAIT_S = 600.0

T = TypeVar("T")


@dataclass(frozen=True)
class ChunkEvent:
    """What ``ChunkStream`` reports to its ``on_event`` hook.

    Attributes:
        kind: ``sent``, ``done`` (its results were read), ``waiting`` (the head chunk has had no result for
            ``waited_s``; every ``STALL_NOTICE_S``) or ``refused`` (``QueueFull``: sent again shortly; see ``detail``).
        chunk_id: the chunk's id; empty for a chunk with no inputs (nothing is sent).
        size: inputs in the chunk.
        in_flight: chunks sent and not yet read back, after this event.
        waited_s: seconds since the chunk was sent.
    """

    kind: str
    chunk_id: str
    size: int
    in_flight: int
    waited_s: float = 0.0
    detail: str = ""


@dataclass
class _Sent(Generic[T]):
    tag: T
    chunk_id: str
    size: int
    sent_s: float
    notified_s: float = 0.0


class ChunkStream:
    """Sends chunks of one model's inputs and yields their outcomes in order (``Client.stream`` builds one).

    Args:
        send: sends one chunk of these inputs (and their routing keys, if any); returns its id.
        results: where the chunks' results are deleted once read (and chunks left in flight cancelled).
        consumer: what waits for each chunk's result.
        max_in_flight: chunks sent and not yet read back, at most (at least 1).
        timeout_s: fail with JobTimeout when the head chunk has no result this long after it was sent (None: wait).
        forget: delete each chunk's result from Redis once read.
        refused_wait_s: how long a refused chunk is sent again before the stream raises.
        on_event: called with a ``ChunkEvent`` on every send, completion, refusal and stall notice.
        watchdog: called every ``WATCHDOG_S`` while waiting; raise from it to stop.
    """

    def __init__(
        self,
        send: Callable[..., str],
        results: ResultStore,
        consumer: ResultConsumer,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        timeout_s: float | None = None,
        forget: bool = True,
        refused_wait_s: float = DEFAULT_REFUSED_WAIT_S,
        on_event: Callable[[ChunkEvent], None] | None = None,
        watchdog: Callable[[], None] | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.send = send
        self.results = results
        self.consumer = consumer
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.forget = forget
        self.refused_wait_s = refused_wait_s
        self.on_event = on_event
        self.watchdog = watchdog

    def run(
        self, chunks: Iterable[tuple[T, list[Any]] | tuple[T, list[Any], list[str | None] | None]]
    ) -> Iterator[tuple[T, list[tuple[bool, Any]]]]:
        """Send ``(tag, inputs[, routing keys])`` chunks, read lazily; yield ``(tag, outcomes)`` per chunk, in order.

        ``outcomes`` has one ``(True, prediction)`` or ``(False, error)`` per input; a chunk that failed whole gives
        every item its error; a chunk with no inputs is not sent and has no outcomes.

        Raises:
            JobTimeout: ``timeout_s`` passed with the head chunk still unfinished.
            QueueFull: the queue refused a chunk for ``refused_wait_s``.
            QueueUnavailable: Redis went away.
        """
        window: deque[_Sent[T]] = deque()
        source = iter(chunks)
        exhausted = False
        try:
            while True:
                while not exhausted and len(window) < self.max_in_flight:
                    try:
                        tag, inputs, *rest = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    chunk_id = self._send(inputs, window, rest[0] if rest else None) if inputs else ""
                    window.append(_Sent(tag, chunk_id, len(inputs), time.monotonic()))
                    if chunk_id:
                        self._emit("sent", chunk_id, len(inputs), window)
                if not window:
                    return
                head = window[0]
                outcomes = self._wait(head, window) if head.chunk_id else []
                window.popleft()
                if head.chunk_id:
                    self._emit("done", head.chunk_id, head.size, window)
                yield head.tag, outcomes
        finally:
            # Chunks still in flight (the caller stopped early, Ctrl-C): nobody will read them, so they are cancelled
            # (the workers drop them unrun, even those with items computed already); results already stored go.
            ids = [sent.chunk_id for sent in window if sent.chunk_id]
            if ids:
                self._abandon(ids)

    def _abandon(self, chunk_ids: list[str]) -> None:
        try:
            answers = self.results.cancel(chunk_ids, JobCancelled)
            done = [chunk_id for chunk_id, answer in answers.items() if answer == ALREADY_DONE]
            if self.forget and done:
                self.results.forget(done)
            logger.info("cancelled %d chunk(s) still in flight", len(chunk_ids) - len(done))
        except Exception:  # noqa: BLE001 - best effort on the way out; results expire anyway
            logger.warning("could not cancel %d chunk(s) still in flight; the workers will compute them for nothing",
                           len(chunk_ids))

    def _send(self, inputs: list[Any], window: deque[_Sent[T]], keys: list[str | None] | None = None) -> str:
        """Send one chunk (with its inputs' routing keys, if any); while the queue refuses it (``QueueFull``), wait
        and send it again, up to a bound."""
        started = time.monotonic()
        pause_s = 0.5
        while True:
            try:
                return self.send(inputs, keys) if keys is not None else self.send(inputs)
            except QueueFull as err:
                waited_s = time.monotonic() - started
                if waited_s + pause_s > self.refused_wait_s:
                    raise
                self._emit("refused", "", len(inputs), window, waited_s, detail=str(err))
                if self.watchdog is not None:
                    self.watchdog()
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 5.0)

    def _wait(self, head: _Sent[T], window: deque[_Sent[T]]) -> list[tuple[bool, Any]]:
        with self.consumer.watch([head.chunk_id]) as watch:
            while True:
                stored = watch.wait(self._slice_s(head))[0]
                if stored.ready:
                    break
                if self.watchdog is not None:
                    self.watchdog()
                waited_s = time.monotonic() - head.sent_s
                if self.timeout_s is not None and waited_s >= self.timeout_s:
                    raise JobTimeout(head.chunk_id, self.timeout_s, stored.state)
                if waited_s - head.notified_s >= STALL_NOTICE_S:
                    head.notified_s = waited_s
                    self._emit("waiting", head.chunk_id, head.size, window, waited_s)
        if self.forget:
            self.results.forget([head.chunk_id])
        return self._outcomes(head, stored.state, stored.value)

    def _slice_s(self, head: _Sent[T]) -> float:
        """How long to wait for the head chunk before looking up: the next watchdog call, stall notice or timeout."""
        waited_s = time.monotonic() - head.sent_s
        until = [head.notified_s + STALL_NOTICE_S - waited_s]
        if self.watchdog is not None:
            until.append(WATCHDOG_S)
        if self.timeout_s is not None:
            until.append(self.timeout_s - waited_s)
        return max(0.0, min(until))

    @staticmethod
    def _outcomes(head: _Sent[T], state: str, value: Any) -> list[tuple[bool, Any]]:
        if state == states.SUCCESS and isinstance(value, list) and len(value) == head.size:
            return [decode_outcome(item, item_id(head.chunk_id, i)) for i, item in enumerate(value)]
        if state == states.SUCCESS:
            error: BaseException = JobFailed(head.chunk_id, "MalformedResult", f"a {type(value).__name__} of outcomes")
        elif isinstance(value, BaseException):
            error = value  # the whole chunk failed (unknown model, malformed payload): every item fails with it
        else:
            error = JobFailed(head.chunk_id, state, repr(value))
        return [(False, error)] * head.size

    def _emit(
        self, kind: str, chunk_id: str, size: int, window: deque[_Sent[T]], waited_s: float = 0.0, detail: str = ""
    ) -> None:
        if self.on_event is not None:
            in_flight = sum(1 for sent in window if sent.chunk_id)
            self.on_event(ChunkEvent(kind, chunk_id, size, in_flight, waited_s, detail))
