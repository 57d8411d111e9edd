"""Runtime: the settings, the registry and the model cache one worker holds, built by ``build_runtime``.
"""

from __future__ import annotations

import gc
import importlib
import sys
from dataclasses import dataclass

from swapless.config.errors import ConfigError
from swapless.config.settings import CacheSettings, Settings
from swapless.manager import ModelEngine, ModelManager, ModelStore, WorkerLimits
from swapless.manager.frameworks.adapter_checks import adapter_reserve

__all__ = ["Runtime", "build_runtime", "load_plugins", "tune_interpreter"]


@dataclass
class Runtime:
    """What one worker process holds: the registry, the cache and the settings."""

    settings: Settings
    store: ModelStore
    manager: ModelManager


#: How long a thread may keep the GIL while another waits for it (``sys.setswitchinterval``; Python's is 5 ms).
GIL_SWITCH_S = 0.0005


def tune_interpreter() -> None:
    """Keep the interpreter from stalling the device between passes. Called once, before any model loads."""
    gc.collect()
    gc.freeze()  # the libraries imported so far leave the cycle collector's reach: a full collection stays short
    sys.setswitchinterval(GIL_SWITCH_S)  # a thread back from the device waits less for the GIL


def load_plugins(settings: CacheSettings) -> None:
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
    """Import the plugins, read the models file and build an empty cache.

    Args:
        settings: the process settings.
        warm_up: import the frameworks' libraries now.

    Raises:
        ConfigError: a plugin cannot be imported, or the models file is missing or invalid.
    """
    s = settings
    load_plugins(s.cache)
    limits = WorkerLimits(
        device=s.cache.device,
        max_batch_size=s.cache.max_batch_size,
        max_text_chars=s.inputs.max_text_chars,
        max_image_bytes=s.inputs.max_image_bytes,
        max_image_pixels=s.inputs.max_image_pixels,
        input_root=str(s.inputs.input_root) if s.inputs.input_root else None,
        triton_url=s.cache.triton_url,
        max_adapters=s.cache.max_adapters,
        adapter_host_bytes=s.cache.adapter_host_bytes,
    )
    engine = ModelEngine(limits)
    store = ModelStore.from_file(s.cache.models_file, engine.frameworks)
    if store.has_variants:
        limits.adapter_bytes, limits.adapter_shapes = adapter_reserve(store, s.cache.max_adapters, engine.runs_adapters)
    if warm_up:
        engine.warm_up(spec.framework for spec in store)
    manager = ModelManager(
        store,
        engine,
        max_models=s.cache.max_models,
        memory_budget_bytes=s.cache.memory_budget_bytes,
        remote_max_models=s.cache.triton_max_models,
        host_max_models=s.cache.host_max_models,
        host_memory_budget_bytes=s.cache.host_memory_budget_bytes,
        keep_interactive_s=s.cache.keep_interactive_s,
    )
    return Runtime(s, store, manager)
