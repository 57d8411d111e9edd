"""Publishing a worker's heartbeat (``swapless.tasks.cluster.members``): building it from the worker's cache, counters
and stats, and a daemon thread that publishes it every interval."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence

import redis

from swapless.manager import ModelManager
from swapless.tasks.broker.connection import RedisHealth
from swapless.tasks.cluster.members import (
    INDEX_FORGET_S,
    TTL_INTERVALS,
    CacheInfo,
    Heartbeat,
    LoadedEntry,
    ModelActivity,
)
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.stats import WorkerStats

__all__ = ["HeartbeatPublisher", "build_heartbeat"]

logger = logging.getLogger(__name__)


def build_heartbeat(
    *,
    hostname: str,
    worker_id: str,
    queue: str,
    started_at: float,
    interval_s: float,
    manager: ModelManager,
    stats: WorkerStats,
    backlog: dict[str, int],
    jobs_done: int,
    jobs_failed: int,
    redis_problem: str | None = None,
    routing: str = "shared",
    claimed: Sequence[str] = (),
    device: str = "",
) -> Heartbeat:
    """The heartbeat of a worker now.

    Args:
        hostname: the worker's node name.
        queue: the queue it consumes.
        started_at: when it started (epoch seconds).
        interval_s: seconds between its heartbeats.
        manager: its model cache (read, never changed).
        stats: its per-model activity.
        backlog: jobs it holds per model, waiting for their group.
        jobs_done: jobs answered with a result since it started.
        jobs_failed: jobs answered with an error since it started.
        redis_problem: what is wrong with Redis now, as the worker sees it (None: nothing).
        routing: how it takes jobs (``SWAPLESS_ROUTING``).
        claimed: the models it holds a claim on (placement).
        device: the kind of device it computes on.
    """
    cache = manager.stats
    models = stats.models()
    for model_id, waiting in backlog.items():
        models.setdefault(model_id, ModelActivity()).backlog = waiting
    for model_id in claimed:
        models.setdefault(model_id, ModelActivity()).claimed = True
    return Heartbeat(
        hostname=hostname,
        machine=socket.gethostname(),
        worker_id=worker_id,
        pid=os.getpid(),
        queue=queue,
        started_at=started_at,
        sent_at=time.time(),
        interval_s=interval_s,
        cache=CacheInfo(
            max_models=manager.max_models,
            memory_budget_bytes=manager.memory_budget_bytes,
            used_bytes=manager.used_bytes(),
            host_max_models=manager.host.max_models if manager.host.enabled else 0,
            host_budget_bytes=manager.host.budget_bytes if manager.host.enabled else 0,
            host_used_bytes=manager.host.used_bytes(),
            **cache.counts(),
        ),
        loaded=[
            LoadedEntry(
                model_id=e.model_id, bytes=e.size_bytes, load_s=e.load_s, hits=e.hits, remote=e.remote,
                busy=e.pins > 0, loaded_at=e.loaded_at, interactive=manager.resident(e),
            )
            for e in manager.snapshot()
        ],
        host=[
            LoadedEntry(
                model_id=e.model_id, bytes=e.size_bytes, load_s=e.load_s, hits=e.hits, remote=False, busy=False,
                loaded_at=e.loaded_at, tier="host",
            )
            for e in manager.host.snapshot()
        ],
        models=models,
        jobs_done=jobs_done,
        jobs_failed=jobs_failed,
        backlog=sum(backlog.values()),
        queue_wait=stats.queue_wait(),
        redis_problem=redis_problem,
        routing=routing,
        device=device,
    )


# KEYS: the heartbeat, the index. ARGV: payload, TTL (ms), hostname, now, forget-before. DEL first: the new
# heartbeat replaces the old one (a write that takes no memory goes first; see HeartbeatPublisher.beat).
_BEAT = """
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[5])
return 1
"""


class HeartbeatPublisher:
    """Publishes a heartbeat every ``interval_s`` from a daemon thread (started by ``start``, not the constructor).

    Args:
        client: the Redis to publish to.
        keyspace: the deployment's keys.
        worker_id: the worker's id (``hostname:pid``).
        build: makes the heartbeat to publish.
        interval_s: seconds between heartbeats; the key expires after ``TTL_INTERVALS`` of them.
        health: told about each failed and each successful beat.
    """

    def __init__(
        self,
        client: redis.Redis,
        keyspace: Keyspace,
        worker_id: str,
        build: Callable[[], Heartbeat],
        interval_s: float,
        health: RedisHealth | None = None,
    ) -> None:
        self.client = client
        self.key = keyspace.heartbeat(worker_id)
        self.index = keyspace.heartbeats
        self.worker_id = worker_id
        self.build = build
        self.interval_s = interval_s
        self.health = health
        self.ttl_ms = max(1000, int(interval_s * TTL_INTERVALS * 1000))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def beat(self) -> None:
        """Publish one heartbeat now (one script: it replaces the last one, so it goes through even while Redis
        is over ``maxmemory``, when the heartbeat has most to say;
        ``swapless.tasks.broker.connection.WRITE_FIRST_NOTE``)."""
        payload = self.build().model_dump_json()
        now = time.time()
        self.client.eval(
            _BEAT, 2, self.key, self.index, payload, self.ttl_ms, self.worker_id, now, now - INDEX_FORGET_S
        )

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="swapless-heartbeat", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.beat()
                if self.health is not None:
                    self.health.ok()
                if self._failing:
                    logger.info("heartbeat published again")
                self._failing = False
            except Exception as err:  # noqa: BLE001 - keep beating through a Redis outage
                if self.health is not None:
                    self.health.failed(err, "publishing the heartbeat")
                if not self._failing:
                    logger.warning("could not publish the heartbeat (%s); retrying every %.1f s", err, self.interval_s)
                self._failing = True
            if self._stop.wait(self.interval_s):
                return

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop beating and delete the heartbeat, so the worker leaves the status at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(self.key)
            pipe.zrem(self.index, self.worker_id)
            pipe.execute()
        except redis.RedisError as err:
            logger.warning("could not delete the heartbeat %s (%s); it expires by itself", self.key, err)
