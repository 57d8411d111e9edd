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
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from celery import Celery, states

from config.settings import Settings, get_settings
from manager.errors import JobFailed, JobTimeout, SwaplessError
from manager.specs import ModelSpec
from manager.store import ModelStore
from tasks.app import PREDICT_TASK, PRIORITY_BULK, PRIORITY_INTERACTIVE, make_app
from tasks.chunks import decode_outcome, item_id, split_item_id
from tasks.publish import build_messages, push, queue_key
from tasks.results import ResultStore, StoredResult
from tasks.stream import DEFAULT_CHUNK_SIZE, DEFAULT_MAX_IN_FLIGHT, ChunkEvent, ChunkStream

__all__ = ["Client", "Job"]

_PRIORITIES = {"interactive": PRIORITY_INTERACTIVE, "bulk": PRIORITY_BULK}


def _batched(values: Iterable[Any], size: int) -> Iterator[list[Any]]:
    if size < 1:
        raise ValueError(f"chunk_size must be at least 1, not {size}")
    iterator = iter(values)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def _storage_id(job_id: str) -> str:
    """The id a job's result is stored under: its chunk's id for an item of a chunk, else its own."""
    parts = split_item_id(job_id)
    return parts[0] if parts is not None else job_id


def _item_result(job_id: str, chunk: StoredResult) -> StoredResult:
    """The state of item ``job_id`` of a chunk, from the chunk's stored state."""
    parts = split_item_id(job_id)
    if parts is None or not chunk.ready:
        return StoredResult(job_id, chunk.state) if parts is not None else chunk
    index = parts[1]
    if chunk.state != states.SUCCESS:
        return StoredResult(job_id, chunk.state, chunk.value)  # the whole chunk failed: so did each item
    if not isinstance(chunk.value, list) or index >= len(chunk.value):
        return StoredResult(job_id, states.FAILURE, JobFailed(job_id, "MalformedResult", "no such item in its chunk"))
    ok, value = decode_outcome(chunk.value[index], job_id)
    return StoredResult(job_id, states.SUCCESS if ok else states.FAILURE, value)


