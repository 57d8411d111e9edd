"""The batch task: queued jobs -> grouped by model -> run through the model cache -> one result per job.

Why not plain celery-batches: its strategy is kept (it turns each message into a request and handles ETAs), but
its flushing is replaced. celery-batches flushes every ``flush_every`` messages or every ``flush_interval``
seconds, hands the batch to the pool, and acks late messages when the batch returns, even if it raised. Here:

- every message goes into this worker's backlog as soon as it arrives (``flush_every = 1``);
- one scheduler thread takes the next group from the backlog the moment it is idle, so a lone job never waits
  for a timer and, while a group computes, the consumer keeps fetching (the backlog grows in the meantime);
- the scheduler sees the whole backlog (up to ``SWAPLESS_PREFETCH`` unacked jobs), serves loaded models first,
  then the cold model with the most waiting work per second of load (``manager.policy``);
- each job's own result or error is stored (pipelined, first result wins), and only then is its message acked.
  A job that never got a result is never acked: a dead worker's jobs are redelivered.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from celery import bootsteps, signals
from celery.exceptions import InvalidTaskError
from kombu.exceptions import ContentDisallowed, DecodeError
from celery_batches import Batches

from config.settings import Settings, get_settings
from manager import (
    ConfigError,
    Outcome,
    PoisonJob,
    PredictionFailed,
    Backlog,
    InputError,
    Job,
    ModelEngine,
    ModelManager,
    ModelStore,
    SwaplessError,
    WorkerLimits,
    run_group,
)
from tasks import status  # issue #7: heartbeat and metrics
from tasks.app import PREDICT_TASK, PRIORITY_BULK, app
from tasks.chunks import CHUNK_TASK, ChunkAssembler, item_id  # issue #5: chunk messages
from tasks.observe import NULL_OBSERVER, SchedulerObserver  # issue #7
from tasks.acks import AckQueue, refresh_visibility
from tasks.results import ResultStore

__all__ = ["BatchScheduler", "Runtime", "SwaplessBatches", "build_runtime", "predict", "run_now"]

logger = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What one worker process holds: the registry, the cache and the settings."""

    settings: Settings
    store: ModelStore
    manager: ModelManager


def build_runtime(settings: Settings | None = None, *, warm_up: bool = False) -> Runtime:
    """Read the models file (failing at start-up on a bad entry) and build an empty cache.

    Args:
        settings: the process settings (the environment's by default).
        warm_up: import the frameworks' libraries now, so that the first job does not wait for them.
    """
    s = settings or get_settings()
    for module in filter(None, (name.strip() for name in s.plugins.split(","))):
        try:
            importlib.import_module(module)  # registers custom frameworks
        except ImportError as err:
            raise ConfigError("SWAPLESS_PLUGINS", f"cannot import {module!r}: {err}") from None
    limits = WorkerLimits(
        device=s.device,
        max_batch_size=s.max_batch_size,
        max_text_chars=s.max_text_chars,
        max_image_bytes=s.max_image_bytes,
        max_image_pixels=s.max_image_pixels,
        input_root=str(s.input_root) if s.input_root else None,
        triton_url=s.triton_url,
    )
    engine = ModelEngine(limits)
    store = ModelStore.from_file(s.models_file, engine.frameworks)
    if warm_up:
        engine.warm_up(spec.framework for spec in store)
    manager = ModelManager(
        store,
        engine,
        max_models=s.max_models,
        memory_budget_bytes=s.memory_budget,
        remote_max_models=s.triton_max_models,
    )
    return Runtime(s, store, manager)


def job_from_request(request: Any, store: ModelStore, received_s: float) -> Job:
    """Turn one Celery request into a Job, or raise an error that fails this job alone.

    Raises:
        InputError: the payload is not ``[model_id, input]``.
        UnknownModel: the model id is not in the registry.
    """
    args = request.args
    if not isinstance(args, (list, tuple)) or len(args) != 2 or request.kwargs:
        raise InputError("?", "malformed job payload: expected args [model_id, input] and no kwargs")
    model_id, value = args
    if not isinstance(model_id, str):
        raise InputError("?", f"malformed job payload: model id must be a string, not {type(model_id).__name__}")
    spec = store.get(model_id)
    priority = (request.delivery_info or {}).get("priority")
    urgent = priority is None or priority < PRIORITY_BULK
    return Job(id=request.id, model_id=spec.id, input=value, received_s=received_s, urgent=urgent)


