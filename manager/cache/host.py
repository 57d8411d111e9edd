"""The host tier: models evicted from the device, kept built in host memory so that their next swap-in is a copy
rather than a load from disk. Its design is in docs/concepts/host-tier.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from swapless.manager.cache.entries import CacheStats, LoadedModel, is_out_of_memory, unload_entry
from swapless.manager.cache.eviction import Cached, choose_victims

__all__ = ["HostEntry", "HostTier"]

logger = logging.getLogger(__name__)


@dataclass
class HostEntry:
    """A model in the host tier: built, in host memory once ``moved`` is set and ``ready``."""

    entry: LoadedModel
    stored_at: float = field(default_factory=time.time)
    moved: threading.Event = field(default_factory=threading.Event)
    ready: bool = False

    @property
    def model_id(self) -> str:
        return self.entry.model_id

    @property
    def size_bytes(self) -> int:
        return self.entry.size_bytes


class HostTier:
    """The host tier of one cache: an LRU with a count limit and a byte budget, thread-safe under a lock of its own.

    Args:
        max_models: models kept in host memory at once (0: no host tier).
        budget_bytes: bytes of models kept in host memory at once (0: no host tier).
        stats: the cache's counters (the tier counts its moves and drops there).
    """

    def __init__(self, max_models: int, budget_bytes: int, stats: CacheStats) -> None:
        if max_models < 0 or budget_bytes < 0:
            raise ValueError("the host tier's max_models and budget_bytes must be at least 0")
        self.max_models = max_models
        self.budget_bytes = budget_bytes
        self._lock = threading.RLock()
        self._stats = stats
        self._entries: OrderedDict[str, HostEntry] = OrderedDict()  # least recently stored first
        self._departing: list[HostEntry] = []

    @property
    def enabled(self) -> bool:
        return self.max_models > 0 and self.budget_bytes > 0

    # -- queries ----------------------------------------------------------------------------------------

    def ids(self) -> list[str]:
        """Models in the tier (those still moving in included), least recently stored first."""
        with self._lock:
            return list(self._entries)

    def get(self, model_id: str) -> HostEntry | None:
        with self._lock:
            return self._entries.get(model_id)

    def snapshot(self) -> list[LoadedModel]:
        """Copies of the tier's entries, least recently stored first; ``loaded_at`` is when each came here."""
        with self._lock:
            return [
                LoadedModel(h.model_id, h.entry.worker, h.size_bytes, h.entry.load_s, False, 0, h.entry.hits,
                            h.stored_at, h.entry.from_host)
                for h in self._entries.values()
            ]

    def used_bytes(self) -> int:
        """Bytes of the models in the tier."""
        with self._lock:
            return sum(h.size_bytes for h in self._entries.values())

    # -- changes ----------------------------------------------------------------------------------------

    def admit(self, entry: LoadedModel, waiting: Mapping[str, int]) -> bool:
        """Take ``entry``, just evicted from the device, dropping models of the tier to disk to make room, and
        queue its move for ``settle``.

        Returns:
            False when it may not come here: the caller unloads it.
        """
        if not self.enabled or entry.remote or not entry.worker.host_tier or entry.size_bytes > self.budget_bytes:
            return False
        with self._lock:
            victims = choose_victims(
                [Cached(h.model_id, h.size_bytes, not h.ready) for h in self._entries.values()],
                incoming_bytes=entry.size_bytes,
                max_models=self.max_models,
                memory_budget_bytes=self.budget_bytes,
                keep=waiting,
            )
            if victims is None:
                return False  # the rest of the tier is still moving in: no room without waiting
            for victim in victims:
                self._drop(victim)
            host = self._entries[entry.model_id] = HostEntry(entry)
            self._departing.append(host)
            return True

    def take(self, model_id: str) -> HostEntry | None:
        """Remove and return the ready entry of ``model_id`` (for a swap-in), or None."""
        with self._lock:
            host = self._entries.get(model_id)
            if host is None or not host.ready:
                return None
            del self._entries[model_id]
            return host

    def drop_all(self) -> bool:
        """Unload every ready entry. Returns whether any went."""
        with self._lock:
            victims = [m for m, h in self._entries.items() if h.ready]
            for model_id in victims:
                self._drop(model_id)
            return bool(victims)

    def close(self) -> None:
        """Unload every entry, those still waiting for their move included."""
        with self._lock:
            for host in self._departing:
                host.moved.set()
            self._departing.clear()
            while self._entries:
                _, host = self._entries.popitem(last=False)
                unload_entry(host.entry)

    def _drop(self, model_id: str) -> None:
        host = self._entries.pop(model_id)
        logger.info("dropping %s from host memory to make room there (%d bytes)", model_id, host.size_bytes)
        unload_entry(host.entry)
        self._stats.host_evictions += 1

    # -- the moves ----------------------------------------------------------------------------------------

    def settle(self) -> None:
        """Carry out the queued moves to host memory, one at a time, until none is left (on the thread that
        loads next, before its load)."""
        while True:
            with self._lock:
                if not self._departing:
                    return
                host = self._departing.pop(0)
            self._move(host)

    def _move(self, host: HostEntry) -> None:
        worker = host.entry.worker
        started = time.perf_counter()
        ok = False
        for attempt in (1, 2):
            try:
                worker.to_host()
                ok = True
                break
            except Exception as err:  # noqa: BLE001 - any failed move leaves the model on disk only, as without the tier
                retry = attempt == 1 and is_out_of_memory(err) and self.drop_all()
                if retry:
                    logger.warning("out of host memory moving %s there; dropped the host tier, retrying once",
                                   host.model_id)
                    continue
                logger.warning("could not move %s to host memory (%s: %s); unloading it", host.model_id,
                               type(err).__name__, err)
                break
        took = time.perf_counter() - started
        with self._lock:
            if ok and self._entries.get(host.model_id) is host:
                host.ready = True
                self._stats.swap_outs += 1
                self._stats.swap_out_s_total += took
                logger.info("moved %s to host memory in %.3f s, %d bytes", host.model_id, took, host.size_bytes)
            else:
                if self._entries.get(host.model_id) is host:
                    del self._entries[host.model_id]
                unload_entry(host.entry)
            host.moved.set()
