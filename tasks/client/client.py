"""The producer client: submit jobs, get their results. Usable from scripts, web apps and asyncio code.

    from tasks.client import Client
    client = Client()                                   # SWAPLESS_REDIS_URL, else redis://127.0.0.1:6379/0
    job = client.submit("sentiment", "What a lovely day")
    job.id                                              # keep it to look the job up later: client.job(job_id)
    job.get(timeout=30)                                 # [{"label": "POSITIVE", "score": 0.99}, ...]
    await job.aget(timeout=30)                          # the same, for asyncio code

    for prediction in client.map("sentiment", texts):  # many inputs: chunked messages, results in input order
        ...
    jobs = client.submit_many("sentiment", texts)       # one Job per input, sent as chunks of 256

Every message is the one Celery's ``send_task`` would send (``tasks.broker.publish``), pushed with one LPUSH per
call, so a plain Celery producer and this client are interchangeable. The client talks to Redis through one
redis-py client with a bounded connect timeout (``SWAPLESS_CONNECT_TIMEOUT_S``): a Redis that is down is
``QueueUnavailable`` within seconds, one that refuses writes (out of memory) ``QueueFull``
(``tasks.broker.connection.translate``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

from celery import Celery, states

from config.errors import DeadlinePassed, JobCancelled, JobTimeout, QueueFull, SwaplessError
from config.settings import Settings, get_settings
from manager.registry.specs import ModelSpec
from manager.registry.store import ModelStore
from tasks.app import make_app
from tasks.broker.connection import redact, redis_client, translated
from tasks.broker.publish import ModelPush, build_messages, push, push_to_models
from tasks.broker.results import ResultStore, StoredResult
from tasks.broker.routes import RouteOverrides
from tasks.client.stream import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAX_IN_FLIGHT,
    ChunkEvent,
    ChunkStream,
)
from tasks.client.waiting import raise_for, read_results, wait_result
from tasks.keyspace import Keyspace
from tasks.protocol import (
    CHUNK_TASK,
    KEYS_HEADER,
    PREDICT_TASK,
    PRIORITY_STEPS,
    SHADOW_HEADER,
    SHADOWED_HEADER,
    expires_header,
    item_id,
    priority_level,
    split_item_id,
    storage_id,
)

__all__ = ["Client", "Job", "Routed"]

logger = logging.getLogger(__name__)


def _batched(values: Iterable[Any], size: int) -> Iterator[list[Any]]:
    if size < 1:
        raise ValueError(f"chunk_size must be at least 1, not {size}")
    iterator = iter(values)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


@dataclass(frozen=True)
class Routed:
    """A single job ready to send: its id, the model its message addresses (the route's pick, or as addressed), its
    input, and the shadow models that get a copy (``via``: the routes it went through, outermost first)."""

    job_id: str
    model_id: str
    value: Any
    shadows: tuple[str, ...] = ()
    via: tuple[str, ...] = ()


class Job:
    """A handle on one submitted job. Cheap to create: ``Client().job(job_id)`` works for any id.

    Jobs of ``submit_many`` are items of chunk messages; their ids are ``"<chunk id>:<index>"`` and they read their
    own item of the chunk's stored result.
    """

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> StoredResult:
        """The stored state now: PENDING (queued, running, or unknown id), SUCCESS or FAILURE."""
        return self.client.fetch([self.id])[0]

    @property
    def state(self) -> str:
        return self.status().state

    def ready(self) -> bool:
        return self.status().ready

    def get(self, timeout: float | None = 60.0, *, forget: bool | None = None) -> Any:
        """Wait for the job and return its prediction.

        Wakes on the result backend's publish (no polling stall), with a slow poll as a safety net.

        Args:
            timeout: seconds to wait (None: no limit).
            forget: delete the result from Redis once read (a second ``get`` then waits in vain); default: the
                client's ``forget``. The items of a chunk (``submit_many``) share their chunk's result and are
                never forgotten one by one (``gather`` forgets a chunk's).

        Raises:
            SwaplessError: the worker's error for this job (UnknownModel, InputError, ...), rebuilt here.
            JobTimeout: no result within ``timeout`` seconds (the job may still finish).
            QueueUnavailable: Redis cannot be reached.
        """
        client = self.client
        with translated(client.settings.broker_url):
            stored = wait_result(client.redis, client.results, self.id, timeout)
            if not stored.ready:
                raise JobTimeout(self.id, timeout or 0.0, stored.state)
            if (client.forget if forget is None else forget) and split_item_id(self.id) is None:
                client.results.forget([self.id])
        return raise_for(stored)

    async def aget(self, timeout: float | None = 60.0, *, forget: bool | None = None) -> Any:
        """``get`` for asyncio code: waits in a thread, never blocking the event loop."""
        return await asyncio.to_thread(self.get, timeout, forget=forget)

    def cancel(self) -> str:
        """Cancel this job if it has not started (``Client.cancel``); returns ``"cancelled"``, ``"running"`` (too
        late: it runs to its end, its result is kept) or ``"done"``."""
        return self.client.cancel([self.id])[self.id]


class Client:
    """Submits jobs to the Swapless queue and reads their results.

    Args:
        redis_url: broker and result backend; defaults to SWAPLESS_REDIS_URL, else redis://127.0.0.1:6379/0.
        settings: settings to use instead of the environment's.
        validate: check model ids against the models file before sending (fail fast with UnknownModel).
        forget: ``get`` and ``gather`` delete each result from Redis once read, unless told otherwise per call.
            Results left unread expire after ``SWAPLESS_RESULT_EXPIRES_S``.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: Settings | None = None,
        validate: bool = True,
        forget: bool = False,
    ) -> None:
        base = settings or get_settings()
        self.settings = base.model_copy(update={"redis_url": redis_url}) if redis_url else base
        #: The Celery app whose result backend's encoding, key names and expiry the results follow.
        self.app: Celery = make_app(self.settings)
        # A client dropped without close() still closes the connections its app opened (send_task, AsyncResult)
        # instead of leaving their sockets to the garbage collector.
        self._release = weakref.finalize(self, self.app.close)
        #: Every call of this client goes through it (one connection pool per URL in the process).
        self.redis = redis_client(self.settings.broker_url, connect_timeout_s=self.settings.connect_timeout_s)
        self.results = ResultStore(self.app, client=self.redis)
        self._validate = validate
        self.forget = forget
        self._store: ModelStore | None = None
        self._routing_unavailable = False
        self._overrides: RouteOverrides | None = None

    @property
    def queue(self) -> str:
        """The queue this client sends to."""
        return self.settings.queue

    @property
    def store(self) -> ModelStore:
        """The model registry this client validates against (read on first use)."""
        if self._store is None:
            self._store = ModelStore.from_file(self.settings.models_file)
        return self._store

    def _checked(self, model_id: str, priority: str) -> int:
        """Check ``priority`` and (with ``validate``) ``model_id`` before anything is sent; returns the level."""
        level = priority_level(priority)
        if self._validate and not self.store.is_route(model_id):
            self.store.get(model_id)
        return level

    def _routing_store(self) -> ModelStore | None:
        """The registry, when this client can read it and it has routes (else jobs go as addressed)."""
        if self._store is None and self._routing_unavailable:
            return None
        try:
            store = self.store
        except SwaplessError:
            self._routing_unavailable = True  # no models file here: the workers route
            return None
        return store if store.routes else None

    def route_weights(self) -> RouteOverrides:
        """The run-time route weights (``swapless route``) this client reads, cached for a second."""
        if self._overrides is None:
            self._overrides = RouteOverrides(self.redis, Keyspace.of(self.settings))
        return self._overrides

    def route_jobs(
        self, jobs: Sequence[tuple[str, Any]], keys: Sequence[str | None] | None = None, *, paths: bool = True
    ) -> list[Routed]:
        """Each job with a fresh id, addressed to the model that serves it: a route resolved (``manager.registry.routing``: by
        its sticky key, else by its id, so a worker resolving a plain Celery job by its id picks the same) with the
        shadows it sends copies to. A job whose route cannot place its input goes as addressed: the worker answers
        it alone (``InputError``). ``paths``: whether an input may be an image file's path (False for inputs from
        the network: ``secret.png`` is then text).
        """
        store = self._routing_store()
        ids = [str(uuid.uuid4()) for _ in jobs]
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
            QueueFull, QueueUnavailable: as ``submit``.
        """
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
        sent = self._publish(PREDICT_TASK, [(r.model_id, r.value) for r in routed], level, expires,
                             ids=[r.job_id for r in routed], headers=extra)
        if shadows:
            try:
                self._publish(PREDICT_TASK, [(m, v) for _, m, v, _ in shadows], PRIORITY_STEPS[-1], expires,
                              ids=[i for i, _, _, _ in shadows], headers=[h for _, _, _, h in shadows])
            except SwaplessError as err:  # a shadow is never worth failing the served job
                logger.warning("could not send %d shadow job(s): %s", len(shadows), err)
        return sent

    def _canonical(self, model_id: str) -> str | None:
        """The id a model's lists are named by (an alias resolved), or None when this client cannot tell (no models
        file here, or an unknown id with ``validate`` off: the message then goes to the shared queue and a worker
        routes it, or answers it with ``UnknownModel``)."""
        try:
            return self.store.get(model_id).id
        except SwaplessError:
            return None

    def _publish(
        self,
        task: str,
        jobs: Sequence[tuple[str, Any]],
        level: int,
        expires: float | datetime | None = None,
        *,
        ids: Sequence[str] | None = None,
        headers: Sequence[dict[str, Any]] | None = None,
    ) -> list[str]:
        """Send one message per ``(model_id, value)`` to ``task`` as addressed, in one round trip; returns their ids
        (``ids``, else new ones). Single jobs are routed before they get here (``route_jobs``, ``send_routed``).

        With placement (``SWAPLESS_ROUTING``), each model's messages go to its own list (``tasks.broker.affinity``)
        and ring its bell; otherwise, and for a model this client cannot name, to the queue's shared lists.

        Raises:
            QueueFull: a model's lists (or the shared queue) hold ``SWAPLESS_MAX_QUEUED`` messages already, or Redis
                is out of memory; ``queued`` lists the ids that were queued nonetheless (other models' jobs).
            QueueUnavailable: Redis cannot be reached.
        """
        s = self.settings
        built = build_messages(self.app, s.queue, jobs, level, task=task, expires=expires_header(expires), ids=ids,
                               headers=headers, max_bytes=s.max_message_bytes)
        shared: list[int] = []
        by_model: dict[str, list[int]] = {}
        for index, (model_id, _) in enumerate(jobs):
            canonical = self._canonical(model_id)  # one layout: a model's own lists, whatever the routing
            if canonical is None:
                shared.append(index)
            else:
                by_model.setdefault(canonical, []).append(index)
        refused: list[tuple[list[int], str]] = []
        keyspace = Keyspace.of(s)
        with translated(s.broker_url):
            if by_model:
                pushes = [
                    ModelPush(keyspace.model(m), level, [built[i][1] for i in indices])
                    for m, indices in by_model.items()
                ]
                outcomes = push_to_models(self.redis, pushes, bound=s.max_queued, placement_bell=keyspace.placement_bell)
                for (m, indices), (pushed, held) in zip(by_model.items(), outcomes, strict=True):
                    if not pushed:
                        refused.append((indices, f"model {m!r} has {held} messages queued"))
            if shared:  # a model this client cannot name: the ingress, where a worker routes it or answers it
                key = keyspace.ingress(level)
                counted = list(keyspace.ingress_lists.lists)
                done = push(self.redis, key, [built[i][1] for i in shared], bound=s.max_queued, counted=counted)
                if done is not None and not done[0]:
                    refused.append((shared, f"queue {s.queue!r} holds {done[1]} messages"))
        if refused:
            left_out = {i for indices, _ in refused for i in indices}
            queued = [job_id for i, (job_id, _) in enumerate(built) if i not in left_out]
            error = QueueFull(
                redact(s.broker_url),
                f"{refused[0][1]}, its bound is {s.max_queued} (SWAPLESS_MAX_QUEUED); wait for the workers to take "
                "some, then send again" + (f" ({len(queued)} of these jobs were queued)" if queued else ""),
            )
            error.queued = queued
            raise error
        return [job_id for job_id, _ in built]

    def models(self) -> list[ModelSpec]:
        """The models that exist (from the models file)."""
        return list(self.store)

    def submit(
        self,
        model_id: str,
        input: Any,
        *,
        priority: str = "interactive",
        expires: float | datetime | None = None,
        key: str | None = None,
    ) -> Job:
        """Queue one job and return its handle at once.

        Args:
            model_id: a model id, alias or route from the registry.
            input: a string for text models; a base64 string of an encoded image for image models.
            priority: ``interactive`` (served ahead of bulk work) or ``bulk``.
            expires: a deadline, in seconds from now or as a datetime: a job not started by then, or whose answer
                would come after it (the model's forward pass takes time too), is answered ``JobExpired`` and never
                run (default: none, or the workers' ``SWAPLESS_*_EXPIRES_S``).
            key: a sticky key for a route (a user id, say): the same key always gets the same version while the
                route's weights hold (default: the job's id, a fresh pick per job).

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            ValueError: unknown ``priority``, an input JSON cannot encode, or ``expires`` is not in the future.
            QueueUnavailable: Redis cannot be reached (within ``SWAPLESS_CONNECT_TIMEOUT_S``, once retried).
            QueueFull: Redis refused the job (out of memory).
        """
        self._checked(model_id, priority)
        return Job(self, self.send_routed(self.route_jobs([(model_id, input)], [key]), priority=priority,
                                          expires=expires)[0])

    def submit_jobs(
        self,
        jobs: Iterable[tuple[str, Any]],
        *,
        priority: str = "interactive",
        expires: float | datetime | None = None,
        keys: Sequence[str | None] | None = None,
    ) -> list[Job]:
        """Queue one job per ``(model_id, input)`` pair, any mix of models, in one round trip to Redis; ``keys``:
        one sticky key per job (see ``submit``).

        Each job is its own message (its own id, result, retries), exactly as ``submit`` sends it. Jobs are consumed
        in the order given.

        Raises:
            UnknownModel: ``validate`` is on and an id is not in the registry (nothing is sent).
            ValueError: unknown ``priority``, an input JSON cannot encode, or ``expires`` is not in the future
                (nothing is sent).
            QueueUnavailable, QueueFull: as ``submit`` (nothing is sent).
        """
        pairs = list(jobs)
        priority_level(priority)
        for model_id in {model_id for model_id, _ in pairs}:
            self._checked(model_id, priority)
        if keys is not None and len(keys) != len(pairs):
            raise ValueError(f"keys has {len(keys)} key(s) for {len(pairs)} job(s): give one per job (None for none)")
        sent = self.send_routed(self.route_jobs(pairs, keys), priority=priority, expires=expires)
        return [Job(self, job_id) for job_id in sent]

    def submit_many(
        self,
        model_id: str,
        inputs: Iterable[Any],
        *,
        priority: str = "bulk",
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        expires: float | datetime | None = None,
    ) -> list[Job]:
        """Queue one job per input, sent as chunk messages of ``chunk_size`` inputs (bulk priority by default).

        Returns at once with one Job per input, in order (``gather`` them, or ``get`` each). For inputs too many to
        hold, use ``map``, which keeps a bounded number of chunks in flight.

        ``expires``: one deadline for every chunk (seconds from now, or a datetime), as ``submit``'s.

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            ValueError: unknown ``priority``, ``chunk_size`` below 1, or ``expires`` not in the future.
            QueueUnavailable, QueueFull: as ``submit`` (the chunks before it were sent).
        """
        level = self._checked(model_id, priority)
        header = expires_header(expires)  # fixed now, for every chunk
        deadline = datetime.fromisoformat(header) if header is not None else None
        jobs: list[Job] = []
        for batch in _batched(inputs, chunk_size):
            chunk_id = self._publish(CHUNK_TASK, [(model_id, batch)], level, deadline)[0]
            jobs.extend(Job(self, item_id(chunk_id, index)) for index in range(len(batch)))
        return jobs

    def map(
        self,
        model_id: str,
        inputs: Iterable[Any],
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        priority: str = "bulk",
        timeout: float | None = None,
        return_exceptions: bool = False,
        on_event: Callable[[ChunkEvent], None] | None = None,
        expires: float | datetime | None = None,
    ) -> Iterator[Any]:
        """Predict every input, yielding the predictions in input order as they finish.

        ``inputs`` is read lazily, ``chunk_size`` at a time, and at most ``max_in_flight`` chunks are queued or
        waiting to be read: memory stays flat for any number of inputs.

        Args:
            model_id: a model id or alias from the registry.
            inputs: the inputs (strings; base64 images or, with SWAPLESS_INPUT_ROOT set on the worker, image paths).
            chunk_size: inputs per queue message.
            max_in_flight: chunks sent and not yet read back, at most.
            priority: ``bulk`` (default) or ``interactive``.
            timeout: seconds a chunk may take from being sent to its result (None: no limit).
            return_exceptions: yield a failed input's error instead of raising it.
            on_event: called with a ``ChunkEvent`` per chunk sent and read (progress, instrumentation).
            expires: one deadline for the whole map (seconds from now, or a datetime): inputs not started by then
                are answered ``JobExpired`` (and no chunk is sent after it: ``DeadlinePassed``).

        Stopping early (``break``, an exception, Ctrl-C) cancels the chunks still in flight.

        Raises:
            SwaplessError: the first failed input's error (InputError, JobExpired, ...), unless
                ``return_exceptions``.
            JobTimeout: a chunk had no result within ``timeout``.
            DeadlinePassed: ``expires`` passed before every chunk was sent.
        """
        stream = self.stream(model_id, priority, expires=expires, max_in_flight=max_in_flight, timeout_s=timeout,
                             on_event=on_event)
        with translated(self.settings.broker_url):
            for _, outcomes in stream.run((None, batch) for batch in _batched(inputs, chunk_size)):
                for ok, value in outcomes:
                    if ok or return_exceptions:
                        yield value
                    else:
                        raise value

    def stream(
        self, model_id: str, priority: str = "bulk", *, expires: float | datetime | None = None, **options: Any
    ) -> ChunkStream:
        """A ``ChunkStream`` for ``model_id`` (what ``map`` and bulk jobs run on); ``options`` are its own.

        Args:
            expires: one deadline for every chunk of the stream (seconds from now, or a datetime): a chunk not
                started by then is answered ``JobExpired`` for each of its inputs.

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            ValueError: unknown ``priority``; a deadline not in the future.
        """
        level = self._checked(model_id, priority)
        header = expires_header(expires)  # fixed now: "by morning", not a window that moves with each chunk
        deadline = datetime.fromisoformat(header) if header is not None else None

        def send(inputs: list[Any], keys: list[str | None] | None = None) -> str:
            if deadline is not None and deadline <= datetime.now(UTC):
                raise DeadlinePassed(deadline.isoformat(timespec="seconds"))
            headers = [{KEYS_HEADER: keys}] if keys is not None and any(k is not None for k in keys) else None
            return self._publish(CHUNK_TASK, [(model_id, inputs)], level, deadline, headers=headers)[0]

        return ChunkStream(send, self.results, **options)

    def fetch(self, job_ids: Sequence[str]) -> list[StoredResult]:
        """The stored states of many jobs now (batched MGETs; items of one chunk share one read).

        Raises:
            QueueUnavailable: Redis cannot be reached.
        """
        with translated(self.settings.broker_url):
            return read_results(self.results, job_ids)

    def cancel(self, job_ids: Sequence[str]) -> dict[str, str]:
        """Cancel jobs that have not started yet, in one round trip.

        A cancelled job's result is ``JobCancelled`` (``get`` raises it, waiters wake at once) and no worker runs it:
        every worker checks for a result before it starts a job, and the cancellation is kept in Redis as the job's
        result for ``SWAPLESS_CANCEL_HOLD_S`` (7 days: as long as a job may wait), so it holds across worker restarts
        and for a job still on its way. A job that has started runs to its end and keeps its result. The jobs of one
        ``submit_many`` chunk share one message: cancelling one cancels its chunk.

        Returns:
            per id: ``"cancelled"``; ``"running"`` (too late: it has started, its result will be kept); ``"done"``
            (it has a result already, kept).

        Raises:
            QueueUnavailable: Redis cannot be reached.
        """
        ids = list(job_ids)
        with translated(self.settings.broker_url):
            return self.results.cancel(ids, JobCancelled, self.settings.cancel_hold_s)

    def job(self, job_id: str) -> Job:
        """A handle on a job submitted earlier, by id."""
        return Job(self, job_id)

    def gather(
        self, jobs: Sequence[Job], timeout: float | None = 300.0, *, forget: bool | None = None
    ) -> list[StoredResult]:
        """Wait for many jobs at once, reading results in batched MGETs; returns their final states in order.

        Args:
            jobs: the jobs.
            timeout: seconds to wait for all of them (None: no limit).
            forget: delete the results from Redis once all are read (items of a chunk: their chunk's result);
                default: the client's ``forget``.

        Raises:
            JobTimeout: some job has no result within ``timeout`` (names the first such job).
            QueueUnavailable: Redis cannot be reached.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        found: dict[str, StoredResult] = {}
        pending = [job.id for job in jobs]
        pause_s = 0.002
        while pending:
            for stored in self.fetch(pending):
                if stored.ready:
                    found[stored.job_id] = stored
            pending = [job_id for job_id in pending if job_id not in found]
            if not pending:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(pending[0], timeout or 0.0, states.PENDING)
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 0.1)
        if self.forget if forget is None else forget:
            stored_under = list(dict.fromkeys(storage_id(job.id) for job in jobs))
            with translated(self.settings.broker_url):
                for start in range(0, len(stored_under), 1000):
                    self.results.forget(stored_under[start : start + 1000])
        return [found[job.id] for job in jobs]

    def close(self) -> None:
        """Release what this client holds (its connections go back to the process's pool for its URL)."""
        self._release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
