"""Variants' adapters checked against their bases at worker start-up, from the files' headers alone: each error one
line naming the variant. Adapters trained the same way over one base share a layout, checked once.
"""

from __future__ import annotations

import json
import math
import re
import struct
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swapless.config.errors import ConfigError
from swapless.manager.registry.specs import ModelSpec
from swapless.manager.registry.store import ModelStore

__all__ = ["AdapterShape", "adapter_reserve", "adapter_shape", "check_variants", "quiet_peft", "read_adapter",
           "read_header"]

_CONFIG, _WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_PREFIX = "base_model.model."
_LORA = (".lora_A.weight", ".lora_B.weight")
#: The LoRA options the slots run as PEFT does, at these values only (DoRA, LoRA biases, per-layer ranks: not).
_PLAIN_LORA: dict[str, Any] = {"use_dora": False, "bias": "none", "rank_pattern": {}, "alpha_pattern": {},
                               "layer_replication": None, "fan_in_fan_out": False}


@dataclass(frozen=True)
class AdapterShape:
    """What an adapter's slot must have in common with it: rank, scaling and the modules it changes (``bytes``, the
    size of its weights, is not part of it)."""

    rank: int
    scale: float
    targets: tuple[str, ...]
    saved: tuple[str, ...]
    bytes: int = field(compare=False)

    def targets_layer(self, name: str) -> bool:
        """Whether the layer ``name`` is one of its LoRA targets (PEFT's rule: a name, matched at the end of the
        layer's path, or a regular expression over the whole path)."""
        return any(name == t or name.endswith("." + t) or re.fullmatch(t, name) for t in self.targets)


@contextmanager
def quiet_peft() -> Iterator[None]:
    """PEFT reads a property transformers 5 deprecates (``is_gradient_checkpointing``): a warning per adapter slot
    that says nothing to a user of Swapless."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def read_header(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from a safetensors file's header alone (no tensor is read)."""
    return {name: list(meta["shape"]) for name, meta in _header(_header_bytes(path)).items()}


#: safetensors' dtype names, as torch's (the ones adapters are saved in).
_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


def read_adapter(directory: Path) -> dict[str, Any]:
    """An adapter's tensors (CPU), its file read in one go: each tensor a view of one buffer, none copied.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a safetensors file of floating-point tensors.
    """
    import torch

    path = directory / _WEIGHTS
    raw = bytearray(path.stat().st_size)  # writable: torch.frombuffer warns on a read-only buffer
    with path.open("rb", buffering=0) as file:
        file.readinto(raw)
    (size,) = struct.unpack("<Q", raw[:8])
    start = 8 + size
    tensors = {}
    for name, meta in _header(bytes(raw[8:start])).items():
        dtype = getattr(torch, _DTYPES.get(meta["dtype"], ""), None)
        if dtype is None:
            raise ValueError(f"tensor {name!r} is {meta['dtype']}, not a floating-point type")
        begin, end = meta["data_offsets"]
        count = (end - begin) // dtype.itemsize
        flat = torch.frombuffer(raw, dtype=dtype, count=count, offset=start + begin) if count else torch.empty(0)
        tensors[name] = flat.view(meta["shape"])
    return tensors


def _header_bytes(path: Path) -> bytes:
    with path.open("rb") as file:
        (size,) = struct.unpack("<Q", file.read(8))
        return file.read(size)


def _header(raw: bytes) -> dict[str, Any]:
    return {name: meta for name, meta in json.loads(raw).items() if name != "__metadata__"}


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


def adapter_shape(variant: ModelSpec, base_shapes: dict[str, list[int]] | None,
                  checked: dict[tuple[bytes, bytes], AdapterShape] | None = None) -> AdapterShape:
    """Read and check one variant's adapter against its base's weights. ``checked``: layouts checked already against
    the same base (each is checked once).

    Raises:
        ConfigError: not a LoRA adapter PEFT saved, or a tensor that does not fit its base; names the variant.
    """
    where = f"variant {variant.id!r}, field 'adapter'"
    assert variant.adapter is not None
    try:
        raw_config = (variant.adapter / _CONFIG).read_bytes()
        raw_header = _header_bytes(variant.adapter / _WEIGHTS)
    except FileNotFoundError:
        raise ConfigError(where, f"{variant.adapter} needs {_CONFIG} and {_WEIGHTS} (PEFT's save_pretrained)") from None
    except (OSError, struct.error) as err:
        raise ConfigError(where, f"cannot read {variant.adapter}: {err}") from None
    known = checked.get((raw_config, raw_header)) if checked is not None else None
    if known is not None:
        return known
    try:
        config = json.loads(raw_config)
        header = _header(raw_header)
    except ValueError as err:
        raise ConfigError(where, f"cannot read {variant.adapter}: {err}") from None
    found = _checked_shape(variant, where, config, header, base_shapes)
    if checked is not None:
        checked[(raw_config, raw_header)] = found
    return found


