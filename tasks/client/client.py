"""The producer client: submit jobs, get their results. Usable from scripts, web apps and asyncio code.

    from swapless.tasks.client import Client
    client = Client()                                   # SWAPLESS_REDIS_URL, else redis://127.0.0.1:6379/0
    job = client.submit("sentiment", "What a lovely day")
    job.id                                              # keep it to look the job up later: client.job(job_id)
    job.get(timeout=30)                                 # [{"label": "POSITIVE", "score": 0.99}, ...]
    await job.aget(timeout=30)                          # the same, for asyncio code

    for prediction in client.map("sentiment", texts):  # many inputs: chunked messages, results in input order
        ...
    jobs = client.submit_many("sentiment", texts)       # one Job per input, sent as chunks of 256

``Client`` is the facade over the producer's parts, each built here once and owning one concern: the
``Publisher`` routes and publishes jobs (``swapless.tasks.client.publisher``); the ``ResultStore`` reads results
(``swapless.tasks.broker.results``); the ``ResultConsumer`` serves every wait, ``Job.get``, ``gather`` and the chunk
streams of ``map`` and bulk runs alike, on one pub/sub connection (``swapless.tasks.client.consumer``); ``Job`` is the
handle on one job (``swapless.tasks.client.job``).

Every message is the one Celery's ``send_task`` would send (``swapless.tasks.broker.publish``), pushed with one LPUSH
per call, so a plain Celery producer and this client are interchangeable. The client talks to Redis through one
redis-py client with a bounded connect timeout (``SWAPLESS_CONNECT_TIMEOUT_S``): a Redis that is down is
``QueueUnavailable`` within seconds, one that refuses writes (out of memory) ``QueueFull``
(``swapless.tasks.broker.connection.translate``).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Self

from celery import Celery, states

from swapless.config.errors import DeadlinePassed, JobCancelled, JobTimeout
from swapless.config.settings import Settings, get_settings
from swapless.manager.registry.specs import ModelSpec
from swapless.manager.registry.store import ModelStore
from swapless.tasks.app import make_app
from swapless.tasks.broker.connection import redis_client, translated
from swapless.tasks.broker.results import ResultStore, StoredResult
from swapless.tasks.broker.sentinel import SentinelOptions
from swapless.tasks.client.consumer import ResultConsumer
from swapless.tasks.client.job import Job
from swapless.tasks.client.publisher import Publisher, Routed
from swapless.tasks.client.reading import read_results
from swapless.tasks.client.stream import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_REFUSED_WAIT_S,
    ChunkEvent,
    ChunkStream,
)
from swapless.tasks.protocol import (
    CALLBACK_URL_HEADER,
    CHUNK_TASK,
    KEYS_HEADER,
    expires_header,
    item_id,
    priority_level,
    storage_id,
)
from swapless.tasks.routing import RouteOverrides
from swapless.tasks.tracing import sending
from swapless.tasks.webhooks import allowed_hosts, check_target

__all__ = ["Client"]


def _batched(values: Iterable[Any], size: int) -> Iterator[list[Any]]:
    if size < 1:
        raise ValueError(f"chunk_size must be at least 1, not {size}")
    iterator = iter(values)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def _traced(headers: Sequence[dict[str, Any]] | None, trace: dict[str, str] | None, count: int
            ) -> Sequence[dict[str, Any]] | None:
    """``count`` jobs' message headers with the trace context ``trace`` (None: none to carry) added."""
    if trace is None:
        return headers
    if headers is None:
        return [trace] * count
    return [{**h, **trace} for h in headers]


def _one(model_ids: Iterable[str]) -> str | None:
    """The model every job addresses, when they all address one."""
    ids = set(model_ids)
    return next(iter(ids)) if len(ids) == 1 else None


def _message_id(routed: Sequence[Routed]) -> dict[str, str] | None:
    """The ``messaging.message.id`` of a send of one job."""
    return {"messaging.message.id": routed[0].job_id} if len(routed) == 1 else None


