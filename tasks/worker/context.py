"""The worker's composition root: every collaborator of one worker process, built once where it starts.

``SwaplessWorker`` (a bootstep) builds the ``WorkerContext`` and attaches it as ``worker.swapless``; the order of
its start: docs/concepts/scheduling.md.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery, bootsteps
from celery.worker import state as worker_state

from swapless.config.errors import SwaplessError
from swapless.config.settings import Settings, get_settings
from swapless.manager import ModelEngine, ModelManager
from swapless.manager.batching.warmup import load_kept, warm_steps
from swapless.tasks import tracing
from swapless.tasks.broker.acks import AckQueue
from swapless.tasks.broker.connection import RedisHealth, ReplicaWait, redis_client
from swapless.tasks.broker.queues import ChannelHooks
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.broker.sentinel import SentinelOptions
from swapless.tasks.cluster.members import read_heartbeats
from swapless.tasks.cluster.placer import Placer
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.podcost import PodDeletionCost
from swapless.tasks.routing import RouteOverrides, Router
from swapless.tasks.webhooks import WebhookQueue
from swapless.tasks.worker.canvas import Canvas
from swapless.tasks.worker.followups import Followups
from swapless.tasks.worker.intake import Intake, answer_malformed
from swapless.tasks.worker.learned import LearnedStore, device_label
from swapless.tasks.worker.reporting import WorkerReporting
from swapless.tasks.worker.runtime import Runtime, build_runtime, tune_interpreter
from swapless.tasks.worker.scheduler import BatchScheduler
from swapless.tasks.worker.shadows import Shadows
from swapless.tasks.worker.spans import BatchSpans
from swapless.tasks.worker.webhooks import WebhookIntake, WebhookSender

__all__ = ["FinishInHand", "SwaplessWorker", "WorkerContext", "build_context", "settings_of"]

logger = logging.getLogger(__name__)

#: Models named in the "ready" line at most (a registry of a thousand is counted, not listed).
READY_NAMES = 20

#: The app configuration key under which ``swapless worker`` hands its settings to the worker (flags included).
SETTINGS_KEY = "swapless_settings"


def settings_of(app: Celery) -> Settings:
    """The settings ``swapless worker`` put in the app's configuration, else the environment's."""
    given = app.conf.get(SETTINGS_KEY)
    return given if isinstance(given, Settings) else get_settings()


@dataclass
class WorkerContext:
    """One worker process's collaborators."""

    app: Celery
    settings: Settings
    keyspace: Keyspace
    health: RedisHealth
    control: redis.Redis
    runtime: Runtime
    router: Router
    reporting: WorkerReporting
    scheduler: BatchScheduler
    placer: Placer
    intake: Intake | None
    hooks: ChannelHooks
    webhooks: WebhookSender
    #: answers a message that is not a job with its error (``swapless.tasks.worker.intake.answer_malformed``)
    answer_malformed: Callable[[Any, Exception], None]
    #: the tracer provider ``start`` set up (``swapless.tasks.tracing.configure``), shut down by ``stop``
    provider: Any = None

    def start(self) -> None:
        """Seed what earlier workers learned, warm up on the scheduler's thread, start the heartbeat, then place."""
        runtime, s = self.runtime, self.settings
        if self.scheduler.spans is not None:
            self.provider = tracing.configure("swapless-worker")
        tune_interpreter()
        after_beat: list[Callable[[], Any]] = []
        records, kind = self._seed(after_beat)
        self._warm_up(records, kind)
        beats = redis_client(s.redis.broker_url, connect_timeout_s=5, socket_timeout_s=5,
                             sentinel=SentinelOptions.of(s))
        pod_cost = PodDeletionCost.from_environment(s.scaling, beats, self.keyspace, self.reporting.worker_id)
        if pod_cost is not None:
            after_beat.append(pod_cost)
        self.reporting.start(self.scheduler, beats, self.placer.claimed, after_beat, device=kind)
        self.webhooks.start()
        self.placer.start()  # claims once warm: a model is not held by a worker still warming up
        if s.placement.routing == "placement":
            logger.info("placement: %s claims models of queue %s with the other workers", self.reporting.worker_id,
                        s.jobs.queue)
        ids = runtime.store.ids()
        shown = ", ".join(ids[:READY_NAMES]) + (f" and {len(ids) - READY_NAMES} more" if len(ids) > READY_NAMES else "")
        logger.info("swapless worker ready: %d model(s): %s", len(ids), shown)

    def _seed(self, after_beat: list[Callable[[], Any]]) -> tuple[dict[str, Any], str]:
        """Seed what earlier workers learned on this kind of device; returns their records and the device kind."""
        engine = self.runtime.manager.factory
        if not isinstance(engine, ModelEngine):
            return {}, ""
        kind = device_label(self.settings.cache.device)
        learned = LearnedStore(self.control, self.keyspace, kind)
        records: dict[str, Any] = {}
        try:
            records = learned.seed(self.runtime.manager, engine)
        except Exception as err:  # noqa: BLE001 - what was learned only saves time
            logger.warning("could not read what earlier workers learned (%s); learning afresh", err)
        after_beat.append(functools.partial(learned.save, self.runtime.manager, engine))
        return records, kind

    def _warm_up(self, records: dict[str, Any], kind: str) -> None:
        """Load the kept models and start the warm start, on the scheduler's thread; wait until it is ready."""
        runtime, s = self.runtime, self.settings
        engine = runtime.manager.factory
        warming = engine if s.worker.warm_start and isinstance(engine, ModelEngine) else None
        kept = [spec.id for spec in runtime.store if spec.keep_loaded]
        if warming is None and not kept:
            return
        others = self._others_live()
        skip = self._measured_if_joining(records, kind, others) if others else set()
        # a worker joining a fleet under placement loads no kept model: the fleet holds them, placement gives
        # this one what it needs
        skip_kept = set(kept) if others and s.placement.routing == "placement" else set()
        idle = None
        if warming is not None:
            idle = _warm_start(runtime.manager, warming, s, records, skip | skip_kept, self.scheduler.wants,
                               self.placer.jobs_waiting)
            next(idle)

        def first() -> None:
            """The kept models, and ``SWAPLESS_WARM_BEFORE_READY_S`` of the warm start, before ready."""
            load_kept(runtime.manager, skip=skip_kept)
            ends = time.perf_counter() + s.worker.warm_before_ready_s
            while idle is not None and time.perf_counter() < ends and next(idle, StopIteration) is None:
                pass

        # on the thread that will run the jobs: those before ready, the rest of the warm start while idle
        self.scheduler.start(first=first, idle=idle)
        self.scheduler.ready.wait()

    def _others_live(self) -> int:
        """How many other workers are live on this queue (0 when their heartbeats cannot be read)."""
        try:
            return sum(1 for b in read_heartbeats(self.control, self.keyspace) if b.queue == self.settings.jobs.queue)
        except Exception:  # noqa: BLE001 - only saves time
            return 0

    def _measured_if_joining(self, records: dict[str, Any], kind: str, others: int) -> set[str]:
        """The models a worker joining a fleet need not warm: those measured on its kind of device before."""
        measured = {m for m, r in records.items() if r.get("batch_costs_s") and r.get("load_s") is not None}
        logger.info("joining %d live worker(s) on %s: not warming the %d model(s) measured there before (%s)",
                    others, kind, len(measured), ", ".join(sorted(measured)) or "-")
        return measured

    def finish_in_hand(self) -> None:
        """Warm shutdown, while the broker connection is open: give up claims, finish the group in hand, ack it."""
        self.placer.stop()
        self.scheduler.stop(timeout_s=self.settings.worker.visibility_timeout_s)
        self.scheduler.acks.drain()

    def stop(self) -> None:
        """Stop everything still running and unload every model. Safe after ``finish_in_hand``."""
        self.placer.stop()
        self.scheduler.stop()
        self.webhooks.stop()
        self.reporting.stop()
        self.runtime.manager.close()
        tracing.shutdown(self.provider)  # the last spans exported before the process exits
        self.provider = None


