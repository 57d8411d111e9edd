"""BatchScheduler: one worker's backlog and the thread that runs it.

The consumer thread hands every request to ``submit``, which decodes each once (``swapless.tasks.worker.delivery``) and
puts its jobs in the backlog; the scheduler thread takes the next group the moment it is idle
(``Backlog.next_group``: loaded models first, then the cold model with the most waiting work per second of load, a
starved job first), runs it through the model cache, stores each job's result in one pipeline and acks the
messages in bulk (``swapless.tasks.worker.ledger``). While the backlog has more work, the storing and acking of a group
is handed to a second thread (``swapless-results``; at most three groups' results wait for it) so that it overlaps the
next group's forward passes instead of leaving the device idle; an idle worker stores at once, on its own thread (no
hand-over in a lone job's path). Results are stored in the order their groups ran. A job in flight when its worker
died runs again as ``swapless.tasks.worker.attempts`` decides; at ``SWAPLESS_MAX_ATTEMPTS`` deaths it fails as a poison
job. Nothing is acked before its result is stored.

A job with a deadline that has not started by then leaves the backlog before the next group is chosen and is
answered ``JobExpired``: it costs neither a load nor a forward pass. A group with deadlines runs one forward pass at
a time, and before each pass the jobs whose answer would come after their deadline (now + the model's last pass
time per job) are answered ``JobExpired`` too: under overload, the jobs that are served are served in time, instead
of every job a little too late. A long bulk group yields to interactive jobs between slices, and a bulk group whose
model is cold loads it aside (on the load-ahead thread) while interactive jobs go on running, instead of holding
them for the load.

A job found with a result before it starts (cancelled: ``Client.cancel`` or Celery's ``revoke``, both stored in
Redis as the job's result; or a redelivered copy of a finished job) is acked without running; the items of a
cancelled chunk leave the backlog with it.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from celery.worker import state as worker_state
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from swapless.config.errors import JobCancelled, JobExpired, PoisonJob, PredictionFailed, SwaplessError
from swapless.manager import Backlog, Outcome, WorkItem, run_group
from swapless.tasks.broker.acks import AckQueue
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.broker.routes import Router
from swapless.tasks.observe.accounting import NULL_OBSERVER, SchedulerObserver
from swapless.tasks.protocol import deadline_text, item_id, split_item_id, storage_id
from swapless.tasks.worker.ahead import ReadAhead
from swapless.tasks.worker.attempts import plan_attempts
from swapless.tasks.worker.chunks import ChunkAssembler
from swapless.tasks.worker.delivery import decode
from swapless.tasks.worker.followups import Followups
from swapless.tasks.worker.idle import IdleWork
from swapless.tasks.worker.ledger import RequestLedger
from swapless.tasks.worker.runtime import Runtime
from swapless.tasks.worker.shadows import Shadows
from swapless.tasks.worker.spans import BatchSpans, BatchTrace, traces_note

__all__ = ["BatchScheduler"]

logger = logging.getLogger(__name__)

#: How long the scheduler waits for the coming jobs of loaded models before it loads another (``Backlog.coming``):
#: a fetch round, which waits for a bell up to the transport's idle poll (0.1 s).
STAY_S = 0.15

#: Longest the consumer thread waits for an idle scheduler thread to take the jobs it just handed over.
HAND_OVER_S = 0.002


class BatchScheduler:
    """Owns the backlog of one worker and the thread that runs it. Thread-safe ``submit``.

    Args:
        runtime: store, cache and settings.
        router: resolves each job's route once, at admission.
        results_factory: builds the ResultStore (called in the scheduler thread).
        shadows: keeps shadowed jobs' references and compares their shadows.
        acks: acks go through it, in bulk (the batch task binds it to the consumer's thread).
        observer: told about every group run (the worker's heartbeat, metrics and task events).
        followups: what is done between a result's store and its ack (Celery's canvas, webhooks).
        spans: makes the spans of traced jobs (``swapless.tasks.worker.spans``); None: tracing is off.
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
    ) -> None:
        self.runtime = runtime
        self.spans = spans
        #: The marks of the batch ``_run_batch`` just ran, for its ``_complete`` (scheduler thread only).
        self._traced: BatchTrace | None = None
        self.router = router
        self.results_factory = results_factory
        self.shadows = shadows
        self.acks = acks if acks is not None else AckQueue()
        self.observer = observer
        self.backlog = Backlog(runtime.settings.max_wait_s)
        self._cond = threading.Condition()
        self.chunks = ChunkAssembler()  # chunk requests in progress, by chunk id
        self.ledger = RequestLedger(self._cond, self.acks, self.chunks, followups)
        #: Seconds per job of each model's last forward pass on a loaded model (scheduler thread only).
        self._pass_s: dict[str, float] = {}
        #: Jobs of the running group whose attempt is counted already (scheduler thread only).
        self._started: set[str] = set()
        #: The next group's reads, sent while a group computes.
        self.ahead = ReadAhead(results_factory)
        self._stopping = False
        #: Completions (store, then ack) handed to the results thread, each with the jobs it answers; None stops it.
        self._completions: queue.Queue[tuple[Callable[[ResultStore], None], Sequence[WorkItem]] | None] = queue.Queue(
            maxsize=1)
        self._completer: threading.Thread | None = None
        #: A completion waiting for the next group's first Redis round trip to be sent first (scheduler thread only).
        self._deferred: tuple[Callable[[ResultStore], None], Sequence[WorkItem]] | None = None
        self._thread: threading.Thread | None = None
        self._first: Callable[[], Any] | None = None
        #: Work done a step at a time until the first job comes (the warm start); None once it ended.
        self._idle: IdleWork | None = None
        #: The loaded models last waited for (``Backlog.coming``; scheduler thread only).
        self._stayed_for: frozenset[str] = frozenset()
        #: The model a bulk group waits for, loading aside (scheduler thread only).
        self._aside: str | None = None
        #: Set once the scheduler thread is running and has done its ``first`` work (loading the kept models).
        self.ready = threading.Event()
        #: Set while the scheduler thread waits for jobs with nothing in hand; cleared once it takes the jobs that
        #: woke it (``submit`` waits for that, briefly, instead of contending for the GIL with it).
        self._idle_waiting = False
        self._took = threading.Event()

    @property
    def jobs_done(self) -> int:
        return self.ledger.jobs_done

    @property
    def jobs_failed(self) -> int:
        return self.ledger.jobs_failed

    # -- consumer side -----------------------------------------------------------------------------------

    def submit(self, requests: Collection[Any]) -> None:
        """Decode requests and add their jobs to the backlog (called from the consumer thread); wake the scheduler."""
        now, wall = time.monotonic(), time.time()
        jobs: list[WorkItem] = []
        with self._cond:
            for request in requests:
                try:
                    delivery = decode(request, self.router, self.runtime.settings, now, wall)
                except SwaplessError as err:
                    self.ledger.reject(request, err)
                    continue
                jobs.extend(self.ledger.admit(delivery))
            self.backlog.add(jobs)
            self._cond.notify()
            handing = bool(jobs) and self._idle_waiting
            if handing:
                self._took.clear()
        if handing:
            # The scheduler thread was idle: let it take these jobs before this thread goes on to its next fetch
            # (which would otherwise hold the GIL while the woken scheduler waits for it).
            self._took.wait(HAND_OVER_S)
        self.start()

    def hand_over(self, model_id: str) -> int:
        """Give back the waiting jobs of a model this worker no longer holds (placement moved it to another worker):
        they leave the backlog and their messages go back to the head of the model's list. A chunk goes back whole
        when none of its items has started; one partly done stays (its other items' outcomes are here); the group
        running now finishes. Returns how many jobs went back."""
        with self._cond:
            whole = self.ledger.chunks.untouched([job.id for job in self.backlog.jobs_of(model_id)])

            def keep(job: WorkItem) -> bool:
                parts = split_item_id(job.id)
                return not self.ledger.live(job.id) or (parts is not None and parts[0] not in whole)

            jobs = self.backlog.take_model(model_id, keep=keep)
            counted = self.ahead.forget([job.id for job in jobs])  # while they are still live here
            requests = self.ledger.release([job for job in jobs if split_item_id(job.id) is None])
            requests += [r for chunk, _ in self.ledger.chunks.drop(sorted(whole)).values() for r in chunk]
        self._clear_counts(counted)
        if requests:
            self.acks.requeue(requests)
            logger.info("handed %d waiting job(s) of %s over to the worker that holds it now", len(jobs), model_id)
        return len(jobs)

    def backlog_counts(self) -> dict[str, int]:
        """Jobs waiting in the backlog per model (safe from any thread)."""
        with self._cond:
            return self.backlog.counts()

    def wants(self, model_id: str) -> bool:
        """Whether jobs of ``model_id`` wait, here or in Redis (safe from any thread)."""
        with self._cond:
            return bool(self.backlog.counts().get(model_id) or self.backlog.queued().get(model_id))

    def _waiting(self, held: dict[str, int]) -> dict[str, int]:
        """Jobs waiting per model: ``held`` here, and those still in Redis (``Backlog.queued``): the cache keeps a
        model with work left there as it keeps one with work held here."""
        for model_id, count in self.backlog.queued().items():
            held[model_id] = held.get(model_id, 0) + count
        return held

    def start(self, first: Callable[[], Any] | None = None, idle: Iterator[Any] | None = None) -> None:
        """Start the scheduler thread (once); it runs ``first`` before any job, then sets ``ready``. ``idle`` is
        stepped while no job has come yet, once the backlog has been empty for ``IDLE_AFTER_S``; the first job ends
        it (closed), after the step in progress.

        The warm start runs there (``idle``): part of what it warms is per thread (oneDNN and OpenMP state), so
        warming on another thread left mobilenet's first groups 30-80 % slower. As idle work, it never delays a job
        by more than the one model being warmed, however large the registry.
        """
        if self._thread is None:
            self._first = first
            if idle is not None:
                self._idle = IdleWork(idle, self._cond, self._has_work)
            self._thread = threading.Thread(target=self._loop, name="swapless-scheduler", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Finish the group in hand, then stop. Jobs still in the backlog stay unacked and are redelivered."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- scheduler thread --------------------------------------------------------------------------------

    def _take(self) -> tuple[list[tuple[Any, SwaplessError]], list[WorkItem], list[WorkItem]] | None:
        manager = self.runtime.manager
        with self._cond:
            idle = not self._stopping and not self.ledger.has_rejected and not len(self.backlog)
        if idle:
            self._hand_over_deferred()  # nothing to run next: store now
        if self._idle is not None:
            self._idle.run()
            self._idle = None
        with self._cond:
            while not self._stopping and not self.ledger.has_rejected and not len(self.backlog):
                self._idle_waiting = True
                self._cond.wait()
            self._idle_waiting = False
            self._took.set()
            loaded = manager.loaded_ids()
            coming = self.backlog.coming(loaded, manager.load_cost_s)
            if coming and not coming <= self._stayed_for:  # once for these models, until one of them has run
                self._stayed_for = coming
                self._cond.wait(STAY_S)
                loaded = manager.loaded_ids()
            if self._stopping:
                return None
            rejected = self.ledger.take_rejected()
            expired = self.backlog.take_expired(time.time())
            group = self.backlog.next_group(loaded, manager.load_cost_s, self.runtime.settings.max_group,
                                            loading=manager.loading_ids())
            if group and group[0].model_id in self._stayed_for:
                self._stayed_for = frozenset()  # its jobs came: worth waiting for again
            return rejected, expired, group

    def _has_work(self) -> bool:
        return self._stopping or self.ledger.has_rejected or bool(len(self.backlog))

    def _loop(self) -> None:
        try:
            if self._first is not None:
                self._first()
        except Exception:  # a failed load of a kept model only costs its first job a load
            logger.exception("loading the models kept loaded failed; going on without them")
        finally:
            self.ready.set()
        results = self.results_factory()
        self._completer = threading.Thread(target=self._complete_loop, name="swapless-results", daemon=True)
        self._completer.start()
        try:
            self._schedule(results)
        finally:
            self._hand_over_deferred()
            self._completions.put(None)  # what is handed over is stored and acked before the thread ends
            self._completer.join()
            self._clear_counts(self.ahead.close())

    def _clear_counts(self, job_ids: Sequence[str]) -> None:
        """Clear the attempts this worker counted ahead for jobs that leave it unrun
        (``swapless.tasks.worker.ahead``)."""
        if not job_ids:
            return
        try:
            self.results_factory().clear_attempts(job_ids)
        except Exception as err:  # noqa: BLE001 - they then run with the jobs in flight at one death
            logger.warning("could not clear the attempts counted ahead for %d job(s) (%s)", len(job_ids), err)

    def _schedule(self, results: ResultStore) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            rejected, expired, group = taken
            try:
                if rejected:
                    rejected_items = [(request, None, err) for request, err in rejected]
                    self._finish(results, functools.partial(self._finish_rejected, rejected_items), ())
                if expired:
                    self._expire(results, expired)
                if group and self._load_aside(group):
                    group = []  # back in the backlog until its model is loaded or interactive jobs come
                if group:
                    self._run(results, group)
            except (RedisError, OperationalError) as err:
                # Redis failed in a way the result store does not retry: keep the jobs (still held, unacked) and
                # try them again shortly; giving them back would need Redis too.
                logger.warning("a group of %d job(s) hit a Redis error (%s); keeping them, retrying in 1 s",
                               len(group) + len(expired), err)
                self._hand_over_deferred()
                self._completions.join()  # what was handed over has its outcome (or is kept) first
                self._keep([*expired, *group])
                time.sleep(1.0)
            except Exception:  # the scheduler must outlive any one group
                logger.exception("a group of %d job(s) failed to complete; putting them back on the queue",
                                 len(group) + len(expired))
                self._hand_over_deferred()
                self._completions.join()
                self._give_back([*expired, *group])

    def _finish_rejected(self, items: list[tuple[Any, None, SwaplessError]], results: ResultStore) -> None:
        self.ledger.finish(results, items)

    def _finish(self, results: ResultStore, work: Callable[[ResultStore], None], jobs: Sequence[WorkItem]) -> None:
        """Store and ack (``work``): on the results thread while the backlog has more to run (it overlaps the next
        group), else here at once. Results are stored in the order their groups ran either way."""
        if self._completer is None or threading.current_thread() is self._completer:
            work(results)
            return
        with self._cond:
            busy = bool(len(self.backlog)) or self.ledger.has_rejected
        if not busy and not self._completions.unfinished_tasks and self._deferred is None:
            work(results)  # nothing to overlap: no hand-over in a lone job's path
            return
        self._hand_over_deferred()
        if len(jobs) <= self.runtime.settings.max_batch_size:
            self._completions.put((work, jobs))  # a slice or a few jobs: stored at once, beside the next pass
            return
        # A whole group: handed over once the next group's first round trip (``_run``'s ``prior``) is sent; storing
        # it would otherwise contend for the CPU with that round trip, while the device waits for the group.
        self._deferred = (work, jobs)

    def _hand_over_deferred(self) -> None:
        """Give the results thread the completion ``_finish`` deferred, if any."""
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            self._completions.put(deferred)  # waits while an earlier group is still being stored

    def _complete_loop(self) -> None:
        """The results thread: store and ack what the scheduler thread hands over, in order. A Redis failure keeps
        the jobs without an outcome for another run, as the scheduler thread does."""
        results = self.results_factory()
        while True:
            item = self._completions.get()
            try:
                if item is None:
                    return
                work, jobs = item
                try:
                    work(results)
                except (RedisError, OperationalError) as err:
                    logger.warning("storing the results of %d job(s) hit a Redis error (%s); keeping them, retrying "
                                   "in 1 s", len(jobs), err)
                    self._keep(jobs)
                    time.sleep(1.0)
                except Exception:  # the thread must outlive any one group
                    logger.exception("storing the results of %d job(s) failed; putting them back on the queue",
                                     len(jobs))
                    self._give_back(jobs)
            finally:
                self._completions.task_done()

    def _expire(self, results: ResultStore, jobs: Sequence[WorkItem]) -> None:
        """Answer jobs whose deadline passed before they started: ``JobExpired``, and never run."""
        logger.info("%d job(s) passed their deadline before they started; answering JobExpired", len(jobs))
        by_model: dict[str, list[Outcome]] = {}
        for job in jobs:
            error = JobExpired(job.model_id, deadline_text(job.expires_at or 0.0))
            by_model.setdefault(job.model_id, []).append(Outcome(job, error=error))
        for model_id, expired in by_model.items():
            self._complete(results, expired)
            self.ledger.jobs_expired += len(expired)
            self.observer.on_skipped(model_id, "expired", len(expired))

    def _keep(self, group: Sequence[WorkItem]) -> None:
        """Put the jobs of ``group`` that have no outcome yet back into the backlog."""
        with self._cond:
            self.backlog.add(self.ledger.unfinished(group))
            self._cond.notify()

    def _give_back(self, group: Sequence[WorkItem]) -> None:
        """Requeue the messages of jobs that got no result; chunk items go back to the backlog (their chunk's
        message also holds items that did finish)."""
        with self._cond:
            unfinished = self.ledger.unfinished(group)
            requests = self.ledger.release(unfinished)
            self.backlog.add([job for job in unfinished if split_item_id(job.id) is not None])
        for request in requests:
            request.reject(requeue=True)

    def _load_ahead(self, running: str) -> None:
        """Once ``running`` is loaded and its group is about to compute, load the model the next group will need,
        if there is room for it."""
        manager = self.runtime.manager
        with self._cond:
            loaded = [*manager.loaded_ids(), running]
            upcoming = self.backlog.peek_next(loaded, manager.load_cost_s, exclude=running)
            waiting = self._waiting(self.backlog.counts())
        waiting[running] = waiting.get(running, 0) + 1  # its jobs are in the group now, none left waiting: keep it
        if upcoming is not None and upcoming not in loaded and manager.load_ahead(upcoming, waiting):
            logger.info("loading %s ahead while %s computes", upcoming, running)

    def _load_aside(self, group: Sequence[WorkItem]) -> bool:
        """A bulk group whose model is cold: load the model on the load-ahead thread, put the group back and wait
        for the load, running the interactive jobs that come meanwhile (a 2 s load on this thread would hold them
        all). False, and the group loads its model itself, when loads ahead are off, when there is no room without
        evicting a model with waiting work or a resident one (``ModelManager.load_ahead``), or when the load aside
        ended without the model (it failed, or the model was evicted again)."""
        manager = self.runtime.manager
        model_id = group[0].model_id
        if not self.runtime.settings.load_ahead or any(job.urgent for job in group):
            return False
        waited, self._aside = self._aside == model_id, None
        if manager.is_loaded(model_id):
            return False
        if not manager.is_loading(model_id):
            if waited:
                return False
            with self._cond:
                waiting = self._waiting(self.backlog.counts())
            waiting[model_id] = waiting.get(model_id, 0) + len(group)
            if not manager.load_ahead(model_id, waiting):
                return False
            logger.info("loading %s aside; interactive jobs run meanwhile", model_id)
        self._aside = model_id
        with self._cond:
            self.backlog.add(group)
            while (not self._stopping and not self.backlog.urgent and not self.ledger.has_rejected
                   and manager.is_loading(model_id)):
                self._cond.wait(0.05)
        return True

    def _run(self, results: ResultStore, group: Sequence[WorkItem]) -> None:
        """Run one group: skip jobs that already have results, fail poison jobs, isolate suspects, run the rest."""
        model_id = group[0].model_id
        if self.runtime.settings.load_ahead and model_id in self.runtime.manager.loaded_ids():
            self._load_ahead(model_id)  # loaded already: the next model's load starts before this group's reads
        self._cancel_revoked(results, group)
        # The first batch's attempts are counted in the same round trip as the reads (see _run_batch), sent during
        # the last pass of the group before when this group was the one expected next (tasks.worker.ahead).
        ids, first = self._first_slice(model_id, group)
        read = self.ahead.take(ids, first)
        if read is None:
            done_before, attempts = results.prior(ids, list(dict.fromkeys(storage_id(i) for i in ids)), start=first)
            self.ahead.record(first, done_before, attempts)
            attempts = self.ahead.own(attempts)
        else:
            done_before, attempts = read
        self._hand_over_deferred()  # the group before this one's results: stored while this one computes
        self._started = {i for i in self.ahead.running(ids) if storage_id(i) not in done_before}
        self.ahead.prune(self.ledger.live)
        if done_before:
            # Cancelled jobs, and redelivered copies of jobs that already have a final result: never run them.
            self._drop(results, model_id, done_before)
            group = [job for job in group if storage_id(job.id) not in done_before]
        max_attempts = self.runtime.settings.max_attempts
        plan = plan_attempts(group, attempts, max_attempts)
        if plan.poison:
            logger.error("%d job(s) of %s were in flight at %d worker deaths each: failing them", len(plan.poison),
                         model_id, max_attempts)
            self._complete(results, [Outcome(job, error=PoisonJob(model_id, attempts[job.id])) for job in plan.poison])
        if plan.together:
            self._complete(results, self._run_batch(results, model_id, plan.together))
        for job in plan.alone:
            self._complete(results, self._run_batch(results, model_id, [job]))
        if plan.fresh:
            self._run_sliced(results, model_id, plan.fresh)

    def _read_next(self) -> None:
        """Send the reads of the group the backlog would give next, answered during this group's last pass (called
        as that pass begins: ``swapless.tasks.worker.ahead``)."""
        manager = self.runtime.manager
        with self._cond:
            upcoming = self.backlog.peek_group(manager.loaded_ids(), manager.load_cost_s,
                                               self.runtime.settings.max_group)
        if upcoming:
            self.ahead.launch(*self._first_slice(upcoming[0].model_id, upcoming))

    def _first_slice(self, model_id: str, group: Sequence[WorkItem]) -> tuple[list[str], list[str]]:
        """The ids of a group's jobs, and of those its first forward pass (``_slice``) runs."""
        ids = [job.id for job in group]
        size = self._slice(model_id, group)
        return ids, ids if size is None else ids[:size]

    def _slice(self, model_id: str, jobs: Sequence[WorkItem]) -> int | None:
        """Jobs per slice of a group (``_run_sliced``), or None: it runs whole."""
        size = self.runtime.settings.max_batch_size
        if any(job.expires_at is not None for job in jobs):
            size = min(size, self.runtime.store.get(model_id).max_batch_size or size)
        elif any(job.urgent for job in jobs):
            return None
        return size if len(jobs) > size else None

    def _run_sliced(self, results: ResultStore, model_id: str, jobs: Sequence[WorkItem]) -> None:
        """Run a group in slices, each slice's results stored (and its messages acked) while the next computes;
        between slices, yield to interactive jobs (bulk groups) and expire jobs whose deadline passed (groups with
        deadlines).

        Interactive jobs that arrive while a long bulk group computes wait for one slice of ``max_batch_size`` jobs
        (a forward pass or two), not for the whole group: the unstarted rest goes back to the backlog, and the
        scheduler picks again. A group with deadlines runs one forward pass (the model's batch size) at a time, and
        a job whose deadline passes while the passes before it compute is answered ``JobExpired`` instead of
        starting late. Other interactive groups, and groups that fit in one slice, run whole.
        """
        size = self._slice(model_id, jobs)
        if size is None:
            self._complete(results, self._run_batch(results, model_id, jobs, last=True))
            return
        deadlines = any(job.expires_at is not None for job in jobs)
        urgent = any(job.urgent for job in jobs)
        pending = list(jobs)
        while pending:
            if deadlines:
                # a job whose answer would come after its deadline is not started: its caller has given up by then
                cutoff = time.time() + self._pass_s.get(model_id, 0.0) * min(size, len(pending))
                late = [job for job in pending if job.expires_at is not None and job.expires_at < cutoff]
                if late:
                    self._expire(results, late)
                    pending = [job for job in pending if job.expires_at is None or job.expires_at >= cutoff]
                    continue
            batch, pending = pending[:size], pending[size:]
            self._complete(results, self._run_batch(results, model_id, batch, last=not pending))
            if pending and not urgent:
                with self._cond:
                    if self.backlog.urgent:
                        self.backlog.add(pending)  # never started: back as they were
                        self.ahead.counted([job.id for job in pending if job.id in self._started])
                        logger.info("%s: yielding to interactive jobs with %d of %d bulk job(s) left", model_id,
                                    len(pending), len(jobs))
                        break

    def _run_batch(
        self, results: ResultStore, model_id: str, batch: Sequence[WorkItem], last: bool = False
    ) -> list[Outcome]:
        """Mark ``batch`` started (the jobs ``_run`` did not count already), run it, return one outcome per job (never
        raises). Jobs found with a result when they are marked (cancelled since the group began) do not run. The
        group's ``last`` batch sends the next group's reads as its last forward pass begins."""
        batch = [job for job in batch if self.ledger.live(job.id)]  # not of a chunk dropped since the group began
        # a Redis failure keeps the batch
        found = results.start([job.id for job in batch if job.id not in self._started])
        self._hand_over_deferred()  # the previous batch's results: stored while this one computes
        self._started.difference_update(job.id for job in batch)
        if found:
            self._drop(results, model_id, found)
            batch = [job for job in batch if storage_id(job.id) not in found]
        if not batch:
            return []
        try:
            waiting = self._waiting(self.backlog_counts())
            warm = model_id in self.runtime.manager.loaded_ids()
            traced = self.spans.start(model_id, batch, self.runtime.manager) if self.spans is not None else None
            started = time.perf_counter()
            ahead = (lambda: self._load_ahead(model_id)) if self.runtime.settings.load_ahead else None
            if traced is not None:
                ahead = traced.on_loaded(ahead)
            outcomes = run_group(self.runtime.manager, model_id, batch, waiting, on_loaded=ahead,
                                 before_last_pass=self._read_next if last else None)
            elapsed = time.perf_counter() - started
            if traced is not None:
                traced.ran(outcomes)
                self._traced = traced
            if warm:  # the last warm pass's seconds per job: when the next answers would come
                self._pass_s[model_id] = elapsed / len(batch)
            self.observer.on_group(model_id, batch, outcomes, elapsed)  # heartbeat, metrics, events; never raises
            failed = sum(1 for o in outcomes if not o.ok)
            logger.info("ran %d job(s) on %s in %.3f s (%d failed)%s", len(outcomes), model_id, elapsed, failed,
                        traces_note(batch))
        except Exception as err:  # a bug here must still give every job an answer
            logger.exception("internal error running %d job(s) on %s", len(batch), model_id)
            outcomes = [
                Outcome(job, error=PredictionFailed(model_id, f"internal error in the worker: {err!r}"))
                for job in batch
            ]
        return outcomes

    def _cancel_revoked(self, results: ResultStore, group: Sequence[WorkItem]) -> None:
        """Jobs revoked through Celery's remote control (``app.control.revoke``; a plain producer's cancel) are
        cancelled in Redis like ``Client.cancel``'s, so every worker skips them and the cancel outlives this one."""
        revoked = worker_state.revoked
        if not revoked:
            return
        ids = [under for under in dict.fromkeys(storage_id(job.id) for job in group) if under in revoked]
        if ids:
            answers = results.cancel(ids, JobCancelled, self.runtime.settings.cancel_hold_s)
            logger.info("revoked job(s) of %s: %s", group[0].model_id, answers)

    def _drop(self, results: ResultStore, model_id: str, result_ids: Collection[str]) -> None:
        """Ack, without running or storing anything, the jobs whose results ``result_ids`` were found before they
        ran: cancelled jobs (their result is the cancellation) and redelivered copies of finished jobs. A chunk's
        waiting items leave the backlog with it."""
        plain = self.ledger.single(result_ids)
        chunks = self.chunks.drop([i for i in result_ids if i not in {r.id for r in plain}])
        if chunks:
            dropped = set(chunks)
            with self._cond:
                self.backlog.take_model(model_id, keep=lambda job: storage_id(job.id) not in dropped)
        requests = plain + [request for requests, _ in chunks.values() for request in requests]
        if not requests:
            return
        found = results.fetch(list(dict.fromkeys(request.id for request in requests)))
        if self.ledger.followups is not None:  # their worker may have died before it sent them
            self.ledger.followups.found(results, requests, found)
        cancelled = sum(
            chunks[s.job_id][1] if s.job_id in chunks else 1 for s in found if isinstance(s.value, JobCancelled)
        )
        logger.info("%d message(s) of %s have a result already (%d job(s) cancelled); acking without running them",
                    len(requests), model_id, cancelled)
        self.ledger.finish(results, [(request, None, None) for request in requests], store=False, count=False)
        results.clear_attempts([item_id(chunk_id, i) for chunk_id, (_, size) in chunks.items() for i in range(size)])
        if cancelled:
            self.ledger.jobs_cancelled += cancelled
            self.observer.on_skipped(model_id, "cancelled", cancelled)

    def _complete(self, results: ResultStore, outcomes: list[Outcome]) -> None:
        outcomes = [o for o in outcomes if self.ledger.live(o.job.id)]  # a chunk dropped after some of its items ran
        jobs = [o.job for o in outcomes]
        outcomes, chunks_done = self.chunks.collect(outcomes)  # items of chunks -> complete chunks
        served = {o.job.id: o.job.served_model for o in outcomes}
        answered = [(self.ledger.delivery(o.job.id), o) for o in outcomes]
        items = [(d.request, o.result, o.error) for d, o in answered] + chunks_done
        traced, self._traced = self._traced, None  # the batch these outcomes are of, when traced

        def work(store: ResultStore) -> None:
            begun_ns = time.time_ns() if traced is not None else 0
            self.ledger.finish(store, items, models=served)
            if traced is not None:
                traced.stored(begun_ns, time.time_ns())
            self.shadows.settle(store, answered)
            if chunks_done:  # the items' attempt counters end with their chunk's stored result
                store.clear_attempts([item_id(r.id, i) for r, value, _ in chunks_done for i in range(len(value))])

        if items:
            self._finish(results, work, jobs)
        elif traced is not None:  # items of chunks not yet whole: nothing stored for this batch
            traced.stored(None, None)
