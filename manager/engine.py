"""ModelEngine: the factory that turns a ModelSpec into an (unloaded) ModelWorker of its framework."""

from __future__ import annotations

import importlib

from manager.specs import ModelSpec
from manager.worker import ModelWorker, WorkerLimits, WorkerRegistry, registry

__all__ = ["BUILTIN_WORKERS", "ModelEngine", "load_builtin_workers"]

#: Modules whose import registers the built-in frameworks. Imported on demand: torch is heavy and producers
#: that only submit jobs never need it.
BUILTIN_WORKERS = {
    "transformers": "manager.transformers_worker",
    "torchvision": "manager.torchvision_worker",
    "triton": "manager.triton_worker",
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
        cls = self.workers[spec.framework]
        return cls(spec, self.limits)

    __call__ = build
