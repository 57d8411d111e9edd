"""The gateway's data plane: what every protocol's routes do with jobs, each check made once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aredis

from swapless.config.errors import InputError, JobCancelled
from swapless.config.settings import InputSettings, Settings
from swapless.manager.frameworks.inputs import base64_image, image_header, text_input
from swapless.manager.registry.specs import InputType, ModelSpec
from swapless.manager.registry.store import ModelStore
from swapless.tasks.broker.connection import async_redis_client
from swapless.tasks.broker.results import StoredResult
from swapless.tasks.broker.sentinel import SentinelOptions
from swapless.tasks.client import Client, Routed
from swapless.tasks.client.aconsumer import AsyncResultConsumer
from swapless.tasks.gateway.auth import Caller
from swapless.tasks.gateway.errors import ModelForbidden, ResultExpired, UnknownJob
from swapless.tasks.gateway.ledger import JobLedger
from swapless.tasks.gateway.quotas import OverLimit, RateLimit, WaitSlots
from swapless.tasks.gateway.turns import give_back
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import CALLBACK_OWNER_HEADER, CALLBACK_URL_HEADER
from swapless.tasks.webhooks import allowed_hosts, check_target

__all__ = ["Ask", "DataPlane", "check_input"]

#: Inputs of more characters than this are routed and checked in a worker thread, off the event loop.
_OFF_LOOP_CHARS = 64 * 1024


@dataclass(frozen=True)
class Ask:
    """One job as a caller asks for it: the model (id, alias or route), the input, and a sticky routing key."""

    model_id: str
    value: Any
    key: str | None = None


def check_input(spec: ModelSpec, value: Any, settings: InputSettings) -> None:
    """Refuse an input the worker serving ``spec`` would fail (type, size, pixels; never a file path).

    Raises:
        InputError: the input does not fit; the message names the limit and its setting.
    """
    if spec.type is InputType.TEXT:
        text_input(spec.id, value, settings.max_text_chars)
        return
    data = base64_image(spec.id, value, settings.max_image_bytes)
    if data is None:
        raise InputError(spec.id, "the image is not valid base64: send the image's bytes in base64 (the gateway reads "
                         "no file paths)")
    image_header(spec.id, data, settings.max_image_pixels)


class DataPlane:
    """Jobs through the gateway; ``start`` and ``stop`` bracket its Redis connections (the app's lifespan).

    Args:
        settings: the gateway's settings.
        store: the models file.
        client: the producer it publishes with.
    """

    def __init__(self, settings: Settings, store: ModelStore, client: Client) -> None:
        self.settings = settings
        self.keyspace = Keyspace.of(settings)
        self.store = store
        self.client = client
        self.waits = WaitSlots(settings.gateway.gateway_max_waits)
        self._redis: aredis.Redis | None = None
        self._ledger: JobLedger | None = None
        self._rate: RateLimit | None = None
        self._consumer: AsyncResultConsumer | None = None

    async def start(self) -> None:
        s = self.settings
        self._redis = async_redis_client(s.redis.broker_url, connect_timeout_s=s.redis.connect_timeout_s,
                                         sentinel=SentinelOptions.of(s))
        self._ledger = JobLedger(self._redis, self.client.results, self.keyspace, s.gateway.gateway_inflight_per_key)
        self._rate = RateLimit(self._redis, s.gateway.gateway_rate_per_key, self.keyspace)
        self._consumer = AsyncResultConsumer(self._redis, self.client.results, failover_s=s.redis.failover_wait_s)

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.aclose()
        if self._redis is not None:
            await self._redis.aclose()
        self._redis = self._ledger = self._rate = self._consumer = None
        self.client.close()

    @property
    def redis(self) -> aredis.Redis:
        """The asyncio Redis client (while the app runs)."""
        if self._redis is None:
            raise RuntimeError("the gateway's Redis client exists only while the app runs (lifespan)")
        return self._redis

    @property
    def consumer(self) -> AsyncResultConsumer:
        """What every wait goes through (while the app runs)."""
        if self._consumer is None:
            raise RuntimeError("the gateway's result consumer exists only while the app runs (lifespan)")
        return self._consumer

    @property
    def ledger(self) -> JobLedger:
        if self._ledger is None:
            raise RuntimeError("the gateway's ledger exists only while the app runs (lifespan)")
        return self._ledger

    # -- submitting ---------------------------------------------------------------------------------------------

    def allow(self, caller: Caller, model_id: str) -> None:
        """Raises ModelForbidden when ``caller`` may not call ``model_id``."""
        if not caller.may_call(self.store, model_id):
            raise ModelForbidden(caller.refusal(model_id))

    def _route(self, asks: Sequence[Ask], label: Callable[[int], str] | None) -> list[Routed]:
        routed = self.client.route_jobs([(a.model_id, a.value) for a in asks], [a.key for a in asks], paths=False)
        for index, job in enumerate(routed):
            try:
                if self.store.is_route(job.model_id):  # the route could not place this input: say why
                    self.store.route(job.model_id, job.value, job.job_id, paths=False)
                check_input(self.store.get(job.model_id), job.value, self.settings.inputs)
            except InputError as err:
                if label is None:
                    raise
                raise InputError(err.model_id, f"{label(index)}: {err.problem}") from None
        return routed

    async def submit(
        self, caller: Caller, asks: Sequence[Ask], *, priority: str = "interactive", expires_s: float | None = None,
        label: Callable[[int], str] | None = None, callback_url: str | None = None,
    ) -> list[str]:
        """Queue ``asks`` as ``caller``'s jobs, all or none; returns their ids.

        Args:
            label: how an input's error names it (``input 'TEXT' element 3``).
            callback_url: each job's webhook.

        Raises:
            ModelForbidden, UnknownModel, InputError, WebhookRefused, OverLimit, QueueFull, QueueUnavailable: nothing
                is queued.
        """
        for model_id in dict.fromkeys(a.model_id for a in asks):
            self.allow(caller, model_id)
        headers = None
        if callback_url is not None:
            check_target(callback_url, allowed_hosts(self.settings.webhooks.webhook_allowed_hosts))
            headers = [{CALLBACK_URL_HEADER: callback_url, CALLBACK_OWNER_HEADER: caller.owner} for _ in asks]
        large = len(asks) > 1 or any(isinstance(a.value, str) and len(a.value) > _OFF_LOOP_CHARS for a in asks)
        routed = await asyncio.to_thread(self._route, asks, label) if large else self._route(asks, label)
        if self._rate is None:
            raise RuntimeError("the gateway's limits exist only while the app runs (lifespan)")
        await self._rate.take(caller.owner, len(routed))
        ids = [job.job_id for job in routed]
        hold_s = expires_s if expires_s is not None else float(self.settings.jobs.cancel_hold_s)
        admitted, count = await self.ledger.admit(caller.owner, ids, hold_s)
        if not admitted:
            raise OverLimit("SWAPLESS_GATEWAY_INFLIGHT_PER_KEY", f"this caller has {count} jobs submitted and not yet "
                            f"finished, and {len(ids)} more would pass the limit of {self.ledger.inflight_cap}", 1)
        try:
            if large:  # building many messages is CPU work: off the event loop
                await asyncio.to_thread(self.client.send_routed, routed, priority=priority, expires=expires_s,
                                        headers=headers)
            else:  # one message: on the loop, through its own Redis client (a thread hand-off costs more)
                await self.client.asend_routed(self.redis, routed, priority=priority, expires=expires_s,
                                               headers=headers)
        except BaseException:
            await self.ledger.release(caller.owner, ids)
            raise
        return ids

    # -- reading and cancelling ---------------------------------------------------------------------------------

    async def read(self, caller: Caller, job_id: str) -> StoredResult:
        """The job's stored state now, for its submitter or an operator.

        Raises:
            UnknownJob: no record of it that this caller may read.
            ResultExpired: it finished, and its result has expired.
        """
        record, stored = await self.ledger.read(job_id)
        if record is None:
            if caller.admin and stored.ready:
                return stored
            raise UnknownJob(job_id)
        if record.owner != caller.owner and not caller.admin:
            raise UnknownJob(job_id)
        if not stored.ready and record.done:
            raise ResultExpired(job_id, self.client.results.expires_s)
        return stored

    async def cancel(self, caller: Caller, job_id: str) -> str:
        """Cancel the caller's job if it has not started: ``cancelled``, ``running`` (too late) or ``done``.

        Raises:
            UnknownJob, ResultExpired: as ``read``; nothing is written.
        """
        record, stored = await self.ledger.read(job_id)
        if record is None or (record.owner != caller.owner and not caller.admin):
            raise UnknownJob(job_id)
        if not stored.ready and record.done:
            raise ResultExpired(job_id, self.client.results.expires_s)
        hold_s = await self.ledger.remaining_s(job_id)
        answers = await asyncio.to_thread(self.client.results.cancel, [job_id], JobCancelled, hold_s)
        return answers[job_id]

    # -- waiting ------------------------------------------------------------------------------------------------

    @asynccontextmanager
    async def waiting(self) -> AsyncIterator[None]:
        """A wait slot for the block (``GatewayBusy`` when none is free)."""
        async with self.waits.hold():
            yield

    async def wait(self, job_id: str, timeout_s: float) -> StoredResult:
        """The job's result once ready, or its PENDING state after ``timeout_s``; the caller's turn is given back."""
        give_back()
        return await self.consumer.wait(job_id, timeout_s)

    async def wait_all(self, job_ids: Sequence[str], timeout_s: float) -> tuple[dict[str, StoredResult], list[str]]:
        """The jobs' final states, and the ids still pending after ``timeout_s``; the caller's turn is given back."""
        give_back()
        stored = await self.consumer.wait_all(job_ids, timeout_s)
        return {s.job_id: s for s in stored if s.ready}, [s.job_id for s in stored if not s.ready]
