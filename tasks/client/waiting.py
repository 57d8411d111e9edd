"""Waiting for results in asyncio code (the gateway's): the wait wakes on the result backend's publish.

A wait subscribes to the result's key before it first reads it, so a result stored in between is never missed,
and sleeps on the subscription (at most ``POLL_S`` between reads, a safety net) instead of polling. Waits reuse
their Redis client's idle pub/sub connections.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import redis.asyncio as aredis

from tasks.broker.results import ResultStore, StoredResult
from tasks.client.consumer import POLL_S
from tasks.client.reading import item_result
from tasks.protocol import storage_id

__all__ = ["aread_result", "await_result"]

#: Idle pub/sub connections kept per client; a wait finding none opens one.
_KEEP = 8


def _published(results: ResultStore, job_id: str, channel: str, message: Any) -> StoredResult | None:
    """``job_id``'s state from a pub/sub message of its result's channel (the stored value itself); None for
    anything else (no message, a subscription notice, another channel's message)."""
    if message is None or message.get("type") != "message" or _text(message.get("channel")) != channel:
        return None
    return item_result(job_id, results.decode(storage_id(job_id), message["data"]))


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


async def aread_result(client: aredis.Redis, results: ResultStore, job_id: str) -> StoredResult:
    """A job's stored state now, for asyncio code."""
    stored_under = storage_id(job_id)
    return item_result(job_id, results.decode(stored_under, await client.get(results.key(stored_under))))


_idle_async: weakref.WeakKeyDictionary[aredis.Redis, list[aredis.client.PubSub]] = weakref.WeakKeyDictionary()


async def await_result(client: aredis.Redis, results: ResultStore, job_id: str, timeout_s: float) -> StoredResult:
    """``job_id``'s final state, or its state now (PENDING) once ``timeout_s`` has passed: the event loop never
    waits on Redis (idle pub/sub connections are reused, and a publish's payload is decoded as it comes)."""
    deadline = time.monotonic() + timeout_s
    channel = results.key(storage_id(job_id))
    idle = _idle_async.setdefault(client, [])
    pubsub = idle.pop() if idle else client.pubsub(ignore_subscribe_messages=True)
    reusable = False
    try:
        await pubsub.subscribe(channel)
        stored = await aread_result(client, results, job_id)
        while True:
            remaining = deadline - time.monotonic()
            if stored.ready or remaining <= 0:
                await pubsub.unsubscribe(channel)
                reusable = True
                return stored
            message = await pubsub.get_message(timeout=min(POLL_S, remaining))
            stored = _published(results, job_id, channel, message) or await aread_result(client, results, job_id)
    finally:
        if reusable and len(idle) < _KEEP:
            idle.append(pubsub)
        else:
            await pubsub.aclose()
