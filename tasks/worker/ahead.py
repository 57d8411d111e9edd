"""ReadAhead: the next group's reads, sent during the last pass of the group before it.

What a job counted ahead means for its attempts: docs/concepts/scheduling.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from swapless.tasks.broker.results import ResultStore
from swapless.tasks.protocol import storage_id

__all__ = ["ReadAhead"]

logger = logging.getLogger(__name__)

#: (result ids with a stored result, {job id: attempts started before}): ``ResultStore.prior``'s answer.
Prior = tuple[set[str], dict[str, int]]

#: How long a read ahead retries while Redis is unreachable (then the scheduler reads for itself, retrying as long
#: as it takes); a stop waits that long, and a little more, for a read in flight.
_RETRY_S = 5.0


class ReadAhead:
    """Reads a group's state ahead of its run. Thread-safe.

    Args:
        results_factory: builds the ResultStore of the thread that reads ahead.
    """

    def __init__(self, results_factory: Callable[[], ResultStore]) -> None:
        self._factory = results_factory
        self._store: ResultStore | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[frozenset[str], frozenset[str], Future[Prior]] | None = None
        self._lock = threading.Lock()
        #: Jobs this worker counted ahead that have not run yet.
        self._counted: set[str] = set()
        self._closed = False

    def launch(self, group: Sequence[str], first: Sequence[str]) -> None:
        """Read the state of ``group`` and count the attempts of ``first``, in the background."""
        with self._lock:
            if self._pending is not None or not group or self._closed:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swapless-ahead")
            result_ids = list(dict.fromkeys(storage_id(job_id) for job_id in group))
            future = self._pool.submit(self._read, list(group), result_ids, list(first))
            self._pending = (frozenset(group), frozenset(first), future)

    def _read(self, group: list[str], result_ids: list[str], first: list[str]) -> Prior:
        if self._store is None:
            self._store = self._factory()
            self._store.retry_s = _RETRY_S
        return self._store.prior(group, result_ids, start=first)

    def take(self, group: Sequence[str], first: Sequence[str]) -> Prior | None:
        """The read ahead of the group about to run, with ``own`` applied; None when it does not cover the group."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return None
        read, counted, future = pending
        try:
            done, attempts = future.result()
        except Exception as err:  # noqa: BLE001 - the scheduler reads again, in its own round trip
            logger.debug("the read ahead failed (%s); reading before the group", err)
            return None
        self.record(counted, done, attempts)
        covered = read.issuperset(group) and all(
            j in counted or j in attempts or storage_id(j) in done for j in first
        )
        return (done, self.own(attempts)) if covered else None

    def own(self, attempts: dict[str, int]) -> dict[str, int]:
        """``attempts`` (a read of the counters) less the attempt this worker counted ahead of each job's run."""
        with self._lock:
            mine = self._counted.intersection(attempts)
        if not mine:
            return attempts
        adjusted = {job_id: count - (job_id in mine) for job_id, count in attempts.items()}
        return {job_id: count for job_id, count in adjusted.items() if count > 0}

    def record(self, first: Collection[str], done: Collection[str], attempts: Mapping[str, int]) -> None:
        """Remember as this worker's the jobs of ``first`` a read counted: never started, without a result."""
        with self._lock:
            self._counted.update(j for j in first if j not in attempts and storage_id(j) not in done)

    def counted(self, job_ids: Collection[str]) -> None:
        """Remember jobs counted already that go back to wait (a bulk group's slices yielding)."""
        with self._lock:
            self._counted.update(job_ids)

    def running(self, job_ids: Collection[str]) -> set[str]:
        """Of the jobs starting to run, those whose attempt is counted already; forgotten here from now on."""
        with self._lock:
            mine = self._counted.intersection(job_ids)
            self._counted.difference_update(mine)
        return mine

    def forget(self, job_ids: Collection[str]) -> list[str]:
        """Of jobs leaving this worker unrun, those counted ahead (the caller clears their counters)."""
        return sorted(self.running(job_ids))

    def prune(self, live: Callable[[str], bool]) -> None:
        """Forget jobs no longer held (answered without a run: expired, cancelled with their chunk)."""
        with self._lock:
            self._counted = {job_id for job_id in self._counted if live(job_id)}

    def close(self) -> list[str]:
        """Stop the reading thread; returns the jobs counted ahead that did not run (to clear)."""
        with self._lock:
            pending, self._pending = self._pending, None
            self._closed = True
        if pending is not None:
            try:
                done, attempts = pending[2].result(timeout=_RETRY_S * 2)
                self.record(pending[1], done, attempts)
            except Exception:  # noqa: BLE001, S110 - nothing was counted that we know of
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        with self._lock:
            left, self._counted = sorted(self._counted), set()
        return left
