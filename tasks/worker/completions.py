"""Completions: storing and acking a group's results, at once or on the results thread beside the next group.

Only the scheduler thread calls a ``Completions``; the results thread it starts reads the one queue between them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from swapless.manager import Job
from swapless.tasks.broker.results import ResultStore

__all__ = ["Completion", "Completions"]

logger = logging.getLogger(__name__)

#: Store and ack (given the thread's ResultStore), with the jobs it answers.
Completion = tuple[Callable[[ResultStore], None], Sequence[Job]]


class Completions:
    """The scheduler thread's side of the results thread.

    Args:
        results_factory: builds the results thread's ResultStore.
        max_batch_size: a completion of more jobs waits for the next group's first round trip.
        keep: puts jobs without an outcome back (a Redis failure).
        give_back: requeues jobs without an outcome (any other failure).
        busy: whether more work waits.
    """

    def __init__(self, results_factory: Callable[[], ResultStore], max_batch_size: int,
                 keep: Callable[[Sequence[Job]], None], give_back: Callable[[Sequence[Job]], None],
                 busy: Callable[[], bool]) -> None:
        self.results_factory = results_factory
        self.max_batch_size = max_batch_size
        self.keep = keep
        self.give_back = give_back
        self.busy = busy
        self._queue: queue.Queue[Completion | None] = queue.Queue(maxsize=1)  # None stops the thread
        self._thread: threading.Thread | None = None
        self._deferred: Completion | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="swapless-results", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Hand over what is deferred, then stop the thread once everything handed over is stored and acked."""
        self.flush()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join()

    def finish(self, results: ResultStore, work: Callable[[ResultStore], None], jobs: Sequence[Job]) -> None:
        """Store and ack: on the results thread while more work waits, else here at once."""
        if self._thread is None or threading.current_thread() is self._thread:
            work(results)
            return
        if not self.busy() and not self._queue.unfinished_tasks and self._deferred is None:
            work(results)  # nothing to overlap: no hand-over in a lone job's path
            return
        self.flush()
        if len(jobs) <= self.max_batch_size:
            self._queue.put((work, jobs))  # a slice or a few jobs: stored at once, beside the next pass
            return
        # A whole group: handed over once the next group's first round trip is sent; storing it would otherwise
        # contend for the CPU with that round trip while the device waits.
        self._deferred = (work, jobs)

    def flush(self) -> None:
        """Give the results thread the deferred completion, if any."""
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            self._queue.put(deferred)  # waits while an earlier group is still being stored

    def drain(self) -> None:
        """Hand over the deferred completion and wait until everything handed over has its outcome."""
        self.flush()
        self._queue.join()

    def _loop(self) -> None:
        results = self.results_factory()
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                work, jobs = item
                try:
                    work(results)
                except (RedisError, OperationalError) as err:
                    logger.warning("storing the results of %d job(s) hit a Redis error (%s); keeping them, retrying "
                                   "in 1 s", len(jobs), err)
                    self.keep(jobs)
                    time.sleep(1.0)
                except Exception:  # the thread must outlive any one group
                    logger.exception("storing the results of %d job(s) failed; putting them back on the queue",
                                     len(jobs))
                    self.give_back(jobs)
            finally:
                self._queue.task_done()
