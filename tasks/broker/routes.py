"""Route weights set at run time (``swapless route``), kept in Redis over the models file's, read by every producer
and worker within ``ttl_s`` of a change: no restart, no reload. And the shadow agreement counts.

The hash ``routes_key`` maps a route id to its weights as JSON; a route with no entry keeps the file's weights.
Readers cache the whole hash for ``ttl_s`` (1 s): a producer that submits thousands of jobs a second reads it once
a second, not once a job.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from config.errors import ConfigError
from manager.registry.store import ModelStore
from tasks.protocol import routes_key, shadow_key

__all__ = ["RouteOverrides", "count_shadow", "read_shadow"]

logger = logging.getLogger(__name__)


class RouteOverrides:
    """The run-time route weights of one queue (``swapless route``), cached for ``ttl_s``.

    Args:
        client: a redis-py client.
        queue: the queue's name.
        key_prefix: the deployment's key prefix.
        ttl_s: how long a read is reused.
    """

    def __init__(self, client: Any, queue: str, key_prefix: str | None = None, ttl_s: float = 1.0) -> None:
        self.client = client
        self.key = routes_key(queue, key_prefix)
        self.ttl_s = ttl_s
        self._cached: dict[str, dict[str, float]] = {}
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def get(self) -> dict[str, dict[str, float]]:
        """Route id -> weights, as set now (at most ``ttl_s`` old). A Redis failure keeps the last read."""
        with self._lock:
            if time.monotonic() - self._read_at < self.ttl_s:
                return self._cached
            try:
                raw = self.client.hgetall(self.key)
            except Exception as err:  # noqa: BLE001 - routing goes on with what it knew
                logger.warning("could not read the route weights (%s); keeping the last ones", err)
                raw = None
            if raw is not None:
                self._cached = {_text(name): json.loads(value) for name, value in raw.items()}
            self._read_at = time.monotonic()
            return self._cached

    def reload(self, store: ModelStore) -> dict[str, dict[str, float]]:
        """Make every weighted route of ``store`` (a models file just read and checked) the run-time split, in one
        round trip: producers and workers running with an older file follow within ``ttl_s``. Returns the weights
        set. (A version a running process does not know yet is ignored by it until it restarts.)"""
        weights = {route.id: dict(route.route) for route in store.routes.values() if route.route is not None}
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.key)
        if weights:
            pipe.hset(self.key, mapping={route_id: json.dumps(split) for route_id, split in weights.items()})
        pipe.execute()
        self._read_at = float("-inf")
        return weights

    def set(self, store: ModelStore, route_id: str, weights: Mapping[str, float]) -> None:
        """Set a route's weights (checked against the store: a split route, known targets, positive weights).

        Raises:
            ConfigError: not a split route, an unknown target, or a weight that is not a positive number.
        """
        if not store.is_route(route_id) or store.routes[route_id].route is None:
            splits = ", ".join(sorted(r.id for r in store.routes.values() if r.route is not None)) or "none"
            raise ConfigError(f"route {route_id!r}", f"no such weighted route in the models file (routes: {splits})")
        current = store.routes[route_id].route or {}
        for target, weight in weights.items():
            if target not in current:
                raise ConfigError(f"route {route_id!r}", f"{target!r} is not one of its versions ({', '.join(current)}); "
                                  "add it to the models file first")
            if not weight > 0 or weight == float("inf"):
                raise ConfigError(f"route {route_id!r}", f"weight {target}={weight:g}: weights are positive numbers")
        if not weights:
            raise ConfigError(f"route {route_id!r}", "give at least one VERSION=WEIGHT")
        self.client.hset(self.key, route_id, json.dumps(dict(weights)))
        self._read_at = float("-inf")

    def clear(self, route_id: str) -> None:
        """Back to the models file's weights."""
        self.client.hdel(self.key, route_id)
        self._read_at = float("-inf")


def count_shadow(client: Any, queue: str, key_prefix: str | None, counts: Mapping[tuple[str, str, str, bool], int]) -> None:
    """Add shadow comparisons: ``(route, served model, shadow model, agreed) -> n``, in one round trip."""
    pipe = client.pipeline(transaction=False)
    key = shadow_key(queue, key_prefix)
    for (route, served, shadow, agreed), n in counts.items():
        pipe.hincrby(key, f"{route}|{served}|{shadow}|total", n)
        if agreed:
            pipe.hincrby(key, f"{route}|{served}|{shadow}|agree", n)
    pipe.execute()


def read_shadow(client: Any, queue: str, key_prefix: str | None) -> dict[tuple[str, str, str], tuple[int, int]]:
    """``(route, served, shadow) -> (agreed, compared)``."""
    found: dict[tuple[str, str, str], list[int]] = {}
    for field, value in client.hgetall(shadow_key(queue, key_prefix)).items():
        route, served, shadow, what = _text(field).split("|")
        pair = found.setdefault((route, served, shadow), [0, 0])
        pair[0 if what == "agree" else 1] = int(value)
    return {pair: (agreed, total) for pair, (agreed, total) in found.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
