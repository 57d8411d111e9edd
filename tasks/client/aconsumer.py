"""``AsyncResultConsumer``: ``ResultConsumer`` for asyncio code, every wait of one event loop on one pub/sub
connection (the gateway holds one for the whole process).

    consumer = AsyncResultConsumer(aredis_client, results)
    await consumer.wait(job_id, timeout_s=30)           # POST /predict
    await consumer.wait_all(job_ids, timeout_s=30)      # /v2 infer: every element's job
    await consumer.aclose()                             # the app's shutdown

It works as the thread one does (docs/concepts/client.md); the event loop never waits on Redis, and a read of
many results is decoded in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import redis
import redis.asyncio as aredis
from redis.asyncio.connection import AbstractConnection, ConnectionPool

from swapless.tasks.broker.results import ResultStore, StoredResult
from swapless.tasks.client.consumer import POLL_S, Failover
from swapless.tasks.client.reading import MGET_KEYS
from swapless.tasks.client.subscriptions import Subscriptions, Waiter, batches, parse_reply

__all__ = ["AsyncResultConsumer", "AsyncWatch"]

logger = logging.getLogger(__name__)

#: The pause before reconnecting the pub/sub connection, doubling up to the second value while it fails, seconds.
_PAUSE_S = (0.1, 2.0)
#: Reads of more results than this are decoded in a worker thread, off the event loop.
_OFF_LOOP_RESULTS = 64


class AsyncWatch:
    """A wait registered with an ``AsyncResultConsumer`` (``AsyncResultConsumer.watch``)."""

    def __init__(self, consumer: AsyncResultConsumer, waiter: Waiter, event: asyncio.Event) -> None:
        self._consumer = consumer
        self._waiter = waiter
        self._event = event
        self._failover = Failover(consumer.failover_s)
        self._next_read = 0.0

    async def wait(self, timeout_s: float) -> list[StoredResult]:
        """Wait until every job has a final state, or ``timeout_s`` seconds.

        Returns:
            each job's state, in the order watched: final, or its state at the last read (PENDING).

        Raises:
            redis.RedisError: a read failed (Redis cannot be reached).
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        waiter = self._waiter
        if not waiter.started:  # the first read: at once, its keys' SUBSCRIBE sent
            waiter.started = True
            self._collect()
            await self._read()
        while not waiter.done:
            now = time.monotonic()
            if now >= deadline:
                break
            until = min(self._next_read, deadline)
            await self._sleep(until - now)
            reread = self._collect()
            if not waiter.done and (reread or time.monotonic() >= until):
                await self._read()  # the subscriptions confirmed (again), the safety net's turn, or the deadline
        return waiter.states()

    async def _sleep(self, seconds: float) -> None:
        """Until the listener hands something over, or ``seconds``."""
        with suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, seconds)):
                await self._event.wait()
        self._event.clear()

    def _collect(self) -> bool:
        inbox, reread = self._waiter.take()
        self._waiter.apply(inbox)
        return reread

    async def _read(self) -> None:
        pending = self._waiter.pending()
        if pending:
            try:
                self._waiter.apply(await self._consumer.read(pending))
                self._failover.ok()
            except (redis.ConnectionError, redis.TimeoutError) as err:
                self._failover.failed(err)
        self._next_read = time.monotonic() + self._consumer.poll_s


