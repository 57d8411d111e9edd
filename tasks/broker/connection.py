"""Reaching Redis: URLs as redis-py reads them, clients with bounded timeouts, and one translation of Redis
failures into the errors a producer sees (``QueueUnavailable``, ``QueueFull``). A ``sentinel://`` URL names Redis
Sentinels (``swapless.tasks.broker.sentinel``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio as aredis
from kombu.exceptions import OperationalError
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from swapless.config.errors import QueueFull, QueueUnavailable, SwaplessError
from swapless.config.settings import RedisSettings
from swapless.tasks.broker.urls import redact

if TYPE_CHECKING:
    from swapless.tasks.broker.sentinel import SentinelOptions

__all__ = [
    "WRITE_FIRST_NOTE",
    "RedisHealth",
    "ReplicaWait",
    "ReplicasBehind",
    "aping",
    "async_redis_client",
    "client_url",
    "is_refused_write",
    "redact",
    "redis_client",
    "refusal",
    "translate",
    "translated",
]

logger = logging.getLogger(__name__)

#: Why the worker's Lua scripts begin with a write that takes no memory (a DEL, an EXPIRE, a ZREMRANGEBYSCORE of
#: nothing). Over ``maxmemory`` (with ``noeviction``, the right policy for a queue) Redis refuses a script whose
#: first write could grow memory, but lets a script that has already written go on, to keep scripts atomic. The
#: worker's writes pay for themselves: a result replaces its message (acked right after), an attempt counter is
#: deleted with its job's result, a heartbeat replaces the last one. So each script starts with such a write, and a
#: full Redis is drained by the workers instead of wedging them; producers' writes (new jobs) are refused there.
WRITE_FIRST_NOTE = "see tasks.broker.connection.WRITE_FIRST_NOTE"


def client_url(url: str) -> str:
    """``url`` as redis-py reads it: kombu's ``redis+socket://PATH`` (local mode's embedded Redis) is ``unix://PATH``."""
    if url.startswith("redis+socket://"):
        return "unix://" + url[len("redis+socket://") :]
    return url


def _options(connect_timeout_s: float, socket_timeout_s: float | None) -> dict[str, Any]:
    return {
        "socket_connect_timeout": connect_timeout_s,
        "socket_timeout": socket_timeout_s,
        # one retry: a Redis restart is ridden out, a Redis that is down is reported within seconds
        "retry": Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=1),
    }


_pools: dict[tuple[str, float, float | None, SentinelOptions | None], redis.ConnectionPool] = {}
_pools_lock = threading.Lock()


def redis_client(
    url: str, connect_timeout_s: float = 3.0, socket_timeout_s: float | None = 10.0, *,
    sentinel: SentinelOptions | None = None,
) -> redis.Redis:
    """A redis-py client for a broker URL, with bounded timeouts and one pool per URL for the process.

    Raises:
        ConfigError: a sentinel URL without ``sentinel`` options, or an unreadable one.
    """
    from swapless.tasks.broker.sentinel import (
        SentinelURL,
        WatchedSentinel,
        is_sentinel_url,
        master_kwargs,
        need_sentinel,
    )

    key = (url, connect_timeout_s, socket_timeout_s, sentinel if is_sentinel_url(url) else None)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            options = _options(connect_timeout_s, socket_timeout_s)
            if is_sentinel_url(url):
                need = need_sentinel(url, sentinel)
                parsed = SentinelURL.parse(url)
                manager = WatchedSentinel(list(parsed.sentinels),
                                          sentinel_kwargs=need.sentinel_kwargs(connect_timeout_s, socket_timeout_s),
                                          **options, **master_kwargs(parsed, need))
                pool = manager.master_for(need.master).connection_pool
            else:
                pool = redis.ConnectionPool.from_url(client_url(url), **options)
            _pools[key] = pool
    return redis.Redis(connection_pool=pool)


#: Connections an asyncio client may open: every request the gateway is serving may hold one for its reads and
#: writes (its waits all share one pub/sub connection), so redis-py's default of 100 would turn the 101st request in
#: flight into an error.
ASYNC_MAX_CONNECTIONS = 2000


