"""The host tier: models evicted from the device, kept built in host memory, so that their next swap-in is a copy
instead of a load from disk (ServerlessLLM's DRAM tier, vLLM's ``max_cpu_loras``).

An LRU of its own, with a count limit and a byte budget. A model evicted from the device comes here when its
framework has a host tier (``ModelWorker.host_tier``), it fits the budget alone, and room can be made by dropping
models of this tier to disk (those with no waiting work first, each in LRU order; never one still being moved
in). Otherwise it is unloaded, as without the tier.

The decision is taken under the cache's lock (``admit``: the room is reserved, the entry is listed as moving);
the copy itself (``ModelWorker.to_host``) runs later, outside that lock, on the thread about to load the next
model, before that load starts (``settle``): the device's memory is free again before anything else takes it.
A ``use`` of a model still moving waits for the move. Out of host memory, every other entry of the tier is
dropped and the move tried once more; failing again, the model is unloaded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from swapless.manager.cache.entries import CacheStats, LoadedModel, is_out_of_memory
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
    """The host tier of one cache (see the module docstring). The queries take the cache's lock (reentrant) and
    may be called from any thread; the changes expect the caller to hold it; ``settle`` takes it itself.

    Args:
        max_models: models kept in host memory at once (0: no host tier).
        budget_bytes: bytes of models kept in host memory at once (0: no host tier).
        lock: the cache's condition: the tier's state changes under it, and waiters are notified through it.
        stats: the cache's counters.
        unload: frees a worker's memory for good (the cache's, which never raises).
    """

    def __init__(
        self,
        max_models: int,
        budget_bytes: int,
        lock: threading.Condition,
        stats: CacheStats,
        unload: Callable[[LoadedModel], None],
    ) -> None:
        if max_models < 0 or budget_bytes < 0:
            raise ValueError("the host tier's max_models and budget_bytes must be at least 0")
        self.max_models = max_models
        self.budget_bytes = budget_bytes
        self._cond = lock
        self._stats = stats
        self._unload = unload
        self._entries: OrderedDict[str, HostEntry] = OrderedDict()  # least recently stored first
        self._departing: list[HostEntry] = []

    @property
    def enabled(self) -> bool:
        return self.max_models > 0 and self.budget_bytes > 0

    # -- queries (any thread) -------------------------------------------------------------------------------

    def ids(self) -> list[str]:
        """Models in the tier (those still moving in included), least recently stored first."""
        with self._cond:
            return list(self._entries)

    def get(self, model_id: str) -> HostEntry | None:
        with self._cond:
            return self._entries.get(model_id)

    def snapshot(self) -> list[LoadedModel]:
        """Copies of the tier's entries, least recently stored first; ``loaded_at`` is when each came here."""
        with self._cond:
            return [
                LoadedModel(h.model_id, h.entry.worker, h.size_bytes, h.entry.load_s, False, 0, h.entry.hits,
                            h.stored_at, h.entry.from_host)
                for h in self._entries.values()
            ]

    def used_bytes(self) -> int:
        """Bytes of the models in the tier."""
        with self._cond:
            return sum(h.size_bytes for h in self._entries.values())

    # -- changes (under the cache's lock) ------------------------------------------------------------------

    def admit(self, entry: LoadedModel, waiting: Mapping[str, int]) -> bool:
        """Take ``entry``, just evicted from the device, if it may come here: room is made by dropping models of
        this tier to disk, and its move is queued for ``settle``. Returns False when it may not: the caller unloads
        it."""
        if not self.enabled or entry.remote or not entry.worker.host_tier or entry.size_bytes > self.budget_bytes:
            return False
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
        host = self._entries.get(model_id)
        if host is None or not host.ready:
            return None
        del self._entries[model_id]
        return host

    def drop_all(self) -> bool:
        """Unload every ready entry (out of memory somewhere, or the cache closing). Returns whether any went."""
        victims = [m for m, h in self._entries.items() if h.ready]
        for model_id in victims:
            self._drop(model_id)
        return bool(victims)

    def close(self) -> None:
        """Unload every entry, those still waiting for their move included."""
        for host in self._departing:
            host.moved.set()
        self._departing.clear()
        while self._entries:
            _, host = self._entries.popitem(last=False)
            self._unload(host.entry)

    def _drop(self, model_id: str) -> None:
        host = self._entries.pop(model_id)
        logger.info("dropping %s from host memory to make room there (%d bytes)", model_id, host.size_bytes)
        self._unload(host.entry)
        self._stats.host_evictions += 1

    # -- the moves (outside the cache's lock) --------------------------------------------------------------

    def settle(self) -> None:
        """Carry out the moves to host memory that ``admit`` queued, one at a time, until none is left. Called on
        the thread that loads next, before its load (the cache's local load turn is held), so the device memory
        they free is free before that load takes any."""
        while True:
            with self._cond:
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
                with self._cond:
                    retry = attempt == 1 and is_out_of_memory(err) and self.drop_all()
                if retry:
                    logger.warning("out of host memory moving %s there; dropped the host tier, retrying once",
                                   host.model_id)
                    continue
                logger.warning("could not move %s to host memory (%s: %s); unloading it", host.model_id,
                               type(err).__name__, err)
                break
        took = time.perf_counter() - started
        with self._cond:
            if ok and self._entries.get(host.model_id) is host:
                host.ready = True
                self._stats.swap_outs += 1
                self._stats.swap_out_s_total += took
                logger.info("moved %s to host memory in %.3f s, %d bytes", host.model_id, took, host.size_bytes)
            else:
                if self._entries.get(host.model_id) is host:
                    del self._entries[host.model_id]
                self._unload(host.entry)
            host.moved.set()
            self._cond.notify_all()
