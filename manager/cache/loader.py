"""Running one load, or one swap-in from the host tier, outside the cache's lock."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from swapless.config.errors import ModelLoadError, SwaplessError
from swapless.manager.cache.entries import is_out_of_memory, safe_unload
from swapless.manager.cache.host import HostEntry, HostTier
from swapless.manager.frameworks.worker import ModelWorker
from swapless.manager.registry.specs import ModelSpec

__all__ = ["Loader"]

logger = logging.getLogger(__name__)


class Loader:
    """Loads workers for one cache: local loads take turns, after the queued moves to host memory.

    Args:
        host: the cache's host tier, whose queued moves go before each local load.
        free_device: evicts every idle model of a pool (``remote`` or local); returns whether any went. Called
            once when a load runs out of memory, before its one retry.
    """

    def __init__(self, host: HostTier, free_device: Callable[[bool], bool]) -> None:
        self._host = host
        self._free_device = free_device
        self._turn = threading.Lock()

    def load(self, spec: ModelSpec, worker: ModelWorker, remote: bool, host: HostEntry | None) -> float:
        """Load ``worker``, or swap it in from ``host``. Returns the seconds it took.

        Raises:
            SwaplessError: the load failed (any other failure becomes a ``ModelLoadError``).
        """
        if remote:
            return self._load_now(spec, worker, remote, None)
        with self._turn:
            self._host.settle()
            return self._load_now(spec, worker, remote, host)

    def settle(self, wait: bool = False) -> None:
        """Carry out the queued moves to host memory, unless (``wait`` off) a load holds the local turn: that
        load, or the next, carries them out before it loads."""
        if not self._turn.acquire(blocking=wait):
            return
        try:
            self._host.settle()
        finally:
            self._turn.release()

    def _load_now(self, spec: ModelSpec, worker: ModelWorker, remote: bool, host: HostEntry | None) -> float:
        started = time.perf_counter()
        for attempt in (1, 2):
            try:
                if host is not None:
                    worker.to_device()
                else:
                    worker.load()
                break
            except SwaplessError:
                safe_unload(worker)
                raise
            except Exception as err:  # any loader failure becomes a clear ModelLoadError
                evicted = attempt == 1 and is_out_of_memory(err) and self._free_device(remote)
                if not (evicted and host is not None):  # a copy half done is kept for the retry
                    safe_unload(worker)
                if evicted:
                    if not remote:
                        self._host.settle()
                    logger.warning("out of memory loading %s; evicted every idle model, retrying once", spec.id)
                    continue
                what = "out of memory" if is_out_of_memory(err) else f"{type(err).__name__}: {err}"
                if host is not None:
                    what = f"swapping it in from host memory: {what} (its next load is from disk)"
                raise ModelLoadError(spec.id, what) from err
        return time.perf_counter() - started
