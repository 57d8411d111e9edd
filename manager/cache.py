"""ModelManager: what is loaded now. An LRU cache of loaded workers with a count limit and a memory budget.

Local models (in this process) and remote models (on a Triton server) are two separate pools: a remote load
never evicts a local model and the reverse. A model with a batch in flight is pinned and never evicted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from manager.errors import ModelLoadError, ModelTooLarge, SwaplessError
from manager.policy import Cached, choose_victims
from manager.specs import ModelSpec
from manager.store import ModelStore
from manager.worker import ModelWorker

__all__ = ["CacheStats", "LoadedModel", "ModelManager"]

logger = logging.getLogger(__name__)

#: Seconds a model is assumed to take to load before it has been loaded once (used by the scheduler).
DEFAULT_LOAD_COST_S = 1.0


@dataclass
class LoadedModel:
    """One cache entry."""

    model_id: str
    worker: ModelWorker
    size_bytes: int
    load_s: float
    remote: bool
    pins: int = 0
    hits: int = 0
    loaded_at: float = field(default_factory=time.time)


@dataclass
class CacheStats:
    """Counters since the cache was made."""

    hits: int = 0
    misses: int = 0
    loads: int = 0
    evictions: int = 0
    load_failures: int = 0
    load_seconds: dict[str, list[float]] = field(default_factory=dict)


def _is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError"


class ModelManager:
    """The LRU cache of loaded models.

    Args:
        store: the registry of models that exist.
        factory: builds an unloaded worker for a spec (``ModelEngine`` in production, a fake in tests).
        max_models: local models loaded at once.
        memory_budget_bytes: bytes of loaded local models at once (None: no byte limit).
        remote_max_models: remote (Triton) models kept loaded on their servers at once.
        pin_wait_s: how long a load waits for a pinned model to be released before it fails.
    """

    def __init__(
        self,
        store: ModelStore,
        factory: Callable[[ModelSpec], ModelWorker],
        *,
        max_models: int = 2,
        memory_budget_bytes: int | None = None,
        remote_max_models: int = 4,
        pin_wait_s: float = 600.0,
    ) -> None:
        if max_models < 1 or remote_max_models < 1:
            raise ValueError("max_models and remote_max_models must be at least 1")
        self.store = store
        self.factory = factory
        self.max_models = max_models
        self.memory_budget_bytes = memory_budget_bytes
        self.remote_max_models = remote_max_models
        self.pin_wait_s = pin_wait_s
        self.stats = CacheStats()
        self._entries: OrderedDict[str, LoadedModel] = OrderedDict()  # least recently used first
        self._sizes: dict[str, int] = {}
        self._load_costs: dict[str, float] = {}
        self._cond = threading.Condition(threading.RLock())

    # -- queries -----------------------------------------------------------------------------------------

    def loaded_ids(self) -> list[str]:
        """Loaded model ids, least recently used first."""
        with self._cond:
            return list(self._entries)

    def is_loaded(self, model_id: str) -> bool:
        with self._cond:
            return model_id in self._entries

    def snapshot(self) -> list[LoadedModel]:
        """Copies of the cache entries, least recently used first."""
        with self._cond:
            return [
                LoadedModel(e.model_id, e.worker, e.size_bytes, e.load_s, e.remote, e.pins, e.hits, e.loaded_at)
                for e in self._entries.values()
            ]

    def used_bytes(self) -> int:
        """Bytes held by loaded local models."""
        with self._cond:
            return sum(e.size_bytes for e in self._entries.values() if not e.remote)

    def load_cost_s(self, model_id: str) -> float:
        """Expected seconds to load ``model_id``: 0 when loaded, the last measured load time, else a default."""
        with self._cond:
            if model_id in self._entries:
                return 0.0
            return self._load_costs.get(model_id, DEFAULT_LOAD_COST_S)

    # -- use ---------------------------------------------------------------------------------------------

    @contextmanager
    def use(self, model_id: str, waiting: Mapping[str, int] | None = None) -> Iterator[ModelWorker]:
        """Yield the loaded worker for ``model_id``, loading it (and evicting others) if needed.

        The model is pinned while the block runs, so no other thread can evict it.

        Args:
            model_id: the model.
            waiting: jobs still waiting per model; models with none are evicted before models with some.

        Raises:
            UnknownModel: the id is not in the store.
            ModelTooLarge: the model does not fit the budget even alone.
            ModelLoadError: loading failed.
        """
        entry = self._acquire(model_id, waiting or {})
        try:
            yield entry.worker
        finally:
            with self._cond:
                entry.pins -= 1
                self._cond.notify_all()

    def _acquire(self, model_id: str, waiting: Mapping[str, int]) -> LoadedModel:
        with self._cond:
            entry = self._entries.get(model_id)
            if entry is not None:
                self._entries.move_to_end(model_id)
                entry.pins += 1
                entry.hits += 1
                self.stats.hits += 1
                return entry
            self.stats.misses += 1
            spec = self.store.get(model_id)
            worker = self.factory(spec)
            remote = worker.remote
            self._make_room(model_id, self._sizes.get(model_id, 0), remote, waiting)
            entry = self._load(spec, worker, remote, waiting)
            entry.pins += 1
            self._entries[model_id] = entry
            # The real size is known only now: evict more if the estimate was low.
            if not remote and self.memory_budget_bytes is not None:
                self._entries.pop(model_id)
                try:
                    self._make_room(model_id, entry.size_bytes, remote, waiting)
                except SwaplessError:
                    self._unload(entry)
                    raise
                self._entries[model_id] = entry
            return entry

    def _load(self, spec: ModelSpec, worker: ModelWorker, remote: bool, waiting: Mapping[str, int]) -> LoadedModel:
        started = time.perf_counter()
        for attempt in (1, 2):
            try:
                worker.load()
                break
            except SwaplessError:
                self.stats.load_failures += 1
                self._safe_unload(worker)
                raise
            except Exception as err:  # noqa: BLE001 - any loader failure becomes a clear ModelLoadError
                self._safe_unload(worker)
                if attempt == 1 and _is_out_of_memory(err) and self._evict_all_unpinned(remote):
                    logger.warning("out of memory loading %s; evicted every idle model, retrying once", spec.id)
                    continue
                self.stats.load_failures += 1
                what = "out of memory" if _is_out_of_memory(err) else f"{type(err).__name__}: {err}"
                raise ModelLoadError(spec.id, what) from err
        load_s = time.perf_counter() - started
        size = 0 if remote else worker.memory_bytes
        self._sizes[spec.id] = size
        self._load_costs[spec.id] = load_s
        self.stats.loads += 1
        self.stats.load_seconds.setdefault(spec.id, []).append(load_s)
        logger.info("loaded %s (%s) in %.3f s, %d bytes", spec.id, spec.framework, load_s, size)
        return LoadedModel(spec.id, worker, size, load_s, remote)

    def _make_room(self, model_id: str, incoming_bytes: int, remote: bool, waiting: Mapping[str, int]) -> None:
        budget = None if remote else self.memory_budget_bytes
        if budget is not None and incoming_bytes > budget:
            raise ModelTooLarge(model_id, incoming_bytes, budget)
        deadline = time.monotonic() + self.pin_wait_s
        while True:
            pool = [e for e in self._entries.values() if e.remote == remote]
            victims = choose_victims(
                [Cached(e.model_id, e.size_bytes, e.pins > 0, e.remote) for e in pool],
                incoming_bytes=incoming_bytes,
                max_models=self.remote_max_models if remote else self.max_models,
                memory_budget_bytes=budget,
                keep=waiting,
            )
            if victims is not None:
                for victim in victims:
                    self._unload(self._entries.pop(victim))
                    self.stats.evictions += 1
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ModelLoadError(model_id, "no room: every loaded model is busy with a batch; try again later")
            self._cond.wait(remaining)  # a pinned model is released -> try again

    def _evict_all_unpinned(self, remote: bool) -> bool:
        victims = [e for e in self._entries.values() if e.remote == remote and e.pins == 0]
        for entry in victims:
            self._unload(self._entries.pop(entry.model_id))
            self.stats.evictions += 1
        return bool(victims)

    def _unload(self, entry: LoadedModel) -> None:
        logger.info("unloading %s (%d bytes)", entry.model_id, entry.size_bytes)
        self._safe_unload(entry.worker)

    @staticmethod
    def _safe_unload(worker: ModelWorker) -> None:
        try:
            worker.unload()
        except Exception:  # noqa: BLE001 - a failing unload must not take the worker down
            logger.exception("unloading %s failed", worker.spec.id)

    # -- explicit control --------------------------------------------------------------------------------

    def evict(self, model_id: str) -> bool:
        """Unload ``model_id`` now if it is loaded and idle. Returns whether it was unloaded."""
        with self._cond:
            entry = self._entries.get(model_id)
            if entry is None or entry.pins > 0:
                return False
            self._unload(self._entries.pop(model_id))
            self.stats.evictions += 1
            return True

    def close(self) -> None:
        """Unload every model (worker shutdown)."""
        with self._cond:
            while self._entries:
                _, entry = self._entries.popitem(last=False)
                self._unload(entry)
