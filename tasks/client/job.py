"""``Job``: a handle on one submitted job, by id: its state, its result (waited for through its client's result
consumer, ``swapless.tasks.client.consumer``), its cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from swapless.config.errors import JobTimeout
from swapless.config.settings import Settings
from swapless.tasks.broker.connection import translated
from swapless.tasks.broker.results import StoredResult
from swapless.tasks.client.reading import raise_for
from swapless.tasks.protocol import split_item_id

__all__ = ["Job", "JobSource"]


class JobSource(Protocol):
    """What a ``Job`` asks of the client that made it (``swapless.tasks.client.Client`` is one)."""

    settings: Settings
    forget: bool

    @property
    def consumer(self) -> Any: ...

    @property
    def results(self) -> Any: ...

    def fetch(self, job_ids: Sequence[str]) -> list[StoredResult]: ...

    def cancel(self, job_ids: Sequence[str]) -> dict[str, str]: ...


class Job:
    """A handle on one submitted job. Cheap to create: ``Client().job(job_id)`` works for any id.

    Jobs of ``submit_many`` are items of chunk messages; their ids are ``"<chunk id>:<index>"`` and they read their
    own item of the chunk's stored result.
    """

    def __init__(self, client: JobSource, job_id: str) -> None:
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

        Wakes on the result backend's publish (no polling stall), with a slow poll as a safety net: the wait goes
        through the client's one result consumer, whose one pub/sub connection serves all of the client's waits.

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
        with translated(client.settings.redis.broker_url):
            stored = client.consumer.wait(self.id, timeout)
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