def _warm_start(manager: ModelManager, engine: ModelEngine, s: Settings, records: dict[str, Any], skip: set[str],
                keep: Callable[[str], bool], jobs_waiting: Callable[[], bool]) -> Iterator[None]:
    """The warm start, a model at a time while no job has come (the scheduler closes it at the first)."""
    started, took, ended = time.perf_counter(), 0, "all warmed or its budget spent"
    steps = warm_steps(manager, engine, total_budget_s=s.worker.warm_start_budget_s, order=list(records),
                       tuned=set(records), skip=skip, keep=keep)
    try:
        yield  # primed here: closed before any model, it still says so
        # jobs waiting in the queue's lists go to some worker of the fleet within a placement round:
        # a load begun for the warm start now would only hold them up (or be made twice)
        while not jobs_waiting():
            if next(steps, None) is None:
                break
            took += 1
            yield
        else:
            ended = "ended by jobs waiting; the others warm on their first jobs"
    except GeneratorExit:
        ended = "ended by the first job; the others warm on their first jobs"
        raise
    finally:
        close = getattr(steps, "close", None)  # a generator: closed, it closes its model's use
        if close is not None:
            close()
        logger.info("warm start on %s: %d model(s) in %.1f s (%s)", threading.current_thread().name,
                    took, time.perf_counter() - started, ended)


