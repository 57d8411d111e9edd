"""BatchScheduler: one worker's backlog and the thread that runs it.

The consumer thread hands every request to ``submit``; the scheduler thread takes the next group the moment it
is idle (``Backlog.next_group``: loaded models first, then the cold model with the most waiting work per second
of load, a starved job first), runs it through the model cache, stores each job's result in one pipeline and acks
the messages in bulk. Jobs that were in flight when a worker died run again together, at a second death alone; at
``SWAPLESS_MAX_ATTEMPTS`` deaths a job fails as a poison job. Nothing is acked before its result is stored.

A job with a deadline (its message's ``expires``, Celery's own header; else ``SWAPLESS_INTERACTIVE_EXPIRES_S`` or
``SWAPLESS_BULK_EXPIRES_S`` from its send time, when set) that has not started by then leaves the backlog before
the next group is chosen and is answered ``JobExpired``: it costs neither a load nor a forward pass. A group with
deadlines runs one forward pass at a time, and before each pass the jobs whose answer would come after their
deadline (now + the model's last pass time per job) are answered ``JobExpired`` too: under overload, the jobs that
are served are served in time, instead of every job a little too late.

A job found with a result before it starts (cancelled: ``Client.cancel`` or Celery's ``revoke``, both stored in
Redis as the job's result; or a redelivered copy of a finished job) is acked without running; the items of a
cancelled chunk leave the backlog with it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from celery.worker import state as worker_state
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from config.errors import JobCancelled, JobExpired, PoisonJob, PredictionFailed, SwaplessError
from manager import Backlog, Job, ModelStore, Outcome, run_group
from tasks.broker.acks import AckQueue
from tasks.broker.connection import redis_client
from tasks.broker.results import ResultStore
from tasks.broker.routes import RouteOverrides, count_shadow
from tasks.observe.accounting import NULL_OBSERVER, SchedulerObserver
from tasks.protocol import (
    CHUNK_TASK,
    SENT_AT_HEADER,
    SHADOW_HEADER,
    SHADOWED_HEADER,
    deadline_of,
    deadline_text,
    item_id,
    read_payload,
    shadow_ref_key,
    split_item_id,
    storage_id,
)
from tasks.worker.chunks import ChunkAssembler
from tasks.worker.runtime import Runtime

__all__ = ["BatchScheduler", "job_from_request"]

logger = logging.getLogger(__name__)


#: Seconds a shadowed job's top label is kept for its shadow copies (they run at bulk priority, maybe much later).
SHADOW_REF_S = 3600


def _top(prediction: Any) -> Any:
    """The top label of a prediction (a list of ``{label, score}``, best first), or the prediction itself."""
    if isinstance(prediction, list) and prediction and isinstance(prediction[0], dict):
        return prediction[0].get("label")
    return prediction


def job_from_request(
    request: Any, store: ModelStore, received_s: float, overrides: Mapping[str, Mapping[str, float]] | None = None
) -> Job:
    """Turn one Celery request into a Job, or raise an error that fails this job alone. A job addressed to a route
    (a plain Celery producer's: ``Client`` resolves its own) goes to the model the route picks by the job's id,
    as ``Client.submit`` would pick it; ``overrides``: the run-time route weights.

    Raises:
        InputError: the payload is not ``[model_id, input]``; a route has no branch for this input.
        UnknownModel: the model id is not in the registry.
    """
    model_id, value, urgent = read_payload(request, "job", "[model_id, input]")
    spec = store.get(store.route(model_id, value, request.id, overrides).model_id if store.routes else model_id)
    return Job(id=request.id, model_id=spec.id, input=value, received_s=received_s, urgent=urgent)


class BatchScheduler:
    """Owns the backlog of one worker and the thread that runs it. Thread-safe ``submit``.

    Args:
        runtime: store, cache and settings.
        results_factory: builds the ResultStore (called in the scheduler thread).
        acks: acks go through it, in bulk (the batch task binds it to the consumer's thread); default: each
            request is acked directly.
        observer: told about every group run (the worker's heartbeat, metrics and task events).
    """

    def __init__(
        self,
        runtime: Runtime,
        results_factory: Callable[[], ResultStore],
        *,
        acks: AckQueue | None = None,
        observer: SchedulerObserver = NULL_OBSERVER,
    ) -> None:
        self.runtime = runtime
        self.results_factory = results_factory
        self.acks = acks if acks is not None else AckQueue()
        self.observer = observer
        self.backlog = Backlog(runtime.settings.max_wait_s)
        self.jobs_done = 0
        self.jobs_failed = 0  # expired jobs included: their result is a failure
        self.jobs_expired = 0
        self.jobs_cancelled = 0
        self._requests: dict[str, Any] = {}
        self._duplicates: dict[str, list[Any]] = {}
        self.chunks = ChunkAssembler()  # chunk requests in progress, by chunk id
        self._rejected: list[tuple[Any, SwaplessError]] = []
        self._weights: RouteOverrides | None = None
        #: Seconds per job of each model's last forward pass on a loaded model (scheduler thread only).
        self._pass_s: dict[str, float] = {}
        #: Jobs of the running group whose attempt is counted already (scheduler thread only).
        self._started: set[str] = set()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._first: Callable[[], Any] | None = None
        #: Set once the scheduler thread is running and has done its ``first`` work (the warm start).
        self.ready = threading.Event()

    # -- consumer side -----------------------------------------------------------------------------------

    def submit(self, requests: Collection[Any]) -> None:
        """Add Celery requests to the backlog (called from the consumer thread) and wake the scheduler."""
        now = time.monotonic()
        jobs = []
        with self._cond:
            for request in requests:
                if request.id in self._requests:
                    # A second copy of a message this worker already holds (a producer's publish retry, a
                    # redelivery): run once, ack every copy with the first.
                    self._duplicates.setdefault(request.id, []).append(request)
                    continue
                try:
                    store, overrides = self.runtime.store, self._route_weights()
                    if request.name == CHUNK_TASK:  # one Job per item; self.chunks keeps the request
                        jobs.extend(self._with_deadline(request, self.chunks.expand(request, store, now, overrides)))
                        continue
                    jobs.extend(self._with_deadline(request, [job_from_request(request, store, now, overrides)]))
                    self._requests[request.id] = request
                except SwaplessError as err:
                    self._rejected.append((request, err))
            self.backlog.add(jobs)
            self._cond.notify()
        self.start()

    def _route_weights(self) -> Mapping[str, Mapping[str, float]] | None:
        """The run-time route weights (``swapless route``), when the registry has routes."""
        if not self.runtime.store.routes:
            return None
        if self._weights is None:
            s = self.runtime.settings
            self._weights = RouteOverrides(
                redis_client(s.broker_url, connect_timeout_s=s.connect_timeout_s), s.queue, s.key_prefix
            )
        return self._weights.get()

    def _with_deadline(self, request: Any, jobs: list[Job]) -> list[Job]:
        """``jobs`` (one request's) with its deadline: the message's own, else the default for its priority."""
        if not jobs:
            return jobs
        deadline = deadline_of(request)
        if deadline is None:
            s = self.runtime.settings
            default_s = s.interactive_expires_s if jobs[0].urgent else s.bulk_expires_s
            if default_s is None:
                return jobs
            sent_at = (getattr(request, "request_dict", None) or {}).get(SENT_AT_HEADER)
            deadline = (sent_at if isinstance(sent_at, (int, float)) else time.time()) + default_s
        return [dataclasses.replace(job, expires_at=deadline) for job in jobs]

    def hand_over(self, model_id: str) -> int:
        """Give back the waiting jobs of a model this worker no longer holds (placement moved it to another worker):
        they leave the backlog and their messages go back to the head of the model's list. Items of chunks stay
        (their chunk's other items may be done); the group running now finishes. Returns how many went back."""
        with self._cond:
            jobs = self.backlog.take_model(model_id, keep=lambda job: job.id not in self._requests)
            requests = [self._requests.pop(job.id) for job in jobs]
            requests += [dup for job in jobs for dup in self._duplicates.pop(job.id, [])]
        if requests:
            self.acks.requeue(requests)
            logger.info("handed %d waiting job(s) of %s over to the worker that holds it now", len(jobs), model_id)
        return len(jobs)

    def backlog_counts(self) -> dict[str, int]:
        """Jobs waiting in the backlog per model (safe from any thread)."""
        with self._cond:
            return self.backlog.counts()

    def start(self, first: Callable[[], Any] | None = None) -> None:
        """Start the scheduler thread (once); it runs ``first`` before any job, then sets ``ready``.

        The warm start runs there (``first``): part of what it warms is per thread (oneDNN and OpenMP state), so
        warming on another thread left mobilenet's first groups 30-80 % slower.
        """
        if self._thread is None:
            self._first = first
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

    def _take(self) -> tuple[list[tuple[Any, SwaplessError]], list[Job], list[Job]] | None:
        manager = self.runtime.manager
        with self._cond:
            while not self._stopping and not self._rejected and not len(self.backlog):
                self._cond.wait()
            if self._stopping:
                return None
            rejected, self._rejected = self._rejected, []
            expired = self.backlog.take_expired(time.time())
            group = self.backlog.next_group(manager.loaded_ids(), manager.load_cost_s, self.runtime.settings.max_group)
            return rejected, expired, group

    def _loop(self) -> None:
        try:
            if self._first is not None:
                self._first()
        except Exception:  # noqa: BLE001 - a failed warm-up only costs speed
            logger.exception("the warm start failed; going on without it")
        finally:
            self.ready.set()
        results = self.results_factory()
        while True:
            taken = self._take()
            if taken is None:
                return
            rejected, expired, group = taken
            try:
                if rejected:
                    self._finish(results, [(request, None, err) for request, err in rejected])
                if expired:
                    self._expire(results, expired)
                if group:
                    self._run(results, group)
            except (RedisError, OperationalError) as err:
                # Redis failed in a way the result store does not retry: keep the jobs (still held, unacked) and
                # try them again shortly; giving them back would need Redis too.
                logger.warning("a group of %d job(s) hit a Redis error (%s); keeping them, retrying in 1 s",
                               len(group) + len(expired), err)
                self._keep([*expired, *group])
                time.sleep(1.0)
            except Exception:  # noqa: BLE001 - the scheduler must outlive any one group
                logger.exception("a group of %d job(s) failed to complete; putting them back on the queue",
                                 len(group) + len(expired))
                self._give_back([*expired, *group])

    def _expire(self, results: ResultStore, jobs: Sequence[Job]) -> None:
        """Answer jobs whose deadline passed before they started: ``JobExpired``, and never run."""
        logger.info("%d job(s) passed their deadline before they started; answering JobExpired", len(jobs))
        outcomes = [Outcome(job, error=JobExpired(job.model_id, deadline_text(job.expires_at or 0.0))) for job in jobs]
        by_model: dict[str, list[Outcome]] = {}
        for outcome in outcomes:
            by_model.setdefault(outcome.job.model_id, []).append(outcome)
        for model_id, expired in by_model.items():
            self._complete(results, model_id, expired)
            self.jobs_expired += len(expired)
            self.observer.on_skipped(model_id, "expired", len(expired))

    def _unfinished(self, group: Sequence[Job]) -> list[Job]:
        with self._cond:
            return [job for job in group if job.id in self._requests or self.chunks.waiting_for(job.id)]

    def _keep(self, group: Sequence[Job]) -> None:
        """Put the jobs of ``group`` that have no outcome yet back into the backlog."""
        unfinished = self._unfinished(group)
        with self._cond:
            self.backlog.add(unfinished)
            self._cond.notify()

    def _give_back(self, group: Sequence[Job]) -> None:
        """Requeue the messages of jobs that got no result; chunk items go back to the backlog (their chunk's
        message also holds items that did finish)."""
        unfinished = self._unfinished(group)
        with self._cond:
            requests = [self._requests.pop(job.id) for job in unfinished if job.id in self._requests]
            requests += [dup for job in unfinished for dup in self._duplicates.pop(job.id, [])]
            items = [job for job in unfinished if split_item_id(job.id) is not None and job.id not in self._requests]
            self.backlog.add(items)
        for request in requests:
            request.reject(requeue=True)

    def _load_ahead(self, running: str) -> None:
        """Once ``running`` is loaded and its group is about to compute, load the model the next group will need,
        if there is room for it."""
        manager = self.runtime.manager
        with self._cond:
            loaded = [*manager.loaded_ids(), running]
            upcoming = self.backlog.peek_next(loaded, manager.load_cost_s, exclude=running)
            waiting = self.backlog.counts()
        if upcoming is not None and upcoming not in loaded and manager.load_ahead(upcoming, waiting):
            logger.info("loading %s ahead while %s computes", upcoming, running)

    def _run(self, results: ResultStore, group: Sequence[Job]) -> None:
        """Run one group: skip jobs that already have results, fail poison jobs, isolate suspects, run the rest."""
        model_id = group[0].model_id
        self._cancel_revoked(results, group)
        # The first batch's attempts are counted in the same round trip as the reads (see _run_batch).
        size = self._slice(model_id, group)
        first = group if size is None else group[:size]
        done_before, attempts = results.prior(
            [job.id for job in group], list(dict.fromkeys(storage_id(job.id) for job in group)),
            start=[job.id for job in first],
        )
        self._started = {job.id for job in first if job.id not in attempts and storage_id(job.id) not in done_before}
        if done_before:
            # Cancelled jobs, and redelivered copies of jobs that already have a final result: never run them.
            self._drop(results, model_id, done_before)
            group = [job for job in group if storage_id(job.id) not in done_before]
        max_attempts = self.runtime.settings.max_attempts
        poison = [job for job in group if attempts.get(job.id, 0) >= max_attempts]
        if poison:
            logger.error("%d job(s) of %s were in flight at %d worker deaths each: failing them", len(poison), model_id, max_attempts)
            self._complete(results, model_id, [Outcome(job, error=PoisonJob(model_id, attempts[job.id])) for job in poison])
        # Jobs that were in flight when a worker died are run again together (a worker dies for many reasons: a
        # whole batch re-run one job at a time would cost its model many passes); in flight at a second death, they
        # run alone, so that one poison input cannot take others down with it again. The last attempt before
        # SWAPLESS_MAX_ATTEMPTS is always alone.
        unfinished = [job for job in group if 0 < attempts.get(job.id, 0) < max_attempts and job.id not in done_before]
        together = [job for job in unfinished if attempts[job.id] == 1 and max_attempts > 2]
        alone = [job for job in unfinished if job not in together]
        if together:
            self._complete(results, model_id, self._run_batch(results, model_id, together))
        for job in alone:
            self._complete(results, model_id, self._run_batch(results, model_id, [job]))
        rest = [job for job in group if job.id not in attempts and job.id not in done_before]
        if rest:
            self._run_sliced(results, model_id, rest)

    def _slice(self, model_id: str, jobs: Sequence[Job]) -> int | None:
        """Jobs per slice of a group (``_run_sliced``), or None: it runs whole."""
        size = self.runtime.settings.max_batch_size
        if any(job.expires_at is not None for job in jobs):
            size = min(size, self.runtime.store.get(model_id).max_batch_size or size)
        elif any(job.urgent for job in jobs):
            return None
        return size if len(jobs) > size else None

    def _run_sliced(self, results: ResultStore, model_id: str, jobs: Sequence[Job]) -> None:
        """Run a group in slices, each slice's results stored (and its messages acked) as soon as it is done;
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
            self._complete(results, model_id, self._run_batch(results, model_id, jobs))
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
            self._complete(results, model_id, self._run_batch(results, model_id, batch))
            if pending and not urgent:
                with self._cond:
                    if self.backlog.urgent:
                        self.backlog.add(pending)  # never started: back as they were
                        logger.info("%s: yielding to interactive jobs with %d of %d bulk job(s) left", model_id,
                                    len(pending), len(jobs))
                        break

    def _run_batch(self, results: ResultStore, model_id: str, batch: Sequence[Job]) -> list[Outcome]:
        """Mark ``batch`` started (the jobs ``_run`` did not count already), run it, return one outcome per job (never
        raises). Jobs found with a result when they are marked (cancelled since the group began) do not run."""
        batch = [job for job in batch if self._live(job.id)]  # not of a chunk dropped since the group began
        # a Redis failure keeps the batch
        found = results.start([job.id for job in batch if job.id not in self._started])
        self._started.difference_update(job.id for job in batch)
        if found:
            self._drop(results, model_id, found)
            batch = [job for job in batch if storage_id(job.id) not in found]
        if not batch:
            return []
        try:
            waiting = self.backlog_counts()
            warm = model_id in self.runtime.manager.loaded_ids()
            started = time.perf_counter()
            ahead = (lambda: self._load_ahead(model_id)) if self.runtime.settings.load_ahead else None
            outcomes = run_group(self.runtime.manager, model_id, batch, waiting, on_loaded=ahead)
            elapsed = time.perf_counter() - started
            if warm:  # the last warm pass's seconds per job: when the next answers would come
                self._pass_s[model_id] = elapsed / len(batch)
            self.observer.on_group(model_id, batch, outcomes, elapsed)  # heartbeat, metrics, events; never raises
            failed = sum(1 for o in outcomes if not o.ok)
            logger.info("ran %d job(s) on %s in %.3f s (%d failed)", len(outcomes), model_id, elapsed, failed)
        except Exception as err:  # noqa: BLE001 - a bug here must still give every job an answer
            logger.exception("internal error running %d job(s) on %s", len(batch), model_id)
            outcomes = [Outcome(job, error=PredictionFailed(model_id, f"internal error in the worker: {err!r}")) for job in batch]
        return outcomes

    def _live(self, job_id: str) -> bool:
        """Whether ``job_id`` is still this worker's to answer (not dropped as cancelled or done elsewhere)."""
        if split_item_id(job_id) is not None:
            return self.chunks.owns(job_id)
        with self._cond:
            return job_id in self._requests

    def _cancel_revoked(self, results: ResultStore, group: Sequence[Job]) -> None:
        """Jobs revoked through Celery's remote control (``app.control.revoke``; a plain producer's cancel) are
        cancelled in Redis like ``Client.cancel``'s, so every worker skips them and the cancel outlives this one."""
        revoked = worker_state.revoked
        if not revoked:
            return
        ids = [under for under in dict.fromkeys(storage_id(job.id) for job in group) if under in revoked]
        if ids:
            answers = results.cancel(ids, JobCancelled)
            logger.info("revoked job(s) of %s: %s", group[0].model_id, answers)

    def _drop(self, results: ResultStore, model_id: str, result_ids: Collection[str]) -> None:
        """Ack, without running or storing anything, the jobs whose results ``result_ids`` were found before they
        ran: cancelled jobs (their result is the cancellation) and redelivered copies of finished jobs. A chunk's
        waiting items leave the backlog with it."""
        with self._cond:
            plain = [self._requests[i] for i in result_ids if i in self._requests]
        chunks = self.chunks.drop([i for i in result_ids if i not in {r.id for r in plain}])
        if chunks:
            dropped = set(chunks)
            with self._cond:
                self.backlog.take_model(model_id, keep=lambda job: storage_id(job.id) not in dropped)
        requests = plain + [request for requests, _ in chunks.values() for request in requests]
        if not requests:
            return
        found = results.fetch(list(dict.fromkeys(request.id for request in requests)))
        cancelled = sum(chunks[s.job_id][1] if s.job_id in chunks else 1 for s in found if isinstance(s.value, JobCancelled))
        logger.info("%d message(s) of %s have a result already (%d job(s) cancelled); acking without running them",
                    len(requests), model_id, cancelled)
        self._finish(results, [(request, None, None) for request in requests], store=False, count=False)
        results.clear_attempts([item_id(chunk_id, i) for chunk_id, (_, size) in chunks.items() for i in range(size)])
        if cancelled:
            self.jobs_cancelled += cancelled
            self.observer.on_skipped(model_id, "cancelled", cancelled)

    def _complete(self, results: ResultStore, model_id: str, outcomes: list[Outcome]) -> None:
        outcomes = [o for o in outcomes if self._live(o.job.id)]  # a chunk dropped after some of its items ran
        outcomes, chunks_done = self.chunks.collect(outcomes)  # items of chunks -> complete chunks
        served = {o.job.id: o.job.model_id for o in outcomes}
        held = [(self._held(o.job.id), o) for o in outcomes]
        self._finish(results, [(request, o.result, o.error) for request, o in held] + chunks_done, models=served)
        headers = [((getattr(request, "request_dict", None) or {}), o) for request, o in held]
        references = {o.job.id: json.dumps([o.job.model_id, _top(o.result)]) for h, o in headers
                      if h.get(SHADOWED_HEADER) and o.error is None}
        if references:
            prefix = self.runtime.settings.key_prefix
            pipe = results.client.pipeline(transaction=False)
            for job_id, reference in references.items():
                pipe.set(shadow_ref_key(job_id, prefix), reference, ex=SHADOW_REF_S)
            pipe.execute()
        shadows = [(h[SHADOW_HEADER], o) for h, o in headers if isinstance(h.get(SHADOW_HEADER), list)]
        if shadows:
            self._compare_shadows(results, shadows)
        if chunks_done:  # the items' attempt counters end with their chunk's stored result
            results.clear_attempts([item_id(r.id, i) for r, value, _ in chunks_done for i in range(len(value))])

    def _compare_shadows(self, results: ResultStore, shadows: list[tuple[list[Any], Outcome]]) -> None:
        """Count, per (route, served model, shadow model), whether each shadow copy's top label is the served job's
        (its ``shadow_ref_key``; in Redis for ``swapless status``, and in the metrics). A served job that failed or
        has not finished is not compared."""
        prefix = self.runtime.settings.key_prefix
        raws = results.client.mget([shadow_ref_key(str(of[0]), prefix) for of, _ in shadows])
        counts: dict[tuple[str, str, str, bool], int] = {}
        for ((_, route_id, *_), outcome), raw in zip(shadows, raws, strict=True):
            if raw is None or outcome.error is not None:
                continue  # the served job failed, or has not finished yet
            served_model, served_top = json.loads(raw)
            pair = (str(route_id), served_model, outcome.job.model_id, served_top == _top(outcome.result))
            counts[pair] = counts.get(pair, 0) + 1
        if counts:
            s = self.runtime.settings
            count_shadow(results.client, s.queue, s.key_prefix, counts)
            for (route_id, served_model, shadow_model, agreed), n in counts.items():
                self.observer.on_shadow(route_id, served_model, shadow_model, agreed, n)

    def _held(self, job_id: str) -> Any:
        with self._cond:
            return self._requests[job_id]

    def _finish(
        self,
        results: ResultStore,
        items: Sequence[tuple[Any, Any, SwaplessError | None]],
        store: bool = True,
        count: bool = True,
        models: Mapping[str, str] | None = None,
    ) -> None:
        if store:
            results.store([(request.id, result, error) for request, result, error in items], models=models)
        with self._cond:  # stored: the jobs leave the backlog's bookkeeping only now
            for request, _, _ in items:
                self._requests.pop(request.id, None)
            copies = [dup for request, _, _ in items for dup in self._duplicates.pop(request.id, [])]
        self.acks.ack([request for request, _, _ in items] + copies)  # only once the results are stored
        if not count:
            return
        for _, _, error in items:
            if error is None:
                self.jobs_done += 1
            else:
                self.jobs_failed += 1