def async_redis_client(
    url: str, connect_timeout_s: float = 3.0, socket_timeout_s: float | None = 10.0, *,
    sentinel: SentinelOptions | None = None,
) -> aredis.Redis:
    """``redis_client`` for asyncio code (``ASYNC_MAX_CONNECTIONS`` connections at most).

    Raises:
        ConfigError: as ``redis_client``.
    """
    from redis.asyncio.retry import Retry as AsyncRetry

    from swapless.tasks.broker.sentinel import (
        SentinelURL,
        WatchedAsyncSentinel,
        is_sentinel_url,
        master_kwargs,
        need_sentinel,
    )

    options = _options(connect_timeout_s, socket_timeout_s)
    options["retry"] = AsyncRetry(ExponentialBackoff(cap=0.5, base=0.05), retries=1)
    if is_sentinel_url(url):
        need = need_sentinel(url, sentinel)
        parsed = SentinelURL.parse(url)
        manager = WatchedAsyncSentinel(list(parsed.sentinels),
                                       sentinel_kwargs=need.sentinel_kwargs(connect_timeout_s, socket_timeout_s),
                                       **options, **master_kwargs(parsed, need))
        return manager.master_for(need.master, max_connections=ASYNC_MAX_CONNECTIONS)
    return aredis.Redis.from_url(client_url(url), max_connections=ASYNC_MAX_CONNECTIONS, **options)


async def aping(client: aredis.Redis, timeout_s: float) -> None:
    """PING through an asyncio client within ``timeout_s`` (redis-py types its commands as maybe-awaitable).

    Raises:
        TimeoutError, redis.RedisError: Redis did not answer.
    """
    reply: Awaitable[Any] = client.ping()  # type: ignore[assignment]
    await asyncio.wait_for(reply, timeout=timeout_s)


def refusal(err: BaseException) -> str | None:
    """Why Redis refused a write (``OOM``, ``READONLY``, ``MISCONF``); None if ``err`` is no refusal."""
    if isinstance(err, redis.exceptions.OutOfMemoryError):
        return "OOM"
    if isinstance(err, redis.exceptions.ReadOnlyError):
        return "READONLY"
    if isinstance(err, redis.exceptions.ResponseError):
        text = str(err)
        if text.startswith("UNBLOCKED"):  # a blocking wait cut short: this Redis just turned replica (a failover)
            return "READONLY"
        for code in ("OOM", "READONLY", "MISCONF"):
            if text.startswith(code) or f" {code} " in text or f"-{code} " in text:
                return code
    return None


def is_refused_write(err: BaseException) -> bool:
    """Whether ``err`` is Redis refusing a write."""
    return refusal(err) is not None


class RedisHealth:
    """What one process has lately seen of Redis: refused writes or no connection, since when. Thread-safe."""

    def __init__(self, stale_s: float = 10.0) -> None:
        self.stale_s = stale_s
        self._lock = threading.Lock()
        self._problem: str | None = None
        self._since = 0.0
        self._last = 0.0

    def failed(self, err: BaseException, where: str) -> str:
        """Record a failure of a Redis call; returns the problem's short name."""
        problem = refusal(err) or ("unreachable" if isinstance(err, (redis.exceptions.ConnectionError,
                                                                     redis.exceptions.TimeoutError)) else "error")
        now = time.time()
        with self._lock:
            first = self._problem != problem or now - self._last > self.stale_s
            if first:
                self._problem, self._since = problem, now
            self._last = now
        if first:
            what = f"refusing writes: {problem}" if problem not in ("unreachable", "error") else problem
            logger.warning("Redis %s (%s: %s); the worker keeps its jobs and retries", what, where, err)
        return problem

    def ok(self) -> None:
        """A write went through: whatever was wrong is over."""
        with self._lock:
            problem, self._problem = self._problem, None
            since = self._since
        if problem is not None:
            logger.warning("Redis accepts writes again after %.1f s (%s)", time.time() - since, problem)

    def problem(self) -> tuple[str, float] | None:
        """``(problem, since)`` while one lasts (epoch seconds), else None."""
        with self._lock:
            if self._problem is None or time.time() - self._last > self.stale_s:
                return None
            return self._problem, self._since

    def describe(self) -> str | None:
        """``"Redis refusing writes: OOM"``, ``"Redis unreachable"``, or None when all is well."""
        found = self.problem()
        if found is None:
            return None
        problem = found[0]
        return f"Redis refusing writes: {problem}" if problem in ("OOM", "READONLY", "MISCONF") else f"Redis {problem}"


