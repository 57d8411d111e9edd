"""The cache's plain records: an entry on the device, a load in progress, the counters, and the cost defaults."""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, fields
from enum import StrEnum

from swapless.manager.frameworks.worker import ModelWorker

__all__ = [
    "DEFAULT_LOAD_COST_S",
    "HOST_COST_FRACTION",
    "CacheCounters",
    "CacheStats",
    "InteractiveDemand",
    "LoadedModel",
    "Tier",
    "is_out_of_memory",
    "safe_unload",
    "unload_entry",
]

logger = logging.getLogger(__name__)

#: Seconds a model is assumed to take to load before it has been loaded once (used by the scheduler).
DEFAULT_LOAD_COST_S = 1.0
#: A swap-in from host memory not yet measured is assumed to cost this share of the model's load from disk (a copy
#: over PCIe against deserialising and building: ServerlessLLM and PipeSwitch measure a tenth or less).
HOST_COST_FRACTION = 0.1


class Tier(StrEnum):
    """Where a model is: loaded on the device, kept built in host memory, or only on disk."""

    DEVICE = "device"
    HOST = "host"
    DISK = "disk"


@dataclass
class LoadedModel:
    """One cache entry (on the device; in host memory for an entry of the host tier).

    ``load_s`` is what its last arrival on the device took: a load from disk, or a copy from host memory when
    ``from_host``.
    """

    model_id: str
    worker: ModelWorker
    size_bytes: int
    load_s: float
    remote: bool
    pins: int = 0
    hits: int = 0
    loaded_at: float = field(default_factory=time.time)
    from_host: bool = False
    #: When it last served interactive jobs (monotonic seconds; None: never since it arrived).
    interactive_at: float | None = None


@dataclass
class Loading:
    """A load in progress: the room it has reserved, and when it is over (``entry``: None if it failed)."""

    size_bytes: int
    remote: bool
    done: threading.Event = field(default_factory=threading.Event)
    entry: LoadedModel | None = None


@dataclass
class CacheCounters:
    """The cache's event counts since it was made, as each heartbeat publishes them (``CacheInfo``).

    ``loads`` counts loads from disk; ``swap_ins`` copies back from the host tier; ``swap_outs`` moves into it;
    ``host_evictions`` drops from it to disk; ``evictions`` models leaving the device, to either tier.
    """

    hits: int = 0
    misses: int = 0
    loads: int = 0
    evictions: int = 0
    load_failures: int = 0
    swap_ins: int = 0
    swap_outs: int = 0
    host_evictions: int = 0

    def counts(self) -> dict[str, int]:
        """The counters by name."""
        return {f.name: getattr(self, f.name) for f in fields(CacheCounters)}


@dataclass
class CacheStats(CacheCounters):
    """The counters, plus what stays in the worker: loads started ahead, and the measured seconds."""

    loads_ahead: int = 0
    load_seconds: dict[str, list[float]] = field(default_factory=dict)
    swap_in_seconds: dict[str, list[float]] = field(default_factory=dict)
    swap_out_s_total: float = 0.0


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` says memory ran out (``MemoryError``, or torch's ``OutOfMemoryError``, on any device)."""
    return isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError"


def safe_unload(worker: ModelWorker) -> None:
    """Free ``worker``'s memory; a failing unload is logged, never raised (it must not take the worker down)."""
    try:
        worker.unload()
    except Exception:
        logger.exception("unloading %s failed", worker.spec.id)


def unload_entry(entry: LoadedModel) -> None:
    """Unload a cache entry for good (``safe_unload``), logging it."""
    logger.info("unloading %s (%d bytes)", entry.model_id, entry.size_bytes)
    safe_unload(entry.worker)


class InteractiveDemand:
    """Interactive jobs per second of each model, an average that forgets with time constant ``tau_s``: which models
    are hot now. A model's rate decays by e every ``tau_s`` without jobs."""

    def __init__(self, tau_s: float) -> None:
        self.tau_s = max(tau_s, 1e-3)
        self._rates: dict[str, tuple[float, float]] = {}  # model -> (rate at ``at``, at)

    def add(self, model_id: str, jobs: int, now: float) -> None:
        self._rates[model_id] = (self.rate(model_id, now) + jobs / self.tau_s, now)

    def rate(self, model_id: str, now: float) -> float:
        rate, at = self._rates.get(model_id, (0.0, now))
        return rate * math.exp(-(now - at) / self.tau_s)

    def hottest(self, count: int, now: float) -> set[str]:
        """The ``count`` models with the highest rates now."""
        if count <= 0:
            return set()
        ranked = sorted(self._rates, key=lambda model_id: -self.rate(model_id, now))
        return set(ranked[:count])
