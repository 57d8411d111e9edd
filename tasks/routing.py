"""Where a job goes: the one ``Router`` every producer, the gateway and the worker resolve routes with; the
run-time route weights kept in Redis (``swapless route``), cached ``ttl_s`` by each reader; the shadow agreement
counts.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from swapless.config.errors import ConfigError
from swapless.manager.registry.routing import Resolved
from swapless.manager.registry.store import ModelStore
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import CHUNK_TASK, message_args

__all__ = ["RouteOverrides", "Router", "count_shadow", "read_shadow"]

logger = logging.getLogger(__name__)


class RouteOverrides:
    """The run-time route weights of one queue (``swapless route``), each read reused for ``ttl_s``."""

    def __init__(self, client: Any, keyspace: Keyspace, ttl_s: float = 1.0) -> None:
        self.client = client
        self.key = keyspace.routes
        self.ttl_s = ttl_s
        self._cached: dict[str, dict[str, float]] = {}
        self._read_at = float("-inf")
        self._lock = threading.Lock()

    def get(self) -> dict[str, dict[str, float]]:
        """Route id -> weights, at most ``ttl_s`` old; a Redis failure keeps the last read."""
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
        """Make every weighted route of ``store`` the run-time split, in one round trip; returns the weights set."""
        weights = {route.id: dict(route.route) for route in store.routes.values() if route.route is not None}
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.key)
        if weights:
            pipe.hset(self.key, mapping={route_id: json.dumps(split) for route_id, split in weights.items()})
        pipe.execute()
        self._read_at = float("-inf")
        return weights

    def set(self, store: ModelStore, route_id: str, weights: Mapping[str, float]) -> None:
        """Set a route's weights, checked against the store.

        Raises:
            ConfigError: not a split route, an unknown target, or a weight that is not positive.
        """
        if not store.is_route(route_id) or store.routes[route_id].route is None:
            splits = ", ".join(sorted(r.id for r in store.routes.values() if r.route is not None)) or "none"
            raise ConfigError(f"route {route_id!r}", f"no such weighted route in the models file (routes: {splits})")
        current = store.routes[route_id].route or {}
        for target, weight in weights.items():
            if target not in current:
                raise ConfigError(
                    f"route {route_id!r}",
                    f"{target!r} is not one of its versions ({', '.join(current)}); add it to the models file first",
                )
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


class Router:
    """Resolves a job addressed to a route to the model that serves it.

    Args:
        store: the models file.
        overrides: the run-time weights (None: the file's alone).
    """

    def __init__(self, store: ModelStore, overrides: RouteOverrides | None = None) -> None:
        self.store = store
        self.overrides = overrides

    def resolve(self, model_id: str, value: object, key: str, *, paths: bool = True) -> Resolved:
        """Where a job for ``model_id`` (a model id, alias or route) with input ``value`` goes.

        Args:
            key: its sticky key, else its id.
            paths: whether an input may be an image file's path (False for network callers).

        Raises:
            UnknownModel: no model, alias or route of that id.
            InputError: a ``by_type`` route has no branch for this input.
        """
        if not self.store.routes or not self.store.is_route(model_id):
            return Resolved(self.store.resolve(model_id))
        weights = self.overrides.get() if self.overrides is not None else None
        return self.store.route(model_id, value, key, weights, paths=paths)

    def model_of(self, payload: dict[str, Any]) -> str | None:
        """The model whose lists an ingress message belongs in; None: keep it where it was taken (a chunk for a route,
        an unknown model, a malformed message).
        """
        args = message_args(payload)
        headers = payload.get("headers") or {}
        if args is None or not isinstance(args[0], str):
            return None
        try:
            if headers.get("task") == CHUNK_TASK:
                return None if self.store.is_route(args[0]) else self.store.home(args[0])
            job_id = headers.get("id")
            return self.store.home(self.resolve(args[0], args[1], job_id if isinstance(job_id, str) else "").model_id)
        except (KeyError, ValueError):  # UnknownModel, InputError: its worker answers it
            return None


def count_shadow(client: Any, keyspace: Keyspace, counts: Mapping[tuple[str, str, str, bool], int]) -> None:
    """Add shadow comparisons: ``(route, served model, shadow model, agreed) -> n``, in one round trip."""
    pipe = client.pipeline(transaction=False)
    key = keyspace.shadow_counts
    for (route, served, shadow, agreed), n in counts.items():
        pipe.hincrby(key, f"{route}|{served}|{shadow}|total", n)
        if agreed:
            pipe.hincrby(key, f"{route}|{served}|{shadow}|agree", n)
    pipe.execute()


def read_shadow(client: Any, keyspace: Keyspace) -> dict[tuple[str, str, str], tuple[int, int]]:
    """``(route, served, shadow) -> (agreed, compared)``."""
    found: dict[tuple[str, str, str], list[int]] = {}
    for field, value in client.hgetall(keyspace.shadow_counts).items():
        route, served, shadow, what = _text(field).split("|")
        pair = found.setdefault((route, served, shadow), [0, 0])
        pair[0 if what == "agree" else 1] = int(value)
    return {pair: (agreed, total) for pair, (agreed, total) in found.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
