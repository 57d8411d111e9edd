"""ModelEngine: the factory that turns a ModelSpec into an (unloaded) ModelWorker of its framework."""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterable

from swapless.manager.batching.tuning import BatchTuner
from swapless.manager.frameworks.worker import ModelWorker, WorkerLimits, WorkerRegistry, registry
from swapless.manager.registry.specs import ModelSpec

__all__ = ["BUILTIN_WORKERS", "ModelEngine", "load_builtin_workers"]

#: Modules whose import registers the built-in frameworks. Imported on demand: torch is heavy and producers
#: that only submit jobs never need it.
BUILTIN_WORKERS = {
    "transformers": "swapless.manager.frameworks.transformers_worker",
    "torchvision": "swapless.manager.frameworks.torchvision_worker",
    "triton": "swapless.manager.frameworks.triton.worker",
}


def load_builtin_workers() -> WorkerRegistry:
    """Import the built-in worker modules (registering them) and return the registry."""
    for module in BUILTIN_WORKERS.values():
        importlib.import_module(module)
    return registry


class ModelEngine:
    """Builds workers by framework name. Callable, so it can be handed to ModelManager as its factory.

    Args:
        limits: the per-process input limits and device handed to every worker.
        workers: the registry to look frameworks up in (the global one by default).
    """

    def __init__(self, limits: WorkerLimits | None = None, workers: WorkerRegistry | None = None) -> None:
        self.limits = limits or WorkerLimits()
        self.workers = workers if workers is not None else registry
        # Batch-size measurements outlive a model's unload: one tuner per model id for the engine's lifetime.
        self._tuners: dict[str, BatchTuner] = {}

    @property
    def frameworks(self) -> list[str]:
        """Names of the frameworks this engine can build, built-in ones included."""
        return sorted(set(self.workers) | set(BUILTIN_WORKERS))

    def build(self, spec: ModelSpec) -> ModelWorker:
        """A new, unloaded worker for ``spec``.

        Raises:
            UnknownFramework: no worker class is registered for ``spec.framework``.
        """
        if spec.framework not in self.workers and spec.framework in BUILTIN_WORKERS:
            importlib.import_module(BUILTIN_WORKERS[spec.framework])
            if spec.framework in registry:  # a custom registry still gets the built-in class
                self.workers.setdefault(spec.framework, registry[spec.framework])
        cls = self.workers[spec.framework]
        worker = cls(spec, self.limits)
        if self.limits.tune_batch_size and not worker.remote:
            worker.tuner = self._tuners.setdefault(spec.id, BatchTuner(worker.batch_size))
        return worker

    def runs_adapters(self, framework: str) -> bool:
        """Whether ``framework``'s workers run variants (``ModelWorker.runs_adapters``)."""
        if framework not in self.workers and framework in BUILTIN_WORKERS:
            importlib.import_module(BUILTIN_WORKERS[framework])
        cls = self.workers.get(framework) or registry.get(framework)
        return cls is not None and cls.runs_adapters

    def seed_tuner(self, spec: ModelSpec, costs: dict[int, float]) -> None:
        """Start ``spec``'s tuner from costs measured earlier (by another worker on the same kind of device)."""
        if not self.limits.tune_batch_size:
            return
        worker = self.build(spec)
        if worker.tuner is not None:
            for size, seconds in costs.items():
                if size in worker.tuner.sizes:
                    worker.tuner.cost_s.setdefault(size, seconds)

    def tuner(self, model_id: str) -> BatchTuner | None:
        """The batch-size tuner of ``model_id`` (None before its first build, or with tuning off)."""
        return self._tuners.get(model_id)

    def per_input_s(self) -> dict[str, float]:
        """Per model measured so far, the seconds per input at its cheapest batch size (what a full queue costs a
        job)."""
        found = {}
        for model_id, tuner in list(self._tuners.items()):
            costs = [c for c in tuner.cost_s.values() if c > 0 and math.isfinite(c)]
            if costs:
                found[model_id] = min(costs)
        return found

    def warm_up(self, frameworks: Iterable[str]) -> None:
        """Import the libraries of ``frameworks`` now (worker start-up) so the first job does not pay for it."""
        for framework in sorted(set(frameworks)):
            if framework not in self.workers and framework in BUILTIN_WORKERS:
                importlib.import_module(BUILTIN_WORKERS[framework])
            cls = self.workers.get(framework)
            if cls is not None:
                cls.warm_up()

    __call__ = build
