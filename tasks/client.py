"""The producer client: submit jobs, get their results. Usable from scripts, web apps and asyncio code.

    from tasks.client import Client
    client = Client()                                   # SWAPLESS_REDIS_URL, else redis://127.0.0.1:6379/0
    job = client.submit("sentiment", "What a lovely day")
    job.id                                              # keep it to look the job up later: client.job(job_id)
    job.get(timeout=30)                                 # [{"label": "POSITIVE", "score": 0.99}, ...]
    await job.aget(timeout=30)                          # the same, for asyncio code
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any

from celery import Celery, states

from config.settings import Settings, get_settings
from manager.errors import JobFailed, JobTimeout, SwaplessError
from manager.specs import ModelSpec
from manager.store import ModelStore
from tasks.app import PREDICT_TASK, PRIORITY_BULK, PRIORITY_INTERACTIVE, make_app
from tasks.results import ResultStore, StoredResult

__all__ = ["Client", "Job"]

_PRIORITIES = {"interactive": PRIORITY_INTERACTIVE, "bulk": PRIORITY_BULK}


def _raise_for(stored: StoredResult) -> Any:
    if stored.state == states.SUCCESS:
        return stored.value
    error = stored.value
    if isinstance(error, SwaplessError):
        raise error
    raise JobFailed(stored.job_id, type(error).__name__ if error is not None else stored.state, str(error))


class Job:
    """A handle on one submitted job. Cheap to create: ``Client().job(job_id)`` works for any id."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> StoredResult:
        """The stored state now: PENDING (queued, running, or unknown id), SUCCESS or FAILURE."""
        return self.client.results.fetch([self.id])[0]

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
            pubsub.subscribe(results.key(self.id))
            while True:
                stored = results.fetch([self.id])[0]
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
        if priority not in _PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(_PRIORITIES)}, not {priority!r}")
        if self._validate:
            self.store.get(model_id)
        result = self.app.send_task(
            PREDICT_TASK, args=[model_id, input], queue=self.settings.queue, priority=_PRIORITIES[priority]
        )
        return Job(self, result.id)

    def submit_many(self, model_id: str, inputs: Iterable[Any], *, priority: str = "bulk") -> list[Job]:
        """Queue one job per input (bulk priority by default) over one connection."""
        if self._validate:
            self.store.get(model_id)
        jobs = []
        with self.app.producer_or_acquire() as producer:
            for value in inputs:
                result = self.app.send_task(
                    PREDICT_TASK,
                    args=[model_id, value],
                    queue=self.settings.queue,
                    priority=_PRIORITIES[priority],
                    producer=producer,
                )
                jobs.append(Job(self, result.id))
        return jobs

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
            for start in range(0, len(pending), 1000):
                for stored in self.results.fetch(pending[start : start + 1000]):
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
