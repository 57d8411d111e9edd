"""What one worker holds of the model side: the settings, the registry and the model cache, built by
``build_runtime`` (the worker's start-up builds one, ``tasks.worker.context``; ``swapless worker`` builds one
first to check the models file and the settings).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from config.errors import ConfigError
from config.settings import Settings
from manager import ModelEngine, ModelManager, ModelStore, WorkerLimits

__all__ = ["Runtime", "build_runtime", "load_plugins"]


@dataclass
class Runtime:
    """What one worker process holds: the registry, the cache and the settings."""

    settings: Settings
    store: ModelStore
    manager: ModelManager


def load_plugins(settings: Settings) -> None:
    """Import the modules of ``SWAPLESS_PLUGINS``, which register custom frameworks.

    Raises:
        ConfigError: a plugin cannot be imported.
    """
    for module in filter(None, (name.strip() for name in settings.plugins.split(","))):
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError("SWAPLESS_PLUGINS", f"cannot import {module!r}: {err}") from None


def build_runtime(settings: Settings, *, warm_up: bool = False) -> Runtime:
    """Import the plugins, read the models file (failing at start-up on a bad entry) and build an empty cache.

    Args:
        settings: the process settings.
        warm_up: import the frameworks' libraries now, so that the first job does not wait for them.

    Raises:
        ConfigError: a plugin cannot be imported, or the models file is missing or invalid.
    """
    s = settings
    load_plugins(s)
    limits = WorkerLimits(
        device=s.device,
        max_batch_size=s.max_batch_size,
        max_text_chars=s.max_text_chars,
        max_image_bytes=s.max_image_bytes,
        max_image_pixels=s.max_image_pixels,
        input_root=str(s.input_root) if s.input_root else None,
        triton_url=s.triton_url,
    )
    engine = ModelEngine(limits)
    store = ModelStore.from_file(s.models_file, engine.frameworks)
    if warm_up:
        engine.warm_up(spec.framework for spec in store)
    manager = ModelManager(
        store,
        engine,
        max_models=s.max_models,
        memory_budget_bytes=s.memory_budget_bytes,
        remote_max_models=s.triton_max_models,
        host_max_models=s.host_max_models,
        host_memory_budget_bytes=s.host_memory_budget_bytes,
    )
    return Runtime(s, store, manager)
