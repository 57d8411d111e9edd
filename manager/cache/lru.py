"""ModelManager: what is loaded now. An LRU cache of loaded workers with a count limit and a memory budget.

Local models (in this process) and remote models (on a Triton server) are two separate pools: a remote load
never evicts a local model and the reverse. A model with a batch in flight is pinned and never evicted.

Loads run outside the cache's lock, with the slot (and the bytes) they will take reserved, so that another thread
can use a loaded model meanwhile. ``load_ahead`` starts loading, on a thread of its own, the model the scheduler
will need next, while the current group computes: only into room there is, or that evicting models with no
waiting work (never one in use) makes, and, under a byte budget, only for a model whose size is known from an
earlier load, and never while another load of its pool runs. A ``use`` of a model being loaded waits for that
load instead of starting another.

Models kept loaded by their spec (``keep_loaded``), and those that served interactive jobs in the last
``keep_interactive_s``, are resident: a load ahead never evicts them, and a load a group needs evicts them last
(``swapless.manager.cache.eviction``). Interactive traffic is sparse (a few jobs a second on a model, none waiting
between them): under plain LRU a bulk burst evicts those models between two jobs, and each interactive caller then waits
for a reload.

Local loads run one at a time (remote loads, on a server, do not): two at once on one device only share its
bandwidth, and libraries with lazy imports are not thread-safe on first use (two transformers loads in two threads
can fail with "cannot import name AutoModelForSequenceClassification").

Two tiers, with a host tier (``host_max_models`` and ``host_memory_budget_bytes`` above 0;
``swapless.manager.cache.host``): a model evicted from the device moves to host memory, kept built, when it fits there,
and its next ``use`` is a copy back to the device rather than a load from disk; the host tier has its own LRU and drops
to disk. Without it (the default), an evicted model is unloaded. ``load_cost_s`` prices each model by its tier: 0 on the
device, its measured swap-in from host memory, else its measured load from disk.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from swapless.config.errors import ModelLoadError, ModelTooLarge, SwaplessError
from swapless.manager.cache.costs import LoadCosts
from swapless.manager.cache.entries import (
    DEFAULT_LOAD_COST_S,
    CacheStats,
    InteractiveDemand,
    LoadedModel,
    Loading,
    Tier,
    is_out_of_memory,
)
from swapless.manager.cache.eviction import Cached, choose_victims
from swapless.manager.cache.host import HostEntry, HostTier
from swapless.manager.frameworks.worker import ModelWorker
from swapless.manager.registry.specs import ModelSpec
from swapless.manager.registry.store import ModelStore

__all__ = ["DEFAULT_LOAD_COST_S", "CacheStats", "LoadedModel", "ModelManager", "Tier"]

logger = logging.getLogger(__name__)


class ModelManager:
    """The LRU cache of loaded models.

    Args:
        store: the registry of models that exist.
        factory: builds an unloaded worker for a spec (``ModelEngine`` in production, a fake in tests).
        max_models: local models loaded at once.
        memory_budget_bytes: bytes of loaded local models at once (None: no byte limit).
        remote_max_models: remote (Triton) models kept loaded on their servers at once.
        pin_wait_s: how long a load waits for a pinned model to be released before it fails.
        host_max_models: models kept built in host memory once evicted from the device (0: no host tier).
        host_memory_budget_bytes: bytes of models kept in host memory (0: no host tier).
        keep_interactive_s: how long a model that served interactive jobs stays resident (0: plain LRU).
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
        host_max_models: int = 0,
        host_memory_budget_bytes: int = 0,
        keep_interactive_s: float = 0.0,
    ) -> None:
        if max_models < 1 or remote_max_models < 1:
            raise ValueError("max_models and remote_max_models must be at least 1")
        self.store = store
        self.factory = factory
        self.max_models = max_models
        self.memory_budget_bytes = memory_budget_bytes
        self.remote_max_models = remote_max_models
        self.pin_wait_s = pin_wait_s
        self.keep_interactive_s = keep_interactive_s
        self.demand = InteractiveDemand(keep_interactive_s)
        self.stats = CacheStats()
        self._entries: OrderedDict[str, LoadedModel] = OrderedDict()  # least recently used first
        self._costs = LoadCosts()
        self._loading: dict[str, Loading] = {}
        self._local_load_lock = threading.Lock()
        self._closed = False
        self._cond = threading.Condition(threading.RLock())
        self.host = HostTier(host_max_models, host_memory_budget_bytes, self._cond, self.stats, self._unload)

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
                LoadedModel(e.model_id, e.worker, e.size_bytes, e.load_s, e.remote, e.pins, e.hits, e.loaded_at,
                            e.from_host, e.interactive_at)
                for e in self._entries.values()
            ]

    def tier(self, model_id: str) -> Tier:
        """Where ``model_id`` is now (a model being loaded counts as on disk until its load is done)."""
        with self._cond:
            if model_id in self._entries:
                return Tier.DEVICE
            return Tier.HOST if self.host.get(model_id) is not None else Tier.DISK

    def used_bytes(self) -> int:
        """Bytes held by loaded local models."""
        with self._cond:
            return sum(e.size_bytes for e in self._entries.values() if not e.remote)

    def loading_ids(self) -> list[str]:
        """Models being loaded now (ahead of their group, or for it)."""
        with self._cond:
            return list(self._loading)

    def in_cache(self) -> list[str]:
        """Models loaded, then those being loaded now."""
        with self._cond:
            return [*self._entries, *self._loading]

    def is_loading(self, model_id: str) -> bool:
        """Whether ``model_id`` is being loaded now (ahead of its group, or for it)."""
        with self._cond:
            return model_id in self._loading

    def resident(self, entry: LoadedModel, now: float | None = None) -> bool:
        """Whether ``entry`` is kept loaded (``ModelSpec.keep_loaded``), or served interactive jobs in the last
        ``keep_interactive_s`` and is among the models with most interactive jobs lately: as many as its pool's
        slots but one, less those kept loaded, so that one slot always serves the rest (see the module docstring)."""
        if entry.worker.spec.keep_loaded:
            return True
        now = time.monotonic() if now is None else now
        if entry.interactive_at is None or now - entry.interactive_at >= self.keep_interactive_s:
            return False
        with self._cond:
            pool = [e for e in self._entries.values() if e.remote == entry.remote]
        slots = self.remote_max_models if entry.remote else self.max_models
        hot = slots - 1 - sum(1 for e in pool if e.worker.spec.keep_loaded)
        return entry.model_id in self.demand.hottest(hot, now)

    def load_cost_s(self, model_id: str) -> float:
        """Expected seconds to bring ``model_id`` onto the device (``LoadCosts.cost_s``): 0 when loaded or being
        loaded, a swap-in's from the host tier, else a load's from disk."""
        with self._cond:
            if model_id in self._loading:
                return 0.0
            return self._costs.cost_s(model_id, self.tier(model_id))

    # -- use ---------------------------------------------------------------------------------------------

    @contextmanager
    def use(
        self, model_id: str, waiting: Mapping[str, int] | None = None, *, interactive: int = 0
    ) -> Iterator[ModelWorker]:
        """Yield the loaded worker for ``model_id``, loading it (and evicting others) if needed.

        The model is pinned while the block runs, so no other thread can evict it.

        Args:
            model_id: the model.
            waiting: jobs still waiting per model; models with none are evicted before models with some.
            interactive: how many of the jobs it runs for are interactive: the model may be resident for
                ``keep_interactive_s``, if it is among the models with most interactive jobs (``resident``).

        Raises:
            UnknownModel: the id is not in the store.
            ModelTooLarge: the model does not fit the budget even alone.
            ModelLoadError: loading failed.
        """
        entry = self._acquire(model_id, waiting or {})
        if interactive:
            entry.interactive_at = time.monotonic()
            self.demand.add(model_id, int(interactive), entry.interactive_at)
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
                host = self.host.get(model_id)
                if loading is None and host is not None and not host.ready:
                    moving = host.moved  # on its way to host memory (queued, perhaps): swapped in once there
                    settle = True
                elif loading is None:
                    self.stats.misses += 1
                    spec = self.store.get(model_id)
                    host = self.host.take(model_id)
                    worker = host.entry.worker if host is not None else self.factory(spec)
                    remote = worker.remote
                    size = host.size_bytes if host is not None else self._costs.sizes.get(model_id, 0)
                    try:
                        self._make_room(model_id, size, remote, waiting)
                    except SwaplessError:
                        if host is not None:
                            self._unload(host.entry)
                        raise
                    loading = self._loading[model_id] = Loading(size, remote)
                    break
                else:
                    moving = loading.done  # loaded ahead, or for another thread: used as it is, or loaded anew
                    settle = False
            if settle:
                self._settle(wait=True)
            moving.wait()
        try:
            entry = self._load(spec, worker, remote, host)
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
        self._settle()
        return entry

    def load_ahead(self, model_id: str, waiting: Mapping[str, int]) -> bool:
        """Start loading ``model_id`` in the background, if it fits now (see the module docstring); a model of the
        host tier is swapped in.

        Args:
            model_id: the model the scheduler will run next.
            waiting: jobs waiting per model: a model with any is never evicted for it.

        Returns:
            whether a load was started.
        """
        with self._cond:
            if self._closed or model_id in self._entries or model_id in self._loading:
                return False
            host = self.host.get(model_id)
            if host is not None and not host.ready:
                return False  # still on its way to host memory
            spec = self.store.get(model_id)
            worker = host.entry.worker if host is not None else self.factory(spec)
            remote = worker.remote
            if any(r.remote == remote for r in self._loading.values()):
                return False  # one load ahead at a time, and none that would wait behind a load a group needs
            size = host.size_bytes if host is not None else self._costs.sizes.get(model_id)
            budget = None if remote else self.memory_budget_bytes
            if budget is not None and size is None:
                return False  # its size is known only once it has been loaded: it could overrun the budget
            pool = [e for e in self._entries.values() if e.remote == remote]
            reserved = [
                Cached(f"\0{m}", r.size_bytes, True, remote) for m, r in self._loading.items() if r.remote == remote
            ]
            now = time.monotonic()
            kept = [  # in use, with work waiting, or resident: never evicted for a load that may not be needed
                Cached(e.model_id, e.size_bytes, e.pins > 0 or waiting.get(e.model_id, 0) > 0 or self.resident(e, now),
                       e.remote)
                for e in pool
            ]
            victims = choose_victims(
                kept + reserved,
                incoming_bytes=size or 0,
                max_models=self.remote_max_models if remote else self.max_models,
                memory_budget_bytes=budget,
            )
            if victims is None:
                return False  # no room without evicting a model that has work or is in use
            for victim in victims:
                self._evict(victim, waiting)
            if host is not None:
                self.host.take(model_id)
            loading = self._loading[model_id] = Loading(size or 0, remote)
            self.stats.loads_ahead += 1
        threading.Thread(
            target=self._load_in_background, args=(spec, worker, remote, loading, host), name="swapless-load-ahead",
            daemon=True,
        ).start()
        return True

    def _load_in_background(
        self, spec: ModelSpec, worker: ModelWorker, remote: bool, loading: Loading, host: HostEntry | None
    ) -> None:
        try:
            entry = self._load(spec, worker, remote, host)
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

    def _load(self, spec: ModelSpec, worker: ModelWorker, remote: bool, host: HostEntry | None) -> LoadedModel:
        """Load ``worker`` (outside the cache's lock: its slot is reserved), or swap it in from the host tier;
        out of memory, evict every idle model and retry once. Local loads take turns (see the module docstring),
        and the moves to host memory queued before go first."""
        if remote:
            return self._load_now(spec, worker, remote, None)
        with self._local_load_lock:
            self.host.settle()
            return self._load_now(spec, worker, remote, host)

    def _settle(self, wait: bool = False) -> None:
        """Carry out the moves to host memory that evictions queued, unless (``wait`` off) a load holds the local
        turn: that load, or the next, carries them out before it loads."""
        if not self._local_load_lock.acquire(blocking=wait):
            return
        try:
            self.host.settle()
        finally:
            self._local_load_lock.release()

    def _load_now(self, spec: ModelSpec, worker: ModelWorker, remote: bool, host: HostEntry | None) -> LoadedModel:
        started = time.perf_counter()
        for attempt in (1, 2):
            try:
                if host is not None:
                    worker.to_device()
                else:
                    worker.load()
                break
            except SwaplessError:
                with self._cond:
                    self.stats.load_failures += 1
                self._safe_unload(worker)
                raise
            except Exception as err:  # any loader failure becomes a clear ModelLoadError
                with self._cond:
                    evicted = attempt == 1 and is_out_of_memory(err) and self._evict_all_unpinned(remote)
                    if not evicted:
                        self.stats.load_failures += 1
                if not (evicted and host is not None):  # a copy half done is kept for the retry
                    self._safe_unload(worker)
                if evicted:
                    if not remote:
                        self.host.settle()
                    logger.warning("out of memory loading %s; evicted every idle model, retrying once", spec.id)
                    continue
                what = "out of memory" if is_out_of_memory(err) else f"{type(err).__name__}: {err}"
                if host is not None:
                    what = f"swapping it in from host memory: {what} (its next load is from disk)"
                raise ModelLoadError(spec.id, what) from err
        load_s = time.perf_counter() - started
        if host is not None:
            with self._cond:
                self._costs.host_s[spec.id] = load_s
                self.stats.swap_ins += 1
                self.stats.swap_in_seconds.setdefault(spec.id, []).append(load_s)
            logger.info("swapped %s in from host memory in %.3f s, %d bytes", spec.id, load_s, host.size_bytes)
            return LoadedModel(spec.id, worker, host.size_bytes, load_s, remote, hits=host.entry.hits,
                               from_host=True)
        size = 0 if remote else worker.memory_bytes
        with self._cond:
            self._costs.sizes[spec.id] = size
            self._costs.disk_s[spec.id] = load_s
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
            now = time.monotonic()
            victims = choose_victims(
                [Cached(e.model_id, e.size_bytes, e.pins > 0, e.remote, self.resident(e, now)) for e in pool]
                + reserved,
                incoming_bytes=incoming_bytes,
                max_models=self.remote_max_models if remote else self.max_models,
                memory_budget_bytes=budget,
                keep=waiting,
            )
            if victims is not None:
                for victim in victims:
                    self._evict(victim, waiting)
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ModelLoadError(model_id, "no room: every loaded model is busy with a batch; try again later")
            self._cond.wait(remaining)  # a pinned model is released -> try again

    def _evict(self, model_id: str, waiting: Mapping[str, int]) -> None:
        """Take an idle model off the device (under the lock): into the host tier if it may go there (its move is
        carried out before the next load), else unloaded."""
        entry = self._entries.pop(model_id)
        self.stats.evictions += 1
        if not self.host.admit(entry, waiting):
            self._unload(entry)

    def _evict_all_unpinned(self, remote: bool) -> bool:
        victims = [e.model_id for e in self._entries.values() if e.remote == remote and e.pins == 0]
        for model_id in victims:
            self._evict(model_id, {})
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

    def seed(
        self, model_id: str, *, load_s: float | None = None, size_bytes: int | None = None,
        host_load_s: float | None = None,
    ) -> None:
        """Take a model's load time (from disk, and from host memory) and size as measured earlier (by another
        worker) until this one measures them."""
        with self._cond:
            self._costs.seed(model_id, load_s=load_s, size_bytes=size_bytes, host_load_s=host_load_s)

    def learned(self, model_id: str) -> dict[str, float | int]:
        """What this cache has measured of a model (``LoadCosts.learned``)."""
        with self._cond:
            return self._costs.learned(model_id)

    # -- explicit control --------------------------------------------------------------------------------

    def evict(self, model_id: str) -> bool:
        """Take ``model_id`` off the device now if it is loaded and idle (into the host tier when it has room).
        Returns whether it left the device."""
        with self._cond:
            entry = self._entries.get(model_id)
            if entry is None or entry.pins > 0:
                return False
            self._evict(model_id, {})
        self._settle()
        return True

    def close(self) -> None:
        """Unload every model, in both tiers (worker shutdown); a load still running ahead unloads its model when
        it ends."""
        with self._cond:
            self._closed = True
            while self._entries:
                _, entry = self._entries.popitem(last=False)
                self._unload(entry)
            self.host.close()
