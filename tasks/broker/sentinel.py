"""Reaching Redis through Redis Sentinel: ``sentinel://`` URLs, the ``SWAPLESS_REDIS_SENTINEL_*`` options, and
Sentinel clients whose pools follow a failover and log where they find the primary (docs/concepts/delivery.md,
"Sentinel and failover").
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio
import redis.asyncio.sentinel as asentinel
import redis.exceptions
import redis.sentinel

from swapless.config.errors import ConfigError
from swapless.config.settings import Settings
from swapless.tasks.broker.urls import redact

__all__ = [
    "PRIMARIES", "RECHECK_S", "PrimaryWatch", "SentinelOptions", "SentinelURL", "WatchedAsyncPool",
    "WatchedAsyncSentinel", "WatchedPool", "WatchedSentinel", "is_sentinel_url", "master_kwargs", "need_sentinel",
]

logger = logging.getLogger(__name__)


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names Redis Sentinels (``sentinel://``) rather than a Redis."""
    return url.lower().startswith("sentinel://")


#: The port of a sentinel whose URL names none.
SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    """What a ``sentinel://[user:password@]host[:port][/db];sentinel://...`` URL says, as Celery and kombu read it."""

    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        """Read a sentinel URL.

        Raises:
            ConfigError: a part is not a ``sentinel://host[:port]`` URL, or the database is not a number.
        """
        sentinels: list[tuple[str, int]] = []
        db: int | None = None
        username = password = None
        for part in (p.strip() for p in url.split(";") if p.strip()):
            try:
                parts = urlsplit(part)
                port = parts.port
            except ValueError:
                parts, port = None, None
            if parts is None or parts.scheme.lower() != "sentinel" or not parts.hostname:
                raise ConfigError("SWAPLESS_REDIS_URL", f"{redact(part)!r} is no sentinel://host:port URL; write "
                                  "sentinel://host:26379;sentinel://host2:26379 (Celery's form)")
            sentinels.append((parts.hostname, port or SENTINEL_PORT))
            path = parts.path.strip("/")
            if db is None and path:
                if not path.isdigit():
                    raise ConfigError("SWAPLESS_REDIS_URL", f"database {path!r} of {redact(part)!r} is not a number")
                db = int(path)
            if password is None and username is None and (parts.password is not None or parts.username):
                username, password = parts.username or None, parts.password
        if not sentinels:
            raise ConfigError("SWAPLESS_REDIS_URL", "names no sentinel; write sentinel://host:26379;sentinel://...")
        return cls(tuple(sentinels), db or 0, username, password)


@dataclass(frozen=True)
class SentinelOptions:
    """How to reach the primary through the sentinels: its master name, their credentials and TLS."""

    master: str
    username: str | None = None
    password: str | None = None
    tls: bool = False

    @classmethod
    def of(cls, settings: Settings) -> SentinelOptions | None:
        """The options ``settings`` give, or None without a master name (no sentinels)."""
        if not settings.redis.redis_sentinel_master:
            return None
        secret = settings.redis.redis_sentinel_password
        return cls(settings.redis.redis_sentinel_master, settings.redis.redis_sentinel_username,
                   secret.get_secret_value() if secret is not None else None, settings.redis.redis_sentinel_tls)

    def sentinel_kwargs(self, connect_timeout_s: float, socket_timeout_s: float | None) -> dict[str, Any]:
        """The keyword arguments of every connection to a sentinel."""
        found: dict[str, Any] = {"socket_connect_timeout": connect_timeout_s, "socket_timeout": socket_timeout_s}
        if self.username:
            found["username"] = self.username
        if self.password:
            found["password"] = self.password
        if self.tls:
            found["ssl"] = True
        return found


class PrimaryWatch:
    """The primary each master name was last found at, per process: one log line when it moves. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: dict[str, tuple[str, int]] = {}

    def found(self, master: str, address: tuple[str, int]) -> None:
        """A client found ``master``'s primary at ``address``."""
        address = (str(address[0]), int(address[1]))
        with self._lock:
            before = self._at.get(master)
            self._at[master] = address
        if before is None:
            logger.info("Redis primary %r is at %s:%d (from Redis Sentinel)", master, *address)
        elif before != address:
            logger.warning("Redis primary %r moved from %s:%d to %s:%d (a failover); reconnected there", master,
                           *before, *address)


#: This process's watch (every Sentinel client of the process reports to it).
PRIMARIES = PrimaryWatch()


#: The longest a Sentinel pool hands out connections without asking the sentinels whether they still name the
#: primary its connections reach, in seconds.
RECHECK_S = 1.0


