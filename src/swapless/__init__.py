"""Swapless: many models from limited GPU memory, as a queue-based batch inference worker (Celery + Redis).

The names below are the public surface; every other module is private and may move between releases.

- Producers: ``Client`` (submit, submit_jobs, map, gather, cancel), ``Job`` (one job's handle), and ``BulkJob`` /
  ``BulkRun`` (a JSONL or CSV file through the queue, resumable).
- Errors: ``SwaplessError`` and its subclasses, one per thing that can go wrong; each message says what to fix.
- Frameworks: subclass ``ModelWorker`` with ``framework="name"`` in a module named by ``SWAPLESS_PLUGINS``; the
  contract (``PLUGIN_API``) is in ``docs/guides/frameworks.md``. ``ModelSpec`` is a models-file entry, ``InputType`` its
  input kind, ``WorkerLimits`` the per-process input limits a worker applies.
- ``celery -A swapless worker`` finds the worker's Celery app as ``swapless.celery``.

Worker-side names (``ModelWorker``, ``ModelSpec``, ``InputType``, ``WorkerLimits``, ``celery``) are imported on
first access, so a producer that imports ``swapless`` loads no model framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from swapless.config.errors import (
    BackendUnavailable,
    BulkFileError,
    ConfigError,
    DeadlinePassed,
    DuplicateFramework,
    InputError,
    JobCancelled,
    JobExpired,
    JobFailed,
    JobTimeout,
    LocalModeError,
    MetricsUnavailable,
    ModelLoadError,
    ModelTooLarge,
    PoisonJob,
    PredictionFailed,
    QueueFull,
    QueueUnavailable,
    SwaplessError,
    UnknownFramework,
    UnknownModel,
    WebhookRefused,
)

if TYPE_CHECKING:
    from celery import Celery

    from swapless.manager.frameworks.worker import ModelWorker, WorkerLimits
    from swapless.manager.registry.specs import InputType, ModelSpec
    from swapless.tasks.client import Client, Job
    from swapless.tasks.client.bulk import BulkJob, BulkRun

__version__ = "0.1.0"

#: The version of the framework contract (``ModelWorker``'s methods and what the worker expects of them). A plugin
#: may check it; it changes only when a plugin written for the previous version would stop working.
PLUGIN_API = 1

__all__ = [
    "PLUGIN_API",
    "BackendUnavailable",
    "BulkFileError",
    "BulkJob",
    "BulkRun",
    "Client",
    "ConfigError",
    "DeadlinePassed",
    "DuplicateFramework",
    "InputError",
    "InputType",
    "Job",
    "JobCancelled",
    "JobExpired",
    "JobFailed",
    "JobTimeout",
    "LocalModeError",
    "MetricsUnavailable",
    "ModelLoadError",
    "ModelSpec",
    "ModelTooLarge",
    "ModelWorker",
    "PoisonJob",
    "PredictionFailed",
    "QueueFull",
    "QueueUnavailable",
    "SwaplessError",
    "UnknownFramework",
    "UnknownModel",
    "WebhookRefused",
    "WorkerLimits",
    "__version__",
    "celery",
]

#: name -> the private module that defines it, imported on first access
_LAZY = {
    "Client": "swapless.tasks.client",
    "Job": "swapless.tasks.client",
    "BulkJob": "swapless.tasks.client.bulk",
    "BulkRun": "swapless.tasks.client.bulk",
    "ModelWorker": "swapless.manager.frameworks.worker",
    "WorkerLimits": "swapless.manager.frameworks.worker",
    "ModelSpec": "swapless.manager.registry.specs",
    "InputType": "swapless.manager.registry.specs",
}


def __getattr__(name: str) -> Any:
    if name == "celery":  # the worker's app, built on first access so a bad setting is one clear line
        from swapless.tasks.worker.task import app

        return app
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'swapless' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    celery: Celery