def build_context(app: Celery, settings: Settings, hostname: str | None = None) -> WorkerContext:
    """Build one worker's collaborators; nothing starts.

    Raises:
        SwaplessError: a bad models file, plugin or setting (``ConfigError``), or a metrics port that cannot be
            opened (``MetricsUnavailable``).
    """
    keyspace = Keyspace.of(settings)
    health = RedisHealth()
    replicas = ReplicaWait.of(settings.redis)
    control = redis_client(settings.redis.broker_url, connect_timeout_s=5, socket_timeout_s=10,
                           sentinel=SentinelOptions.of(settings))
    runtime = build_runtime(settings, warm_up=True)
    router = Router(runtime.store, RouteOverrides(control, keyspace) if runtime.store.routes else None)
    reporting = WorkerReporting(runtime, keyspace, health, hostname)
    sending = redis_client(settings.redis.broker_url, connect_timeout_s=5, socket_timeout_s=10,
                           sentinel=SentinelOptions.of(settings))
    spans = BatchSpans(tracing.tracer(), settings.jobs.queue) if tracing.wanted() else None
    sender = WebhookSender(WebhookQueue.of(sending, settings), settings.webhooks,
                           tracer=spans.tracer if spans is not None else None)
    followups = Followups(Canvas(app, settings.worker.canvas_queue),
                          WebhookIntake(WebhookQueue.of(control, settings), wake=sender.wake))
    scheduler = BatchScheduler(
        runtime,
        router,
        # keeps trying while Redis refuses, or too few replicas hold what it stored
        lambda: ResultStore(app, retry_s=None, health=health, replicas=replicas),
        Shadows(keyspace, reporting.observer),
        acks=AckQueue(),
        observer=reporting.observer,
        followups=followups,
        spans=spans,
        refused=reporting.stats.refused,
    )
    placer = Placer(settings, keyspace, runtime.store, runtime.manager, router, control, health,
                    reporting.worker_id, activity=reporting.stats.models, on_release=scheduler.hand_over)
    scheduler.inbox.backlog.queued = placer.queued

    def malformed(message: Any, err: Exception) -> None:
        answer_malformed(ResultStore(app, retry_s=5, health=health, replicas=replicas), message, err)

    # with task events on, every message goes through Celery's requests
    intake = (None if settings.observe.task_events
              else Intake(scheduler.submit, reporting.sent_times.record_many, malformed))
    return WorkerContext(app, settings, keyspace, health, control, runtime, router, reporting, scheduler, placer,
                         intake, ChannelHooks(settings.jobs.queue, placer, intake, health), sender, malformed)


class SwaplessWorker(bootsteps.StartStopStep):
    """The worker step that builds, starts and stops the ``WorkerContext``."""

    label = "Swapless"
    requires = ("celery.worker.components:Timer",)

    def create(self, w: Any) -> None:
        try:
            context = build_context(w.app, settings_of(w.app), getattr(w, "hostname", None))
        except SwaplessError as err:
            logger.critical("cannot start: %s", err)
            raise SystemExit(2) from None
        w.swapless = context  # as Celery's own steps attach theirs (w.timer, w.pool, w.hub)
        options = dict(w.app.conf.broker_transport_options or {})
        options["swapless_hooks"] = context.hooks  # kombu hands transport options to each channel it opens
        w.app.conf.broker_transport_options = options

    def start(self, w: Any) -> None:
        w.swapless.start()

    def stop(self, w: Any) -> None:
        w.swapless.stop()


class FinishInHand(bootsteps.StartStopStep):
    """Warm shutdown (SIGTERM): give up the claims, finish the group in hand and ack it while the broker is connected.

    Only a closing worker finishes in hand; jobs still in the backlog go back to their lists.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def stop(self, parent: Any) -> None:
        controller = parent.controller
        context = getattr(controller, "swapless", None)
        closing = getattr(getattr(controller, "blueprint", None), "state", None) == bootsteps.CLOSE
        if context is not None and closing and not worker_state.should_terminate:
            context.finish_in_hand()
