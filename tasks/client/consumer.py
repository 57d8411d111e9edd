"""``ResultConsumer``: every wait of one ``Client`` on one pub/sub connection, for code that waits in threads
(as Celery's ``ResultConsumer`` in ``celery/backends/asynchronous.py``).

    consumer = ResultConsumer(client.redis, client.results)
    consumer.wait(job_id, timeout_s=30)                 # Job.get: the final state, or PENDING after the timeout
    consumer.wait_all(job_ids, timeout_s=300)           # Client.gather: every job's, in order
    with consumer.watch([chunk_id]) as watch:           # ChunkStream: one wait, in slices
        watch.wait(0.5)

How a wait never misses a result, reconnects and rides out a failover: docs/concepts/client.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis
from redis.connection import Connection, ConnectionPool

from swapless.tasks.broker.results import ResultStore, StoredResult
from swapless.tasks.client.reading import read_stored
from swapless.tasks.client.subscriptions import Subscriptions, Waiter, batches, parse_reply

__all__ = ["POLL_S", "Failover", "ResultConsumer", "Watch"]

logger = logging.getLogger(__name__)

#: Longest time a wait goes without reading its results (the safety net under the publishes), in seconds.
POLL_S = 0.5
#: The pause before reconnecting the pub/sub connection, doubling up to the second value while it fails, seconds.
_PAUSE_S = (0.1, 2.0)
#: How long ``close`` waits for the listener to let its connection go, seconds.
_CLOSE_WAIT_S = 2.0


class Watch:
    """A wait registered with a ``ResultConsumer`` (``ResultConsumer.watch``); ``wait`` on it as often as needed."""

    def __init__(
        self, waiter: Waiter, event: threading.Event, lock: threading.RLock, results: ResultStore, poll_s: float,
        failover_s: float = 0.0,
    ) -> None:
        self._waiter = waiter
        self._event = event
        self._lock = lock
        self._results = results
        self._poll_s = poll_s
        self._failover = Failover(failover_s)
        self._next_read = 0.0

    def wait(self, timeout_s: float | None) -> list[StoredResult]:
        """Wait until every job has a final state, or ``timeout_s`` seconds (None: no limit).

        Returns:
            each job's state, in the order watched: final, or its state at the last read (PENDING).

        Raises:
            redis.RedisError: a read failed (Redis cannot be reached).
        """
        deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
        if not self._waiter.started:  # the first read: at once, its keys' SUBSCRIBE sent (see the module docstring)
            with self._lock:
                self._waiter.started = True
            self._collect()
            self._read()
        while not self._waiter.done:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            until = self._next_read if deadline is None else min(self._next_read, deadline)
            self._event.wait(max(0.0, until - now))
            self._event.clear()
            reread = self._collect()
            if not self._waiter.done and (reread or time.monotonic() >= until):
                self._read()  # the subscriptions confirmed (again), the safety net's turn, or the deadline
        return self._waiter.states()

    def _collect(self) -> bool:
        """Take what the listener handed over; returns whether it asked for a read."""
        with self._lock:
            inbox, reread = self._waiter.take()
        self._waiter.apply(inbox)
        return reread

    def _read(self) -> None:
        pending = self._waiter.pending()
        if pending:
            try:
                self._waiter.apply(read_stored(self._results, pending))
                self._failover.ok()
            except (redis.ConnectionError, redis.TimeoutError) as err:
                self._failover.failed(err)
        self._next_read = time.monotonic() + self._poll_s


class Failover:
    """How long a wait's reads have failed to reach Redis, against how long it rides that out (``failover_s``)."""

    def __init__(self, failover_s: float) -> None:
        self.failover_s = failover_s
        self._since: float | None = None

    def ok(self) -> None:
        self._since = None

    def failed(self, err: BaseException) -> None:
        """A read failed: raise ``err`` once reads have failed for ``failover_s``, else let the wait read again."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if now - self._since >= self.failover_s:
            raise err
        logger.debug("a wait's read failed (%s); reading again (a failover takes seconds)", err)


class ResultConsumer:
    """The waits of one client on one pub/sub connection. Thread-safe.

    Args:
        redis_client: the client whose pool lends the connection (``Client.redis``).
        results: where results are stored, read and decoded (``Client.results``).
        poll_s: longest time a wait goes without reading its results.
        failover_s: how long a wait rides out reads that cannot reach Redis (0: not at all).
    """

    def __init__(
        self, redis_client: redis.Redis, results: ResultStore, *, poll_s: float = POLL_S, failover_s: float = 0.0
    ) -> None:
        self.redis = redis_client
        self.results = results
        self.poll_s = poll_s
        self.failover_s = failover_s
        self._lock = threading.RLock()  # reentrant: a client collected while its thread holds it still closes
        self._wanted = threading.Condition(self._lock)  # the listener, with no connection, waits for a key
        self._table = Subscriptions()
        self._conn: Connection | None = None
        self._broken = False  # a command failed on the connection: the listener replaces it
        self._listener: tuple[threading.Thread, threading.Event] | None = None

    @contextmanager
    def watch(self, job_ids: Sequence[str]) -> Iterator[Watch]:
        """Register a wait for ``job_ids`` for the block (their keys subscribed until it ends)."""
        event = threading.Event()
        waiter = Waiter(self.results, job_ids, event.set)
        with self._lock:
            new = self._table.add(waiter)
            if self._listener is None and waiter.channels:
                self._start()  # it subscribes every key once connected
            elif new:
                self._send("SUBSCRIBE", new)
                self._wanted.notify()
        try:
            yield Watch(waiter, event, self._lock, self.results, self.poll_s, self.failover_s)
        finally:
            with self._lock:
                self._send("UNSUBSCRIBE", self._table.remove(waiter))

    def wait(self, job_id: str, timeout_s: float | None) -> StoredResult:
        """``job_id``'s final state, or its state (PENDING) once ``timeout_s`` has passed (None: no limit).

        Raises:
            redis.RedisError: a read failed (Redis cannot be reached).
        """
        with self.watch([job_id]) as watch:
            return watch.wait(timeout_s)[0]

    def wait_all(self, job_ids: Sequence[str], timeout_s: float | None) -> list[StoredResult]:
        """Every job's final state, in order, or (once ``timeout_s`` has passed) its state then.

        Raises:
            redis.RedisError: a read failed (Redis cannot be reached).
        """
        with self.watch(job_ids) as watch:
            return watch.wait(timeout_s)

    def close(self) -> None:
        """Stop the listener and give its connection back to the pool. Waits still running read on their poll."""
        with self._lock:
            listener, self._listener = self._listener, None
            if listener is None:
                return
            listener[1].set()
            self._wanted.notify_all()
            if self._conn is not None:
                self._conn.disconnect()  # wakes the listener from its read; it gives the connection back
                self._conn = None
                self._table.lost()
        if listener[0] is not threading.current_thread():
            listener[0].join(_CLOSE_WAIT_S)

    # -- the listener ---------------------------------------------------------------------------------------------

    def _start(self) -> None:
        stop = threading.Event()
        thread = threading.Thread(target=self._listen, args=(stop,), name="swapless-results", daemon=True)
        self._listener = (thread, stop)
        thread.start()

    def _send(self, command: str, channels: Sequence[str]) -> None:
        """Send ``command`` for ``channels`` on the connection, if there is one (under the lock)."""
        conn = self._conn
        if conn is None or self._broken or not channels:
            return
        try:
            for batch in batches(channels):
                if command == "SUBSCRIBE":
                    self._table.sent(batch)
                conn.send_command(command, *batch, check_health=False)
        except Exception as err:  # noqa: BLE001 - the listener replaces the connection and subscribes again
            logger.debug("%s failed on the results' pub/sub connection: %s", command, err)
            self._broken = True

    def _listen(self, stop: threading.Event) -> None:
        pool: ConnectionPool = self.redis.connection_pool
        conn: Connection | None = None
        pause_s, dropped = _PAUSE_S[0], False
        try:
            while not stop.is_set():
                if conn is None:
                    conn = self._connect(pool, stop, dropped)
                    if conn is None:
                        stop.wait(pause_s)  # Redis down: try again, backing off
                        pause_s = min(2 * pause_s, _PAUSE_S[1])
                        continue
                    pause_s, dropped = _PAUSE_S[0], False
                try:
                    reply = self._next(conn)
                except Exception as err:  # noqa: BLE001 - dropped (or cut by close): reconnect, unless stopping
                    if stop.is_set():
                        break
                    logger.info("lost the pub/sub connection for results (%s); reconnecting", err)
                    self._drop(pool, conn)
                    conn, dropped = None, True
                    continue
                if reply is not None:
                    self._dispatch(reply)
        except Exception:  # a bug here must not pass unseen: the waits are left with their poll
            logger.exception("the results' listener stopped; waits fall back on their poll")
        finally:
            if conn is not None:
                self._drop(pool, conn)

    def _connect(self, pool: ConnectionPool, stop: threading.Event, dropped: bool) -> Connection | None:
        """A new connection with every wanted key subscribed, once some key is wanted; None if Redis refused."""
        with self._wanted:
            while not stop.is_set() and not len(self._table):
                self._wanted.wait()
        if stop.is_set():
            return None
        try:
            conn = pool.get_connection()
        except Exception as err:  # noqa: BLE001 - the listener tries again
            logger.debug("cannot open the pub/sub connection for results (%s); retrying", err)
            return None
        with self._lock:
            closed = stop.is_set()
            if not closed:
                self._conn, self._broken = conn, False
                self._send("SUBSCRIBE", self._table.channels())
        if closed:
            conn.disconnect()
            pool.release(conn)
            return None
        if dropped:
            logger.info("pub/sub connection for results back: %d key(s) subscribed again", len(self._table))
        return conn

    def _drop(self, pool: ConnectionPool, conn: Connection) -> None:
        """Let ``conn`` go: nothing is subscribed on it any more (if it is still the consumer's)."""
        with self._lock:
            if self._conn is conn:
                self._conn = None
                self._table.lost()
        conn.disconnect()
        pool.release(conn)

    def _next(self, conn: Connection) -> Any:
        """The next reply on the connection, or None after ``poll_s`` without one.

        Raises:
            redis.RedisError, OSError: the connection failed (or a command sent on it did).
        """
        ready = conn.can_read(timeout=self.poll_s)
        with self._lock:
            if self._broken:
                raise redis.ConnectionError("a command on the pub/sub connection failed")
        return conn.read_response(disconnect_on_error=False) if ready else None

    def _dispatch(self, reply: Any) -> None:
        """A subscription confirmed, or a result published: hand it to the waits of its key."""
        parsed = parse_reply(reply)
        if parsed is None:
            return
        kind, channel, payload = parsed
        if kind == "subscribe":
            with self._lock:
                self._table.confirm(channel)
            return
        with self._lock:
            found = self._table.published(channel)
        if found is None:
            return
        under = found[0]
        try:
            stored: StoredResult | None = self.results.decode(under, payload)
        except Exception:  # not a result we can read: the waits read it themselves
            logger.warning("could not decode the result published for %s; reading it instead", under, exc_info=True)
            stored = None
        with self._lock:
            found = self._table.published(channel)
            for waiter in found[1] if found is not None else ():
                waiter.deliver(under, stored)
