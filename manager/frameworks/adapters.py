"""Variants as adapters over one loaded base: ``check_variants`` at start-up, ``AdapterPool`` at run time.

A variant (``VariantSpec``) is a PEFT adapter: LoRA matrices for some of its base's layers, and optionally its own
copy of modules such as the classification head (``modules_to_save``). Its base loads once; the pool wraps the loaded
model in PEFT and keeps a fixed number of adapter *slots* per adapter shape (rank, alpha, target modules). Bringing
a variant in is a copy of its weights into a free or least recently used slot, from host memory when it was read
before, else from its safetensors file: milliseconds, where loading the variant as a whole model would take the
base's full load. One forward pass serves inputs of many variants (PEFT's ``adapter_names``, one name per row; the
name ``__base__`` runs a row on the base alone).
"""

from __future__ import annotations

import json
import logging
import struct
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from swapless.config.errors import ConfigError, ModelLoadError
from swapless.manager.registry.specs import ModelSpec
from swapless.manager.registry.store import ModelStore

__all__ = ["BASE", "AdapterInput", "AdapterPool", "AdapterShape", "adapter_reserve", "check_variants", "quiet_peft",
           "read_header"]

logger = logging.getLogger(__name__)

#: The adapter name PEFT runs a row of a mixed batch with on the base alone.
BASE = "__base__"
_CONFIG, _WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_PREFIX = "base_model.model."
_LORA = (".lora_A.weight", ".lora_B.weight")


class AdapterInput(NamedTuple):
    """A prepared input of a variant: the text, and the variant's entry."""

    text: str
    variant: ModelSpec


@dataclass(frozen=True)
class AdapterShape:
    """What an adapter's slot must have in common with it: rank, scaling and the modules it changes (``bytes``, the
    size of its weights, is not part of it)."""

    rank: int
    alpha: int
    targets: tuple[str, ...]
    saved: tuple[str, ...]
    bytes: int = field(compare=False)


@contextmanager
def quiet_peft() -> Iterator[None]:
    """PEFT reads a property transformers 5 deprecates (``is_gradient_checkpointing``): a warning per adapter slot
    that says nothing to a user of Swapless."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def read_header(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from a safetensors file's header alone (no tensor is read)."""
    with path.open("rb") as file:
        (size,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(size))
    return {name: list(meta["shape"]) for name, meta in header.items() if name != "__metadata__"}


def _tensor_bytes(path: Path) -> int:
    with path.open("rb") as file:
        (size,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(size))
    return max((meta["data_offsets"][1] for name, meta in header.items() if name != "__metadata__"), default=0)


def _base_shapes(base: ModelSpec) -> dict[str, list[int]] | None:
    """The base's weights' shapes from its local safetensors files (None: no local directory to read)."""
    if base.path is None or not base.path.is_dir():
        return None
    index = base.path / "model.safetensors.index.json"
    files = (sorted({base.path / f for f in json.loads(index.read_text())["weight_map"].values()})
             if index.exists() else [base.path / "model.safetensors"])
    shapes: dict[str, list[int]] = {}
    for file in files:
        if not file.exists():
            return None
        shapes.update(read_header(file))
    return shapes


def _num_labels(base: ModelSpec) -> int | None:
    config = base.path / "config.json" if base.path is not None else None
    if config is None or not config.exists():
        return None
    data = json.loads(config.read_text())
    return len(data["id2label"]) if isinstance(data.get("id2label"), dict) else data.get("num_labels")


def adapter_shape(variant: ModelSpec, base_shapes: dict[str, list[int]] | None) -> AdapterShape:
    """Read and check one variant's adapter against its base's weights.

    Raises:
        ConfigError: the adapter is not a LoRA adapter PEFT saved, or a tensor of it does not fit its base (an
            architecture or size mismatch); the message names the variant.
    """
    where = f"variant {variant.id!r}, field 'adapter'"
    assert variant.adapter is not None
    config_file, weights = variant.adapter / _CONFIG, variant.adapter / _WEIGHTS
    if not config_file.exists() or not weights.exists():
        raise ConfigError(where, f"{variant.adapter} needs {_CONFIG} and {_WEIGHTS} (PEFT's save_pretrained)")
    try:
        config = json.loads(config_file.read_text())
        shapes = read_header(weights)
    except (OSError, ValueError, struct.error) as err:
        raise ConfigError(where, f"cannot read {variant.adapter}: {err}") from None
    if config.get("peft_type") != "LORA":
        raise ConfigError(where, f"peft_type {config.get('peft_type')!r} is not supported; save a LoRA adapter")
    rank = int(config.get("r") or 0)
    for name, shape in shapes.items():
        if base_shapes is None:
            break
        if not name.startswith(_PREFIX):
            raise ConfigError(where, f"tensor {name!r} is not one of a PEFT adapter over a model")
        key = name[len(_PREFIX):]
        lora = next((suffix for suffix in _LORA if key.endswith(suffix)), None)
        if lora is not None:
            module = key[: -len(lora)]
            target = base_shapes.get(f"{module}.weight")
            if target is None:
                raise ConfigError(where, f"its base {variant.base!r} has no layer {module!r}: adapter of another "
                                  "architecture")
            want = [rank, target[1]] if lora == _LORA[0] else [target[0], rank]
            if shape != want:
                raise ConfigError(where, f"{module} {lora[1:7]} is {shape}, its base {variant.base!r} needs {want}: "
                                  "adapter of another model size")
        elif base_shapes.get(key) is None or base_shapes[key] != shape:
            raise ConfigError(where, f"{key} is {shape}, its base {variant.base!r} has "
                              f"{base_shapes.get(key)}: a head for another number of labels or another model")
    targets = config.get("target_modules") or ()
    return AdapterShape(rank, int(config.get("lora_alpha") or rank),
                        tuple(sorted([targets] if isinstance(targets, str) else targets)),
                        tuple(sorted(config.get("modules_to_save") or ())), _tensor_bytes(weights))