def _release(app: Celery, consumer: ResultConsumer) -> None:
    consumer.close()
    app.close()


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
        #: Every call of this client goes through it (one connection pool per URL in the process).
        self.redis = redis_client(self.settings.redis.broker_url, sentinel=SentinelOptions.of(self.settings),
                                  connect_timeout_s=self.settings.redis.connect_timeout_s)
        #: A producer's writes (cancels, forgets) ride out a blip (with Sentinel, a failover), but a Redis that is
        #: down is reported within the connect timeout, not after the worker's minute of retries.
        retry_s = self.settings.redis.connect_timeout_s
        if self.settings.redis.redis_sentinel_master:
            retry_s = max(retry_s, self.settings.redis.redis_failover_wait_s)
        self.results = ResultStore(self.app, retry_s=retry_s, client=self.redis)
        #: Routes and publishes this client's jobs.
        self.publisher = Publisher(self.settings, self.app, self.redis)
        #: Every wait of this client (``Job.get``, ``gather``, chunk streams): one pub/sub connection, opened by the
        #: first wait.
        self.consumer = ResultConsumer(self.redis, self.results, failover_s=self.settings.redis.failover_wait_s)
        # A client dropped without close() still lets go of what it opened (its app's connections, the consumer's
        # pub/sub connection and listener) instead of leaving their sockets to the garbage collector.
        self._release = weakref.finalize(self, _release, self.app, self.consumer)
        self._validate = validate
        self.forget = forget

    @property
    def queue(self) -> str:
        """The queue this client sends to."""
        return self.settings.jobs.queue

    @property
    def store(self) -> ModelStore:
        """The model registry this client validates against (read on first use)."""
        return self.publisher.store

    def _checked(self, model_id: str, priority: str) -> int:
        """Check ``priority`` and (with ``validate``) ``model_id`` before anything is sent; returns the level."""
        level = priority_level(priority)
        if self._validate and not self.store.is_route(model_id):
            self.store.get(model_id)
        return level

    def route_weights(self) -> RouteOverrides:
        """The run-time route weights (``swapless route``) this client reads, cached for a second."""
        return self.publisher.route_weights()

    def route_jobs(
        self, jobs: Sequence[tuple[str, Any]], keys: Sequence[str | None] | None = None, *, paths: bool = True
    ) -> list[Routed]:
        """Each job with a fresh id, addressed to the model that serves it (``Publisher.route_jobs``: a route
        resolved by its sticky key, else by its id, with the shadows it sends copies to). ``paths``: whether an
        input may be an image file's path (False for inputs from the network)."""
        return self.publisher.route_jobs(jobs, keys, paths=paths)

    def send_routed(
        self, routed: Sequence[Routed], *, priority: str = "interactive", expires: float | datetime | None = None,
        headers: Sequence[dict[str, Any]] | None = None,
    ) -> list[str]:
        """Send jobs ``route_jobs`` addressed, in one round trip, then their shadow copies at bulk priority
        (``Publisher.send_routed``); returns the served jobs' ids. ``headers``: extra message headers per job.

        Raises:
            ValueError: unknown ``priority``; an input JSON cannot encode; a message over
                ``SWAPLESS_MAX_MESSAGE_BYTES`` (``InputError``; nothing is sent).
            QueueFull, QueueUnavailable: as ``submit``.
        """
        with sending(self.queue, len(routed), lambda: _one(r.model_id for r in routed), _message_id(routed)) as trace:
            return self.publisher.send_routed(routed, priority=priority, expires=expires,
                                              headers=_traced(headers, trace, len(routed)))

    async def asend_routed(
        self, redis: Any, routed: Sequence[Routed], *, priority: str = "interactive",
        expires: float | datetime | None = None, headers: Sequence[dict[str, Any]] | None = None,
    ) -> list[str]:
        """``send_routed`` through ``redis``, an asyncio redis-py client, on the caller's event loop (the
        gateway's: no thread hand-off for a few jobs). ``headers``: extra message headers per job."""
        with sending(self.queue, len(routed), lambda: _one(r.model_id for r in routed), _message_id(routed)) as trace:
            return await self.publisher.asend_routed(redis, routed, priority=priority, expires=expires,
                                                     headers=_traced(headers, trace, len(routed)))

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
        callback_url: str | None = None,
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
            callback_url: where the job's final state is posted as a signed webhook once it is stored
                (``swapless.tasks.worker.webhooks``; at least once, ``webhook-id`` the job's id).

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            WebhookRefused: ``callback_url`` is not http(s) or names a host this deployment does not call back.
            ValueError: unknown ``priority``, an input JSON cannot encode, or ``expires`` is not in the future.
            QueueUnavailable: Redis cannot be reached (within ``SWAPLESS_CONNECT_TIMEOUT_S``, once retried).
            QueueFull: Redis refused the job (out of memory).
        """
        self._checked(model_id, priority)
        headers = self._callback_headers(callback_url, 1)
        return Job(self, self.send_routed(self.route_jobs([(model_id, input)], [key]), priority=priority,
                                          expires=expires, headers=headers)[0])

    def _callback_headers(self, callback_url: str | None, count: int) -> list[dict[str, Any]] | None:
        """The message headers of ``count`` jobs with ``callback_url`` (checked here: ``check_target`` without DNS,
        which the worker's sender does before each attempt), or None without one.

        Raises:
            WebhookRefused: the URL is not http(s) or names a host the allow-list does not.
        """
        if callback_url is None:
            return None
        check_target(callback_url, allowed_hosts(self.settings.webhooks.webhook_allowed_hosts))
        return [{CALLBACK_URL_HEADER: callback_url} for _ in range(count)]

    def submit_jobs(
        self,
        jobs: Iterable[tuple[str, Any]],
        *,
        priority: str = "interactive",
        expires: float | datetime | None = None,
        keys: Sequence[str | None] | None = None,
        callback_url: str | None = None,
    ) -> list[Job]:
        """Queue one job per ``(model_id, input)`` pair, any mix of models, in one round trip to Redis; ``keys``:
        one sticky key per job (see ``submit``); ``callback_url``: each job's webhook (see ``submit``).

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
        headers = self._callback_headers(callback_url, len(pairs))
        sent = self.send_routed(self.route_jobs(pairs, keys), priority=priority, expires=expires, headers=headers)
        return [Job(self, job_id) for job_id in sent]

    def submit_many(
        self,
        model_id: str,
        inputs: Iterable[Any],
        *,
        priority: str = "bulk",
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        expires: float | datetime | None = None,
        callback_url: str | None = None,
    ) -> list[Job]:
        """Queue one job per input, sent as chunk messages of ``chunk_size`` inputs (bulk priority by default).

        Returns at once with one Job per input, in order (``gather`` them, or ``get`` each). For inputs too many to
        hold, use ``map``, which keeps a bounded number of chunks in flight.

        ``expires``: one deadline for every chunk (seconds from now, or a datetime), as ``submit``'s.
        ``callback_url``: one webhook per chunk, its ``result`` the chunk's (one outcome per input, in order).

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            ValueError: unknown ``priority``, ``chunk_size`` below 1, or ``expires`` not in the future.
            QueueUnavailable, QueueFull: as ``submit`` (the chunks before it were sent).
        """
        level = self._checked(model_id, priority)
        header = expires_header(expires)  # fixed now, for every chunk
        deadline = datetime.fromisoformat(header) if header is not None else None
        headers = self._callback_headers(callback_url, 1)
        jobs: list[Job] = []
        for batch in _batched(inputs, chunk_size):
            with sending(self.queue, 1, model_id, {"swapless.chunk.inputs": len(batch)}) as trace:
                chunk_id = self.publisher.publish(CHUNK_TASK, [(model_id, batch)], level, expires=deadline,
                                                  headers=_traced(headers, trace, 1))[0]
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
        callback_url: str | None = None,
        refused_wait_s: float = DEFAULT_REFUSED_WAIT_S,
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
            callback_url: one webhook per chunk as it finishes (see ``submit_many``).
            refused_wait_s: how long a chunk the queue refuses (``QueueFull``: Redis out of memory, or the model's
                lists at SWAPLESS_MAX_QUEUED) is sent again, with a growing pause, before ``map`` raises it
                (``on_event`` gets a ``refused`` event each time); 0 raises at the first refusal.

        Stopping early (``break``, an exception, Ctrl-C) cancels the chunks still in flight.

        Raises:
            SwaplessError: the first failed input's error (InputError, JobExpired, ...), unless
                ``return_exceptions``.
            JobTimeout: a chunk had no result within ``timeout``.
            DeadlinePassed: ``expires`` passed before every chunk was sent.
            QueueFull: the queue refused a chunk for ``refused_wait_s``; nothing of that chunk was queued.
        """
        stream = self.stream(model_id, priority, expires=expires, max_in_flight=max_in_flight, timeout_s=timeout,
                             on_event=on_event, callback_url=callback_url, refused_wait_s=refused_wait_s)
        with translated(self.settings.redis.broker_url):
            for _, outcomes in stream.run((None, batch) for batch in _batched(inputs, chunk_size)):
                for ok, value in outcomes:
                    if ok or return_exceptions:
                        yield value
                    else:
                        raise value

    def stream(
        self, model_id: str, priority: str = "bulk", *, expires: float | datetime | None = None,
        callback_url: str | None = None, **options: Any
    ) -> ChunkStream:
        """A ``ChunkStream`` for ``model_id`` (what ``map`` and bulk jobs run on); ``options`` are its own.

        Args:
            expires: one deadline for every chunk of the stream (seconds from now, or a datetime): a chunk not
                started by then is answered ``JobExpired`` for each of its inputs.
            callback_url: one webhook per chunk (see ``submit_many``).

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            WebhookRefused: ``callback_url`` is not allowed (see ``submit``).
            ValueError: unknown ``priority``; a deadline not in the future.
        """
        level = self._checked(model_id, priority)
        header = expires_header(expires)  # fixed now: "by morning", not a window that moves with each chunk
        deadline = datetime.fromisoformat(header) if header is not None else None
        callback = (self._callback_headers(callback_url, 1) or [{}])[0]

        def send(inputs: list[Any], keys: list[str | None] | None = None) -> str:
            if deadline is not None and deadline <= datetime.now(UTC):
                raise DeadlinePassed(deadline.isoformat(timespec="seconds"))
            extra = {**callback, **({KEYS_HEADER: keys} if keys is not None and any(k is not None for k in keys)
                                    else {})}
            with sending(self.queue, 1, model_id, {"swapless.chunk.inputs": len(inputs)}) as trace:
                headers = _traced([extra] if extra else None, trace, 1)
                return self.publisher.publish(CHUNK_TASK, [(model_id, inputs)], level, headers=headers,
                                              expires=deadline)[0]

        return ChunkStream(send, self.results, self.consumer, **options)

    def fetch(self, job_ids: Sequence[str]) -> list[StoredResult]:
        """The stored states of many jobs now (batched MGETs; items of one chunk share one read).

        Raises:
            QueueUnavailable: Redis cannot be reached.
        """
        with translated(self.settings.redis.broker_url):
            return read_results(self.results, job_ids)

    def cancel(self, job_ids: Sequence[str]) -> dict[str, str]:
        """Cancel jobs that have not started yet, in one round trip.

        A cancelled job's result is ``JobCancelled`` (``get`` raises it, waiters wake at once) and no worker runs it:
        every worker checks for a result before it starts a job, and the cancellation is kept in Redis as the job's
        result for ``SWAPLESS_CANCEL_HOLD_S`` (7 days: as long as a job may wait), so it holds across worker restarts
        and for a job still on its way. A job that has started runs to its end and keeps its result. The jobs of one
        ``submit_many`` chunk share one message: cancelling one cancels its chunk. A job has started once it is next in
        line on its worker's device (from the start of the last forward pass of the group before it).

        Returns:
            per id: ``"cancelled"``; ``"running"`` (too late: it has started, its result will be kept); ``"done"``
            (it has a result already, kept).

        Raises:
            QueueUnavailable: Redis cannot be reached.
        """
        ids = list(job_ids)
        with translated(self.settings.redis.broker_url):
            return self.results.cancel(ids, JobCancelled, self.settings.jobs.cancel_hold_s)

    def job(self, job_id: str) -> Job:
        """A handle on a job submitted earlier, by id."""
        return Job(self, job_id)

    def gather(
        self, jobs: Sequence[Job], timeout: float | None = 300.0, *, forget: bool | None = None
    ) -> list[StoredResult]:
        """Wait for many jobs at once; returns their final states in order. The wait goes through the client's
        result consumer: woken by each result's publish (no polling loop), reading the results found ready in
        batched MGETs (first, after a reconnect, and every ``POLL_S`` as a safety net).

        Args:
            jobs: the jobs.
            timeout: seconds to wait for all of them (None: no limit).
            forget: delete the results from Redis once all are read (items of a chunk: their chunk's result);
                default: the client's ``forget``.

        Raises:
            JobTimeout: some job has no result within ``timeout`` (names the first such job).
            QueueUnavailable: Redis cannot be reached.
        """
        with translated(self.settings.redis.broker_url):
            stored = self.consumer.wait_all([job.id for job in jobs], timeout)
        late = next((s for s in stored if not s.ready), None)
        if late is not None:
            raise JobTimeout(late.job_id, timeout or 0.0, states.PENDING)
        if self.forget if forget is None else forget:
            stored_under = list(dict.fromkeys(storage_id(job.id) for job in jobs))
            with translated(self.settings.redis.broker_url):
                for start in range(0, len(stored_under), 1000):
                    self.results.forget(stored_under[start : start + 1000])
        return stored

    def close(self) -> None:
        """Release what this client holds: its result consumer's listener stops, and its connections go back to the
        process's pool for its URL (a later wait opens the consumer's again)."""
        self.consumer.close()
        self._release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
