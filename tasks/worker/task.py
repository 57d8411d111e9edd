"""The batch task: queued jobs -> grouped by model -> run through the model cache -> one result per job.

Why not plain celery-batches: its strategy is kept (it turns each message into a request and handles ETAs), but
its flushing is replaced. celery-batches flushes every ``flush_every`` messages or every ``flush_interval``
seconds, hands the batch to the pool, and acks late messages when the batch returns, even if it raised. Here:

- every message goes into this worker's backlog as soon as it arrives: everything one read of the transport
  delivered is flushed at once, on the event loop's next tick (``_flush_per_tick``);
- one scheduler thread takes the next group from the backlog the moment it is idle, so a lone job never waits
  for a timer and, while a group computes, the consumer keeps fetching (the backlog grows in the meantime);
- the scheduler sees the whole backlog (up to ``SWAPLESS_PREFETCH`` unacked jobs), serves loaded models first,
  then the cold model with the most waiting work per second of load (``manager.batching.order``);
- each job's own result or error is stored (pipelined, first result wins), and only then is its message acked.
  A job that never got a result is never acked: a dead worker's jobs are redelivered.

Chunk messages (``swapless.predict_chunk``) go to the same scheduler: one backlog and one cache per worker, both
kinds of message grouped by model together. ``predict.apply(args=[model_id, input])`` and
``predict_chunk.apply(args=[model_id, inputs])`` run eagerly through the same model code.

The worker's start-up (``worker_init``) builds the runtime once (``tasks.worker.runtime``), its reporting
(``tasks.worker.reporting``) and the scheduler, handing each its collaborators; nothing is reassigned later but the
consumer thread the acks run on, which changes with each broker connection.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from celery import bootsteps, signals
from celery.exceptions import InvalidTaskError
from celery_batches import Batches
from kombu.exceptions import ContentDisallowed, DecodeError

from config.errors import InputError, SwaplessError
from config.settings import get_settings
from manager import ModelEngine, run_group
from manager.batching.warmup import warm_start
from tasks.app import make_app
from tasks.broker.acks import AckQueue, refresh_visibility
from tasks.broker.connection import redis_client, worker_health
from tasks.broker.results import ResultStore
from tasks.broker.transport import use_affinity, use_intake
from tasks.observe.placement import read_placement
from tasks.protocol import CHUNK_TASK, PREDICT_TASK
from tasks.worker import control as _control  # noqa: F401 - registers Swapless's revoke in place of Celery's
from tasks.worker.chunks import ChunkAssembler
from tasks.worker.intake import Intake
from tasks.worker.learned import LearnedStore, device_label
from tasks.worker.placement import Placement
from tasks.worker.reporting import WorkerReporting
from tasks.worker.runtime import Runtime, get_runtime, reset_runtime
from tasks.worker.scheduler import BatchScheduler, job_from_request

__all__ = ["SwaplessBatches", "app", "predict", "predict_chunk", "run_now"]

logger = logging.getLogger(__name__)

#: The worker's Celery app: ``celery -A tasks worker`` and ``swapless worker`` run it.
app = make_app(include=[__name__])


def _worker_scheduler() -> BatchScheduler | None:
    return getattr(app.tasks[PREDICT_TASK], "scheduler", None)


class SwaplessBatches(Batches):
    """celery-batches' strategy with Swapless' scheduler in place of its flush (see the module docstring)."""

    abstract = True
    #: Hand every message to the scheduler as it arrives (per event-loop tick when there is a hub, see
    #: ``_flush_per_tick``); the scheduler does the batching.
    flush_every = 1
    #: Only jobs with an ETA wait for this timer.
    flush_interval = 0.5

    #: The worker's scheduler, built at ``worker_init`` (None outside a worker).
    scheduler: BatchScheduler | None = None
    _refresh_tref: Any = None
    _tick: Callable[[], None] | None = None
    _tick_hub: Any = None

    def Strategy(self, task: Any, app: Any, consumer: Any) -> Callable[..., Any]:  # noqa: N802 - Celery's name
        """Called by the consumer at each (re)connection: bulk acks on its thread, and the visibility refresh."""
        scheduler = _worker_scheduler()
        if scheduler is not None:
            scheduler.acks.bind(consumer.call_soon)
        if _intake is not None:
            _intake.bind(consumer.call_soon)
        if self._refresh_tref is not None:
            self._refresh_tref.cancel()
            self._refresh_tref = None
        if self.name == PREDICT_TASK:  # one refresh per consumer: both tasks' messages share its channel

            def refresh() -> None:
                task_consumer = getattr(consumer, "task_consumer", None)
                if task_consumer is not None:
                    refresh_visibility(task_consumer.channel)

            self._refresh_tref = consumer.timer.call_repeatedly(get_settings().visibility_refresh_s, refresh)
        self._flush_per_tick(getattr(consumer, "hub", None))
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

    def _flush_per_tick(self, hub: Any) -> None:
        """Hand the scheduler everything that arrived in one turn of the event loop at once.

        The transport delivers up to ``swapless_fetch_limit`` messages per read; flushing each one alone (celery-batches'
        ``flush_every = 1``) took the scheduler's lock and woke its thread once per job. The hub runs ``on_tick``
        before each poll, so one flush follows each read. Without a hub, every message is flushed as it comes.
        """
        if self._tick is not None and self._tick_hub is not None:
            self._tick_hub.on_tick.discard(self._tick)
            self._tick = self._tick_hub = None
        if hub is None:
            self.flush_every = 1
            return

        def tick() -> None:
            if not self._buffer.empty():
                self._do_flush()

        self._tick, self._tick_hub = tick, hub
        hub.on_tick.add(tick)
        self.flush_every = 1 << 30

    def _answer_malformed(self, message: Any, err: Exception) -> None:
        answer_malformed(message, err)

    def flush(self, requests: Collection[Any]) -> None:
        scheduler = _worker_scheduler()
        if scheduler is None:
            raise RuntimeError("no scheduler: the worker's start-up (worker_init) did not run")
        scheduler.submit(requests)


def answer_malformed(message: Any, err: Exception) -> None:
    """Store an ``InputError`` under a message's id when the message is not a job (it is dropped)."""
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
        ResultStore(app, retry_s=5).store([(job_id, None, InputError("?", problem))])
    except Exception:  # noqa: BLE001 - best effort: the message is dropped either way
        logger.warning("could not store the error of malformed message %s", job_id, exc_info=True)