def check_variants(variants: Iterable[ModelSpec], bases: dict[str, ModelSpec],
                   runs_adapters: Callable[[str], bool] = lambda framework: framework == "transformers",
                   ) -> dict[str, AdapterShape]:
    """Check every variant's adapter against its base (worker start-up): the adapter files, their tensors' shapes
    against the base's layers, and the variant's labels against the base's classes. Headers only: a thousand
    variants take tens of milliseconds.

    Raises:
        ConfigError: naming the first variant that does not fit.
    """
    found: dict[str, AdapterShape] = {}
    shapes: dict[str, dict[str, list[int]] | None] = {}
    for variant in variants:
        base = bases[variant.base or ""]
        if not runs_adapters(base.framework):
            raise ConfigError(f"variant {variant.id!r}, field 'base'", f"base {base.id!r} runs on {base.framework}, "
                              "which runs no adapters; give a transformers text classifier as its base")
        if base.id not in shapes:
            shapes[base.id] = _base_shapes(base)
        found[variant.id] = adapter_shape(variant, shapes[base.id])
        classes = _num_labels(base)
        if variant.labels and classes is not None and len(variant.labels) != classes:
            raise ConfigError(f"variant {variant.id!r}, field 'labels'", f"{len(variant.labels)} labels for a head "
                              f"of {classes} classes; give one label per class of {base.id!r}")
    return found


def adapter_reserve(store: ModelStore, slots: int,
                    runs_adapters: Callable[[str], bool] = lambda framework: framework == "transformers",
                    ) -> dict[str, int]:
    """Check every variant of ``store`` (``check_variants``; worker start-up) and return, per base, the bytes its
    adapter slots may take: per adapter shape, ``slots`` (or fewer variants) of its largest adapter. A base counts
    them in its size once loaded, so the cache's budget holds with every slot filled.

    Raises:
        ConfigError: naming the first variant that does not fit its base.
    """
    shapes = check_variants(store.variants(), {spec.id: spec for spec in store}, runs_adapters)
    reserve: dict[str, int] = {}
    for base in {v.base for v in store.variants() if v.base is not None}:
        by_shape: dict[AdapterShape, list[int]] = {}
        for variant in store.variants(base):
            by_shape.setdefault(shapes[variant.id], []).append(shapes[variant.id].bytes)
        reserve[base] = sum(min(slots, len(sizes)) * max(sizes) for sizes in by_shape.values())
    return reserve


