"""The batch task: queued jobs, grouped by model, run through the model cache, one result per job.

``predict.apply`` and ``predict_chunk.apply`` run eagerly through the same model code. Why not plain
celery-batches: docs/concepts/scheduling.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from celery.exceptions import InvalidTaskError
from celery_batches import Batches

from swapless.config.errors import SwaplessError
from swapless.config.settings import get_settings
from swapless.manager import run_group
from swapless.tasks.app import make_app
from swapless.tasks.broker.acks import refresh_visibility
from swapless.tasks.broker.kombu_private import batches_buffer
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.protocol import CHUNK_TASK, PREDICT_TASK
from swapless.tasks.routing import Router
from swapless.tasks.worker import control as _control  # noqa: F401 - registers Swapless's revoke in place of Celery's
from swapless.tasks.worker.chunks import ChunkAssembler
from swapless.tasks.worker.context import FinishInHand, SwaplessWorker, WorkerContext
from swapless.tasks.worker.delivery import decode
from swapless.tasks.worker.runtime import build_runtime
from swapless.tasks.worker.scheduler import BatchScheduler

__all__ = ["SwaplessBatches", "app", "predict", "predict_chunk", "run_now"]

logger = logging.getLogger(__name__)

#: The worker's Celery app: ``celery -A swapless worker`` and ``swapless worker`` run it.
app = make_app(include=[__name__])
app.steps["worker"].add(SwaplessWorker)
app.steps["consumer"].add(FinishInHand)


class SwaplessBatches(Batches):
    """celery-batches' strategy with Swapless' scheduler in place of its flush."""

    abstract = True
    #: Hand every message to the scheduler as it arrives (per event-loop tick when there is a hub, see
    #: ``_flush_per_tick``); the scheduler does the batching.
    flush_every = 1
    #: Only jobs with an ETA wait for this timer.
    flush_interval = 0.5

    _scheduler: BatchScheduler | None = None
    _refresh_tref: Any = None
    _tick: Callable[[], None] | None = None
    _tick_hub: Any = None

    def Strategy(self, task: Any, app: Any, consumer: Any) -> Callable[..., Any]:  # Celery's name
        """Called by the consumer at each (re)connection: bind to the worker's context and refresh visibility."""
        context: WorkerContext = consumer.controller.swapless
        self._scheduler = context.scheduler  # as celery-batches binds the consumer's pool here
        context.scheduler.acks.bind(consumer.call_soon)
        if context.intake is not None:
            context.intake.bind(consumer.call_soon)
        if self._refresh_tref is not None:
            self._refresh_tref.cancel()
            self._refresh_tref = None
        if self.name == PREDICT_TASK:  # one refresh per consumer: both tasks' messages share its channel

            def refresh() -> None:
                task_consumer = getattr(consumer, "task_consumer", None)
                if task_consumer is not None:
                    refresh_visibility(task_consumer.channel, context.health)

            self._refresh_tref = consumer.timer.call_repeatedly(context.settings.worker.visibility_refresh_s, refresh)
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
            except Exception as err:  # any parse failure of one message
                context.answer_malformed(message, err)
                raise InvalidTaskError(f"malformed job message: {err!r}") from err

        return guarded

    def _flush_per_tick(self, hub: Any) -> None:
        """Hand the scheduler everything that arrived in one turn of the event loop at once (one flush per read)."""
        if self._tick is not None and self._tick_hub is not None:
            self._tick_hub.on_tick.discard(self._tick)
            self._tick = self._tick_hub = None
        if hub is None:
            self.flush_every = 1
            return

        empty, flush = batches_buffer(self)

        def tick() -> None:
            if not empty():
                flush()

        self._tick, self._tick_hub = tick, hub
        hub.on_tick.add(tick)
        self.flush_every = 1 << 30

    def flush(self, requests: Collection[Any]) -> None:
        if self._scheduler is None:
            raise RuntimeError("no scheduler: this task runs in a worker whose context has not started")
        self._scheduler.submit(requests)


def _eager(requests: Sequence[Any], chunks: bool) -> None:
    """Run requests in this thread through a cache built for the call, and store their results."""
    settings = get_settings()
    runtime = build_runtime(settings)
    router = Router(runtime.store)
    results = ResultStore(app)
    try:
        for request in requests:
            try:
                delivery = decode(request, router, settings, time.monotonic())
            except SwaplessError as err:
                results.store([(request.id, None, err)])
                continue
            by_model: dict[str, list[Any]] = {}
            for job in delivery.jobs:  # a chunk for a route may span several models
                by_model.setdefault(job.model_id, []).append(job)
            outcomes = [o for model_id, jobs in by_model.items() for o in run_group(runtime.manager, model_id, jobs)]
            if not chunks:
                results.store([(o.job.id, o.result, o.error) for o in outcomes])
                continue
            assembler = ChunkAssembler()
            assembler.expand(delivery)
            _, done = assembler.collect(outcomes)
            results.store([(request.id, value, None) for _, value, _ in done])
    finally:
        runtime.manager.close()


def run_now(requests: Sequence[Any]) -> None:
    """Run job requests in this thread and store their results (the eager path, ``predict.apply(...)``)."""
    _eager(requests, chunks=False)


def run_chunks_now(requests: Sequence[Any]) -> None:
    """The eager path of chunks: expand, run and store each chunk in this thread."""
    _eager(requests, chunks=True)


@app.task(base=SwaplessBatches, name=PREDICT_TASK, bind=False, acks_late=True)
def predict(requests: Sequence[Any]) -> None:
    """The batch task; in a worker the scheduler runs its jobs. ``predict.apply`` runs it eagerly."""
    run_now(requests)


@app.task(base=SwaplessBatches, name=CHUNK_TASK, bind=False, acks_late=True)
def predict_chunk(requests: Sequence[Any]) -> None:
    """The chunk task; in a worker the scheduler runs its items."""
    run_chunks_now(requests)
