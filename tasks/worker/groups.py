"""GroupRunner: what the scheduler thread does with a group, and the state only that thread keeps.

Only the scheduler thread calls a ``GroupRunner``; what it shares with other threads goes through the ``JobInbox``,
the ``RequestLedger`` and ``Completions`` (see docs/concepts/scheduling.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence

from celery.worker import state as worker_state

from swapless.config.errors import JobCancelled, JobExpired, PoisonJob, PredictionFailed
from swapless.manager import Job, Outcome, run_group
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.observe.accounting import SchedulerObserver
from swapless.tasks.protocol import deadline_text, item_id, storage_id
from swapless.tasks.worker.ahead import ReadAhead
from swapless.tasks.worker.attempts import plan_attempts
from swapless.tasks.worker.chunks import ChunkAssembler
from swapless.tasks.worker.completions import Completions
from swapless.tasks.worker.inbox import JobInbox
from swapless.tasks.worker.ledger import RequestLedger
from swapless.tasks.worker.runtime import Runtime
from swapless.tasks.worker.shadows import Shadows
from swapless.tasks.worker.spans import BatchSpans, BatchTrace, traces_note

__all__ = ["GroupRunner"]

logger = logging.getLogger(__name__)


class GroupRunner:
    """Runs the groups the scheduler thread takes; only that thread calls it.

    Args:
        runtime: store, cache and settings.
        inbox: the backlog.
        ledger: the requests held.
        ahead: the next group's reads.
        completions: stores and acks.
        shadows: compares shadowed jobs with their shadows.
        observer: told about every group run.
        spans: makes the spans of traced jobs; None: tracing is off.
        refused: counts poison jobs.
    """

    def __init__(self, runtime: Runtime, inbox: JobInbox, ledger: RequestLedger, ahead: ReadAhead,
                 completions: Completions, shadows: Shadows, observer: SchedulerObserver,
                 spans: BatchSpans | None, refused: Callable[[int], None]) -> None:
        self.runtime = runtime
        self.inbox = inbox
        self.ledger = ledger
        self.chunks: ChunkAssembler = ledger.chunks
        self.ahead = ahead
        self.completions = completions
        self.shadows = shadows
        self.observer = observer
        self.spans = spans
        self.refused = refused
        self._traced: BatchTrace | None = None  # the batch ``_run_batch`` just ran, for its ``complete``
        self._pass_s: dict[str, float] = {}  # seconds per job of each model's last pass on a loaded model
        self._started: set[str] = set()  # jobs of the running group whose attempt is counted already
        self._aside: str | None = None  # the model a bulk group waits for, loading aside

    def run(self, results: ResultStore, group: Sequence[Job]) -> None:
        """Run one group: skip jobs that already have results, fail poison jobs, isolate suspects, run the rest."""
        model_id = group[0].model_id
        if self.runtime.settings.cache.load_ahead and model_id in self.runtime.manager.loaded_ids():
            self._load_ahead(model_id)  # loaded already: the next model's load starts before this group's reads
        self._cancel_revoked(results, group)
        # the first batch's attempts are counted in the same round trip as the reads, perhaps sent ahead
        ids, first = self._first_slice(model_id, group)
        read = self.ahead.take(ids, first)
        if read is None:
            done_before, attempts = results.prior(ids, list(dict.fromkeys(storage_id(i) for i in ids)), start=first)
            self.ahead.record(first, done_before, attempts)
            attempts = self.ahead.own(attempts)
        else:
            done_before, attempts = read
        self.completions.flush()  # the group before this one's results: stored while this one computes
        self._started = {i for i in self.ahead.running(ids) if storage_id(i) not in done_before}
        self.ahead.prune(self.ledger.live)
        if done_before:
            # Cancelled jobs, and redelivered copies of jobs that already have a final result: never run them.
            self._drop(results, model_id, done_before)
            group = [job for job in group if storage_id(job.id) not in done_before]
        max_attempts = self.runtime.settings.worker.max_attempts
        plan = plan_attempts(group, attempts, max_attempts)
        if plan.poison:
            logger.error("%d job(s) of %s were in flight at %d worker deaths each: failing them", len(plan.poison),
                         model_id, max_attempts)
            self.complete(results, [Outcome(job, error=PoisonJob(model_id, attempts[job.id])) for job in plan.poison])
            self.refused(len(plan.poison))
        if plan.together:
            self.complete(results, self._run_batch(results, model_id, plan.together))
        for job in plan.alone:
            self.complete(results, self._run_batch(results, model_id, [job]))
        if plan.fresh:
            self._run_sliced(results, model_id, plan.fresh)

    def _read_next(self) -> None:
        """Send the reads of the group the backlog would give next (as this group's last pass begins)."""
        manager = self.runtime.manager
        max_group = self.runtime.settings.worker.max_group
        upcoming = self.inbox.peek_group(manager.loaded_ids(), manager.load_cost_s, max_group)
        if upcoming:
            self.ahead.launch(*self._first_slice(upcoming[0].model_id, upcoming))

    def _first_slice(self, model_id: str, group: Sequence[Job]) -> tuple[list[str], list[str]]:
        """The ids of a group's jobs, and of those its first forward pass (``_slice``) runs."""
        ids = [job.id for job in group]
        size = self._slice(model_id, group)
        return ids, ids if size is None else ids[:size]

    def _slice(self, model_id: str, jobs: Sequence[Job]) -> int | None:
        """Jobs per slice of a group (``_run_sliced``), or None: it runs whole."""
        size = self.runtime.settings.cache.max_batch_size
        if any(job.expires_at is not None for job in jobs):
            size = min(size, self.runtime.store.get(model_id).max_batch_size or size)
        elif any(job.urgent for job in jobs):
            return None
        return size if len(jobs) > size else None

    def _run_sliced(self, results: ResultStore, model_id: str, jobs: Sequence[Job]) -> None:
        """Run a group in slices; between slices, yield to interactive jobs and expire jobs past their deadline."""
        size = self._slice(model_id, jobs)
        if size is None:
            self.complete(results, self._run_batch(results, model_id, jobs, last=True))
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
                    self.expire(results, late)
                    pending = [job for job in pending if job.expires_at is None or job.expires_at >= cutoff]
                    continue
            batch, pending = pending[:size], pending[size:]
            self.complete(results, self._run_batch(results, model_id, batch, last=not pending))
            if pending and not urgent and self.inbox.yield_to_urgent(pending):  # never started: back as they were
                self.ahead.counted([job.id for job in pending if job.id in self._started])
                logger.info("%s: yielding to interactive jobs with %d of %d bulk job(s) left", model_id,
                            len(pending), len(jobs))
                break

    def _run_batch(
        self, results: ResultStore, model_id: str, batch: Sequence[Job], last: bool = False
    ) -> list[Outcome]:
        """Mark ``batch`` started, run it and return one outcome per job (never raises).

        The ``last`` batch of a group sends the next group's reads.
        """
        batch = [job for job in batch if self.ledger.live(job.id)]  # not of a chunk dropped since the group began
        # a Redis failure keeps the batch
        found = results.start([job.id for job in batch if job.id not in self._started])
        self.completions.flush()  # the previous batch's results: stored while this one computes
        self._started.difference_update(job.id for job in batch)
        if found:
            self._drop(results, model_id, found)
            batch = [job for job in batch if storage_id(job.id) not in found]
        if not batch:
            return []
        try:
            waiting = self.inbox.waiting()
            warm = model_id in self.runtime.manager.loaded_ids()
            traced = self.spans.start(model_id, batch, self.runtime.manager) if self.spans is not None else None
            started = time.perf_counter()
            ahead = (lambda: self._load_ahead(model_id)) if self.runtime.settings.cache.load_ahead else None
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

    def _cancel_revoked(self, results: ResultStore, group: Sequence[Job]) -> None:
        """Cancel in Redis the jobs revoked through Celery's remote control, as ``Client.cancel`` does."""
        revoked = worker_state.revoked
        if not revoked:
            return
        ids = [under for under in dict.fromkeys(storage_id(job.id) for job in group) if under in revoked]
        if ids:
            answers = results.cancel(ids, JobCancelled, self.runtime.settings.jobs.cancel_hold_s)
            logger.info("revoked job(s) of %s: %s", group[0].model_id, answers)

    def _drop(self, results: ResultStore, model_id: str, result_ids: Collection[str]) -> None:
        """Ack without running the jobs whose results were found before they ran; a chunk's items leave with it."""
        plain = self.ledger.single(result_ids)
        chunks = self.chunks.drop([i for i in result_ids if i not in {r.id for r in plain}])
        if chunks:
            dropped = set(chunks)
            self.inbox.take_model(model_id, lambda _: lambda job: storage_id(job.id) not in dropped)
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
        self.ledger.finish(results, [(request, None, None) for request in requests], store=False)
        results.clear_attempts([item_id(chunk_id, i) for chunk_id, (_, size) in chunks.items() for i in range(size)])
        if cancelled:
            self.observer.on_skipped(model_id, "cancelled", cancelled)

    def complete(self, results: ResultStore, outcomes: list[Outcome]) -> None:
        """Store the outcomes (chunk items once their chunk is whole) and ack their messages."""
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
            self.completions.finish(results, work, jobs)
        elif traced is not None:  # items of chunks not yet whole: nothing stored for this batch
            traced.stored(None, None)

    def expire(self, results: ResultStore, jobs: Sequence[Job]) -> None:
        """Answer jobs whose deadline passed before they started: ``JobExpired``, and never run."""
        logger.info("%d job(s) passed their deadline before they started; answering JobExpired", len(jobs))
        by_model: dict[str, list[Outcome]] = {}
        for job in jobs:
            error = JobExpired(job.model_id, deadline_text(job.expires_at or 0.0))
            by_model.setdefault(job.model_id, []).append(Outcome(job, error=error))
        for model_id, expired in by_model.items():
            self.complete(results, expired)
            self.observer.on_skipped(model_id, "expired", len(expired))

    def _load_ahead(self, running: str) -> None:
        """Load the model the next group needs while ``running``'s group computes, if there is room."""
        manager = self.runtime.manager
        loaded = [*manager.loaded_ids(), running]
        upcoming, waiting = self.inbox.peek_next(loaded, manager.load_cost_s, running)
        waiting[running] = waiting.get(running, 0) + 1  # its jobs are in the group now, none left waiting: keep it
        if upcoming is not None and upcoming not in loaded and manager.load_ahead(upcoming, waiting):
            logger.info("loading %s ahead while %s computes", upcoming, running)

    def load_aside(self, group: Sequence[Job]) -> bool:
        """Load a bulk group's cold model aside and put the group back; False: the group loads it itself."""
        manager = self.runtime.manager
        model_id = group[0].model_id
        if not self.runtime.settings.cache.load_ahead or any(job.urgent for job in group):
            return False
        waited, self._aside = self._aside == model_id, None
        if manager.is_loaded(model_id):
            return False
        if not manager.is_loading(model_id):
            if waited:
                return False
            waiting = self.inbox.waiting()
            waiting[model_id] = waiting.get(model_id, 0) + len(group)
            if not manager.load_ahead(model_id, waiting):
                return False
            logger.info("loading %s aside; interactive jobs run meanwhile", model_id)
        self._aside = model_id
        self.inbox.put_back_until(group, lambda: manager.is_loading(model_id))
        return True
