"""BatchScheduler: one worker's backlog and the thread that runs it.

The consumer thread hands requests to ``submit``; the scheduler thread takes groups from the ``JobInbox`` and runs
them with its ``GroupRunner``; ``Completions`` stores and acks. How the threads share the work, and what each owns:
docs/concepts/scheduling.md.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from swapless.config.errors import SwaplessError
from swapless.manager import WorkItem
from swapless.tasks.broker.acks import AckQueue
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.observe.accounting import NULL_OBSERVER, SchedulerObserver
from swapless.tasks.protocol import split_item_id
from swapless.tasks.routing import Router
from swapless.tasks.worker.ahead import ReadAhead
from swapless.tasks.worker.chunks import ChunkAssembler
from swapless.tasks.worker.completions import Completions
from swapless.tasks.worker.delivery import Delivery, decode
from swapless.tasks.worker.followups import Followups
from swapless.tasks.worker.groups import GroupRunner
from swapless.tasks.worker.idle import IdleWork
from swapless.tasks.worker.inbox import JobInbox
from swapless.tasks.worker.ledger import RequestLedger
from swapless.tasks.worker.runtime import Runtime
from swapless.tasks.worker.shadows import Shadows
from swapless.tasks.worker.spans import BatchSpans

__all__ = ["BatchScheduler"]

logger = logging.getLogger(__name__)


def _no_count(jobs: int) -> None:
    return None


class BatchScheduler:
    """The backlog of one worker and the thread that runs it. Thread-safe ``submit``.

    Args:
        runtime: store, cache and settings.
        router: resolves each job's route once, at admission.
        results_factory: builds a ResultStore (one per storing thread).
        shadows: compares shadowed jobs with their shadows.
        acks: acks go through it, in bulk.
        observer: told about every group run.
        followups: what is done between a result's store and its ack.
        spans: makes the spans of traced jobs; None: tracing is off.
        refused: counts requests answered with an error outside any group report.
    """

    def __init__(
        self,
        runtime: Runtime,
        router: Router,
        results_factory: Callable[[], ResultStore],
        shadows: Shadows,
        *,
        acks: AckQueue | None = None,
        observer: SchedulerObserver = NULL_OBSERVER,
        followups: Followups | None = None,
        spans: BatchSpans | None = None,
        refused: Callable[[int], None] = _no_count,
    ) -> None:
        self.runtime = runtime
        self.spans = spans
        self.router = router
        self.results_factory = results_factory
        self.acks = acks if acks is not None else AckQueue()
        self.refused = refused
        self.inbox = JobInbox(runtime.settings.worker.max_wait_s)
        self.chunks = ChunkAssembler()  # chunk requests in progress, by chunk id
        self.ledger = RequestLedger(self.acks, self.chunks, followups)
        self.ahead = ReadAhead(results_factory)  # the next group's reads, sent while a group computes
        self.completions = Completions(results_factory, runtime.settings.cache.max_batch_size, self._keep,
                                       self._give_back, self.inbox.busy)
        self.runner = GroupRunner(runtime, self.inbox, self.ledger, self.ahead, self.completions, shadows, observer,
                                  spans, refused)
        self._thread: threading.Thread | None = None
        self._first: Callable[[], Any] | None = None
        self._idle: IdleWork | None = None  # the warm start, a step at a time until the first job
        #: Set once the scheduler thread is running and has done its ``first`` work (loading the kept models).
        self.ready = threading.Event()

    # -- consumer side -----------------------------------------------------------------------------------

    def submit(self, requests: Collection[Any]) -> None:
        """Decode requests and hand their jobs to the scheduler thread (called from the consumer thread)."""
        now, wall = time.monotonic(), time.time()
        deliveries: list[Delivery] = []
        rejected: list[tuple[Any, SwaplessError]] = []
        for request in requests:
            try:
                deliveries.append(decode(request, self.router, self.runtime.settings, now, wall))
            except SwaplessError as err:
                rejected.append((request, err))
        self.inbox.put(self.ledger.admit(deliveries), rejected)
        self.start()

    def hand_over(self, model_id: str) -> int:
        """Give back the waiting jobs of a model another worker now holds; returns how many went back.

        A chunk goes back whole when none of its items has started; one partly done stays.
        """
        whole: set[str] = set()

        def choose(waiting: list[WorkItem]) -> Callable[[WorkItem], bool]:
            whole.update(self.chunks.untouched([job.id for job in waiting]))

            def keep(job: WorkItem) -> bool:
                parts = split_item_id(job.id)
                return not self.ledger.live(job.id) or (parts is not None and parts[0] not in whole)

            return keep

        jobs = self.inbox.take_model(model_id, choose)
        counted = self.ahead.forget([job.id for job in jobs])  # while they are still live here
        requests = self.ledger.release([job for job in jobs if split_item_id(job.id) is None])
        requests += [r for chunk, _ in self.chunks.drop(sorted(whole)).values() for r in chunk]
        self._clear_counts(counted)
        if requests:
            self.acks.requeue(requests)
            logger.info("handed %d waiting job(s) of %s over to the worker that holds it now", len(jobs), model_id)
        return len(jobs)

    def backlog_counts(self) -> dict[str, int]:
        """Jobs waiting in the backlog per model (safe from any thread)."""
        return self.inbox.counts()

    def wants(self, model_id: str) -> bool:
        """Whether jobs of ``model_id`` wait, here or in Redis (safe from any thread)."""
        return self.inbox.wants(model_id)

    def start(self, first: Callable[[], Any] | None = None, idle: Iterator[Any] | None = None) -> None:
        """Start the scheduler thread (once).

        Args:
            first: run on that thread before any job; ``ready`` is set after it.
            idle: stepped on that thread until the first job comes (the warm start).
        """
        if self._thread is None:
            self._first = first
            if idle is not None:
                self._idle = IdleWork(idle, self.inbox)
            self._thread = threading.Thread(target=self._loop, name="swapless-scheduler", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Finish the group in hand, then stop. Jobs still in the backlog stay unacked and are redelivered."""
        self.inbox.stop()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- scheduler thread --------------------------------------------------------------------------------

    def _take(self) -> tuple[list[tuple[Any, SwaplessError]], list[WorkItem], list[WorkItem]] | None:
        manager = self.runtime.manager
        if not self.inbox.has_work():
            self.completions.flush()  # nothing to run next: store now
        if self._idle is not None:
            self._idle.run()
            self._idle = None
        return self.inbox.take(manager.loaded_ids, manager.load_cost_s, self.runtime.settings.worker.max_group,
                               manager.loading_ids)

    def _loop(self) -> None:
        try:
            if self._first is not None:
                self._first()
        except Exception:  # a failed load of a kept model only costs its first job a load
            logger.exception("loading the models kept loaded failed; going on without them")
        finally:
            self.ready.set()
        results = self.results_factory()
        self.completions.start()
        try:
            self._schedule(results)
        finally:
            self.completions.close()  # what is handed over is stored and acked before the thread ends
            self._clear_counts(self.ahead.close())

    def _clear_counts(self, job_ids: Sequence[str]) -> None:
        """Clear the attempts this worker counted ahead for jobs that leave it unrun."""
        if not job_ids:
            return
        try:
            self.results_factory().clear_attempts(job_ids)
        except Exception as err:  # noqa: BLE001 - they then run with the jobs in flight at one death
            logger.warning("could not clear the attempts counted ahead for %d job(s) (%s)", len(job_ids), err)

    def _schedule(self, results: ResultStore) -> None:
        runner = self.runner
        while True:
            taken = self._take()
            if taken is None:
                return
            rejected, expired, group = taken
            try:
                if rejected:
                    rejected_items = [(request, None, err) for request, err in rejected]
                    self.completions.finish(results, functools.partial(self._finish_rejected, rejected_items), ())
                if expired:
                    runner.expire(results, expired)
                if group and runner.load_aside(group):
                    group = []  # back in the backlog until its model is loaded or interactive jobs come
                if group:
                    runner.run(results, group)
            except (RedisError, OperationalError) as err:
                # Redis failed in a way the result store does not retry: keep the jobs (still held, unacked) and
                # try them again shortly; giving them back would need Redis too.
                logger.warning("a group of %d job(s) hit a Redis error (%s); keeping them, retrying in 1 s",
                               len(group) + len(expired), err)
                self.completions.drain()  # what was handed over has its outcome (or is kept) first
                self._keep([*expired, *group])
                time.sleep(1.0)
            except Exception:  # the scheduler must outlive any one group
                logger.exception("a group of %d job(s) failed to complete; putting them back on the queue",
                                 len(group) + len(expired))
                self.completions.drain()
                self._give_back([*expired, *group])

    def _finish_rejected(self, items: list[tuple[Any, None, SwaplessError]], results: ResultStore) -> None:
        self.ledger.finish(results, items)
        self.refused(len(items))

    # -- any thread that stores --------------------------------------------------------------------------

    def _keep(self, group: Sequence[WorkItem]) -> None:
        """Put the jobs of ``group`` that have no outcome yet back into the backlog."""
        self.inbox.put(self.ledger.unfinished(group))

    def _give_back(self, group: Sequence[WorkItem]) -> None:
        """Requeue the messages of jobs without a result; chunk items go back to the backlog."""
        unfinished = self.ledger.unfinished(group)
        requests = self.ledger.release(unfinished)
        self.inbox.put([job for job in unfinished if split_item_id(job.id) is not None])
        for request in requests:
            request.reject(requeue=True)
