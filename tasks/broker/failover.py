"""Celery's result backend and kombu's transport over Redis Sentinel, with the Sentinel client that reports where it
finds the primary.

``SentinelTransport`` is the Swapless transport (``swapless.tasks.broker.transport``) over kombu's Sentinel channel;
kombu finds it by the ``swapless-sentinel://`` scheme of its URLs. Celery's ``SentinelBackend`` asks the sentinels for
the primary at each connection, so a worker's and a producer's result reads and writes reach the new primary after a
failover; this one also logs the move, once per process, with every other client of the process
(``swapless.tasks.broker.sentinel.PrimaryWatch``). ``swapless.tasks.app`` names it as
``swapless.tasks.broker.failover:SentinelBackend+sentinel://...``.
"""

from __future__ import annotations

import time
from typing import Any

import redis.exceptions
from kombu.transport import redis as kombu_redis
from kombu.utils.url import url_to_parts
from redis import Redis

from swapless.tasks.broker.kombu_private import RedisSentinelChannel, SentinelBackendShim, socket_of
from swapless.tasks.broker.sentinel import WatchedPool, WatchedSentinel
from swapless.tasks.broker.transport import SENTINEL_SCHEME, Channel

__all__ = ["SentinelBackend", "SentinelChannel", "SentinelTransport"]


class SentinelBackend(SentinelBackendShim):  # type: ignore[misc]
    """Celery's ``SentinelBackend`` over ``WatchedSentinel``."""

    def sentinel_instance(self, **params: Any) -> WatchedSentinel:
        params = params.copy()
        hosts = params.pop("hosts")
        options = self.backend_transport_options
        return WatchedSentinel([(host["host"], host["port"]) for host in hosts],
                               min_other_sentinels=options.get("min_other_sentinels", 0),
                               sentinel_kwargs=options.get("sentinel_kwargs", {}), **params)


class SentinelChannel(Channel, RedisSentinelChannel):
    """:class:`Channel` over the primary Redis Sentinel names (kombu's ``SentinelChannel``), logging where it
    finds it (``swapless.tasks.broker.connection.PrimaryWatch``).

    Its fetches go through one connection it keeps (kombu's), which a failover whose old primary lives on (stalled,
    then back) leaves open and answered: after each round the channel asks its pool whether the sentinels still
    name that connection's server (``WatchedPool.recheck``, at most every ``recheck_s``) and, named elsewhere,
    closes it, so that kombu's next poll connects to the primary they name (the reconnection kombu makes after a
    connection error) rather than fetching from the old one until the sentinels demote it."""

    from_transport_options = (  # type: ignore[assignment]
        *Channel.from_transport_options,
        "master_name",
        "min_other_sentinels",
        "sentinel_kwargs",
        "sentinel_fanout_compat",
    )

    def sentinel_pool(self, asynchronous: bool = False) -> Any:
        # kombu's own, with a Sentinel client that reports the primary it finds
        params = self.connection_params(asynchronous)
        params.pop("host", None)
        params.pop("port", None)
        sentinels = []
        for url in self.connection.client.alt:
            parts = url_to_parts(url)
            if parts.scheme in ("sentinel", SENTINEL_SCHEME):
                sentinels.append((parts.hostname, parts.port or self.connection.default_port))
        manager = WatchedSentinel(sentinels, min_other_sentinels=getattr(self, "min_other_sentinels", 0),
                                  sentinel_kwargs=getattr(self, "sentinel_kwargs", None), **params)
        self.keep_sentinel_manager(manager, asynchronous)
        master_name = getattr(self, "master_name", None)
        if master_name is None:
            raise ValueError("'master_name' transport option must be specified.")
        credentials = {k: params[k] for k in ("username", "password") if k in params}
        return manager.master_for(master_name, Redis, **credentials).connection_pool

    def read_fetch(self, **options: Any) -> Any:
        try:
            return super().read_fetch(**options)
        finally:
            self._leave_a_replaced_primary()

    def _leave_a_replaced_primary(self) -> None:
        """Close the fetch connection when the sentinels name a primary other than its server."""
        client = self.__dict__.get("client")  # kombu's cached client, made by the first poll
        connection = getattr(client, "connection", None)
        pool = getattr(client, "connection_pool", None)
        if connection is None or not isinstance(pool, WatchedPool) or socket_of(connection) is None:
            return
        pool.recheck()
        if pool.master_address is not None and (connection.host, connection.port) != tuple(pool.master_address):
            connection.disconnect()


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with :class:`SentinelChannel`, riding out a failover while it connects."""

    Channel = SentinelChannel

    #: How often a connection that finds no primary, or one that refuses, asks the sentinels again.
    poll_s = 0.1

    def establish_connection(self) -> Any:
        """kombu's, asking the sentinels again every ``poll_s`` while they name no primary or name one that refuses
        (between a primary's death and the promotion), for up to the transport option ``failover_wait_s``
        (``SWAPLESS_REDIS_FAILOVER_WAIT_S``): a worker reconnects within ``poll_s`` of the promotion rather than on
        kombu's reconnect backoff (2 s, then 4 s, ...), which takes over after the wait. A worker asked to stop
        stops waiting."""
        options = self.client.transport_options if self.client is not None else {}
        wait_s = float(options.get("failover_wait_s", 0.0))
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return super().establish_connection()
            except redis.exceptions.ConnectionError:  # MasterNotFoundError too
                if time.monotonic() + self.poll_s >= deadline or _stopping():
                    raise
                time.sleep(self.poll_s)


def _stopping() -> bool:
    """Whether this process is a Celery worker asked to stop (a warm or cold shutdown)."""
    from celery.worker import state

    return any(flag is not None and flag is not False for flag in (state.should_stop, state.should_terminate))
