"""ChunkAssembler: a chunk message's items collected back into its one result. Plain data.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from swapless.config.errors import SwaplessError
from swapless.manager import Job, Outcome
from swapless.tasks.protocol import encode_outcome, split_item_id
from swapless.tasks.worker.delivery import Delivery

__all__ = ["ChunkAssembler"]


@dataclass
class _Pending:
    requests: list[Any]
    outcomes: list[dict[str, Any] | None]
    missing: int = field(init=False)

    def __post_init__(self) -> None:
        self.missing = len(self.outcomes)


class ChunkAssembler:
    """Chunks in progress in one worker: their deliveries, and their items' outcomes. Thread-safe.

    A second delivery of a chunk in progress adds no jobs; it is acked with the first.
    """

    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Chunks in progress."""
        with self._lock:
            return len(self._pending)

    def expand(self, delivery: Delivery) -> list[Job]:
        """Register a chunk delivery and return its item Jobs for the backlog (none for a second copy)."""
        with self._lock:
            pending = self._pending.get(delivery.id)
            if pending is not None:
                pending.requests.append(delivery.request)
                return []
            self._pending[delivery.id] = _Pending([delivery.request], [None] * len(delivery.jobs))
        return list(delivery.jobs)

    def waiting_for(self, job_id: str) -> bool:
        """Whether ``job_id`` is an item of a chunk in progress here that has no outcome yet."""
        parts = split_item_id(job_id)
        if parts is None:
            return False
        with self._lock:
            pending = self._pending.get(parts[0])
            return pending is not None and parts[1] < len(pending.outcomes) and pending.outcomes[parts[1]] is None

    def owns(self, job_id: str) -> bool:
        """Whether ``job_id`` is an item of a chunk in progress here."""
        parts = split_item_id(job_id)
        if parts is None:
            return False
        with self._lock:
            return parts[0] in self._pending

    def untouched(self, item_ids: Collection[str]) -> set[str]:
        """The chunks in progress all of whose items wait among ``item_ids``, none with an outcome."""
        found: dict[str, int] = {}
        for job_id in item_ids:
            parts = split_item_id(job_id)
            if parts is not None:
                found[parts[0]] = found.get(parts[0], 0) + 1
        with self._lock:
            return {chunk_id for chunk_id, waiting in found.items()
                    if (pending := self._pending.get(chunk_id)) is not None
                    and waiting == len(pending.outcomes) == pending.missing}

    def drop(self, chunk_ids: Sequence[str]) -> dict[str, tuple[list[Any], int]]:
        """Forget the chunks among ``chunk_ids``; returns ``{chunk id: (its requests, its item count)}``."""
        dropped: dict[str, tuple[list[Any], int]] = {}
        with self._lock:
            for chunk_id in chunk_ids:
                pending = self._pending.pop(chunk_id, None)
                if pending is not None:
                    dropped[chunk_id] = (pending.requests, len(pending.outcomes))
        return dropped

    def collect(self, outcomes: Sequence[Outcome]) -> tuple[list[Outcome], list[tuple[Any, Any, SwaplessError | None]]]:
        """Take the outcomes of chunk items.

        Returns:
            ``(others, done)``: the outcomes of plain jobs, in order, and one ``(request, chunk_result, None)`` per
            request of each chunk now complete.
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