def _raise_for(stored: StoredResult) -> Any:
    if stored.state == states.SUCCESS:
        return stored.value
    error = stored.value
    if isinstance(error, SwaplessError):
        raise error
    raise JobFailed(stored.job_id, type(error).__name__ if error is not None else stored.state, str(error))


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

    def get(self, timeout: float | None = 60.0) -> Any:
        """Wait for the job and return its prediction.

        Wakes on the result backend's publish (no polling stall), with a slow poll as a safety net.

        Raises:
            SwaplessError: the worker's error for this job (UnknownModel, InputError, ...), rebuilt here.
            JobTimeout: no result within ``timeout`` seconds (the job may still finish).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        results = self.client.results
        pubsub = results.client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(results.key(_storage_id(self.id)))
            while True:
                stored = self.client.fetch([self.id])[0]
                if stored.ready:
                    return _raise_for(stored)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise JobTimeout(self.id, timeout or 0.0, stored.state)
                wait_s = 0.5 if remaining is None else min(0.5, remaining)
                pubsub.get_message(timeout=wait_s)
        finally:
            pubsub.close()

    async def aget(self, timeout: float | None = 60.0) -> Any:
        """``get`` for asyncio code: waits in a thread, never blocking the event loop."""
        return await asyncio.to_thread(self.get, timeout)


class Client:
    """Submits jobs to the Swapless queue and reads their results.

    Args:
        redis_url: broker and result backend; defaults to SWAPLESS_REDIS_URL, else redis://127.0.0.1:6379/0.
        settings: settings to use instead of the environment's.
        validate: check model ids against the models file before sending (fail fast with UnknownModel).
    """

    def __init__(self, redis_url: str | None = None, *, settings: Settings | None = None, validate: bool = True) -> None:
        base = settings or get_settings()
        self.settings = base.model_copy(update={"redis_url": redis_url}) if redis_url else base
        self.app: Celery = make_app(self.settings)
        self._validate = validate
        self._store: ModelStore | None = None
        self._results: ResultStore | None = None

    @property
    def results(self) -> ResultStore:
        if self._results is None:
            self._results = ResultStore(self.app)
        return self._results

    @property
    def store(self) -> ModelStore:
        """The model registry this client validates against (read on first use)."""
        if self._store is None:
            self._store = ModelStore.from_file(self.settings.models_file)
        return self._store

    @staticmethod
    def _level(priority: str) -> int:
        """The Redis priority of ``priority``; ValueError naming the choices if there is none."""
        if priority not in _PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(_PRIORITIES)}, not {priority!r}")
        return _PRIORITIES[priority]

    def _checked(self, model_id: str, priority: str) -> int:
        """Check ``priority`` and (with ``validate``) ``model_id`` before anything is sent; returns the level."""
        level = self._level(priority)
        if self._validate:
            self.store.get(model_id)
        return level

    def models(self) -> list[ModelSpec]:
        """The models that exist (from the models file)."""
        return list(self.store)

    def submit(self, model_id: str, input: Any, *, priority: str = "interactive") -> Job:
        """Queue one job and return its handle at once.

        Args:
            model_id: a model id or alias from the registry.
            input: a string for text models; a base64 string of an encoded image for image models.
            priority: ``interactive`` (served ahead of bulk work) or ``bulk``.

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            ValueError: unknown ``priority``.
        """
        level = self._checked(model_id, priority)
        result = self.app.send_task(PREDICT_TASK, args=[model_id, input], queue=self.settings.queue, priority=level)
        return Job(self, result.id)

    def submit_jobs(self, jobs: Iterable[tuple[str, Any]], *, priority: str = "interactive") -> list[Job]:
        """Queue one job per ``(model_id, input)`` pair, any mix of models, in one round trip to Redis.

        Each job is its own message (its own id, result, retries), exactly as ``submit`` sends it; the messages are
        built without Celery's per-message publish path and pushed in one pipeline (``tasks.publish``), which
        takes about a tenth of the CPU per job. Jobs are consumed in the order given.

        Raises:
            UnknownModel: ``validate`` is on and an id is not in the registry (nothing is sent).
            ValueError: unknown ``priority``, or an input JSON cannot encode (nothing is sent).
        """
        pairs = list(jobs)
        level = self._level(priority)
        for model_id in {model_id for model_id, _ in pairs}:
            self._checked(model_id, priority)
        built = build_messages(self.app, self.settings.queue, pairs, level)
        push(self.results.client, queue_key(self.settings, level), [message for _, message in built])
        return [Job(self, job_id) for job_id, _ in built]

    def submit_many(
        self, model_id: str, inputs: Iterable[Any], *, priority: str = "bulk", chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> list[Job]:
        """Queue one job per input, sent as chunk messages of ``chunk_size`` inputs (bulk priority by default).

        Returns at once with one Job per input, in order (``gather`` them, or ``get`` each). For inputs too many to
        hold, use ``map``, which keeps a bounded number of chunks in flight.

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            ValueError: unknown ``priority`` or ``chunk_size`` below 1.
        """
        stream = self.stream(model_id, priority)
        jobs: list[Job] = []
        for batch in _batched(inputs, chunk_size):
            chunk_id = stream.send(batch)
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

        Raises:
            SwaplessError: the first failed input's error (InputError, ...), unless ``return_exceptions``.
            JobTimeout: a chunk had no result within ``timeout``.
        """
        stream = self.stream(model_id, priority, max_in_flight=max_in_flight, timeout_s=timeout, on_event=on_event)
        for _, outcomes in stream.run((None, batch) for batch in _batched(inputs, chunk_size)):
            for ok, value in outcomes:
                if ok or return_exceptions:
                    yield value
                else:
                    raise value

    def stream(self, model_id: str, priority: str = "bulk", **options: Any) -> ChunkStream:
        """A ``ChunkStream`` for ``model_id`` (what ``map`` and bulk jobs run on); ``options`` are its own.

        Raises:
            UnknownModel: ``validate`` is on and the id is not in the registry.
            ValueError: unknown ``priority``.
        """
        level = self._checked(model_id, priority)
        return ChunkStream(self, model_id, priority=level, **options)

    def fetch(self, job_ids: Sequence[str]) -> list[StoredResult]:
        """The stored states of many jobs now (batched MGETs; items of one chunk share one read)."""
        storage_ids = list(dict.fromkeys(_storage_id(job_id) for job_id in job_ids))
        stored: dict[str, StoredResult] = {}
        for start in range(0, len(storage_ids), 1000):
            for found in self.results.fetch(storage_ids[start : start + 1000]):
                stored[found.job_id] = found
        return [_item_result(job_id, stored[_storage_id(job_id)]) for job_id in job_ids]

    def job(self, job_id: str) -> Job:
        """A handle on a job submitted earlier, by id."""
        return Job(self, job_id)

    def gather(self, jobs: Sequence[Job], timeout: float | None = 300.0) -> list[StoredResult]:
        """Wait for many jobs at once, reading results in batched MGETs; returns their final states in order.

        Raises:
            JobTimeout: some job has no result within ``timeout`` (names the first such job).
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
        return [found[job.id] for job in jobs]

    def close(self) -> None:
        """Release the connections (the app's pools)."""
        self.app.close()
