"""The model side: which models exist (ModelStore), what is loaded (ModelManager), how workers are built
(ModelEngine) and run (ModelWorker). Nothing here imports Celery. Its errors are in ``config.errors``."""

from manager.cache import CacheStats, LoadedModel, ModelManager
from manager.engine import ModelEngine, load_builtin_workers
from manager.runner import Backlog, Job, Outcome, run_group
from manager.specs import InputType, ModelSpec
from manager.store import ModelStore
from manager.worker import ModelWorker, WorkerLimits, registry

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
