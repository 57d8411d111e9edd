"""Celery's result backend and kombu's transport over Redis Sentinel, with the Sentinel client that reports where it
finds the primary.

``SentinelTransport`` is the Swapless transport (``tasks.broker.transport``) over kombu's Sentinel channel; kombu
finds it by the ``swapless-sentinel://`` scheme of its URLs. Celery's ``SentinelBackend`` asks the sentinels for the
primary at each connection, so a worker's and a producer's result reads and writes reach the new primary after a
failover; this one also logs the move, once per process, with every other client of the process
(``tasks.broker.sentinel.PrimaryWatch``). ``tasks.app`` names it as
``tasks.broker.failover:SentinelBackend+sentinel://...``.
"""

from __future__ import annotations

from typing import Any

from celery.backends.redis import SentinelBackend as CelerySentinelBackend
from kombu.transport import redis as kombu_redis
from kombu.utils.url import _parse_url
from redis import Redis

from tasks.broker.sentinel import WatchedSentinel
from tasks.broker.transport import SENTINEL_SCHEME, Channel

__all__ = ["SentinelBackend", "SentinelChannel", "SentinelTransport"]


class SentinelBackend(CelerySentinelBackend):  # type: ignore[misc]
    """Celery's ``SentinelBackend`` over ``WatchedSentinel``."""

    def _get_sentinel_instance(self, **params: Any) -> WatchedSentinel:
        params = params.copy()
        hosts = params.pop("hosts")
        options = self._transport_options
        return WatchedSentinel([(host["host"], host["port"]) for host in hosts],
                               min_other_sentinels=options.get("min_other_sentinels", 0),
                               sentinel_kwargs=options.get("sentinel_kwargs", {}), **params)


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """:class:`Channel` over the primary Redis Sentinel names (kombu's ``SentinelChannel``), logging where it
    finds it (``tasks.broker.connection.PrimaryWatch``)."""

    from_transport_options = (  # type: ignore[assignment]
        *Channel.from_transport_options,
        "master_name",
        "min_other_sentinels",
        "sentinel_kwargs",
        "sentinel_fanout_compat",
    )

    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        # kombu's own, with a Sentinel client that reports the primary it finds
        params = self._connparams(asynchronous)
        params.pop("host", None)
        params.pop("port", None)
        sentinels = []
        for url in self.connection.client.alt:
            parts = _parse_url(url)
            if parts.scheme in ("sentinel", SENTINEL_SCHEME):
                sentinels.append((parts.hostname, parts.port or self.connection.default_port))
        manager = WatchedSentinel(sentinels, min_other_sentinels=getattr(self, "min_other_sentinels", 0),
                                  sentinel_kwargs=getattr(self, "sentinel_kwargs", None), **params)
        if asynchronous:
            self._async_sentinel_manager = manager
        else:
            self._sentinel_manager = manager
        master_name = getattr(self, "master_name", None)
        if master_name is None:
            raise ValueError("'master_name' transport option must be specified.")
        credentials = {k: params[k] for k in ("username", "password") if k in params}
        return manager.master_for(master_name, Redis, **credentials).connection_pool


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with :class:`SentinelChannel`."""

    Channel = SentinelChannel