class AsyncResultConsumer:
    """The waits of one event loop on one pub/sub connection. Use it from one loop.

    Args:
        redis_client: the asyncio client whose pool lends the connection, and that reads results.
        results: where results are stored and how they are decoded.
        poll_s: longest time a wait goes without reading its results.
        failover_s: how long a wait rides out reads that cannot reach Redis (0: not at all).
    """

    def __init__(
        self, redis_client: aredis.Redis, results: ResultStore, *, poll_s: float = POLL_S, failover_s: float = 0.0
    ) -> None:
        self.redis = redis_client
        self.results = results
        self.poll_s = poll_s
        self.failover_s = failover_s
        self._table = Subscriptions()
        self._wanted = asyncio.Event()  # set while some key is wanted: the listener connects
        self._conn: AbstractConnection | None = None
        self._broken = False  # a command failed on the connection: the listener replaces it
        self._listener: asyncio.Task[None] | None = None

    @asynccontextmanager
    async def watch(self, job_ids: Sequence[str]) -> AsyncIterator[AsyncWatch]:
        """Register a wait for ``job_ids`` for the block (their keys subscribed until it ends)."""
        event = asyncio.Event()
        waiter = Waiter(self.results, job_ids, event.set)
        new = self._table.add(waiter)
        if new:
            self._wanted.set()
        if waiter.channels and (self._listener is None or self._listener.done()):
            self._listener = asyncio.create_task(self._listen(), name="swapless-results")
        elif new:
            await self._send("SUBSCRIBE", new)
        try:
            yield AsyncWatch(self, waiter, event)
        finally:
            gone = self._table.remove(waiter)
            if not len(self._table):
                self._wanted.clear()
            await self._send("UNSUBSCRIBE", gone)

    async def wait(self, job_id: str, timeout_s: float) -> StoredResult:
        """``job_id``'s final state, or its state (PENDING) once ``timeout_s`` has passed.

        Raises:
            redis.RedisError: a read failed (Redis cannot be reached).
        """
        async with self.watch([job_id]) as watch:
            return (await watch.wait(timeout_s))[0]

    async def wait_all(self, job_ids: Sequence[str], timeout_s: float) -> list[StoredResult]:
        """Every job's final state, in order, or (once ``timeout_s`` has passed) its state then.

        Raises:
            redis.RedisError: a read failed (Redis cannot be reached).
        """
        async with self.watch(job_ids) as watch:
            return await watch.wait(timeout_s)

    async def read(self, storage_ids: Sequence[str]) -> dict[str, StoredResult]:
        """What is stored under each storage id now, in batched MGETs (decoded off the loop when many)."""
        raw: list[Any] = []
        for start in range(0, len(storage_ids), MGET_KEYS):
            keys = [self.results.key(under) for under in storage_ids[start : start + MGET_KEYS]]
            raw.extend(await self.redis.mget(keys))

        def decode() -> dict[str, StoredResult]:
            return {under: self.results.decode(under, value) for under, value in zip(storage_ids, raw, strict=True)}

        return await asyncio.to_thread(decode) if len(raw) > _OFF_LOOP_RESULTS else decode()

    async def aclose(self) -> None:
        """Stop the listener and give its connection back to the pool. Waits still running read on their poll."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with suppress(asyncio.CancelledError):
                await listener

    # -- the listener ---------------------------------------------------------------------------------------------

    async def _send(self, command: str, channels: Sequence[str]) -> None:
        conn = self._conn
        if conn is None or self._broken or not channels:
            return
        try:
            for batch in batches(channels):
                if command == "SUBSCRIBE":
                    self._table.sent(batch)  # before the await: the confirmation may come while it runs
                await conn.send_command(command, *batch, check_health=False)
        except Exception as err:  # noqa: BLE001 - the listener replaces the connection and subscribes again
            logger.debug("%s failed on the results' pub/sub connection: %s", command, err)
            self._broken = True

    async def _listen(self) -> None:
        pool: ConnectionPool = self.redis.connection_pool
        conn: AbstractConnection | None = None
        pause_s, dropped = _PAUSE_S[0], False
        try:
            while True:
                if conn is None:
                    await self._wanted.wait()
                    conn = await self._connect(pool, dropped)
                    if conn is None:
                        await asyncio.sleep(pause_s)  # Redis down: try again, backing off
                        pause_s = min(2 * pause_s, _PAUSE_S[1])
                        continue
                    pause_s, dropped = _PAUSE_S[0], False
                try:
                    reply = await conn.read_response(timeout=self.poll_s, disconnect_on_error=False)
                    if self._broken:
                        raise ConnectionError("a command on the pub/sub connection failed")
                except Exception as err:  # noqa: BLE001 - dropped: reconnect
                    logger.info("lost the pub/sub connection for results (%s); reconnecting", err)
                    await self._drop(pool, conn)
                    conn, dropped = None, True
                    continue
                if reply is not None:
                    self._dispatch(reply)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not pass unseen: the waits are left with their poll
            logger.exception("the results' listener stopped; waits fall back on their poll")
        finally:
            if conn is not None:
                await self._drop(pool, conn)

    async def _connect(self, pool: ConnectionPool, dropped: bool) -> AbstractConnection | None:
        try:
            conn: AbstractConnection = await pool.get_connection()
        except Exception as err:  # noqa: BLE001 - the listener tries again
            logger.debug("cannot open the pub/sub connection for results (%s); retrying", err)
            return None
        self._conn, self._broken = conn, False
        await self._send("SUBSCRIBE", self._table.channels())
        if dropped:
            logger.info("pub/sub connection for results back: %d key(s) subscribed again", len(self._table))
        return conn

    async def _drop(self, pool: ConnectionPool, conn: AbstractConnection) -> None:
        if self._conn is conn:
            self._conn = None
            self._table.lost()
        with suppress(Exception):
            await conn.disconnect()
        await pool.release(conn)

    def _dispatch(self, reply: Any) -> None:
        """A subscription confirmed, or a result published: hand it to the waits of its key."""
        parsed = parse_reply(reply)
        if parsed is None:
            return
        kind, channel, payload = parsed
        if kind == "subscribe":
            self._table.confirm(channel)
            return
        found = self._table.published(channel)
        if found is None:
            return
        under, waiters = found
        try:
            stored: StoredResult | None = self.results.decode(under, payload)
        except Exception:  # not a result we can read: the waits read it themselves
            logger.warning("could not decode the result published for %s; reading it instead", under, exc_info=True)
            stored = None
        for waiter in waiters:
            waiter.deliver(under, stored)