class FinishInHand(bootsteps.StartStopStep):
    """Warm shutdown (SIGTERM): finish the group in hand and ack it while the broker connection is still open.

    A consumer step that needs the task consumer, so it shuts down before the connection does. Jobs still
    waiting in the backlog stay unacked; kombu puts them back on the queue when the channel closes.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def shutdown(self, parent: Any) -> None:
        _stop_placement()  # other workers take this worker's models over while it finishes the group in hand
        scheduler = _worker_scheduler()
        if scheduler is not None:
            scheduler.stop(timeout_s=get_settings().visibility_timeout_s)
            scheduler.acks.drain()


app.steps["consumer"].add(FinishInHand)


def run_now(requests: Sequence[Any]) -> None:
    """Run job requests in this thread and store their results (the eager path, ``predict.apply(...)``)."""
    runtime = get_runtime()
    store = ResultStore(app)
    for request in requests:
        try:
            job = job_from_request(request, runtime.store, time.monotonic())
        except SwaplessError as err:
            store.store([(request.id, None, err)])
            continue
        store.store([(o.job.id, o.result, o.error) for o in run_group(runtime.manager, job.model_id, [job])])


def run_chunks_now(requests: Sequence[Any]) -> None:
    """The eager path of chunks: expand, run and store each chunk in this thread."""
    runtime = get_runtime()
    results = ResultStore(app)
    for request in requests:
        chunks = ChunkAssembler()
        try:
            jobs = chunks.expand(request, runtime.store, time.monotonic())
        except SwaplessError as err:
            results.store([(request.id, None, err)])
            continue
        _, done = chunks.collect(run_group(runtime.manager, jobs[0].model_id, jobs))
        results.store([(request.id, value, None) for _, value, _ in done])


@app.task(base=SwaplessBatches, name=PREDICT_TASK, bind=False, acks_late=True)
def predict(requests: Sequence[Any]) -> None:
    """The batch task. In a worker, SwaplessBatches.flush feeds the scheduler and this body is not used;
    ``predict.apply(args=[model_id, input])`` runs it eagerly through the same model code."""
    run_now(requests)


@app.task(base=SwaplessBatches, name=CHUNK_TASK, bind=False, acks_late=True)
def predict_chunk(requests: Sequence[Any]) -> None:
    """The chunk task. In a worker its flush feeds the same scheduler as ``predict``'s; this body is not used."""
    run_chunks_now(requests)


