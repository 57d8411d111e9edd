"""Celery's Redis Sentinel result backend, with the Sentinel client that reports where it finds the primary.

Celery's ``SentinelBackend`` asks the sentinels for the primary at each connection, so a worker's and a producer's
result reads and writes reach the new primary after a failover; this one also logs the move, once per process, with
every other client of the process (``tasks.broker.connection.PrimaryWatch``). ``tasks.app`` names it as
``tasks.broker.backend:SentinelBackend+sentinel://...``.
"""

from __future__ import annotations

from typing import Any

from celery.backends.redis import SentinelBackend as CelerySentinelBackend

from tasks.broker.connection import WatchedSentinel

__all__ = ["SentinelBackend"]


class SentinelBackend(CelerySentinelBackend):  # type: ignore[misc]
    """Celery's ``SentinelBackend`` over ``WatchedSentinel``."""

    def _get_sentinel_instance(self, **params: Any) -> WatchedSentinel:
        params = params.copy()
        hosts = params.pop("hosts")
        options = self._transport_options
        return WatchedSentinel([(host["host"], host["port"]) for host in hosts],
                               min_other_sentinels=options.get("min_other_sentinels", 0),
                               sentinel_kwargs=options.get("sentinel_kwargs", {}), **params)
