"""ModelManager: what is loaded now, an LRU cache of loaded workers with a count limit and a memory budget.

Local models and remote (Triton) models are two pools; a model with a batch in flight is pinned; a host tier
(``swapless.manager.cache.host``) may keep evicted models built in host memory. The design is in
docs/concepts/cache.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, overload

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
    safe_unload,
    unload_entry,
)
from swapless.manager.cache.eviction import Cached, choose_victims
from swapless.manager.cache.host import HostEntry, HostTier
from swapless.manager.frameworks.worker import ModelWorker
from swapless.manager.registry.specs import ModelSpec
from swapless.manager.registry.store import ModelStore

__all__ = ["DEFAULT_LOAD_COST_S", "CacheStats", "LoadedModel", "ModelManager", "Tier"]

logger = logging.getLogger(__name__)


@dataclass
class _Reservation:
    """A load whose room is held: the worker to load (new, or from the host tier) and its size when known."""

    spec: ModelSpec
    worker: ModelWorker
    remote: bool
    host: HostEntry | None
    size_bytes: int | None
    loading: Loading


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
        self.host = HostTier(host_max_models, host_memory_budget_bytes, self.stats)

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
                if loading is not None:
                    moving = loading.done  # loaded ahead, or for another thread: used as it is, or loaded anew
                elif host is not None and not host.ready:
                    moving = host.moved  # on its way to host memory (queued, perhaps): swapped in once there
                else:
                    self.stats.misses += 1
                    reservation = self._reserve(model_id, waiting)
                    break
            if loading is None:
                self._settle(wait=True)
            moving.wait()
        return self._load_for_use(reservation, waiting)

    def _load_for_use(self, res: _Reservation, waiting: Mapping[str, int]) -> LoadedModel:
        model_id, loading = res.spec.id, res.loading
        try:
            entry = self._load(res)
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
                if not res.remote and self.memory_budget_bytes is not None:
                    self._evict_each(self._make_room(model_id, entry.size_bytes, res.remote, waiting), waiting)
            except SwaplessError:
                unload_entry(entry)
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
        """Start loading ``model_id`` on a thread of its own if it fits now without evicting a model in use, with
        waiting work or resident; a model of the host tier is swapped in.

        Args:
            model_id: the model the scheduler will run next.
            waiting: jobs waiting per model.

        Returns:
            whether a load was started.
        """
        with self._cond:
            if self._closed or model_id in self._entries or model_id in self._loading:
                return False
            host = self.host.get(model_id)
            if host is not None and not host.ready:
                return False  # still on its way to host memory
            reservation = self._reserve(model_id, waiting, ahead=True)
            if reservation is None:
                return False
            self.stats.loads_ahead += 1
        threading.Thread(
            target=self._load_in_background, args=(reservation,), name="swapless-load-ahead", daemon=True
        ).start()
        return True

    @overload
    def _reserve(self, model_id: str, waiting: Mapping[str, int]) -> _Reservation: ...
    @overload
    def _reserve(self, model_id: str, waiting: Mapping[str, int], *, ahead: Literal[True]) -> _Reservation | None: ...

    def _reserve(self, model_id: str, waiting: Mapping[str, int], *, ahead: bool = False) -> _Reservation | None:
        """Under the lock: take the worker to load, evict what its room needs, and hold that room.

        For a use, waits for pinned models to be released (``_make_room``). Ahead, evicts only idle models with no
        waiting work, and returns None when that is not enough.

        Raises:
            ModelTooLarge, ModelLoadError: for a use, no room can be made.
        """
        spec = self.store.get(model_id)
        host = self.host.get(model_id) if ahead else self.host.take(model_id)
        worker = host.entry.worker if host is not None else self.factory(spec)
        remote = worker.remote
        size = host.size_bytes if host is not None else self._costs.sizes.get(model_id)
        if ahead:
            victims = self._room_ahead(model_id, size, remote, waiting)
            if victims is None or (host is not None and self.host.take(model_id) is not host):
                return None
        else:
            try:
                victims = self._make_room(model_id, size or 0, remote, waiting)
            except SwaplessError:
                if host is not None:
                    unload_entry(host.entry)
                raise
        self._evict_each(victims, waiting)
        loading = self._loading[model_id] = Loading(size or 0, remote)
        return _Reservation(spec, worker, remote, host, size, loading)

    def _load_in_background(self, res: _Reservation) -> None:
        spec = res.spec
        try:
            entry: LoadedModel | None = self._load(res)
        except Exception as err:  # noqa: BLE001 - the group that needs it loads it again and reports the error
            logger.warning("loading %s ahead failed (%s); its group will load it", spec.id, err)
            entry = None
        with self._cond:
            del self._loading[spec.id]
            if entry is not None and self._closed:
                unload_entry(entry)
            elif entry is not None:
                self._entries[spec.id] = entry
                res.loading.entry = entry
            self._cond.notify_all()
        res.loading.done.set()

    def _load(self, res: _Reservation) -> LoadedModel:
        """Load the reserved worker outside the cache's lock, or swap it in from the host tier. Local loads take
        turns, after the queued moves to host memory."""
        if res.remote:
            return self._load_now(res.spec, res.worker, res.remote, None)
        with self._local_load_lock:
            self.host.settle()
            return self._load_now(res.spec, res.worker, res.remote, res.host)

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
                safe_unload(worker)
                raise
            except Exception as err:  # any loader failure becomes a clear ModelLoadError
                with self._cond:
                    evicted = attempt == 1 and is_out_of_memory(err) and self._evict_all_unpinned(remote)
                    if not evicted:
                        self.stats.load_failures += 1
                if not (evicted and host is not None):  # a copy half done is kept for the retry
                    safe_unload(worker)
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

    def _make_room(self, model_id: str, incoming_bytes: int, remote: bool, waiting: Mapping[str, int]) -> list[str]:
        """The models to evict so that ``model_id`` fits, waiting up to ``pin_wait_s`` for pinned ones."""
        budget = None if remote else self.memory_budget_bytes
        if budget is not None and incoming_bytes > budget:
            raise ModelTooLarge(model_id, incoming_bytes, budget)
        deadline = time.monotonic() + self.pin_wait_s
        while True:
            victims = self._victims(model_id, incoming_bytes, remote, waiting, ahead=False)
            if victims is not None:
                return victims
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ModelLoadError(model_id, "no room: every loaded model is busy with a batch; try again later")
            self._cond.wait(remaining)  # a pinned model is released -> try again

    def _room_ahead(
        self, model_id: str, size: int | None, remote: bool, waiting: Mapping[str, int]
    ) -> list[str] | None:
        """The models to evict for a load ahead, or None when it should not start."""
        if any(r.remote == remote for r in self._loading.values()):
            return None  # one load ahead at a time, and none that would wait behind a load a group needs
        if size is None and not remote and self.memory_budget_bytes is not None:
            return None  # its size is known only once it has been loaded: it could overrun the budget
        return self._victims(model_id, size or 0, remote, waiting, ahead=True)

    def _victims(
        self, model_id: str, incoming_bytes: int, remote: bool, waiting: Mapping[str, int], *, ahead: bool
    ) -> list[str] | None:
        """``choose_victims`` over ``remote``'s pool; loads in progress hold their room. Ahead, a model in use, with
        work waiting, or resident is never evicted (the load may not be needed)."""
        pool = [e for e in self._entries.values() if e.remote == remote]
        reserved = [
            Cached(f"\0{m}", r.size_bytes, True, remote)
            for m, r in self._loading.items()
            if r.remote == remote and m != model_id
        ]
        now = time.monotonic()
        if ahead:
            cached = [
                Cached(e.model_id, e.size_bytes, e.pins > 0 or waiting.get(e.model_id, 0) > 0 or self.resident(e, now),
                       e.remote)
                for e in pool
            ]
        else:
            cached = [Cached(e.model_id, e.size_bytes, e.pins > 0, e.remote, self.resident(e, now)) for e in pool]
        return choose_victims(
            cached + reserved,
            incoming_bytes=incoming_bytes,
            max_models=self.remote_max_models if remote else self.max_models,
            memory_budget_bytes=None if remote else self.memory_budget_bytes,
            keep=None if ahead else waiting,
        )

    def _evict_each(self, victims: list[str], waiting: Mapping[str, int]) -> None:
        for victim in victims:
            self._evict(victim, waiting)

    def _evict(self, model_id: str, waiting: Mapping[str, int]) -> None:
        """Take an idle model off the device (under the lock): into the host tier if it may go there (its move is
        carried out before the next load), else unloaded."""
        entry = self._entries.pop(model_id)
        self.stats.evictions += 1
        if not self.host.admit(entry, waiting):
            unload_entry(entry)

    def _evict_all_unpinned(self, remote: bool) -> bool:
        victims = [e.model_id for e in self._entries.values() if e.remote == remote and e.pins == 0]
        for model_id in victims:
            self._evict(model_id, {})
        return bool(victims)

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
                unload_entry(entry)
            self.host.close()