class WatchedPool(redis.sentinel.SentinelConnectionPool):
    """redis-py's Sentinel pool that asks the sentinels again every ``recheck_s`` and drops connections to a primary
    they no longer name. Thread-safe.
    """

    recheck_s = RECHECK_S

    def reset(self) -> None:
        super().reset()  # also a forked child's first call: the lock is new there
        self._asked_at = time.monotonic()
        self._asking = threading.Lock()

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        self.recheck()
        return super().get_connection(*args, **kwargs)

    def recheck(self) -> None:
        """Ask the sentinels for the primary, unless asked within ``recheck_s``; close idle connections if it moved."""
        if self.master_address is None or time.monotonic() - self._asked_at < self.recheck_s:
            return  # no connection made yet (making one asks), or asked lately
        if not self._asking.acquire(blocking=False):
            return
        try:
            self._asked_at = time.monotonic()
            self.get_master_address()  # closes the idle connections when the primary moved
        except redis.exceptions.ConnectionError:
            pass  # no primary named (a failover under way), or no sentinel answers: the connections are left as is
        finally:
            self._asking.release()


class WatchedAsyncPool(asentinel.SentinelConnectionPool):
    """``WatchedPool`` for asyncio clients."""

    recheck_s = RECHECK_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._asked_at = time.monotonic()
        self._asking = False

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        await self.recheck()
        return await super().get_connection(*args, **kwargs)

    async def recheck(self) -> None:
        """``WatchedPool.recheck``."""
        if self.master_address is None or self._asking or time.monotonic() - self._asked_at < self.recheck_s:
            return
        self._asking = True
        try:
            self._asked_at = time.monotonic()
            await self.get_master_address()
        except redis.exceptions.ConnectionError:
            pass
        finally:
            self._asking = False


def _failing_over(state: dict[str, Any]) -> bool:
    """Whether a sentinel's ``SENTINEL MASTERS`` entry is mid-failover (it still names the old primary)."""
    flags = state.get("flags", ())
    if isinstance(flags, str):
        flags = flags.split(",")
    return "failover_in_progress" in flags


class WatchedSentinel(redis.sentinel.Sentinel):
    """redis-py's Sentinel client, reporting each primary it finds; a sentinel mid-failover is skipped."""

    def check_master_state(self, state: dict[str, Any], service_name: str) -> bool:
        return bool(super().check_master_state(state, service_name)) and not _failing_over(state)

    def discover_master(self, service_name: str) -> tuple[str, int]:
        address = super().discover_master(service_name)
        PRIMARIES.found(service_name, address)
        return address  # type: ignore[no-any-return]

    def master_for(self, service_name: str, redis_class: type[Any] = redis.Redis,
                   connection_pool_class: type[Any] = WatchedPool, **kwargs: Any) -> Any:
        return super().master_for(service_name, redis_class, connection_pool_class, **kwargs)


class WatchedAsyncSentinel(asentinel.Sentinel):
    """``WatchedSentinel`` for asyncio clients."""

    def check_master_state(self, state: dict[str, Any], service_name: str) -> bool:
        return bool(super().check_master_state(state, service_name)) and not _failing_over(state)

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        address = await super().discover_master(service_name)
        PRIMARIES.found(service_name, address)
        return address  # type: ignore[no-any-return]

    def master_for(self, service_name: str, redis_class: type[Any] = redis.asyncio.Redis,
                   connection_pool_class: type[Any] = WatchedAsyncPool, **kwargs: Any) -> Any:
        return super().master_for(service_name, redis_class, connection_pool_class, **kwargs)


def need_sentinel(url: str, sentinel: SentinelOptions | None) -> SentinelOptions:
    """``sentinel``, which a sentinel ``url`` needs.

    Raises:
        ConfigError: there are none (no ``SWAPLESS_REDIS_SENTINEL_MASTER``).
    """
    if sentinel is None:
        raise ConfigError("SWAPLESS_REDIS_SENTINEL_MASTER", f"{redact(url)!r} names sentinels: set "
                          "SWAPLESS_REDIS_SENTINEL_MASTER to the name they know the primary by")
    return sentinel


def master_kwargs(url: SentinelURL, sentinel: SentinelOptions) -> dict[str, Any]:
    """The keyword arguments of every connection to the primary: its database, credentials and TLS."""
    found: dict[str, Any] = {"db": url.db}
    if url.username:
        found["username"] = url.username
    if url.password is not None:
        found["password"] = url.password
    if sentinel.tls:
        found["ssl"] = True
    return found