class BatchScheduler:
    """Owns the backlog of one worker and the thread that runs it. Thread-safe ``submit``.

    Args:
        runtime: store, cache and settings.
        results_factory: builds the ResultStore (called in the scheduler thread).
    """

    #: Acks go through it, in bulk, on the consumer's thread (set by SwaplessBatches; default: ack directly).
    acks: AckQueue = AckQueue(None)

    #: Told about every group run (issue #7: ``tasks.status.start_worker_reporting`` sets the worker's).
    observer: SchedulerObserver = NULL_OBSERVER

    def __init__(self, runtime: Runtime, results_factory: Callable[[], ResultStore]) -> None:
        self.runtime = runtime
        self.results_factory = results_factory
        self.backlog = Backlog(runtime.settings.max_wait_s)
        self.jobs_done = 0
        self.jobs_failed = 0
        self._requests: dict[str, Any] = {}
        self._duplicates: dict[str, list[Any]] = {}
        self.chunks = ChunkAssembler()  # issue #5: chunk requests in progress, by chunk id
        self._rejected: list[tuple[Any, SwaplessError]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

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
                    if request.name == CHUNK_TASK:  # issue #5: one Job per item; self.chunks keeps the request
                        jobs.extend(self.chunks.expand(request, self.runtime.store, now))
                        continue
                    jobs.append(job_from_request(request, self.runtime.store, now))
                    self._requests[request.id] = request
                except SwaplessError as err:
                    self._rejected.append((request, err))
            self.backlog.add(jobs)
            self._cond.notify()
        self.start()

    def start(self) -> None:
        if self._thread is None:
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

    def _take(self) -> tuple[list[tuple[Any, SwaplessError]], list[Job]] | None:
        manager = self.runtime.manager
        with self._cond:
            while not self._stopping and not self._rejected and not len(self.backlog):
                self._cond.wait()
            if self._stopping:
                return None
            rejected, self._rejected = self._rejected, []
            group = self.backlog.next_group(manager.loaded_ids(), manager.load_cost_s, self.runtime.settings.max_group)
            return rejected, group

    def _loop(self) -> None:
        results = self.results_factory()
        while True:
            taken = self._take()
            if taken is None:
                return
            rejected, group = taken
            try:
                if rejected:
                    self._finish(results, [(request, None, err) for request, err in rejected])
                if group:
                    self._run(results, group)
            except Exception:  # noqa: BLE001 - the scheduler must outlive any one group
                logger.exception("a group of %d job(s) failed to complete; putting them back on the queue", len(group))
                self._give_back(group)

    def _give_back(self, group: Sequence[Job]) -> None:
        """Requeue the messages of jobs that got no result (e.g. Redis stayed down longer than the retries)."""
        with self._cond:
            requests = [self._requests.pop(job.id) for job in group if job.id in self._requests]
            requests += [dup for job in group for dup in self._duplicates.pop(job.id, [])]
        for request in requests:
            request.reject(requeue=True)

    def _run(self, results: ResultStore, group: Sequence[Job]) -> None:
        """Run one group: skip jobs that already have results, fail poison jobs, isolate suspects, run the rest."""
        model_id = group[0].model_id
        done_before, attempts = results.prior([job.id for job in group])
        if done_before:
            # Redelivered copies of jobs that already have a final result: do not run them again.
            logger.info("%d redelivered job(s) of %s already have results; acking", len(done_before), model_id)
            self._finish(results, [(self._pop(job.id), None, None) for job in group if job.id in done_before], store=False)
        max_attempts = self.runtime.settings.max_attempts
        poison = [job for job in group if attempts.get(job.id, 0) >= max_attempts]
        if poison:
            logger.error("%d job(s) of %s were in flight at %d worker deaths each: failing them", len(poison), model_id, max_attempts)
            self._complete(results, model_id, [Outcome(job, error=PoisonJob(model_id, attempts[job.id])) for job in poison])
        # Jobs that were in flight when a worker died run alone, so that one poison input cannot take others down.
        suspects = [job for job in group if 0 < attempts.get(job.id, 0) < max_attempts and job.id not in done_before]
        rest = [job for job in group if job.id not in attempts and job.id not in done_before]
        for batch in [[job] for job in suspects] + ([rest] if rest else []):
            try:
                results.start([job.id for job in batch])
                with self._cond:
                    waiting = self.backlog.counts()
                started = time.perf_counter()
                outcomes = run_group(self.runtime.manager, model_id, batch, waiting)
                elapsed = time.perf_counter() - started
                self.observer.on_group(model_id, batch, outcomes, elapsed)  # issue #7: heartbeat and metrics; never raises
                failed = sum(1 for o in outcomes if not o.ok)
                logger.info("ran %d job(s) on %s in %.3f s (%d failed)", len(outcomes), model_id, elapsed, failed)
            except Exception as err:  # noqa: BLE001 - a bug here must still give every job an answer
                logger.exception("internal error running %d job(s) on %s", len(batch), model_id)
                outcomes = [Outcome(job, error=PredictionFailed(model_id, f"internal error in the worker: {err!r}")) for job in batch]
            self._complete(results, model_id, outcomes)

    def _complete(self, results: ResultStore, model_id: str, outcomes: list[Outcome]) -> None:
        outcomes, chunks_done = self.chunks.collect(outcomes)  # issue #5: items of chunks -> complete chunks
        self._finish(results, [(self._pop(o.job.id), o.result, o.error) for o in outcomes] + chunks_done)
        if chunks_done:  # issue #5: the items' attempt counters end with their chunk's stored result
            results.clear_attempts([item_id(r.id, i) for r, value, _ in chunks_done for i in range(len(value))])

    def _pop(self, job_id: str) -> Any:
        with self._cond:
            return self._requests.pop(job_id)

    def _finish(
        self, results: ResultStore, items: Sequence[tuple[Any, Any, SwaplessError | None]], store: bool = True
    ) -> None:
        if store:
            results.store([(request.id, result, error) for request, result, error in items])
        with self._cond:
            copies = [dup for request, _, _ in items for dup in self._duplicates.pop(request.id, [])]
        self.acks.ack([request for request, _, _ in items] + copies)  # only once the results are stored
        for _, _, error in items:
            if error is None:
                self.jobs_done += 1
            else:
                self.jobs_failed += 1


class SwaplessBatches(Batches):
    """celery-batches' strategy with Swapless' scheduler in place of its flush (see the module docstring)."""

    abstract = True
    #: Hand every message to the scheduler as it arrives; the scheduler does the batching.
    flush_every = 1
    #: Only jobs with an ETA wait for this timer.
    flush_interval = 0.5

    scheduler: BatchScheduler | None = None
    acks: AckQueue | None = None
    _refresh_tref: Any = None

    def Strategy(self, task: Any, app: Any, consumer: Any) -> Callable[..., Any]:  # noqa: N802 - Celery's name
        """Called by the consumer at each (re)connection: bulk acks on its thread, and the visibility refresh."""
        self.acks = AckQueue(consumer.call_soon)
        if self.scheduler is not None:
            self.scheduler.acks = self.acks
        if self._refresh_tref is not None:
            self._refresh_tref.cancel()
        settings = get_settings()

        def refresh() -> None:
            task_consumer = getattr(consumer, "task_consumer", None)
            if task_consumer is not None:
                refresh_visibility(task_consumer.channel)

        self._refresh_tref = consumer.timer.call_repeatedly(settings.visibility_refresh_s, refresh)
        handler = super().Strategy(task, app, consumer)

        def guarded(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any) -> None:
            # A message whose JSON is not a job (an object, null, a list of the wrong length) makes Celery's
            # request parsing raise; anything but InvalidTaskError there stops the whole worker, and the message
            # would stop the next one too. Answer it with an error result instead, and drop it.
            try:
                handler(message, body, ack, reject, callbacks, **kwargs)
            except InvalidTaskError:
                raise
            except Exception as err:  # noqa: BLE001 - any parse failure of one message
                self._answer_malformed(message, err)
                raise InvalidTaskError(f"malformed job message: {err!r}") from err

        return guarded

    def _answer_malformed(self, message: Any, err: Exception) -> None:
        job_id = (getattr(message, "headers", None) or {}).get("id")
        if not isinstance(job_id, str):
            return
        if isinstance(err, ContentDisallowed):
            problem = f"message refused, nothing in it was decoded: {err}; send JSON"
        elif isinstance(err, DecodeError):
            problem = f"message body is not valid JSON ({err})"
        else:
            problem = f"malformed job message: expected args [model_id, input] ({type(err).__name__}: {err})"
        try:
            ResultStore(self.app, retry_s=5).store([(job_id, None, InputError("?", problem))])
        except Exception:  # noqa: BLE001 - best effort: the message is dropped either way
            logger.warning("could not store the error of malformed message %s", job_id, exc_info=True)

    def flush(self, requests: Collection[Any]) -> None:
        if self.scheduler is None:
            self.scheduler = BatchScheduler(build_runtime(), lambda: ResultStore(self.app))
        if self.acks is not None:
            self.scheduler.acks = self.acks
        self.scheduler.submit(requests)


class FinishInHand(bootsteps.StartStopStep):
    """Warm shutdown (SIGTERM): finish the group in hand and ack it while the broker connection is still open.

    A consumer step that needs the task consumer, so it shuts down before the connection does. Jobs still
    waiting in the backlog stay unacked; kombu puts them back on the queue when the channel closes.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def shutdown(self, parent: Any) -> None:
        task = app.tasks.get(PREDICT_TASK)
        scheduler = getattr(task, "scheduler", None)
        if scheduler is not None:
            scheduler.stop(timeout_s=get_settings().visibility_timeout_s)
            scheduler.acks.drain()


app.steps["consumer"].add(FinishInHand)



def run_now(requests: Sequence[Any]) -> None:
    """Run requests in this thread and store their results (the eager path, ``predict.apply(...)``)."""
    runtime = build_runtime()
    store = ResultStore(app)
    try:
        for request in requests:
            try:
                job = job_from_request(request, runtime.store, time.monotonic())
            except SwaplessError as err:
                store.store([(request.id, None, err)])
                continue
            store.store([(o.job.id, o.result, o.error) for o in run_group(runtime.manager, job.model_id, [job])])
    finally:
        runtime.manager.close()


@app.task(base=SwaplessBatches, name=PREDICT_TASK, bind=False, acks_late=True)
def predict(requests: Sequence[Any]) -> None:
    """The batch task. In a worker, SwaplessBatches.flush feeds the scheduler and this body is not used;
    ``predict.apply(args=[model_id, input])`` runs it eagerly through the same model code."""
    run_now(requests)


@signals.worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    # Build the runtime before the first message (a bad models file stops the worker at start-up).
    task = app.tasks[PREDICT_TASK]
    try:
        runtime = build_runtime(warm_up=True)
    except SwaplessError as err:
        logger.critical("cannot start: %s", err)
        raise SystemExit(2) from None  # not an Exception: Celery's signal dispatch lets it stop the worker
    task.scheduler = BatchScheduler(runtime, lambda: ResultStore(task.app))
    logger.info("swapless worker ready: models %s", ", ".join(task.scheduler.runtime.store.ids()))
    status.start_worker_reporting(task.scheduler, getattr(sender, "hostname", None))  # issue #7


@signals.worker_shutdown.connect
def _on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    task = app.tasks.get(PREDICT_TASK)
    scheduler = getattr(task, "scheduler", None)
    if scheduler is not None:
        scheduler.stop()
        status.stop_worker_reporting()  # issue #7
        scheduler.runtime.manager.close()