class ReplicasBehind(redis.exceptions.RedisError):
    """Fewer replicas than ``SWAPLESS_REDIS_MIN_REPLICAS`` confirmed a write in time: the primary alone holds it."""

    def __init__(self, confirmed: int, wanted: int, timeout_s: float) -> None:
        super().__init__(confirmed, wanted, timeout_s)
        self.confirmed, self.wanted, self.timeout_s = confirmed, wanted, timeout_s

    def __str__(self) -> str:
        return (f"only {self.confirmed} of the {self.wanted} replica(s) SWAPLESS_REDIS_MIN_REPLICAS asks for "
                f"confirmed the write within {self.timeout_s:g} s (SWAPLESS_REDIS_REPLICA_TIMEOUT_S)")


@dataclass(frozen=True)
class ReplicaWait:
    """How many replicas must hold a write, and how long a ``WAIT`` waits for them."""

    count: int
    timeout_s: float

    @classmethod
    def of(cls, settings: RedisSettings) -> ReplicaWait | None:
        """The wait ``settings`` ask for; None: none (``SWAPLESS_REDIS_MIN_REPLICAS`` is 0)."""
        if settings.redis_min_replicas <= 0:
            return None
        return cls(settings.redis_min_replicas, settings.redis_replica_timeout_s)

    def command(self) -> tuple[str, int, int]:
        """The ``WAIT`` to send after the write."""
        return "WAIT", self.count, max(1, round(self.timeout_s * 1000))

    def check(self, reply: Any) -> None:
        """Raise unless ``reply``, the ``WAIT``'s, counts enough replicas.

        Raises:
            ReplicasBehind: too few replicas confirmed the write.
        """
        confirmed = int(reply)
        if confirmed < self.count:
            raise ReplicasBehind(confirmed, self.count, self.timeout_s)


_ADVICE = {
    "OOM": "Redis is out of memory (maxmemory); wait for workers to drain the queue, read (or forget) stored "
    "results, or raise maxmemory, then send it again",
    "READONLY": "this Redis is a read-only replica; point SWAPLESS_REDIS_URL at the primary",
    "MISCONF": "Redis cannot save its data to disk and refuses writes; fix its disk or its save settings",
}


def translate(err: BaseException, url: str) -> BaseException:
    """The error a producer should see for a Redis failure ``err`` on ``url``; other errors as they are."""
    if isinstance(err, SwaplessError):
        return err
    code = refusal(err)
    where = redact(url)
    if code == "OOM":
        return QueueFull(where, _ADVICE[code])
    if code is not None:
        return QueueUnavailable(where, _ADVICE[code])
    if isinstance(err, ReplicasBehind):
        return QueueUnavailable(where, f"{err}; the job is on the primary only and may still run: send it again "
                                "(or check the replicas, or lower SWAPLESS_REDIS_MIN_REPLICAS)")
    if isinstance(err, redis.exceptions.AuthenticationError | redis.exceptions.NoPermissionError):
        return QueueUnavailable(where, f"{err}; check the user and password in SWAPLESS_REDIS_URL")
    if isinstance(err, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OperationalError, OSError)):
        detail = str(err).splitlines()[0].rstrip(".") if str(err) else type(err).__name__
        return QueueUnavailable(
            where,
            f"{detail}; is Redis running there? Check SWAPLESS_REDIS_URL (connect timeout: SWAPLESS_CONNECT_TIMEOUT_S)",
        )
    return err


@contextlib.contextmanager
def translated(url: str) -> Iterator[None]:
    """Raise ``translate``'s error for any Redis failure inside the block."""
    try:
        yield
    except (redis.exceptions.RedisError, OperationalError, OSError) as err:
        better = translate(err, url)
        if better is err:
            raise
        raise better from None
