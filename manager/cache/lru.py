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
from functools import partial
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
    unload_entry,
)
from swapless.manager.cache.eviction import choose_victims, pool_candidates
from swapless.manager.cache.host import HostEntry, HostTier
from swapless.manager.cache.loader import Loader
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
        self._closed = False
        self._cond = threading.Condition(threading.RLock())
        self.host = HostTier(host_max_models, host_memory_budget_bytes, self.stats)
        self._loader = Loader(self.host, self._evict_all_unpinned)

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
        """Whether ``entry`` is kept loaded by its spec, or is among its pool's hottest interactive models."""
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
        """Expected seconds to bring ``model_id`` onto the device (0 when loaded or being loaded)."""
        with self._cond:
            if model_id in self._loading:
                return 0.0
            return self._costs.cost_s(model_id, self.tier(model_id))

    # -- use ---------------------------------------------------------------------------------------------

    @contextmanager
    def use(
        self, model_id: str, waiting: Mapping[str, int] | None = None, *, interactive: int = 0
    ) -> Iterator[ModelWorker]:
        """Yield the loaded worker for ``model_id``, pinned while the block runs, loading it if needed.

        Args:
            model_id: the model.
            waiting: jobs still waiting per model; models with none are evicted first.
            interactive: how many of the jobs it runs for are interactive.

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
                self._loader.settle(wait=True)
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
        self._loader.settle()
        return entry

    def load_ahead(self, model_id: str, waiting: Mapping[str, int]) -> bool:
        """Start loading ``model_id`` on a thread of its own, if it fits without evicting a busy model.

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
        """Under the lock: take the worker to load, evict for its room and hold that room (None: no load ahead).

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
        """Load the reserved worker outside the lock, or swap it in; record what it took."""
        spec, worker, host = res.spec, res.worker, res.host
        try:
            load_s = self._loader.load(spec, worker, res.remote, host)
        except SwaplessError:
            with self._cond:
                self.stats.load_failures += 1
            raise
        if host is not None:
            with self._cond:
                self._costs.host_s[spec.id] = load_s
                self.stats.swap_ins += 1
                self.stats.swap_in_seconds.setdefault(spec.id, []).append(load_s)
            logger.info("swapped %s in from host memory in %.3f s, %d bytes", spec.id, load_s, host.size_bytes)
            return LoadedModel(spec.id, worker, host.size_bytes, load_s, res.remote, hits=host.entry.hits,
                               from_host=True)
        size = 0 if res.remote else worker.memory_bytes
        with self._cond:
            self._costs.sizes[spec.id] = size
            self._costs.disk_s[spec.id] = load_s
            self.stats.loads += 1
            self.stats.load_seconds.setdefault(spec.id, []).append(load_s)
        logger.info("loaded %s (%s) in %.3f s, %d bytes", spec.id, spec.framework, load_s, size)
        return LoadedModel(spec.id, worker, size, load_s, res.remote)

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
        pool = [e for e in self._entries.values() if e.remote == remote]
        reserved = {m: r.size_bytes for m, r in self._loading.items() if r.remote == remote and m != model_id}
        return choose_victims(
            pool_candidates(pool, reserved, waiting, partial(self.resident, now=time.monotonic()), remote=remote,
                            ahead=ahead),
            incoming_bytes=incoming_bytes,
            max_models=self.remote_max_models if remote else self.max_models,
            memory_budget_bytes=None if remote else self.memory_budget_bytes,
            keep=None if ahead else waiting,
        )

    def _evict_each(self, victims: list[str], waiting: Mapping[str, int]) -> None:
        for victim in victims:
            self._evict(victim, waiting)

    def _evict(self, model_id: str, waiting: Mapping[str, int]) -> None:
        """Take an idle model off the device (under the lock), into the host tier or unloaded."""
        entry = self._entries.pop(model_id)
        self.stats.evictions += 1
        if not self.host.admit(entry, waiting):
            unload_entry(entry)

    def _evict_all_unpinned(self, remote: bool) -> bool:
        with self._cond:
            victims = [e.model_id for e in self._entries.values() if e.remote == remote and e.pins == 0]
            for model_id in victims:
                self._evict(model_id, {})
            return bool(victims)

    # -- what was learned --------------------------------------------------------------------------------

    def seed(
        self, model_id: str, *, load_s: float | None = None, size_bytes: int | None = None,
        host_load_s: float | None = None,
    ) -> None:
        """Take a model's load times and size as another worker measured them, until this one does."""
        with self._cond:
            self._costs.seed(model_id, load_s=load_s, size_bytes=size_bytes, host_load_s=host_load_s)

    def learned(self, model_id: str) -> dict[str, float | int]:
        """What this cache has measured of a model (``LoadCosts.learned``)."""
        with self._cond:
            return self._costs.learned(model_id)

    # -- explicit control --------------------------------------------------------------------------------

    def evict(self, model_id: str) -> bool:
        """Take ``model_id`` off the device now if it is loaded and idle. Returns whether it left."""
        with self._cond:
            entry = self._entries.get(model_id)
            if entry is None or entry.pins > 0:
                return False
            self._evict(model_id, {})
        self._loader.settle()
        return True

    def close(self) -> None:
        """Unload every model, in both tiers; a load running ahead unloads its model when it ends."""
        with self._cond:
            self._closed = True
            while self._entries:
                _, entry = self._entries.popitem(last=False)
                unload_entry(entry)
            self.host.close()
