"""What one worker process holds, built once per process: the settings, the registry and the model cache.

``get_runtime`` builds it on first use (the worker's start-up, ``swapless worker``'s settings check, or an eager
``predict.apply``) and hands the same one to every later caller, so a process never holds two caches.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass

from config.errors import ConfigError
from config.settings import Settings, get_settings
from manager import ModelEngine, ModelManager, ModelStore, WorkerLimits

__all__ = ["Runtime", "build_runtime", "get_runtime", "load_plugins", "reset_runtime"]


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


def build_runtime(settings: Settings | None = None, *, warm_up: bool = False) -> Runtime:
    """Import the plugins, read the models file (failing at start-up on a bad entry) and build an empty cache.

    Args:
        settings: the process settings (the environment's by default).
        warm_up: import the frameworks' libraries now, so that the first job does not wait for them.

    Raises:
        ConfigError: a plugin cannot be imported, or the models file is missing or invalid.
    """
    s = settings or get_settings()
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
    )
    return Runtime(s, store, manager)


_runtime: Runtime | None = None
_lock = threading.Lock()


def get_runtime(*, warm_up: bool = False) -> Runtime:
    """This process's runtime, built from the environment's settings on first use.

    Raises:
        ConfigError: as ``build_runtime``.
    """
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = build_runtime(warm_up=warm_up)
        return _runtime


def reset_runtime() -> None:
    """Unload every model and forget the runtime (worker shutdown); the next ``get_runtime`` builds a new one."""
    global _runtime
    with _lock:
        runtime, _runtime = _runtime, None
    if runtime is not None:
        runtime.manager.close()
