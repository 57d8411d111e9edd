"""The model side: which models exist (ModelStore), what is loaded (ModelManager), how workers are built
(ModelEngine) and run (ModelWorker). Nothing here imports Celery. Its errors are in ``config.errors``."""

from manager.batching.runner import Backlog, Job, Outcome, run_group
from manager.cache.lru import CacheStats, LoadedModel, ModelManager
from manager.frameworks.engine import ModelEngine, load_builtin_workers
from manager.frameworks.worker import ModelWorker, WorkerLimits, registry
from manager.registry.specs import InputType, ModelSpec
from manager.registry.store import ModelStore

__all__ = [
    "Backlog",
    "CacheStats",
    "InputType",
    "Job",
    "LoadedModel",
    "ModelEngine",
    "ModelManager",
    "ModelSpec",
    "ModelStore",
    "ModelWorker",
    "Outcome",
    "WorkerLimits",
    "load_builtin_workers",
    "registry",
    "run_group",
]
