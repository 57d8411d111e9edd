"""The producer client: submit jobs, get their results, from scripts, web apps and asyncio code.

    from swapless import Client
    client = Client()                                   # SWAPLESS_REDIS_URL, else redis://127.0.0.1:6379/0
    job = client.submit("sentiment", "What a lovely day")
    job.get(timeout=30)                                 # [{"label": "POSITIVE", "score": 0.99}, ...]
    for prediction in client.map("sentiment", texts):  # many inputs, results in input order
        ...

How its parts fit is in docs/concepts/client.md.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, Self

from celery import Celery, states

from swapless.config.errors import JobCancelled, JobTimeout
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
from swapless.tasks.client.sending import (
    ChunkSender,
    batched,
    callback_headers,
    deadline_of,
    message_id,
    one_model,
    traced,
)
from swapless.tasks.client.stream import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_REFUSED_WAIT_S,
    ChunkEvent,
    ChunkStream,
)
from swapless.tasks.protocol import CHUNK_TASK, item_id, priority_level, storage_id
from swapless.tasks.routing import RouteOverrides
from swapless.tasks.tracing import sending

__all__ = ["Client"]


def _release(app: Celery, consumer: ResultConsumer) -> None:
    consumer.close()
    app.close()


class Client:
    """Submits jobs to the Swapless queue and reads their results: a facade over its publisher, result store and
    result consumer.

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
        """Each job with a fresh id, addressed to the model that serves it (``Publisher.route_jobs``). ``paths``:
        whether an input may be an image file's path."""
        return self.publisher.route_jobs(jobs, keys, paths=paths)

    def send_routed(
        self, routed: Sequence[Routed], *, priority: str = "interactive", expires: float | datetime | None = None,
        headers: Sequence[dict[str, Any]] | None = None,
    ) -> list[str]:
        """Send routed jobs in one round trip (``Publisher.send_routed``); returns their ids.

        Raises:
            ValueError: unknown ``priority``, or an input that cannot be sent (nothing is sent).
            QueueFull, QueueUnavailable: as ``submit``.
        """
        with sending(self.queue, len(routed), lambda: one_model(r.model_id for r in routed),
                     message_id(routed)) as trace:
            return self.publisher.send_routed(routed, priority=priority, expires=expires,
                                              headers=traced(headers, trace, len(routed)))

    async def asend_routed(
        self, redis: Any, routed: Sequence[Routed], *, priority: str = "interactive",
        expires: float | datetime | None = None, headers: Sequence[dict[str, Any]] | None = None,
    ) -> list[str]:
        """``send_routed`` through ``redis``, an asyncio redis-py client, on the caller's event loop."""
        with sending(self.queue, len(routed), lambda: one_model(r.model_id for r in routed),
                     message_id(routed)) as trace:
            return await self.publisher.asend_routed(redis, routed, priority=priority, expires=expires,
                                                     headers=traced(headers, trace, len(routed)))

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
            expires: a deadline (seconds from now, or a datetime); a job that would finish after it is answered
                ``JobExpired`` and never run.
            key: a sticky key for a route: the same key gets the same version while the weights hold.
            callback_url: where the job's final state is posted as a signed webhook.

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            WebhookRefused: ``callback_url`` is not http(s) or names a host this deployment does not call back.
            ValueError: unknown ``priority``, an input JSON cannot encode, or ``expires`` is not in the future.
            QueueUnavailable: Redis cannot be reached.
            QueueFull: Redis refused the job (out of memory).
        """
        self._checked(model_id, priority)
        headers = callback_headers(self.settings, callback_url, 1)
        return Job(self, self.send_routed(self.route_jobs([(model_id, input)], [key]), priority=priority,
                                          expires=expires, headers=headers)[0])

    def submit_jobs(
        self,
        jobs: Iterable[tuple[str, Any]],
        *,
        priority: str = "interactive",
        expires: float | datetime | None = None,
        keys: Sequence[str | None] | None = None,
        callback_url: str | None = None,
    ) -> list[Job]:
        """Queue one job per ``(model_id, input)`` pair in one round trip, each its own message as ``submit``
        sends it. ``keys``: one sticky key per job; the other options are ``submit``'s.

        Raises:
            UnknownModel, ValueError, QueueUnavailable, QueueFull: as ``submit`` (nothing is sent).
        """
        pairs = list(jobs)
        priority_level(priority)
        for model_id in {model_id for model_id, _ in pairs}:
            self._checked(model_id, priority)
        if keys is not None and len(keys) != len(pairs):
            raise ValueError(f"keys has {len(keys)} key(s) for {len(pairs)} job(s): give one per job (None for none)")
        headers = callback_headers(self.settings, callback_url, len(pairs))
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
        """Queue one job per input, sent as chunk messages of ``chunk_size`` inputs; returns one Job per input.

        ``expires`` is one deadline for every chunk; ``callback_url`` one webhook per chunk. For more inputs than
        fit in memory, use ``map``.

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            ValueError: unknown ``priority``, ``chunk_size`` below 1, or ``expires`` not in the future.
            QueueUnavailable, QueueFull: as ``submit`` (the chunks before it were sent).
        """
        level = self._checked(model_id, priority)
        deadline = deadline_of(expires)
        headers = callback_headers(self.settings, callback_url, 1)
        jobs: list[Job] = []
        for batch in batched(inputs, chunk_size):
            with sending(self.queue, 1, model_id, {"swapless.chunk.inputs": len(batch)}) as trace:
                chunk_id = self.publisher.publish(CHUNK_TASK, [(model_id, batch)], level, expires=deadline,
                                                  headers=traced(headers, trace, 1))[0]
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

        Inputs are read lazily, with at most ``max_in_flight`` chunks in flight. Stopping early cancels them.

        Args:
            model_id: a model id or alias from the registry.
            inputs: the inputs.
            chunk_size: inputs per queue message.
            max_in_flight: chunks sent and not yet read back, at most.
            priority: ``bulk`` (default) or ``interactive``.
            timeout: seconds a chunk may take from being sent to its result (None: no limit).
            return_exceptions: yield a failed input's error instead of raising it.
            on_event: called with a ``ChunkEvent`` per chunk sent, read or refused.
            expires: one deadline for the whole map; no chunk is sent after it.
            callback_url: one webhook per chunk.
            refused_wait_s: how long a refused chunk is sent again before ``map`` raises (0: at once).

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
            for _, outcomes in stream.run((None, batch) for batch in batched(inputs, chunk_size)):
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

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            WebhookRefused: ``callback_url`` is not allowed (see ``submit``).
            ValueError: unknown ``priority``; a deadline not in the future.
        """
        level = self._checked(model_id, priority)
        # One deadline fixed now ("by morning"), not a window that moves with each chunk.
        send = ChunkSender(self.publisher, self.queue, model_id, level, deadline_of(expires),
                           (callback_headers(self.settings, callback_url, 1) or [{}])[0])
        return ChunkStream(send, self.results, self.consumer, **options)

    def fetch(self, job_ids: Sequence[str]) -> list[StoredResult]:
        """The stored states of many jobs now (batched MGETs; items of one chunk share one read).

        Raises:
            QueueUnavailable: Redis cannot be reached.
        """
        with translated(self.settings.redis.broker_url):
            return read_results(self.results, job_ids)

    def cancel(self, job_ids: Sequence[str]) -> dict[str, str]:
        """Cancel jobs that have not started yet, in one round trip; cancelling an item cancels its chunk.

        Returns:
            per id: ``"cancelled"``, ``"running"`` (too late) or ``"done"`` (it has a result already).

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
        """Wait for many jobs at once; returns their final states in order.

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
        """Stop the result consumer's listener and release the connections (a later wait opens them again)."""
        self.consumer.close()
        self._release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
