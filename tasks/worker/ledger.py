"""RequestLedger: the requests one worker holds, from admission until each is answered, given back or dropped.

It has its own lock; chunk items are the ``ChunkAssembler``'s. Nothing is acked before its result is stored.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from swapless.config.errors import SwaplessError
from swapless.manager import Job
from swapless.tasks.broker.acks import AckQueue
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.protocol import split_item_id
from swapless.tasks.tracing import TRACEPARENT_HEADER, trace_id_of
from swapless.tasks.worker.chunks import ChunkAssembler
from swapless.tasks.worker.delivery import Delivery
from swapless.tasks.worker.followups import Followups

__all__ = ["RequestLedger"]


class RequestLedger:
    """The requests one worker holds. Thread-safe.

    Args:
        acks: acks and requeues go through it.
        chunks: the chunks in progress.
        followups: what is done between a store and its ack (Celery's canvas, webhooks); None: nothing.
    """

    def __init__(self, acks: AckQueue, chunks: ChunkAssembler, followups: Followups | None = None) -> None:
        self._lock = threading.Lock()
        self.acks = acks
        self.chunks = chunks
        self.followups = followups
        self._deliveries: dict[str, Delivery] = {}
        self._duplicates: dict[str, list[Any]] = {}

    # -- admission (consumer thread) ----------------------------------------------------------------------------

    def admit(self, deliveries: Sequence[Delivery]) -> list[Job]:
        """Hold ``deliveries`` until each ends; returns their jobs for the backlog (none for a second copy)."""
        jobs: list[Job] = []
        with self._lock:
            for delivery in deliveries:
                if delivery.chunk:
                    jobs.extend(self.chunks.expand(delivery))
                elif delivery.id in self._deliveries:
                    self._duplicates.setdefault(delivery.id, []).append(delivery.request)
                else:
                    self._deliveries[delivery.id] = delivery
                    jobs.extend(delivery.jobs)
        return jobs

    # -- lookups -------------------------------------------------------------------------------------------------

    def delivery(self, job_id: str) -> Delivery:
        """The delivery of a held single job."""
        with self._lock:
            return self._deliveries[job_id]

    def live(self, job_id: str) -> bool:
        """Whether ``job_id`` is still this worker's to answer."""
        if split_item_id(job_id) is not None:
            return self.chunks.owns(job_id)
        with self._lock:
            return job_id in self._deliveries

    def unfinished(self, jobs: Sequence[Job]) -> list[Job]:
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
        models: Mapping[str, str] | None = None,
    ) -> None:
        """Store each ``(request, result, error)``, send its follow-ups, then ack it and its copies.

        Args:
            store: False for requests that have a result already: acked only.
            models: the model that served each request id.
        """
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

    def release(self, jobs: Sequence[Job]) -> list[Any]:
        """Forget the single jobs among ``jobs`` without an answer; returns their requests and copies, to requeue."""
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
