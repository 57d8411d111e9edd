"""ModelManager: what is loaded now. An LRU cache of loaded workers with a count limit and a memory budget.

Local models (in this process) and remote models (on a Triton server) are two separate pools: a remote load
never evicts a local model and the reverse. A model with a batch in flight is pinned and never evicted.

Loads run outside the cache's lock, with the slot (and the bytes) they will take reserved, so that another thread
can use a loaded model meanwhile. ``load_ahead`` starts loading, on a thread of its own, the model the scheduler
will need next, while the current group computes: only into room there is, or that evicting models with no
waiting work (never one in use) makes, and, under a byte budget, only for a model whose size is known from an
earlier load, and never while another load of its pool runs. A ``use`` of a model being loaded waits for that
load instead of starting another.

Local loads run one at a time (remote loads, on a server, do not): two at once on one device only share its
bandwidth, and libraries with lazy imports are not thread-safe on first use (two transformers loads in two threads
can fail with "cannot import name AutoModelForSequenceClassification").
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from config.errors import ModelLoadError, ModelTooLarge, SwaplessError
from manager.cache.eviction import Cached, choose_victims
from manager.frameworks.worker import ModelWorker
from manager.registry.specs import ModelSpec
from manager.registry.store import ModelStore

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
class _Loading:
    """A load in progress: the room it has reserved, and when it is over (``entry``: None if it failed)."""

    size_bytes: int
    remote: bool
    done: threading.Event = field(default_factory=threading.Event)
    entry: LoadedModel | None = None


@dataclass
class CacheStats:
    """Counters since the cache was made."""

    hits: int = 0
    misses: int = 0
    loads: int = 0
    evictions: int = 0
    load_failures: int = 0
    #: loads started ahead of their model's group (``load_ahead``), and how many of them a group then used
    loads_ahead: int = 0
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
        self._loading: dict[str, _Loading] = {}
        self._local_load_lock = threading.Lock()
        self._closed = False
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

    def loading_ids(self) -> list[str]:
        """Models being loaded now (ahead of their group, or for it)."""
        with self._cond:
            return list(self._loading)

    def load_cost_s(self, model_id: str) -> float:
        """Expected seconds to load ``model_id``: 0 when loaded or being loaded, the last measured load time, else
        a default."""
        with self._cond:
            if model_id in self._entries or model_id in self._loading:
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
        while True:
            with self._cond:
                entry = self._entries.get(model_id)
                if entry is not None:
                    self._entries.move_to_end(model_id)
                    entry.pins += 1
                    entry.hits += 1
                    self.stats.hits += 1
                    return entry
                loading = self._loading.get(model_id)
                if loading is None:
                    self.stats.misses += 1
                    spec = self.store.get(model_id)
                    worker = self.factory(spec)
                    remote = worker.remote
                    self._make_room(model_id, self._sizes.get(model_id, 0), remote, waiting)
                    loading = self._loading[model_id] = _Loading(self._sizes.get(model_id, 0), remote)
                    break
            loading.done.wait()  # loaded ahead, or for another thread: used as it is, or loaded anew if that failed
        try:
            entry = self._load(spec, worker, remote)
        except BaseException:
            with self._cond:
                del self._loading[model_id]
                self._cond.notify_all()
            loading.done.set()
            raise
        with self._cond:
            del self._loading[model_id]
            entry.pins += 1
            try:
                # The real size is known only now: evict more if the estimate was low.
                if not remote and self.memory_budget_bytes is not None:
                    self._make_room(model_id, entry.size_bytes, remote, waiting)
            except SwaplessError:
                self._unload(entry)
                raise
            else:
                self._entries[model_id] = entry
                loading.entry = entry
            finally:
                self._cond.notify_all()
                loading.done.set()
        return entry

    def load_ahead(self, model_id: str, waiting: Mapping[str, int]) -> bool:
        """Start loading ``model_id`` in the background, if it fits now (see the module docstring).

        Args:
            model_id: the model the scheduler will run next.
            waiting: jobs waiting per model: a model with any is never evicted for it.

        Returns:
            whether a load was started.
        """
        with self._cond:
            if self._closed or model_id in self._entries or model_id in self._loading:
                return False
            spec = self.store.get(model_id)
            worker = self.factory(spec)
            remote = worker.remote
            if any(r.remote == remote for r in self._loading.values()):
                return False  # one load ahead at a time, and none that would wait behind a load a group needs
            size = self._sizes.get(model_id)
            budget = None if remote else self.memory_budget_bytes
            if budget is not None and size is None:
                return False  # its size is known only once it has been loaded: it could overrun the budget
            pool = [e for e in self._entries.values() if e.remote == remote]
            reserved = [
                Cached(f"\0{m}", r.size_bytes, True, remote) for m, r in self._loading.items() if r.remote == remote
            ]
            victims = choose_victims(
                [Cached(e.model_id, e.size_bytes, e.pins > 0 or waiting.get(e.model_id, 0) > 0, e.remote) for e in pool]
                + reserved,
                incoming_bytes=size or 0,
                max_models=self.remote_max_models if remote else self.max_models,
                memory_budget_bytes=budget,
            )
            if victims is None:
                return False  # no room without evicting a model that has work or is in use
            for victim in victims:
                self._unload(self._entries.pop(victim))
                self.stats.evictions += 1
            loading = self._loading[model_id] = _Loading(size or 0, remote)
            self.stats.loads_ahead += 1
        threading.Thread(
            target=self._load_in_background, args=(spec, worker, remote, loading), name="swapless-load-ahead",
            daemon=True,
        ).start()
        return True

    def _load_in_background(self, spec: ModelSpec, worker: ModelWorker, remote: bool, loading: _Loading) -> None:
        try:
            entry = self._load(spec, worker, remote)
        except Exception as err:  # noqa: BLE001 - the group that needs it loads it again and reports the error
            logger.warning("loading %s ahead failed (%s); its group will load it", spec.id, err)
            entry = None
        with self._cond:
            del self._loading[spec.id]
            if entry is not None and self._closed:
                self._unload(entry)
            elif entry is not None:
                self._entries[spec.id] = entry
                loading.entry = entry
            self._cond.notify_all()
        loading.done.set()

    def _load(self, spec: ModelSpec, worker: ModelWorker, remote: bool) -> LoadedModel:
        """Load ``worker`` (outside the cache's lock: its slot is reserved); out of memory, evict every idle model
        and retry once. Local loads take turns (see the module docstring)."""
        with nullcontext() if remote else self._local_load_lock:
            return self._load_now(spec, worker, remote)

    def _load_now(self, spec: ModelSpec, worker: ModelWorker, remote: bool) -> LoadedModel:
        started = time.perf_counter()
        for attempt in (1, 2):
            try:
                worker.load()
                break
            except SwaplessError:
                with self._cond:
                    self.stats.load_failures += 1
                self._safe_unload(worker)
                raise
            except Exception as err:  # any loader failure becomes a clear ModelLoadError
                self._safe_unload(worker)
                with self._cond:
                    evicted = attempt == 1 and _is_out_of_memory(err) and self._evict_all_unpinned(remote)
                    if not evicted:
                        self.stats.load_failures += 1
                if evicted:
                    logger.warning("out of memory loading %s; evicted every idle model, retrying once", spec.id)
                    continue
                what = "out of memory" if _is_out_of_memory(err) else f"{type(err).__name__}: {err}"
                raise ModelLoadError(spec.id, what) from err
        load_s = time.perf_counter() - started
        size = 0 if remote else worker.memory_bytes
        with self._cond:
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
            reserved = [  # loads in progress hold their room
                Cached(f"\0{m}", r.size_bytes, True, remote)
                for m, r in self._loading.items()
                if r.remote == remote and m != model_id
            ]
            victims = choose_victims(
                [Cached(e.model_id, e.size_bytes, e.pins > 0, e.remote) for e in pool] + reserved,
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
        except Exception:  # a failing unload must not take the worker down
            logger.exception("unloading %s failed", worker.spec.id)

    # -- what was learned --------------------------------------------------------------------------------

    def seed(self, model_id: str, *, load_s: float | None = None, size_bytes: int | None = None) -> None:
        """Take a model's load time and size as measured earlier (by another worker) until this one measures them."""
        with self._cond:
            if load_s is not None:
                self._load_costs.setdefault(model_id, float(load_s))
            if size_bytes is not None:
                self._sizes.setdefault(model_id, int(size_bytes))

    def learned(self, model_id: str) -> dict[str, float | int]:
        """What this cache has measured of a model: ``load_s`` and ``size_bytes`` (when known)."""
        with self._cond:
            found: dict[str, float | int] = {}
            if model_id in self._load_costs:
                found["load_s"] = round(self._load_costs[model_id], 4)
            if model_id in self._sizes:
                found["size_bytes"] = self._sizes[model_id]
            return found

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
        """Unload every model (worker shutdown); a load still running ahead unloads its model when it ends."""
        with self._cond:
            self._closed = True
            while self._entries:
                _, entry = self._entries.popitem(last=False)
                self._unload(entry)
