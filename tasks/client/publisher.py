"""Sending jobs: routing them to the model that serves each, then publishing their messages.

- ``Publisher.route_jobs``: each single job gets its id and, when it addresses a route, the version the route
  picks for it (``swapless.manager.registry.routing``: by its sticky key, else by its id) and the shadows that get a
  copy: a ``Routed`` value, decided once and carried to the send.
- ``Publisher.send_routed``: the routed jobs in one round trip, then their shadow copies at bulk priority (a
  shadow never fails the served job); ``asend_routed`` the same through an asyncio Redis client (the gateway's).
- ``Publisher.publish`` (``apublish``): messages as addressed (single jobs or chunks), built as Celery's
  ``send_task`` would build them (``swapless.tasks.broker.publish``): to each model's own lists, ringing the placement
  bell (a model this producer cannot name: to the ingress, where a worker routes it); bounded by ``SWAPLESS_MAX_QUEUED``
  (``QueueFull``, naming the ids queued nonetheless); with ``SWAPLESS_REDIS_MIN_REPLICAS``, only once that many
  replicas hold them. Redis failures, and too few replicas, are ``QueueUnavailable`` / ``QueueFull``
  (``swapless.tasks.broker.connection.translated``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import redis
from celery import Celery

from swapless.config.errors import QueueFull, SwaplessError
from swapless.config.settings import Settings
from swapless.manager.registry.store import ModelStore
from swapless.tasks.broker.connection import ReplicaWait, redact, translated
from swapless.tasks.broker.publish import (
    ModelPush,
    apush,
    apush_to_models,
    build_messages,
    check_messages,
    push,
    push_to_models,
)
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import (
    PREDICT_TASK,
    PRIORITY_STEPS,
    SHADOW_HEADER,
    SHADOWED_HEADER,
    expires_header,
    new_ids,
    priority_level,
)
from swapless.tasks.routing import RouteOverrides

__all__ = ["Publisher", "Routed"]

logger = logging.getLogger(__name__)

#: A publish of more jobs than this goes in slices, the first of this many jobs (see ``_publish_in_slices``).
FIRST_SLICE = 64
#: The largest slice of a publish in slices.
LARGEST_SLICE = 1024


@dataclass(frozen=True)
class Routed:
    """A single job ready to send: its id, the model its message addresses (the route's pick, or as addressed), its
    input, and the shadow models that get a copy (``via``: the routes it went through, outermost first)."""

    job_id: str
    model_id: str
    value: Any
    shadows: tuple[str, ...] = ()
    via: tuple[str, ...] = ()


class _Batch(NamedTuple):
    """``publish``'s arguments for one send: the task, its ``(model_id, value)`` jobs, their level, ids, headers."""

    task: str
    jobs: list[tuple[str, Any]]
    level: int
    ids: list[str]
    headers: list[dict[str, Any]]


@dataclass(frozen=True)
class _Plan:
    """One publish's messages (``(id, JSON)`` in the jobs' order) and where each goes: indices per model (its own
    lists, as ``pushes``), and those for the ingress (``shared``)."""

    built: list[tuple[str, str]]
    by_model: dict[str, list[int]]
    pushes: list[ModelPush]
    shared: list[int]

    @property
    def shared_messages(self) -> list[str]:
        return [self.built[i][1] for i in self.shared]



class Publisher:
    """Routes and publishes one producer's jobs (each ``Client`` has one).

    Args:
        settings: the producer's settings (queue, key prefix, routing, bounds).
        app: the Celery app whose message format the messages follow.
        redis_client: the client every push goes through.
    """

    def __init__(self, settings: Settings, app: Celery, redis_client: redis.Redis) -> None:
        self.settings = settings
        self.app = app
        self.redis = redis_client
        self.keyspace = Keyspace.of(settings)
        #: How many replicas must hold each message before a send returns (``SWAPLESS_REDIS_MIN_REPLICAS``).
        self.replicas = ReplicaWait.of(settings.redis)
        self._store: ModelStore | None = None
        self._routing_unavailable = False
        self._overrides: RouteOverrides | None = None

    @property
    def store(self) -> ModelStore:
        """The model registry (the models file, read on first use).

        Raises:
            ConfigError: the models file is missing or invalid.
        """
        if self._store is None:
            self._store = ModelStore.from_file(self.settings.cache.models_file)
        return self._store

    def _routing_store(self) -> ModelStore | None:
        """The registry, when this producer can read it and it has routes (else jobs go as addressed)."""
        if self._store is None and self._routing_unavailable:
            return None
        try:
            store = self.store
        except SwaplessError:
            self._routing_unavailable = True  # no models file here: the workers route
            return None
        return store if store.routes else None

    def route_weights(self) -> RouteOverrides:
        """The run-time route weights (``swapless route``) this producer reads, cached for a second."""
        if self._overrides is None:
            self._overrides = RouteOverrides(self.redis, self.keyspace)
        return self._overrides

    def route_jobs(
        self, jobs: Sequence[tuple[str, Any]], keys: Sequence[str | None] | None = None, *, paths: bool = True
    ) -> list[Routed]:
        """Each job with a fresh id, addressed to the model that serves it: a route resolved
        (``swapless.manager.registry.routing``: by its sticky key, else by its id, so a worker resolving a plain Celery
        job by its id picks the same) with the shadows it sends copies to. A job whose route cannot place its
        input goes as addressed: the worker answers it alone (``InputError``). ``paths``: whether an input may
        be an image file's path (False for inputs from the network: ``secret.png`` is then text).
        """
        store = self._routing_store()
        ids = new_ids(len(jobs))
        if store is None:
            return [Routed(job_id, model_id, value) for job_id, (model_id, value) in zip(ids, jobs, strict=True)]
        overrides = self.route_weights().get()
        routed: list[Routed] = []
        for index, (model_id, value) in enumerate(jobs):
            given = keys[index] if keys is not None else None
            key = given if given is not None else ids[index]
            try:
                found = store.route(model_id, value, key, overrides, paths=paths) if store.is_route(model_id) else None
            except SwaplessError:
                found = None
            if found is None:
                routed.append(Routed(ids[index], model_id, value))
            else:
                routed.append(Routed(ids[index], found.model_id, value, found.shadows, found.via))
        return routed

    def send_routed(
        self, routed: Sequence[Routed], *, priority: str = "interactive", expires: float | datetime | None = None,
        headers: Sequence[dict[str, Any]] | None = None,
    ) -> list[str]:
        """Send jobs ``route_jobs`` addressed, in one round trip, then their shadow copies at bulk priority (a shadow
        never delays a served job; one that cannot be sent is logged, never failing the served job); returns the
        served jobs' ids. ``headers``: extra message headers per job.

        Raises:
            ValueError: unknown ``priority``; an input JSON cannot encode; a message over
                ``SWAPLESS_MAX_MESSAGE_BYTES`` (``InputError``; nothing is sent).
            QueueFull, QueueUnavailable: as ``publish``.
        """
        served, shadows = self._with_shadows(routed, priority, headers)
        sent = self.publish(*served, expires=expires)
        if shadows is not None:
            try:
                self.publish(*shadows, expires=expires)
            except SwaplessError as err:  # a shadow is never worth failing the served job
                logger.warning("could not send %d shadow job(s): %s", len(shadows.jobs), err)
        return sent

    async def asend_routed(
        self, client: Any, routed: Sequence[Routed], *, priority: str = "interactive",
        expires: float | datetime | None = None, headers: Sequence[dict[str, Any]] | None = None,
    ) -> list[str]:
        """``send_routed`` through ``client``, an asyncio redis-py client (the gateway's): on its event loop, with no
        hand-off to a thread."""
        served, shadows = self._with_shadows(routed, priority, headers)
        sent = await self.apublish(client, *served, expires=expires)
        if shadows is not None:
            try:
                await self.apublish(client, *shadows, expires=expires)
            except SwaplessError as err:  # a shadow is never worth failing the served job
                logger.warning("could not send %d shadow job(s): %s", len(shadows.jobs), err)
        return sent

    def _with_shadows(
        self, routed: Sequence[Routed], priority: str, headers: Sequence[dict[str, Any]] | None
    ) -> tuple[_Batch, _Batch | None]:
        """The served jobs' messages to send, and their shadow copies' (None: no shadows)."""
        level = priority_level(priority)
        shadows = [
            (f"{r.job_id}.shadow{n}", shadow, r.value, {SHADOW_HEADER: [r.job_id, r.via[0]]})
            for r in routed
            for n, shadow in enumerate(r.shadows)
        ]
        extra = [dict(h) for h in headers] if headers is not None else [{} for _ in routed]
        if shadows:  # the served jobs leave their top label for their shadows to compare with
            for r, h in zip(routed, extra, strict=True):
                if r.shadows:
                    h[SHADOWED_HEADER] = 1
        served = _Batch(PREDICT_TASK, [(r.model_id, r.value) for r in routed], level, [r.job_id for r in routed], extra)
        if not shadows:
            return served, None
        return served, _Batch(PREDICT_TASK, [(m, v) for _, m, v, _ in shadows], PRIORITY_STEPS[-1],
                              [i for i, _, _, _ in shadows], [h for _, _, _, h in shadows])

    def _canonical(self, model_id: str) -> str | None:
        """The id a model's lists are named by (an alias resolved; a variant's base), or None when this producer
        cannot tell (no models file here, or an unknown id with ``validate`` off: the message then goes to the shared
        queue and a worker routes it, or answers it with ``UnknownModel``)."""
        try:
            return self.store.home(model_id)
        except SwaplessError:
            return None

    def publish(
        self,
        task: str,
        jobs: Sequence[tuple[str, Any]],
        level: int,
        ids: Sequence[str] | None = None,
        headers: Sequence[dict[str, Any]] | None = None,
        *,
        expires: float | datetime | None = None,
    ) -> list[str]:
        """Send one message per ``(model_id, value)`` to ``task`` as addressed, in one round trip; returns their ids
        (``ids``, else new ones). Single jobs are routed before they get here (``route_jobs``, ``send_routed``).

        Each model's messages go to its own lists (``swapless.tasks.keyspace.ModelKeys``) and ring the placement bell; a
        model this producer cannot name goes to the ingress, where a worker routes it or answers ``UnknownModel``.

        Raises:
            QueueFull: a model's lists (or the shared queue) hold ``SWAPLESS_MAX_QUEUED`` messages already, or Redis
                is out of memory; ``queued`` lists the ids that were queued nonetheless (other models' jobs).
            QueueUnavailable: Redis cannot be reached.
        """
        ids = list(ids) if ids is not None else new_ids(len(jobs))
        if len(jobs) <= FIRST_SLICE:
            plan = self._plan(task, jobs, level, expires, ids, headers)
            with translated(self.settings.redis.broker_url):
                outcomes, shared = self._push(plan, level, {}, {})
            return self._settle(plan, outcomes, shared)
        return self._publish_in_slices(task, jobs, level, ids, headers, expires)

    def _push(self, plan: _Plan, level: int, coming: dict[str | None, int], admitted: dict[str | None, bool]
              ) -> tuple[list[tuple[bool, int]], tuple[bool, int] | None]:
        """One round trip: ``plan``'s pushes, each model's bounded with its ``coming`` messages unless ``admitted``
        already (the ingress under the key None); returns each model's outcome and the ingress's."""
        s, keyspace = self.settings, self.keyspace
        pushes = [ModelPush(p.keys, p.priority, p.messages, coming.get(m, 0), m not in admitted)
                  for m, p in zip(plan.by_model, plan.pushes, strict=True)]
        outcomes = (push_to_models(self.redis, pushes, bound=s.jobs.max_queued, placement_bell=keyspace.placement_bell,
                                   replicas=self.replicas)
                    if pushes else [])
        shared = None
        if plan.shared:
            bound = s.jobs.max_queued if None not in admitted else None
            shared = push(self.redis, keyspace.ingress(level), plan.shared_messages, bound=bound,
                          counted=list(keyspace.ingress_lists.lists), replicas=self.replicas,
                          coming=coming.get(None, 0))
            if shared is None:
                shared = (True, 0)
        return outcomes, shared

    def _publish_in_slices(
        self, task: str, jobs: Sequence[tuple[str, Any]], level: int, ids: list[str],
        headers: Sequence[dict[str, Any]] | None, expires: float | datetime | None,
    ) -> list[str]:
        """``publish`` of a long call: every input checked first (an input error sends nothing), then the messages
        built and pushed a slice at a time, the first of ``FIRST_SLICE`` jobs, doubling up to ``LARGEST_SLICE``:
        workers start on the first jobs within milliseconds while the rest are built. A model's first slice counts
        all its jobs of the call against ``SWAPLESS_MAX_QUEUED``, so each model's jobs are queued whole or not at
        all, as in one round trip; a failure partway (Redis lost) leaves the earlier slices queued: the error's
        ``queued`` names them."""
        s = self.settings
        bodies = check_messages(self.app, s.jobs.queue, jobs, level, task=task, expires=expires_header(expires),
                                headers=headers, max_bytes=s.jobs.max_message_bytes)
        canonical: dict[str, str | None] = {}
        for model_id, _ in jobs:
            if model_id not in canonical:
                canonical[model_id] = self._canonical(model_id)
        coming = Counter(canonical[model_id] for model_id, _ in jobs)
        admitted: dict[str | None, bool] = {}
        refused: dict[str | None, int] = {}
        sent: list[str] = []
        start, size = 0, FIRST_SLICE
        with translated(s.redis.broker_url):
            while start < len(jobs):
                stop = min(len(jobs), start + size)
                chosen = [i for i in range(start, stop) if admitted.get(canonical[jobs[i][0]], True)]
                start, size = stop, min(2 * size, LARGEST_SLICE)
                if not chosen:
                    continue
                for i in chosen:
                    coming[canonical[jobs[i][0]]] -= 1  # what is left after this slice
                plan = self._plan(task, [jobs[i] for i in chosen], level, expires, [ids[i] for i in chosen],
                                  [headers[i] for i in chosen] if headers is not None else None,
                                  [bodies[i] for i in chosen])
                try:
                    outcomes, shared = self._push(plan, level, coming, admitted)
                except SwaplessError as err:
                    err.queued = list(sent)  # type: ignore[attr-defined]
                    raise
                results: list[tuple[str | None, list[int], tuple[bool, int]]] = [
                    (m, indices, outcome) for (m, indices), outcome in zip(plan.by_model.items(), outcomes, strict=True)
                ]
                if shared is not None:
                    results.append((None, plan.shared, shared))
                for m, indices, (pushed, held) in results:
                    admitted.setdefault(m, pushed)
                    if pushed:
                        sent.extend(plan.built[i][0] for i in indices)
                    else:
                        refused[m] = held
        if refused:
            m, held = next(iter(refused.items()))
            where = (f"model {m!r} has {held} messages queued" if m is not None
                     else f"queue {s.jobs.queue!r} holds {held} messages")
            raise self._queue_full(where, [ids[i] for i in range(len(jobs)) if admitted.get(canonical[jobs[i][0]])])
        return ids

    def _queue_full(self, where: str, queued: list[str]) -> QueueFull:
        """The error of a send refused by ``SWAPLESS_MAX_QUEUED`` at ``where``, naming the ids ``queued`` anyway."""
        s = self.settings
        error = QueueFull(
            redact(s.redis.broker_url),
            f"{where}, its bound is {s.jobs.max_queued} (SWAPLESS_MAX_QUEUED); wait for the workers to take some, then "
            "send again" + (f" ({len(queued)} of these jobs were queued)" if queued else ""),
        )
        error.queued = queued
        return error

    async def apublish(
        self,
        client: Any,
        task: str,
        jobs: Sequence[tuple[str, Any]],
        level: int,
        ids: Sequence[str] | None = None,
        headers: Sequence[dict[str, Any]] | None = None,
        *,
        expires: float | datetime | None = None,
    ) -> list[str]:
        """``publish`` through ``client``, an asyncio redis-py client."""
        plan = self._plan(task, jobs, level, expires, ids, headers)
        s, keyspace = self.settings, self.keyspace
        with translated(s.redis.broker_url):
            outcomes = (await apush_to_models(client, plan.pushes, bound=s.jobs.max_queued,
                                              placement_bell=keyspace.placement_bell, replicas=self.replicas)
                        if plan.pushes else [])
            shared = (await apush(client, keyspace.ingress(level), plan.shared_messages, bound=s.jobs.max_queued,
                                  counted=list(keyspace.ingress_lists.lists), replicas=self.replicas)
                      if plan.shared else None)
        return self._settle(plan, outcomes, shared)

    def _plan(
        self, task: str, jobs: Sequence[tuple[str, Any]], level: int, expires: float | datetime | None,
        ids: Sequence[str] | None, headers: Sequence[dict[str, Any]] | None, bodies: Sequence[str] | None = None,
    ) -> _Plan:
        """The messages, and which go to each model's lists and which to the ingress (``bodies``: the jobs'
        bodies already encoded by ``check_messages``)."""
        s = self.settings
        built = build_messages(self.app, s.jobs.queue, jobs, level, task=task, expires=expires_header(expires), ids=ids,
                               headers=headers, max_bytes=s.jobs.max_message_bytes, bodies=bodies)
        shared: list[int] = []
        by_model: dict[str, list[int]] = {}
        for index, (model_id, _) in enumerate(jobs):
            canonical = self._canonical(model_id)  # one layout: a model's own lists, whatever the routing
            if canonical is None:
                shared.append(index)
            else:
                by_model.setdefault(canonical, []).append(index)
        pushes = [ModelPush(self.keyspace.model(m), level, [built[i][1] for i in indices])
                  for m, indices in by_model.items()]
        return _Plan(built, by_model, pushes, shared)

    def _settle(self, plan: _Plan, outcomes: list[tuple[bool, int]], shared: tuple[bool, int] | None) -> list[str]:
        """The ids sent, or QueueFull naming those queued nonetheless."""
        s = self.settings
        refused: list[tuple[list[int], str]] = []
        for (m, indices), (pushed, held) in zip(plan.by_model.items(), outcomes, strict=True):
            if not pushed:
                refused.append((indices, f"model {m!r} has {held} messages queued"))
        if shared is not None and not shared[0]:
            refused.append((plan.shared, f"queue {s.jobs.queue!r} holds {shared[1]} messages"))
        if refused:
            left_out = {i for indices, _ in refused for i in indices}
            raise self._queue_full(refused[0][1], [job_id for i, (job_id, _) in enumerate(plan.built)
                                                   if i not in left_out])
        return [job_id for job_id, _ in plan.built]
