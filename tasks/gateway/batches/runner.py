"""``BatchRunner``: finds batches that no process drives and drives them, a thread per batch."""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from pathlib import Path

from swapless.config.settings import BatchSettings, Settings
from swapless.manager.registry.store import ModelStore
from swapless.tasks.broker.connection import redis_client
from swapless.tasks.broker.sentinel import SentinelOptions
from swapless.tasks.client import Client
from swapless.tasks.gateway.batches.driver import BatchDriver, LeaseLost, Stopped
from swapless.tasks.gateway.batches.files import FileStore
from swapless.tasks.gateway.batches.state import BatchStore
from swapless.tasks.gateway.keys import load_keys
from swapless.tasks.keyspace import Keyspace

__all__ = ["BatchRunner", "fair_order", "work_root"]

logger = logging.getLogger(__name__)

#: Seconds between two purges of the files past their retention.
PURGE_EVERY_S = 3600.0


def fair_order(waiting: list[tuple[str, str, float]], driven: dict[str, int]) -> list[tuple[str, str]]:
    """``(batch id, owner)`` of the ``waiting`` batches in turns between keys, the least-driven key first."""
    by_owner: dict[str, list[tuple[float, str]]] = {}
    for batch_id, owner, created in waiting:
        by_owner.setdefault(owner, []).append((created, batch_id))
    for queue in by_owner.values():
        queue.sort()
    counts = {owner: driven.get(owner, 0) for owner in by_owner}
    order = []
    while by_owner:
        owner = min(by_owner, key=lambda o: (counts[o], by_owner[o][0]))
        _, batch_id = by_owner[owner].pop(0)
        order.append((batch_id, owner))
        counts[owner] += 1
        if not by_owner[owner]:
            del by_owner[owner]
    return order


def work_root(settings: BatchSettings, files: FileStore) -> Path:
    """Where drivers keep their work files (``SWAPLESS_BATCH_WORK_DIR``; see config/settings/)."""
    if settings.batch_work_dir is not None:
        return settings.batch_work_dir
    if files.local:
        return Path(files.root) / "work"
    return Path.home() / ".cache" / "swapless" / "batch-work"


class BatchRunner:
    """Drives batches: ``start`` starts its thread; ``stop`` ends it and its drivers.

    Args:
        settings: the process's settings.
        models: the models file.
    """

    def __init__(self, settings: Settings, models: ModelStore) -> None:
        self.settings = settings
        self.models = models
        self.runner_id = f"{socket.gethostname()}:{secrets.token_hex(4)}"
        #: API keys of the deployment: with several, one slot stays free of any one key's batches
        self._tenants = len(load_keys(settings.gateway, models))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._driving: dict[str, threading.Thread] = {}
        self._client: Client | None = None

    def start(self) -> None:
        s = self.settings
        self.files = FileStore.of(s.batches)
        self.store = BatchStore(redis_client(s.redis.broker_url, connect_timeout_s=s.redis.connect_timeout_s,
                                             sentinel=SentinelOptions.of(s)), Keyspace.of(s),
                                s.batches.batch_retention_s, s.batches.batch_max_window_s)
        self._client = Client(settings=s, validate=False)
        self._thread = threading.Thread(target=self._loop, name="swapless-batches", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop polling and every driver (each gives its lease up), waiting ``timeout_s`` at most."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in [self._thread, *self._driving.values()]:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        if self._client is not None:
            self._client.close()

    def driving(self) -> list[str]:
        """The batches this runner drives now."""
        return sorted(self._driving)

    def _loop(self) -> None:
        poll_s = min(1.0, self.settings.batches.batch_lease_s / 3)
        purged = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() - purged >= PURGE_EVERY_S:
                    purged = time.monotonic()
                    self.files.purge()
                self.tick()
            except Exception:  # Redis or the file store away: try again at the next poll
                logger.exception("the batch runner could not look for batches; trying again")
            self._stop.wait(poll_s)

    def tick(self) -> None:
        """Take the lease of each active batch nobody drives, in ``fair_order``, while a slot is free."""
        for batch_id, thread in list(self._driving.items()):
            if not thread.is_alive():
                del self._driving[batch_id]
        waiting: list[tuple[str, str, float]] = []
        mine: dict[str, int] = {}
        for batch_id in self.store.active():
            batch = self.store.get(batch_id)
            if batch is None:
                self.store.forget_active(batch_id)
                continue
            owner = batch.get("owner", "")
            if batch_id in self._driving:
                mine[owner] = mine.get(owner, 0) + 1
            elif self.store.lease_holder(batch_id) is None:
                waiting.append((batch_id, owner, float(batch.get("created_at") or 0)))
        slots = self.settings.batches.batch_max_active
        per_key = max(1, slots - 1) if self._tenants > 1 else slots
        for batch_id, owner in fair_order(waiting, mine):
            if len(self._driving) >= slots:
                return
            if mine.get(owner, 0) >= per_key:
                continue
            if self.store.take_lease(batch_id, self.runner_id, self.settings.batches.batch_lease_s):
                mine[owner] = mine.get(owner, 0) + 1
                thread = threading.Thread(target=self._drive, args=(batch_id,), name=f"swapless-{batch_id}",
                                          daemon=True)
                self._driving[batch_id] = thread
                thread.start()

    def _drive(self, batch_id: str) -> None:
        if self._client is None:
            raise RuntimeError("BatchRunner.start makes its client before any batch is driven")
        driver = BatchDriver(batch_id, self.store, self.files, self._client, self.models, self.settings,
                             work_root(self.settings.batches, self.files) / batch_id, self.runner_id, self._stop)
        try:
            driver.run()
        except LeaseLost:
            logger.warning("batch %s: lease lost (this process was too slow to renew it); another runner drives it",
                           batch_id)
            return
        except Stopped:
            logger.info("batch %s: left to the next runner (this one stops); it resumes from the output so far",
                        batch_id)
        except Exception:  # Redis away, the queue full for long: the next poll takes it up again
            logger.exception("batch %s stopped by an error; it resumes at the next poll", batch_id)
        self.store.release_lease(batch_id, self.runner_id)
