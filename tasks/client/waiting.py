"""Reading and waiting for results: job ids to the keys they are stored under, chunk items, and the wait that
wakes on the result backend's publish (for threads and for asyncio), shared by ``Job`` and the gateway.

The items of a chunk (ids ``"<chunk id>:<index>"``) have no result of their own: they read their item of the
chunk's stored list. A wait subscribes to the result's key before it first reads it, so a result stored in between
is never missed, and sleeps on the subscription (at most ``POLL_S`` between reads, a safety net) instead of polling.
Waits reuse their Redis client's idle pub/sub connections (``_Subscriptions``).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aredis
from celery import states
from redis.client import PubSub

from config.errors import JobFailed, SwaplessError
from tasks.broker.results import ResultStore, StoredResult
from tasks.protocol import decode_outcome, split_item_id, storage_id

__all__ = ["POLL_S", "aread_result", "await_result", "raise_for", "read_results", "wait_result"]

#: Longest sleep between two reads of a result while waiting on its publish.
POLL_S = 0.5
_MGET_KEYS = 1000


def _item_result(job_id: str, chunk: StoredResult) -> StoredResult:
    """The state of ``job_id`` from what is stored under its storage id (itself, or its chunk)."""
    parts = split_item_id(job_id)
    if parts is None:
        return chunk
    if not chunk.ready:
        return StoredResult(job_id, chunk.state)
    index = parts[1]
    if chunk.state != states.SUCCESS:
        return StoredResult(job_id, chunk.state, chunk.value)  # the whole chunk failed: so did each item
    if not isinstance(chunk.value, list) or index >= len(chunk.value):
        return StoredResult(job_id, states.FAILURE, JobFailed(job_id, "MalformedResult", "no such item in its chunk"))
    ok, value = decode_outcome(chunk.value[index], job_id)
    return StoredResult(job_id, states.SUCCESS if ok else states.FAILURE, value)


def read_results(results: ResultStore, job_ids: Sequence[str]) -> list[StoredResult]:
    """The stored states of many jobs now (batched MGETs; the items of one chunk share one read)."""
    storage_ids = list(dict.fromkeys(storage_id(job_id) for job_id in job_ids))
    stored: dict[str, StoredResult] = {}
    for start in range(0, len(storage_ids), _MGET_KEYS):
        for found in results.fetch(storage_ids[start : start + _MGET_KEYS]):
            stored[found.job_id] = found
    return [_item_result(job_id, stored[storage_id(job_id)]) for job_id in job_ids]


def raise_for(stored: StoredResult) -> Any:
    """A final state's prediction, or its error raised (rebuilt as the worker's own where it can be)."""
    if stored.state == states.SUCCESS:
        return stored.value
    error = stored.value
    if isinstance(error, SwaplessError):
        raise error
    raise JobFailed(stored.job_id, type(error).__name__ if error is not None else stored.state, str(error))


class _Subscriptions:
    """The idle pub/sub connections of one Redis client, kept for the next wait: a wait that opened its own would
    pay a connection's set-up (connect, the client's handshake) on top of its SUBSCRIBE, every time."""

    #: Idle pub/sub connections kept per client; a wait finding none opens one.
    KEEP = 8

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._idle: list[PubSub] = []
        self._lock = threading.Lock()

    def take(self) -> PubSub:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self.client.pubsub(ignore_subscribe_messages=True)

    def give_back(self, pubsub: PubSub, reusable: bool) -> None:
        if reusable:
            with self._lock:
                if len(self._idle) < self.KEEP:
                    self._idle.append(pubsub)
                    return
        pubsub.close()


_subscriptions: weakref.WeakKeyDictionary[redis.Redis, _Subscriptions] = weakref.WeakKeyDictionary()
_subscriptions_lock = threading.Lock()


def _subscriptions_of(client: redis.Redis) -> _Subscriptions:
    with _subscriptions_lock:
        found = _subscriptions.get(client)
        if found is None:
            found = _subscriptions[client] = _Subscriptions(client)
        return found


def wait_result(client: redis.Redis, results: ResultStore, job_id: str, timeout_s: float | None) -> StoredResult:
    """``job_id``'s final state, or its state now (PENDING) once ``timeout_s`` has passed (None: no limit).

    The publish carries the stored value itself: a wait woken by it decodes that, with no second read. Messages of
    other channels (a pub/sub connection reused from an earlier wait may still get one) only wake a read.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    channel = results.key(storage_id(job_id))
    subscriptions = _subscriptions_of(client)
    pubsub = subscriptions.take()
    reusable = False
    try:
        pubsub.subscribe(channel)
        stored = read_results(results, [job_id])[0]
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if stored.ready or (remaining is not None and remaining <= 0):
                pubsub.unsubscribe(channel)
                reusable = True
                return stored
            message = pubsub.get_message(timeout=POLL_S if remaining is None else min(POLL_S, remaining))
            stored = _published(results, job_id, channel, message) or read_results(results, [job_id])[0]
    finally:
        subscriptions.give_back(pubsub, reusable)


def _published(results: ResultStore, job_id: str, channel: str, message: Any) -> StoredResult | None:
    """``job_id``'s state from a pub/sub message of its result's channel (the stored value itself); None for
    anything else (no message, a subscription notice, another channel's message)."""
    if message is None or message.get("type") != "message" or _text(message.get("channel")) != channel:
        return None
    return _item_result(job_id, results.decode(storage_id(job_id), message["data"]))


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


async def aread_result(client: aredis.Redis, results: ResultStore, job_id: str) -> StoredResult:
    """``read_results`` of one job, for asyncio code."""
    stored_under = storage_id(job_id)
    return _item_result(job_id, results.decode(stored_under, await client.get(results.key(stored_under))))


_idle_async: weakref.WeakKeyDictionary[aredis.Redis, list[aredis.client.PubSub]] = weakref.WeakKeyDictionary()


async def await_result(client: aredis.Redis, results: ResultStore, job_id: str, timeout_s: float) -> StoredResult:
    """``wait_result`` for asyncio code: the event loop never waits on Redis (idle pub/sub connections are reused,
    and a publish's payload is decoded as it comes, as there)."""
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
        if reusable and len(idle) < _Subscriptions.KEEP:
            idle.append(pubsub)
        else:
            await pubsub.aclose()
