"""The model side: which models exist (ModelStore), what is loaded (ModelManager), how workers are built
(ModelEngine) and run (ModelWorker). Nothing here imports Celery."""

from manager.cache import CacheStats, LoadedModel, ModelManager
from manager.engine import ModelEngine, load_builtin_workers
from manager.errors import (
    BackendUnavailable,
    ConfigError,
    DuplicateFramework,
    InputError,
    ModelLoadError,
    ModelTooLarge,
    PoisonJob,
    PredictionFailed,
    SwaplessError,
    UnknownFramework,
    UnknownModel,
)
from manager.runner import Backlog, Job, Outcome, run_group
from manager.specs import InputType, ModelSpec
from manager.store import ModelStore
from manager.worker import ModelWorker, WorkerLimits, registry

__all__ = [
    "Backlog",
    "BackendUnavailable",
    "CacheStats",
    "ConfigError",
    "DuplicateFramework",
    "InputError",
    "InputType",
    "Job",
    "LoadedModel",
    "ModelEngine",
    "ModelLoadError",
    "ModelManager",
    "ModelSpec",
    "ModelStore",
    "ModelTooLarge",
    "ModelWorker",
    "Outcome",
    "PoisonJob",
    "PredictionFailed",
    "SwaplessError",
    "UnknownFramework",
    "UnknownModel",
    "WorkerLimits",
    "load_builtin_workers",
    "registry",
    "run_group",
]
