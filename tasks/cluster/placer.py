"""This worker's part in placement: a daemon thread that claims, renews and releases models and puts dead
workers' jobs back (docs/concepts/several-workers.md says what it does each interval).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis

from swapless.config.settings import Settings
from swapless.manager import ModelManager, ModelStore
from swapless.manager.cache.entries import DEFAULT_LOAD_COST_S, HOST_COST_FRACTION
from swapless.tasks.broker.connection import RedisHealth
from swapless.tasks.broker.queues import RECOVER, WAKE
from swapless.tasks.cluster.claims import CLAIM, RELEASE, RENEW
from swapless.tasks.cluster.members import TTL_INTERVALS, Heartbeat, ModelActivity, read_heartbeats
from swapless.tasks.cluster.plan import Demand, PlanWorker, plan
from swapless.tasks.cluster.view import ModelPlacement, read_placement
from swapless.tasks.keyspace import Keyspace, ModelKeys
from swapless.tasks.routing import Router

__all__ = ["Placer"]

logger = logging.getLogger(__name__)

#: Seconds per job assumed for a model no worker has run or measured, while no other model has run either (once some
#: have, the median of theirs: models served together tend to cost alike).
DEFAULT_JOB_S = 0.01
#: Seconds between two recovery sweeps.
RECOVER_EVERY_S = 1.0
#: Claimed models past this many times the cache's slots are a long tail (``fetch_first``).
LONG_TAIL_FACTOR = 2


def _gone_from_this_machine(beat: Heartbeat) -> bool:
    """A worker of this machine whose process has exited before its heartbeat expired: its jobs need not wait."""
    if beat.machine != socket.gethostname() or beat.pid == os.getpid():
        return False
    try:
        os.kill(beat.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


class Placer:
    """This worker's claims and the thread that keeps them; the transport's ``Affinity``.

    Args:
        settings: the worker's settings (routing mode, intervals, hold limits, visibility timeout).
        manager: this worker's cache (what it has loaded, what it learned).
        router: resolves the model of an ingress message.
        health: told of every Redis failure.
        worker_id: this worker's id (``hostname:pid``).
        activity: what this worker did per model so far (its heartbeat's).
        on_release: told of each model whose claim this worker gave up (it hands its waiting jobs over).
    """

    def __init__(
        self,
        settings: Settings,
        keyspace: Keyspace,
        store: ModelStore,
        manager: ModelManager,
        router: Router,
        client: redis.Redis,
        health: RedisHealth,
        worker_id: str,
        activity: Callable[[], Mapping[str, ModelActivity]] = dict,
        on_release: Callable[[str], Any] = lambda model_id: None,
    ) -> None:
        self.settings = settings
        self.keyspace = keyspace
        self.store = store
        self.manager = manager
        self.router = router
        self.client = client
        self.health = health
        self.worker_id = worker_id
        self.claims = settings.placement.routing == "placement"
        self.per_model_limit = settings.placement.prefetch_per_model
        self.activity = activity
        self.on_release = on_release
        self.lease_ms = int(settings.observe.heartbeat_interval_s * TTL_INTERVALS * 1000)
        self._claimed: list[str] = [] if self.claims else store.ids()
        self._limits: dict[str, int] = {}
        self._queued: dict[str, int] = {}
        self._jobs_waiting = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._poke = threading.Event()  # a tick now (the placement bell rang), not at the next interval
        self._thread: threading.Thread | None = None
        self._last_recover = 0.0
        self._failing = False

    # -- what the transport asks ---------------------------------------------------------------------------

    def claimed(self) -> list[str]:
        """The models this worker fetches from now."""
        with self._lock:
            return list(self._claimed)

    def fetch_first(self) -> list[str] | None:
        """With a long tail claimed (over ``LONG_TAIL_FACTOR`` times the cache's slots), the models loaded or loading,
        whose jobs the transport fetches first; None: all alike."""
        with self._lock:
            claimed = len(self._claimed)
        return self.manager.in_cache() if claimed > LONG_TAIL_FACTOR * self.manager.max_models else None

    def queued(self) -> dict[str, int]:
        """Messages waiting per model this worker claims, as the last round read them."""
        return self._queued

    def jobs_waiting(self) -> bool:
        """Whether the last round found messages in any model's lists."""
        return self._jobs_waiting

    def hold_limit(self, model_id: str) -> int:
        """Most jobs of ``model_id`` this worker holds at once."""
        return self._limits.get(model_id, self.per_model_limit)

    def route(self, payload: dict[str, Any]) -> str | None:
        """The model an ingress message goes to (``Router.model_of``); None: this worker keeps it."""
        return self.router.model_of(payload)

    # -- the thread ----------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="swapless-placement", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop placing and release every claim, for other workers to take at once."""
        self._stop.set()
        self._poke.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if not self.claims:
            return
        with self._lock:
            claimed, self._claimed = self._claimed, []
        now_ms = int(time.time() * 1000)
        try:
            pipe = self.client.pipeline(transaction=False)
            for model_id in claimed:
                pipe.eval(RELEASE, 1, self._keys(model_id).holders, self.worker_id, now_ms, 0)
            pipe.execute()
        except redis.RedisError as err:
            logger.warning("could not release %d claim(s) (%s); they lapse by themselves", len(claimed), err)
        if claimed:
            logger.info("released the claims on %s", ", ".join(claimed))

    def _run(self) -> None:
        interval = self.settings.placement.placement_interval_s
        while not self._stop.is_set():
            try:
                self.tick()
                if self._failing:
                    logger.info("placement works again")
                self._failing = False
            except Exception as err:  # keep placing through a Redis outage
                self.health.failed(err, "placing models")
                if not self._failing:
                    logger.warning("placement failed (%s); retrying every %.1f s", err, interval, exc_info=True)
                self._failing = True
            self._poke.wait(interval)
            self._poke.clear()

    def wake(self) -> None:
        """Place now: jobs came for a model no worker holds."""
        self._poke.set()

    # -- one round -----------------------------------------------------------------------------------------

    def _keys(self, model_id: str) -> ModelKeys:
        return self.keyspace.model(model_id)

    def _live(self) -> tuple[list[Heartbeat], set[str]]:
        """The live workers' heartbeats, and their ids with this worker's."""
        s = self.settings
        beats = [beat for beat in read_heartbeats(self.client, self.keyspace) if beat.queue == s.jobs.queue]
        gone = {beat.worker_id for beat in beats if _gone_from_this_machine(beat)}
        beats = [beat for beat in beats if beat.worker_id not in gone]
        return beats, {beat.worker_id for beat in beats} | {self.worker_id}

    def tick(self) -> None:
        """One round: read, plan, claim and release, renew; recover now and then."""
        s = self.settings
        models = self.store.ids()
        if not self.claims:
            if time.monotonic() - self._last_recover >= RECOVER_EVERY_S:
                self._last_recover = time.monotonic()
                self.recover(models, self._live()[1])
            return
        places = read_placement(self.client, self.keyspace, models)
        self._queued = {p.model_id: p.waiting_messages for p in places
                        if p.waiting_messages and self.worker_id in p.holder_ids}
        self._jobs_waiting = any(p.waiting_messages for p in places)
        beats, live = self._live()
        dead = sorted({h for p in places for h in p.holder_ids if h not in live})
        workers = self._workers(beats)
        demand = self._demand(places, beats, live)
        alone = all(w.worker_id == self.worker_id for w in workers)
        self._limits = {} if alone else {d.model_id: self._hold_for(d) for d in demand}
        moves = plan(
            self.worker_id,
            workers,
            demand,
            copy_backlog_s=s.placement.copy_backlog_s,
            max_copies=s.placement.max_copies,
            copy_idle_s=s.placement.copy_idle_s,
        )
        now_ms = int(time.time() * 1000)
        held_now = [p.model_id for p in places if self.worker_id in p.holder_ids]
        pipe = self.client.pipeline(transaction=False)
        for model_id, most, _ in moves.claim:
            pipe.eval(CLAIM, 1, self._keys(model_id).holders, self.worker_id, now_ms, self.lease_ms, most, *dead)
        claimed = [m for (m, _, _), ok in zip(moves.claim, pipe.execute(), strict=True) if ok]
        # a victim goes only for a claim that was made: another worker may have been quicker
        victims = [v for m, _, v in moves.claim if v is not None and m in claimed]
        leaving = [*moves.release, *victims, *moves.drop]
        pipe = self.client.pipeline(transaction=False)
        for model_id in leaving:
            keep_last = "1" if model_id in moves.drop else "0"
            pipe.eval(RELEASE, 1, self._keys(model_id).holders, self.worker_id, now_ms, keep_last)
        renewing = [m for m in held_now if m not in leaving]
        for model_id in renewing:
            pipe.eval(RENEW, 1, self._keys(model_id).holders, self.worker_id, now_ms, self.lease_ms)
        replies = pipe.execute()
        left, renewed = replies[: len(leaving)], replies[len(leaving) :]
        held = {m for m, ok in zip(renewing, renewed, strict=True) if ok} | set(claimed)
        held |= {m for m, ok in zip(leaving, left, strict=True) if not ok and m in held_now}  # the last copy stays
        with self._lock:
            before = set(self._claimed)
            self._claimed = [m for m in models if m in held]
        if held - before:  # the consumer's wait does not listen to the new models' bells yet: it fetches again now
            self.client.eval(WAKE, 1, self.keyspace.wake(self.worker_id), self.lease_ms)
        for model_id in before - held:
            self.on_release(model_id)
        if held != before:
            logger.info("claims now: %s (took %s, gave up %s)", ", ".join(sorted(held)) or "none",
                        ", ".join(sorted(held - before)) or "-", ", ".join(sorted(before - held)) or "-")
        if time.monotonic() - self._last_recover >= RECOVER_EVERY_S:
            self._last_recover = time.monotonic()
            self.recover(models, live)

    def _hold_for(self, d: Demand) -> int:
        """About ``copy_backlog_s`` seconds of ``d``'s work, within [two forward passes, ``prefetch_per_model``]."""
        s = self.settings
        try:
            batch = self.store.get(d.model_id).max_batch_size or s.cache.max_batch_size
        except KeyError:
            batch = s.cache.max_batch_size
        seconds_worth = math.ceil(s.placement.copy_backlog_s / max(d.job_s, 1e-6))
        return min(self.per_model_limit, max(2 * batch, seconds_worth))

    def recover(self, models: list[str], live: set[str]) -> int:
        """Put back the held jobs of workers not in ``live`` and those not refreshed for the visibility timeout;
        returns how many came back."""
        stale_before = time.time() - self.settings.worker.visibility_timeout_s
        pipe = self.client.pipeline(transaction=False)
        for lists in [*(self._keys(model_id) for model_id in models), self.keyspace.ingress_lists]:
            pipe.eval(RECOVER, 7, *lists.queue_and_records, repr(stale_before), *sorted(live))
        restored = sum(int(n) for n in pipe.execute())
        if restored:
            logger.warning("put %d job(s) of dead or silent workers back on their models' lists", restored)
        return restored

    def _workers(self, beats: list[Heartbeat]) -> list[PlanWorker]:
        now = time.time()
        views = {}
        for beat in beats:
            if not beat.worker_id or beat.routing != "placement":
                continue
            idle = {m: now - a.last_run_at for m, a in beat.models.items() if a.last_run_at is not None}
            views[beat.worker_id] = PlanWorker(beat.worker_id, beat.cache.max_models,
                                               frozenset(e.model_id for e in beat.loaded), idle,
                                               frozenset(e.model_id for e in beat.host),
                                               frozenset(e.model_id for e in beat.loaded if e.interactive))
        manager = self.manager  # this worker's own view, fresher than its last heartbeat
        idle = {m: now - a.last_run_at for m, a in self.activity().items() if a.last_run_at is not None}
        loaded = manager.snapshot()
        # a model being loaded counts as loaded: its load is paid already, and handing it over would pay another
        views[self.worker_id] = PlanWorker(self.worker_id, manager.max_models, frozenset(manager.in_cache()),
                                           idle, frozenset(manager.host.ids()),
                                           frozenset(e.model_id for e in loaded if manager.resident(e)))
        return list(views.values())

    def _known_load_s(self, model_id: str, tier: str = "load_s") -> float | None:
        """A load (``load_s``) or swap-in (``host_load_s``) time this worker's cache learned; None when unknown."""
        learned = self.manager.learned(model_id).get(tier)
        return float(learned) if learned is not None else None

    def _measured_job_s(self) -> dict[str, float]:
        """Seconds per job of the models this worker's tuners measured, at each one's cheapest batch size."""
        per_input_s = getattr(self.manager.factory, "per_input_s", None)
        return per_input_s() if per_input_s is not None else {}

    def _demand(self, places: list[ModelPlacement], beats: list[Heartbeat], live: set[str]) -> list[Demand]:
        run_s: dict[str, float] = {}
        jobs: dict[str, int] = {}
        load_s: dict[str, float] = {}
        loads: dict[str, int] = {}
        swap_s: dict[str, float] = {}
        swaps: dict[str, int] = {}
        others = [beat.models for beat in beats if beat.worker_id != self.worker_id]
        for activities in [*others, self.activity()]:
            for model_id, a in activities.items():
                run_s[model_id] = run_s.get(model_id, 0.0) + a.run_s_total
                jobs[model_id] = jobs.get(model_id, 0) + a.jobs_done + a.jobs_failed
                load_s[model_id] = load_s.get(model_id, 0.0) + a.load_s_total
                loads[model_id] = loads.get(model_id, 0) + a.loads
                swap_s[model_id] = swap_s.get(model_id, 0.0) + a.swap_s_total
                swaps[model_id] = swaps.get(model_id, 0) + a.swap_ins
        ran = {m: run_s[m] / n for m, n in jobs.items() if n and math.isfinite(run_s[m] / n)}
        measured = self._measured_job_s()
        known = ran or measured
        like_the_others = statistics.median(known.values()) if known else DEFAULT_JOB_S
        demand = []
        for p in places:
            holders = tuple(h for h in p.holder_ids if h in live)  # a dead worker's claims are void already
            if not (p.waiting_messages or p.held or holders):
                continue
            job_s = ran.get(p.model_id) or measured.get(p.model_id) or like_the_others
            load = load_s[p.model_id] / loads[p.model_id] if loads.get(p.model_id) else self._known_load_s(p.model_id)
            load = DEFAULT_LOAD_COST_S if load is None else load
            swap = swap_s[p.model_id] / swaps[p.model_id] if swaps.get(p.model_id) else self._known_load_s(
                p.model_id, "host_load_s")
            demand.append(Demand(p.model_id, p.waiting_messages, p.held, job_s, holders, load,
                                 load * HOST_COST_FRACTION if swap is None else swap,
                                 measured=p.model_id in ran or p.model_id in measured))
        return demand
