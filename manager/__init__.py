"""The model side: which models exist (ModelStore), what is loaded (ModelManager), how workers are built
(ModelEngine) and run (ModelWorker). Nothing here imports Celery. Its errors are in ``swapless.config.errors``."""

from swapless.manager.batching.runner import Backlog, Outcome, WorkItem, run_group
from swapless.manager.cache.lru import CacheStats, LoadedModel, ModelManager
from swapless.manager.frameworks.engine import ModelEngine, load_builtin_workers
from swapless.manager.frameworks.worker import ModelWorker, WorkerLimits, registry
from swapless.manager.registry.specs import InputType, ModelSpec
from swapless.manager.registry.store import ModelStore

__all__ = [
    "Backlog",
    "CacheStats",
    "InputType",
    "LoadedModel",
    "ModelEngine",
    "ModelManager",
    "ModelSpec",
    "ModelStore",
    "ModelWorker",
    "Outcome",
    "WorkItem",
    "WorkerLimits",
    "load_builtin_workers",
    "registry",
    "run_group",
]
