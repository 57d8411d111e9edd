"""What ``bench/gpu.py`` measures on the device itself, in this process: the device, each model's load time and the
CUDA memory it leaves behind once unloaded, the device memory a worker process takes, and the memory budget a
worker runs with.

Every figure is of the device it names; on a machine without CUDA the memory figures are ``None`` (shown as
"n/a (no CUDA)"), never a guess.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Self

from bench.common import inputs_for
from bench.profile import cpu_s

if TYPE_CHECKING:
    from swapless.manager.registry.specs import ModelSpec

__all__ = [
    "UNLOAD_TOLERANCE_BYTES",
    "DeviceInfo",
    "DeviceUse",
    "LoadProbe",
    "budget_in_effect",
    "compute_cpu_ms_per_job",
    "device_info",
    "probe_loads",
]

#: How far above its value before the load ``torch.cuda.memory_allocated()`` may stay once a model is unloaded.
UNLOAD_TOLERANCE_BYTES = 64 * 1024 * 1024
#: Inputs of the one forward pass run between a probe's load and its unload.
PROBE_INPUTS = 8


@dataclass(frozen=True)
class DeviceInfo:
    """The device the benchmark runs on.

    Attributes:
        device: what the workers are given (``cuda`` or ``cpu``).
        label: how rows name it: ``cuda (NVIDIA H200)`` or ``cpu``.
        total_bytes: the device's memory (None on CPU).
    """

    device: str
    label: str
    total_bytes: int | None

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def device_info(choice: str) -> DeviceInfo:
    """The device for ``choice``: ``auto`` (cuda when torch sees one, else cpu), ``cuda`` or ``cpu``.

    Raises:
        RuntimeError: ``cuda`` was asked for and torch sees no CUDA device.
    """
    import torch

    cuda = torch.cuda.is_available()
    if choice == "cuda" and not cuda:
        raise RuntimeError("--device cuda: torch sees no CUDA device")
    if choice == "cpu" or not cuda:
        return DeviceInfo("cpu", "cpu", None)
    return DeviceInfo(
        "cuda", f"cuda ({torch.cuda.get_device_name(0)})", torch.cuda.get_device_properties(0).total_memory
    )


def allocated_bytes(info: DeviceInfo) -> int | None:
    """``torch.cuda.memory_allocated()`` after a synchronize; None on CPU."""
    if not info.cuda:
        return None
    import torch

    torch.cuda.synchronize()
    return int(torch.cuda.memory_allocated())


@dataclass(frozen=True)
class LoadProbe:
    """One model's load, one forward pass and its unload, in this process.

    Attributes:
        model_id: the model.
        load_s: seconds of ``load()`` from its saved files (tokenizer or transforms included).
        size_bytes: what the loaded model reports taking (``memory_bytes``).
        before, after_load, after_unload: ``torch.cuda.memory_allocated()`` at each point (None on CPU).
    """

    model_id: str
    load_s: float
    size_bytes: int
    before: int | None
    after_load: int | None
    after_unload: int | None

    @property
    def left_bytes(self) -> int | None:
        """Allocated bytes the unload did not give back (None on CPU)."""
        if self.before is None or self.after_unload is None:
            return None
        return self.after_unload - self.before


def probe_loads(models_file: Path, info: DeviceInfo, seed: int = 0) -> list[LoadProbe]:
    """Load each model of ``models_file`` in turn on the device, run one forward pass of ``PROBE_INPUTS`` inputs,
    unload it, and read the CUDA allocator at each step (after one unmeasured cycle per framework).

    Args:
        models_file: the models.
        info: the device.
        seed: for the inputs.

    Returns:
        One probe per model, in the file's order.
    """
    from swapless.manager import ModelEngine, ModelStore, WorkerLimits
    from swapless.manager.registry.specs import InputType

    engine = ModelEngine(WorkerLimits(device=info.device))
    store = ModelStore.from_file(models_file, engine.frameworks)
    engine.warm_up(spec.framework for spec in store)
    image_ids = {spec.id for spec in store if spec.type is InputType.IMAGE}
    rng = random.Random(seed)

    def cycle(spec: ModelSpec) -> LoadProbe:
        worker = engine.build(spec)
        before = allocated_bytes(info)
        started = time.perf_counter()
        worker.load()
        load_s = time.perf_counter() - started
        after_load = allocated_bytes(info)
        size = worker.memory_bytes
        worker.predict([worker.prepare(v) for v in inputs_for(spec.id, rng, PROBE_INPUTS, image_ids)])
        worker.unload()
        return LoadProbe(spec.id, load_s, size, before, after_load, allocated_bytes(info))

    # The first load and pass of a framework in a process pay one-off costs (lazy imports, the CUDA context and
    # kernels, cuBLAS workspaces): one model of each goes through once, unmeasured.
    for first in {spec.framework: spec for spec in reversed(list(store))}.values():
        cycle(first)
    return [cycle(spec) for spec in store]


@dataclass(frozen=True)
class TierProbe:
    """One model brought onto the device from each tier, through the cache (``ModelManager`` with a host tier).

    Attributes:
        model_id: the model.
        disk_s: a miss with the model only on disk: its load from its saved files.
        resident_s: a hit: ``use`` of the model while it is on the device.
        to_host_s: its move to host memory once evicted (pinned on CUDA).
        host_s: a miss with the model in the host tier: the copy back to the device.
        after_load, after_to_host, after_swap_in: ``torch.cuda.memory_allocated()`` after each step (None on CPU).
        before: allocated before the load.
    """

    model_id: str
    disk_s: float
    resident_s: float
    to_host_s: float
    host_s: float
    before: int | None
    after_load: int | None
    after_to_host: int | None
    after_swap_in: int | None


def probe_tiers(models_file: Path, info: DeviceInfo) -> list[TierProbe]:
    """For each model of ``models_file`` in turn, through a cache of one model with a host tier: a load from disk, a
    hit, an eviction (a move to host memory), a swap-in from host memory; the CUDA allocator after each step. One
    unmeasured round per framework first (one-off costs, as ``probe_loads``)."""
    from swapless.manager import ModelEngine, ModelManager, ModelStore, WorkerLimits

    engine = ModelEngine(WorkerLimits(device=info.device))
    store = ModelStore.from_file(models_file, engine.frameworks)
    engine.warm_up(spec.framework for spec in store)

    def cycle(model_id: str) -> TierProbe:
        manager = ModelManager(store, engine, max_models=1, host_max_models=1, host_memory_budget_bytes=1 << 50)

        def timed_use() -> float:
            started = time.perf_counter()
            with manager.use(model_id):
                return time.perf_counter() - started

        try:
            before = allocated_bytes(info)
            disk_s = timed_use()
            after_load = allocated_bytes(info)
            resident_s = timed_use()
            manager.evict(model_id)  # into the host tier: the move is carried out before evict returns
            to_host_s = manager.stats.swap_out_s_total
            after_to_host = allocated_bytes(info)
            host_s = timed_use()
            after_swap_in = allocated_bytes(info)
        finally:
            manager.close()
        return TierProbe(model_id, disk_s, resident_s, to_host_s, host_s, before, after_load, after_to_host,
                         after_swap_in)

    for first in {spec.framework: spec for spec in reversed(list(store))}.values():
        cycle(first.id)
    return [cycle(model_id) for model_id in store.ids()]


def compute_cpu_ms_per_job(
    models_file: Path, info: DeviceInfo, model_id: str, values: list[str], batch_size: int
) -> float:
    """CPU milliseconds per job (this process, all threads) of ``model_id``'s forward passes over ``values`` at
    ``batch_size``, inputs prepared as a worker does: the baseline of a worker's CPU per job on one model.

    The model is loaded and warmed first (not counted); the figure is the median of three runs over ``values``.
    """
    import os
    import statistics

    from swapless.manager import ModelEngine, ModelStore, WorkerLimits

    engine = ModelEngine(WorkerLimits(device=info.device, max_batch_size=batch_size, tune_batch_size=False))
    worker = engine.build(ModelStore.from_file(models_file, engine.frameworks).get(model_id))
    worker.load()
    try:
        worker.predict([worker.prepare(v) for v in values[:batch_size]])  # first-call costs once
        runs = []
        for _ in range(3):
            before = cpu_s(os.getpid())
            worker.predict([worker.prepare(v) for v in values])
            runs.append(1000 * (cpu_s(os.getpid()) - before) / len(values))
        return statistics.median(runs)
    finally:
        worker.unload()


class DeviceUse:
    """The peak of the device memory in use (total − free, from ``cudaMemGetInfo``, every process together) above
    what was in use when it started, sampled on a thread: what a worker process started meanwhile takes, its CUDA
    context included. On CPU it samples nothing and its peak is None.

    Args:
        info: the device.
        interval_s: seconds between samples.
    """

    def __init__(self, info: DeviceInfo, interval_s: float = 0.02) -> None:
        self.info = info
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._baseline = 0
        self._peak = 0

    @staticmethod
    def _used() -> int:
        import torch

        free, total = torch.cuda.mem_get_info()
        return int(total - free)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._peak = max(self._peak, self._used())

    def __enter__(self) -> Self:
        if self.info.cuda:
            self._baseline = self._peak = self._used()
            self._thread = threading.Thread(target=self._sample, name="bench-device-use", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._peak = max(self._peak, self._used())

    @property
    def peak_bytes(self) -> int | None:
        """Peak bytes in use above the start (None on CPU)."""
        return self._peak - self._baseline if self.info.cuda else None


def budget_in_effect() -> int | None:
    """The byte budget a ``swapless worker`` started from this environment with no ``--memory-budget`` runs with:
    ``SWAPLESS_MEMORY_BUDGET_BYTES``, which has no default (None: no byte limit, only ``--max-models``)."""
    from swapless.config.settings import Settings

    return Settings().cache.memory_budget_bytes
