"""Celery's result backend and Swapless's transport over Redis Sentinel, logging where they find the primary
(docs/concepts/delivery.md, "Sentinel and failover"). kombu finds the transport by the ``swapless-sentinel://``
scheme; ``swapless.tasks.app`` names the backend as ``swapless.tasks.broker.failover:SentinelBackend+sentinel://``.
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
    """:class:`Channel` over the primary the sentinels name, closing its fetch connection after a round when they
    name another.
    """

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
        """kombu's, asking the sentinels again every ``poll_s`` while they name no primary, or one that refuses.

        It waits up to the transport option ``failover_wait_s``, then kombu's reconnect backoff takes over; a worker
        asked to stop stops waiting.
        """
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
