"""The batch task: queued jobs -> grouped by model -> run through the model cache -> one result per job.

Why not plain celery-batches: its strategy is kept (it turns each message into a request and handles ETAs), but
its flushing is replaced. celery-batches flushes every ``flush_every`` messages or every ``flush_interval``
seconds, hands the batch to the pool, and acks late messages when the batch returns, even if it raised. Here:

- every message goes into this worker's backlog as soon as it arrives: everything one read of the transport
  delivered is flushed at once, on the event loop's next tick (``_flush_per_tick``);
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
from typing import Any

from celery import bootsteps, signals
from celery.exceptions import InvalidTaskError
from celery_batches import Batches
from kombu.exceptions import ContentDisallowed, DecodeError

from config.settings import Settings, get_settings
from manager import (
    ConfigError,
    InputError,
    ModelEngine,
    ModelManager,
    ModelStore,
    SwaplessError,
    WorkerLimits,
    run_group,
)
from manager.warmup import warm_start
from tasks import status  # issue #7: heartbeat and metrics
from tasks.acks import AckQueue, refresh_visibility
from tasks.app import PREDICT_TASK, app
from tasks.results import ResultStore
from tasks.scheduler import BatchScheduler, Runtime, job_from_request

__all__ = ["BatchScheduler", "Runtime", "SwaplessBatches", "build_runtime", "predict", "run_now"]

logger = logging.getLogger(__name__)


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


class SwaplessBatches(Batches):
    """celery-batches' strategy with Swapless' scheduler in place of its flush (see the module docstring)."""

    abstract = True
    #: Hand every message to the scheduler as it arrives (per event-loop tick when there is a hub, see
    #: ``_flush_per_tick``); the scheduler does the batching.
    flush_every = 1
    #: Only jobs with an ETA wait for this timer.
    flush_interval = 0.5

    scheduler: BatchScheduler | None = None
    acks: AckQueue | None = None
    _refresh_tref: Any = None
    _tick: Callable[[], None] | None = None
    _tick_hub: Any = None

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
    status.start_worker_reporting(task.scheduler, getattr(sender, "hostname", None))  # issue #7


@signals.celeryd_after_setup.connect
def _on_worker_setup(**_: Any) -> None:
    # After Celery has set up logging (worker_init comes before it: what is logged there is lost), before the
    # consumer starts: the warm start (SWAPLESS_WARM_START) runs before the first job is fetched.
    scheduler = getattr(app.tasks[PREDICT_TASK], "scheduler", None)
    if scheduler is None:
        return
    runtime = scheduler.runtime
    engine = runtime.manager.factory
    if runtime.settings.warm_start and isinstance(engine, ModelEngine):

        def warm() -> None:
            took = warm_start(runtime.manager, engine)
            logger.info("warm start on %s: %d model(s) in %.1f s", threading.current_thread().name, len(took),
                        sum(took.values()))

        scheduler.start(first=warm)  # on the thread that will run the jobs
        scheduler.ready.wait()
    logger.info("swapless worker ready: models %s", ", ".join(runtime.store.ids()))


@signals.worker_shutdown.connect
def _on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    task = app.tasks.get(PREDICT_TASK)
    scheduler = getattr(task, "scheduler", None)
    if scheduler is not None:
        scheduler.stop()
        status.stop_worker_reporting()  # issue #7
        scheduler.runtime.manager.close()