_reporting: WorkerReporting | None = None
_intake: Intake | None = None


@signals.worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    # Build the runtime, the reporting and the scheduler before the first message (a bad models file stops the
    # worker at start-up).
    global _reporting, _intake
    try:
        runtime = get_runtime(warm_up=True)
        _reporting = WorkerReporting(runtime, getattr(sender, "hostname", None))
    except SwaplessError as err:
        logger.critical("cannot start: %s", err)
        raise SystemExit(2) from None  # not an Exception: Celery's signal dispatch lets it stop the worker
    scheduler = BatchScheduler(
        runtime,
        lambda: ResultStore(app, retry_s=None, health=worker_health),  # keeps trying while Redis refuses
        acks=AckQueue(),
        observer=_reporting.observer,
    )
    app.tasks[PREDICT_TASK].scheduler = scheduler
    _reporting.start(scheduler)
    if not runtime.settings.task_events:  # with events on, every message goes through Celery's requests
        _intake = Intake(scheduler.submit, _reporting.sent_times.record, answer_malformed)
        use_intake(_intake)


_placement: Placement | None = None


def _start_placement(runtime: Runtime, reporting: WorkerReporting, scheduler: BatchScheduler) -> None:
    """Start this worker's one placement thread (once: two would claim and release against each other)."""
    global _placement
    if _placement is not None:
        return
    _placement = Placement(runtime, reporting.worker_id, activity=reporting.stats.models,
                           on_release=scheduler.hand_over)
    reporting.claimed = _placement.claimed
    use_affinity(_placement)
    _placement.start()
    logger.info("placement: %s claims models of queue %s with the other workers", reporting.worker_id,
                runtime.settings.queue)


def _stop_placement() -> None:
    global _placement
    placement, _placement = _placement, None
    if placement is not None:
        placement.stop()


@signals.celeryd_after_setup.connect
def _on_worker_setup(**_: Any) -> None:
    # After Celery has set up logging (worker_init comes before it: what is logged there is lost), before the
    # consumer starts: the warm start (SWAPLESS_WARM_START) runs before the first job is fetched.
    scheduler = _worker_scheduler()
    if scheduler is None or _reporting is None:
        return
    runtime = scheduler.runtime
    engine = runtime.manager.factory
    s = runtime.settings
    records: dict[str, Any] = {}
    if isinstance(engine, ModelEngine):
        learned = LearnedStore(redis_client(s.broker_url), s.key_prefix, device_label(s.device))
        try:
            records = learned.seed(runtime.manager, engine)
        except Exception as err:  # noqa: BLE001 - what was learned only saves time
            logger.warning("could not read what earlier workers learned (%s); learning afresh", err)
        _reporting.on_beat.append(lambda: learned.save(runtime.manager, engine))
    if s.warm_start and isinstance(engine, ModelEngine):
        order = [*_models_with_jobs_waiting(runtime), *records]

        def warm() -> None:
            started = time.perf_counter()
            took = warm_start(runtime.manager, engine, total_budget_s=s.warm_start_budget_s, order=order,
                              tuned=set(records))
            logger.info("warm start on %s: %d model(s) in %.1f s", threading.current_thread().name, len(took),
                        time.perf_counter() - started)

        scheduler.start(first=warm)  # on the thread that will run the jobs
        scheduler.ready.wait()
    if s.routing == "placement":  # claims once warm: a model is not held by a worker still warming up
        _start_placement(runtime, _reporting, scheduler)
    logger.info("swapless worker ready: models %s", ", ".join(runtime.store.ids()))


def _models_with_jobs_waiting(runtime: Runtime) -> list[str]:
    """Models with jobs in their lists now, most first (what the warm start does first)."""
    s = runtime.settings
    try:
        places = read_placement(redis_client(s.broker_url), s.queue, s.key_prefix, runtime.store.ids())
    except Exception:  # noqa: BLE001 - only an order
        return []
    return [p.model_id for p in sorted(places, key=lambda p: -p.waiting) if p.waiting]


@signals.worker_shutdown.connect
def _on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    global _reporting
    scheduler = _worker_scheduler()
    if scheduler is not None:
        scheduler.stop()
    _stop_placement()
    if _reporting is not None:
        _reporting.stop()
        _reporting = None
    reset_runtime()