def _checked_shape(variant: ModelSpec, where: str, config: dict[str, Any], header: dict[str, Any],
                   base_shapes: dict[str, list[int]] | None) -> AdapterShape:
    if config.get("peft_type") != "LORA":
        raise ConfigError(where, f"peft_type {config.get('peft_type')!r} is not supported; save a LoRA adapter")
    unsupported = [f"{key}={config[key]!r}" for key, off in _PLAIN_LORA.items()
                   if config.get(key, off) not in (off, None)]
    if unsupported:
        raise ConfigError(where, f"{', '.join(unsupported)} is not supported; save a plain LoRA adapter")
    rank = int(config.get("r") or 0)
    for name, meta in header.items():
        if base_shapes is not None:
            _check_tensor(variant, where, name, list(meta["shape"]), rank, base_shapes)
    targets = config.get("target_modules") or ()
    alpha = float(config.get("lora_alpha") or rank)
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / max(rank, 1)
    size = max((meta["data_offsets"][1] for meta in header.values()), default=0)
    return AdapterShape(rank, scale, tuple(sorted([targets] if isinstance(targets, str) else targets)),
                        tuple(sorted(set(config.get("modules_to_save") or ()))), size)


def _check_tensor(variant: ModelSpec, where: str, name: str, shape: list[int], rank: int,
                  base_shapes: dict[str, list[int]]) -> None:
    if not name.startswith(_PREFIX):
        raise ConfigError(where, f"tensor {name!r} is not one of a PEFT adapter over a model")
    key = name[len(_PREFIX):]
    lora = next((suffix for suffix in _LORA if key.endswith(suffix)), None)
    if lora is None:
        if base_shapes.get(key) != shape:
            raise ConfigError(where, f"{key} is {shape}, its base {variant.base!r} has {base_shapes.get(key)}: a head "
                              "for another number of labels or another model")
        return
    module = key[: -len(lora)]
    target = base_shapes.get(f"{module}.weight")
    if target is None:
        raise ConfigError(where, f"its base {variant.base!r} has no layer {module!r}: adapter of another architecture")
    want = [rank, target[1]] if lora == _LORA[0] else [target[0], rank]
    if shape != want:
        raise ConfigError(where, f"{module} {lora[1:7]} is {shape}, its base {variant.base!r} needs {want}: adapter "
                          "of another model size")


def check_variants(variants: Iterable[ModelSpec], bases: dict[str, ModelSpec],
                   runs_adapters: Callable[[str], bool] = lambda framework: framework == "transformers",
                   ) -> dict[str, AdapterShape]:
    """Check every variant's adapter against its base (worker start-up): the adapter files, their tensors' shapes
    against the base's layers, and the variant's labels against the base's classes. Headers only, and each layout
    of adapter file once per base: a thousand variants take tens of milliseconds.

    Raises:
        ConfigError: naming the first variant that does not fit.
    """
    found: dict[str, AdapterShape] = {}
    shapes: dict[str, dict[str, list[int]] | None] = {}
    classes: dict[str, int | None] = {}
    checked: dict[str, dict[tuple[bytes, bytes], AdapterShape]] = {}
    for variant in variants:
        base = bases[variant.base or ""]
        if not runs_adapters(base.framework):
            raise ConfigError(f"variant {variant.id!r}, field 'base'", f"base {base.id!r} runs on {base.framework}, "
                              "which runs no adapters; give a transformers text classifier as its base")
        if base.id not in shapes:
            shapes[base.id], classes[base.id] = _base_shapes(base), _num_labels(base)
        found[variant.id] = adapter_shape(variant, shapes[base.id], checked.setdefault(base.id, {}))
        count = classes[base.id]
        if variant.labels and count is not None and len(variant.labels) != count:
            raise ConfigError(f"variant {variant.id!r}, field 'labels'", f"{len(variant.labels)} labels for a head "
                              f"of {count} classes; give one label per class of {base.id!r}")
    return found


def adapter_reserve(store: ModelStore, slots: int,
                    runs_adapters: Callable[[str], bool] = lambda framework: framework == "transformers",
                    ) -> tuple[dict[str, int], dict[str, AdapterShape]]:
    """Check every variant of ``store`` and return, per base, the bytes its adapter slots may take (counted in its size
    once loaded, so the budget holds with every slot filled), and each variant's shape.

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
    return reserve, shapes


