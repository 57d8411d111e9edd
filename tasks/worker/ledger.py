"""How each request a worker holds ends: answered (its result or error stored, then its message acked), dropped
(acked without running: it had a result already), given back (its message requeued), or kept for another try;
and the worker's counts of each.

``RequestLedger`` holds every single-job delivery from admission until its end, the second copies of messages it
already holds (a producer's publish retry, a redelivery: run once, acked with the first), and the requests to
answer with an error without running (malformed, unknown model). The items of chunks are the ``ChunkAssembler``'s.
Nothing is acked before its result is stored.

Thread-safe: it shares the scheduler's lock (reentrant), so that the backlog and the ledger change together.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from swapless.config.errors import SwaplessError
from swapless.manager import WorkItem
from swapless.tasks.broker.acks import AckQueue
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.protocol import split_item_id
from swapless.tasks.tracing import TRACEPARENT_HEADER, trace_id_of
from swapless.tasks.worker.chunks import ChunkAssembler
from swapless.tasks.worker.delivery import Delivery
from swapless.tasks.worker.followups import Followups

__all__ = ["RequestLedger"]


class RequestLedger:
    """The requests one worker holds, and how each ends (see the module docstring).

    Args:
        lock: the scheduler's lock (an ``RLock`` or a ``Condition`` over one).
        acks: acks and requeues go through it.
        chunks: the chunks in progress.
        followups: what is done between a store and its ack (Celery's canvas, webhooks); None: nothing.
    """

    def __init__(self, lock: threading.Condition, acks: AckQueue, chunks: ChunkAssembler,
                 followups: Followups | None = None) -> None:
        self._lock = lock
        self.acks = acks
        self.chunks = chunks
        self.followups = followups
        self._deliveries: dict[str, Delivery] = {}
        self._duplicates: dict[str, list[Any]] = {}
        self._rejected: list[tuple[Any, SwaplessError]] = []
        self.jobs_done = 0
        self.jobs_failed = 0  # expired jobs included: their result is a failure
        self.jobs_expired = 0
        self.jobs_cancelled = 0

    # -- admission (consumer thread) ----------------------------------------------------------------------------

    def admit(self, delivery: Delivery) -> list[WorkItem]:
        """Hold ``delivery`` until it ends; returns its jobs for the backlog (none for a second copy)."""
        with self._lock:
            if delivery.chunk:
                return self.chunks.expand(delivery)
            if delivery.id in self._deliveries:
                self._duplicates.setdefault(delivery.id, []).append(delivery.request)
                return []
            self._deliveries[delivery.id] = delivery
            return list(delivery.jobs)

    def reject(self, request: Any, err: SwaplessError) -> None:
        """Answer ``request`` with ``err`` without running it (on the scheduler's next turn)."""
        with self._lock:
            self._rejected.append((request, err))

    @property
    def has_rejected(self) -> bool:
        return bool(self._rejected)

    def take_rejected(self) -> list[tuple[Any, SwaplessError]]:
        with self._lock:
            rejected, self._rejected = self._rejected, []
        return rejected

    # -- lookups -------------------------------------------------------------------------------------------------

    def delivery(self, job_id: str) -> Delivery:
        """The delivery of a held single job."""
        with self._lock:
            return self._deliveries[job_id]

    def live(self, job_id: str) -> bool:
        """Whether ``job_id`` is still this worker's to answer (not dropped as cancelled or done elsewhere)."""
        if split_item_id(job_id) is not None:
            return self.chunks.owns(job_id)
        with self._lock:
            return job_id in self._deliveries

    def unfinished(self, jobs: Sequence[WorkItem]) -> list[WorkItem]:
        """Those of ``jobs`` that have no outcome yet."""
        with self._lock:
            return [job for job in jobs if job.id in self._deliveries or self.chunks.waiting_for(job.id)]

    def single(self, job_ids: Collection[str]) -> list[Any]:
        """The requests of the held single jobs among ``job_ids``."""
        with self._lock:
            return [self._deliveries[i].request for i in job_ids if i in self._deliveries]

    # -- endings -------------------------------------------------------------------------------------------------

    def finish(
        self,
        results: ResultStore,
        items: Sequence[tuple[Any, Any, SwaplessError | None]],
        *,
        store: bool = True,
        count: bool = True,
        models: Mapping[str, str] | None = None,
    ) -> None:
        """End requests: store each ``(request, result, error)`` (unless ``store`` is off: a job with a result
        already), then send its follow-ups (``swapless.tasks.worker.followups``), then ack it and its copies; count it
        done or failed (unless ``count`` is off)."""
        if store:
            results.store([(request.id, result, error) for request, result, error in items], models=models,
                          traces=_trace_ids(items))
            if self.followups is not None:
                self.followups.stored(results, items, models)
        with self._lock:  # stored: the requests leave the ledger only now
            for request, _, _ in items:
                self._deliveries.pop(request.id, None)
            copies = [dup for request, _, _ in items for dup in self._duplicates.pop(request.id, [])]
        self.acks.ack([request for request, _, _ in items] + copies)  # only once the results are stored
        if count:
            for _, _, error in items:
                if error is None:
                    self.jobs_done += 1
                else:
                    self.jobs_failed += 1

    def release(self, jobs: Sequence[WorkItem]) -> list[Any]:
        """Forget the single jobs among ``jobs`` without an answer; returns their requests and copies, to requeue
        (``hand_over``, ``give_back``)."""
        with self._lock:
            requests = [self._deliveries.pop(job.id).request for job in jobs if job.id in self._deliveries]
            requests += [dup for job in jobs for dup in self._duplicates.pop(job.id, [])]
        return requests


def _trace_ids(items: Sequence[tuple[Any, Any, Any]]) -> dict[str, str]:
    """Request id -> the trace id of its producer, for the requests whose message carried one."""
    found = {}
    for request, _, _ in items:
        headers = getattr(request, "request_dict", None)
        trace_id = trace_id_of(headers.get(TRACEPARENT_HEADER)) if headers else None
        if trace_id is not None:
            found[request.id] = trace_id
    return found
