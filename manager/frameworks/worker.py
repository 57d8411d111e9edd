"""The ModelWorker contract and the registry of worker classes by framework name. Subclasses register by passing
``framework="name"`` in the class statement::

    class TransformerWorker(ModelWorker, framework="transformers"):
        ...
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from swapless.config.errors import DuplicateFramework, InputError, UnknownFramework
from swapless.config.settings import DEFAULT_MAX_BATCH_SIZE
from swapless.manager.batching.tuning import BatchTuner
from swapless.manager.frameworks.image_files import looks_like_path, read_image_file
from swapless.manager.frameworks.inputs import base64_image, text_input
from swapless.manager.registry.specs import InputType, ModelSpec

T = TypeVar("T")

__all__ = ["ModelWorker", "WorkerLimits", "WorkerRegistry", "registry"]

logger = logging.getLogger(__name__)


class WorkerRegistry(dict[str, type["ModelWorker"]]):
    """Worker classes by framework name. A duplicate name raises; an unknown name raises UnknownFramework,
    which is also a KeyError and lists the known names."""

    def register(self, framework: str, cls: type[ModelWorker]) -> None:
        existing = self.get(framework)
        if existing is not None and existing is not cls:
            raise DuplicateFramework(framework, f"{existing.__module__}.{existing.__qualname__}")
        self[framework] = cls

    def __missing__(self, framework: str) -> type[ModelWorker]:
        raise UnknownFramework(framework, self.keys())


registry = WorkerRegistry()


class WorkerLimits:
    """Per-process limits the workers apply to inputs (from Settings; plain values so tests can build them)."""

    def __init__(
        self,
        *,
        device: str = "cpu",
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        tune_batch_size: bool = True,
        max_text_chars: int = 100_000,
        max_image_bytes: int = 20 * 1024 * 1024,
        max_image_pixels: int = 89_478_485,
        input_root: str | None = None,
        triton_url: str = "127.0.0.1:8000",
        max_adapters: int = 256,
        adapter_host_bytes: int = 1 << 30,
        adapter_bytes: Mapping[str, int] | None = None,
        adapter_shapes: Mapping[str, Any] | None = None,
    ) -> None:
        self.device = device
        self.max_batch_size = max_batch_size
        self.tune_batch_size = tune_batch_size
        self.max_text_chars = max_text_chars
        self.max_image_bytes = max_image_bytes
        self.max_image_pixels = max_image_pixels
        self.input_root = input_root
        self.triton_url = triton_url
        #: Variants resident at once per base and adapter shape (adapter slots).
        self.max_adapters = max_adapters
        #: Adapter weights kept in host memory for later swap-ins, per base.
        self.adapter_host_bytes = adapter_host_bytes
        #: Base id -> the bytes its adapter slots may take (counted in its size once loaded).
        self.adapter_bytes: Mapping[str, int] = dict(adapter_bytes or {})
        #: Variant id -> its adapter's shape, as the start-up checks found it (``adapter_checks.AdapterShape``).
        self.adapter_shapes: Mapping[str, Any] = dict(adapter_shapes or {})


class ModelWorker(ABC):
    """Runs one model; built unloaded (no side effects in ``__init__``). The contract:

    - ``load()`` brings the model into memory (or onto its server), once, before any ``predict``.
    - ``prepare(value)`` checks and decodes one job's input (``InputError`` names what is wrong), per job.
    - ``predict(batch) -> list``: one JSON-serializable output per prepared input, in order, in forward passes of
      at most ``batch_size`` (``batched``).
    - ``unload()`` frees what ``load()`` took; the worker may be loaded again.
    - ``memory_bytes``: what the loaded model takes in this process (0 for remote models).
    - ``to_host()`` and ``to_device()`` (with ``host_tier``): move the built model to host memory and back.
    """

    framework: ClassVar[str] = ""
    #: True for models that live in another process (Triton): they take no local memory budget.
    remote: ClassVar[bool] = False
    #: True for workers that implement ``to_host``/``to_device`` (the cache's host tier may keep them built).
    host_tier: ClassVar[bool] = False
    #: True for workers whose ``prepare_for`` takes variants (adapters over the model, ``VariantSpec``).
    runs_adapters: ClassVar[bool] = False

    def __init_subclass__(cls, framework: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if framework is not None:
            cls.framework = framework
            registry.register(framework, cls)

    def __init__(self, spec: ModelSpec, limits: WorkerLimits | None = None) -> None:
        self.spec = spec
        self.limits = limits or WorkerLimits()
        self.memory_bytes = 0
        #: Chooses forward-pass sizes by measurement (set by ModelEngine; None: always ``batch_size``).
        self.tuner: BatchTuner | None = None
        # The first forward pass after a load pays one-off costs (allocator growth, kernel choice, lazy init): it is
        # not shown to the tuner, which would otherwise rule out that size for good.
        self._first_pass = True
        #: Called once, as the last pass of the inputs ``batched`` cuts begins (set by ``run_group``).
        self.before_last_pass: Callable[[], None] | None = None

    @property
    def batch_size(self) -> int:
        """Inputs per forward pass: the model entry's ``max_batch_size``, else the process default."""
        return self.spec.max_batch_size or self.limits.max_batch_size

    def batched(self, items: Sequence[T]) -> Iterator[Sequence[T]]:
        """Cut ``items`` into forward passes of at most ``batch_size``; with a tuner, of the size it picks, and
        each pass (the caller's work between two yields) is timed so the tuner learns."""
        start = 0
        while start < len(items):
            size = min(self.tuner.next_size(), self.batch_size) if self.tuner else self.batch_size
            chunk = items[start : start + size]
            if start + len(chunk) >= len(items) and self.before_last_pass is not None:
                hook, self.before_last_pass = self.before_last_pass, None
                try:
                    hook()
                except Exception:  # it only saves time: the pass goes on
                    logger.exception("the hook before the last pass of %s failed", self.spec.id)
            started = time.perf_counter()
            yield chunk
            if self.tuner is not None and not self._first_pass:
                self.tuner.record(size, len(chunk), time.perf_counter() - started)
            self._first_pass = False
            start += len(chunk)

    @classmethod  # noqa: B027 - an optional hook: frameworks without heavy imports keep the no-op
    def warm_up(cls) -> None:
        """Import heavy libraries ahead of the first load (called once per process at worker start-up)."""

    @abstractmethod
    def load(self) -> None:
        """Load the model. Raises ModelLoadError (or any exception, which the cache wraps) on failure."""

    @abstractmethod
    def predict(self, batch: Sequence[Any]) -> list[Any]:
        """Run prepared inputs; return one output per input, in order."""

    @abstractmethod
    def unload(self) -> None:
        """Free the model's memory. Must be safe to call twice."""

    def to_host(self) -> None:
        """Move the loaded model to host memory (pinned when CUDA is there), keeping it built.

        Raises:
            NotImplementedError: the framework has no host tier (``host_tier`` is False).
            MemoryError: host memory is short (torch's out-of-memory error does as well).
        """
        raise NotImplementedError(f"{self.framework} models have no host tier")

    def to_device(self) -> None:
        """Move a model that ``to_host`` moved back onto the device, ready for ``predict``.

        Raises:
            NotImplementedError: the framework has no host tier.
        """
        raise NotImplementedError(f"{self.framework} models have no host tier")

    def prepare_for(self, variant: ModelSpec | None, value: Any) -> Any:
        """Check one raw job input of ``variant`` (one of this model's adapters; None: the model itself). The
        default runs no variants.

        Raises:
            InputError: the input is bad, or this framework does not run adapters.
        """
        if variant is not None:
            raise InputError(variant.id, f"{self.framework} models do not run adapters; serve it as a model")
        return self.prepare(value)

    def prepare(self, value: Any) -> Any:
        """Check one raw job input. The default accepts what ``type`` implies: text, or a base64 image."""
        if self.spec.type is InputType.TEXT:
            return self.prepare_text(value)
        return self.prepare_image_bytes(value)

    # -- input helpers shared by the frameworks ------------------------------------------------------------

    def prepare_text(self, value: Any) -> str:
        """A non-empty string of at most ``max_text_chars`` characters
        (``swapless.manager.frameworks.inputs.text_input``)."""
        return text_input(self.spec.id, value, self.limits.max_text_chars)

    def prepare_image_bytes(self, value: Any) -> bytes:
        """The encoded image bytes of a base64 string (a ``data:image/...;base64,`` prefix is allowed), or of an
        image file under ``SWAPLESS_INPUT_ROOT`` when the value is a path
        (``swapless.manager.frameworks.image_files``)."""
        data = base64_image(self.spec.id, value, self.limits.max_image_bytes)
        if data is not None:
            return data
        text = value.strip()
        if looks_like_path(text):  # an image file, read only from under SWAPLESS_INPUT_ROOT
            return read_image_file(self.spec.id, text, self.limits.input_root, self.limits.max_image_bytes)
        raise InputError(
            self.spec.id, "image is not valid base64; this is an image model (did you send plain text or a file path?)"
        )