class AdapterPool:
    """The variants of one loaded base in adapter slots (see the module docstring). Not thread-safe: the worker
    that owns the base calls it from its forward passes.

    Args:
        model: the loaded base (a transformers model); wrapped in PEFT at the first variant.
        slots: most variants resident at once, per adapter shape.
        host_bytes: most bytes of adapter weights kept in host memory for later copies.
    """

    def __init__(self, model: Any, slots: int, host_bytes: int) -> None:
        self.base = model
        self.peft: Any = None
        self.slots = slots
        self.host_bytes = host_bytes
        self._shapes: dict[str, AdapterShape] = {}
        #: Variant id -> its slot, least recently used first.
        self._resident: OrderedDict[str, str] = OrderedDict()
        self._free: dict[AdapterShape, list[str]] = {}
        self._made: dict[AdapterShape, int] = {}
        self._host: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._host_used = 0
        #: Per slot, its tensors by the names in an adapter's file.
        self._targets: dict[str, dict[str, Any]] = {}
        self.swap_ins = 0

    @property
    def model(self) -> Any:
        """What the forward pass calls: the PEFT model once a variant came, else the base."""
        return self.peft if self.peft is not None else self.base

    def groups(self, variants: Sequence[ModelSpec | None]) -> list[list[int]]:
        """Indices of ``variants`` cut into runs of at most ``slots`` distinct variants each, in order."""
        runs: list[list[int]] = [[]]
        seen: set[str] = set()
        for index, variant in enumerate(variants):
            if variant is not None and variant.id not in seen:
                if len(seen) == self.slots:
                    runs.append([])
                    seen = set()
                seen.add(variant.id)
            runs[-1].append(index)
        return runs

    def names(self, variants: Sequence[ModelSpec | None]) -> list[str] | None:
        """Each row's adapter name (its variant's slot, ``BASE`` for the base's own jobs), every variant brought in
        first; None when no variant was ever brought in (the base runs unwrapped)."""
        wanted = {v.id: v for v in variants if v is not None}
        for variant in wanted.values():
            self._bring_in(variant, keep=wanted.keys())
        if self.peft is None:
            return None
        for variant_id in wanted:
            self._resident.move_to_end(variant_id)
        return [self._resident[v.id] if v is not None else BASE for v in variants]

    def _bring_in(self, variant: ModelSpec, keep: Iterable[str]) -> None:
        if variant.id in self._resident:
            return
        shape = self._shapes.get(variant.id)
        if shape is None:
            shape = self._shapes[variant.id] = adapter_shape(variant, None)
        slot = self._slot(shape, set(keep))
        state = self._weights(variant)
        targets = self._targets[slot]
        import torch

        try:
            with torch.no_grad():
                for key, tensor in state.items():
                    target = targets.get(key)
                    if target is None or target.shape != tensor.shape:
                        want = None if target is None else list(target.shape)
                        raise ValueError(f"{key} is {list(tensor.shape)}, its slot takes {want}")
                    target.copy_(tensor)
        except (RuntimeError, ValueError) as err:
            self._free[shape].append(slot)
            raise ModelLoadError(variant.id, f"adapter does not fit its base: {err}") from err
        self._resident[variant.id] = slot
        self.swap_ins += 1

    def _slot(self, shape: AdapterShape, keep: set[str]) -> str:
        """A slot for an adapter of ``shape``: a free one, a new one while under ``slots``, else the least recently
        used one's whose variant is not in ``keep``."""
        free = self._free.setdefault(shape, [])
        if free:
            return free.pop()
        made = self._made.get(shape, 0)
        if made < self.slots:
            self._made[shape] = made + 1
            name = f"s{list(self._made).index(shape)}_{made}"
            self._new_slot(name, shape)
            return name
        for variant_id, slot in self._resident.items():
            if variant_id not in keep and self._shapes.get(variant_id) == shape:
                del self._resident[variant_id]
                return slot
        raise ModelLoadError(next(iter(keep)), f"more variants in one pass than SWAPLESS_MAX_ADAPTERS ({self.slots})")

    def _new_slot(self, name: str, shape: AdapterShape) -> None:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=shape.rank, lora_alpha=shape.alpha, target_modules=list(shape.targets),
                            modules_to_save=list(shape.saved) or None)
        with quiet_peft():
            if self.peft is None:
                self.peft = get_peft_model(self.base, config, adapter_name=name).eval()
            else:
                self.peft.add_adapter(name, config)
                self.peft.eval()
        # The slot's tensors by the names its adapters' files use (PEFT's saved names: no adapter name in them), so
        # that a swap-in is one copy per tensor.
        targets: dict[str, Any] = {}
        for parameter_name, parameter in self.peft.named_parameters():
            for mark in (f".modules_to_save.{name}.", f".{name}."):
                if mark in parameter_name:
                    targets[parameter_name.replace(mark, ".", 1)] = parameter
                    break
        self._targets[name] = targets

    def _weights(self, variant: ModelSpec) -> dict[str, Any]:
        """The adapter's tensors, from host memory when read before (then a copy is all a swap-in costs)."""
        cached = self._host.get(variant.id)
        if cached is not None:
            self._host.move_to_end(variant.id)
            return cached
        from safetensors.torch import load_file

        assert variant.adapter is not None
        state = load_file(str(variant.adapter / _WEIGHTS))
        size = sum(t.numel() * t.element_size() for t in state.values())
        while self._host and self._host_used + size > self.host_bytes:
            _, dropped = self._host.popitem(last=False)
            self._host_used -= sum(t.numel() * t.element_size() for t in dropped.values())
        if size <= self.host_bytes:
            self._host[variant.id] = state
            self._host_used += size
        return state

    def resident(self) -> list[str]:
        """The variants in slots now, least recently used first."""
        return list(self._resident)
