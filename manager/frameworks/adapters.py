"""Variants as adapters over one loaded base: ``check_variants`` at start-up, ``AdapterPool`` at run time.

A variant (``VariantSpec``) is a PEFT adapter: LoRA matrices for some of its base's layers, and optionally its own
copy of layers such as the classification head (``modules_to_save``), as PEFT's ``save_pretrained`` writes it. Its
base loads once; the pool keeps adapter *slots* per adapter shape (rank, alpha, target layers) as stacked tensors
beside the base's layers, read by forward hooks. Bringing a variant in is a copy of its weights into a free or least
recently used slot, from host memory when it was read before, else from its safetensors file: milliseconds, where
loading the variant as a whole model takes the base's full load. One forward pass serves inputs of many variants:
each LoRA layer gathers every row's matrices and adds its product in two batched multiplications, whatever the number
of variants in the pass (the way Punica's and S-LoRA's kernels batch many adapters); rows of the base's own jobs use
slot 0, which changes nothing.
"""

from __future__ import annotations

import json
import logging
import math
import re
import struct
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from swapless.config.errors import ConfigError, ModelLoadError, PredictionFailed
from swapless.manager.registry.specs import ModelSpec
from swapless.manager.registry.store import ModelStore

__all__ = ["AdapterInput", "AdapterPool", "AdapterShape", "adapter_reserve", "check_variants", "quiet_peft",
           "read_header"]

logger = logging.getLogger(__name__)

_CONFIG, _WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
_PREFIX = "base_model.model."
_LORA = (".lora_A.weight", ".lora_B.weight")
#: The LoRA options the slots run as PEFT does, at these values only (DoRA, LoRA biases, per-layer ranks: not).
_PLAIN_LORA: dict[str, Any] = {"use_dora": False, "bias": "none", "rank_pattern": {}, "alpha_pattern": {},
                               "layer_replication": None, "fan_in_fan_out": False}


class AdapterInput(NamedTuple):
    """A prepared input of a variant: the text, and the variant's entry."""

    text: str
    variant: ModelSpec


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
    """Read and check one variant's adapter against its base's weights. ``checked``: the shapes of adapter files
    checked already against the same base, by their config's and header's bytes (adapters trained the same way over
    one base have the same: each layout is checked once).

    Raises:
        ConfigError: the adapter is not a LoRA adapter PEFT saved, or a tensor of it does not fit its base (an
            architecture or size mismatch); the message names the variant.
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


class _Shape:
    """The slots of one adapter shape over a base: for each LoRA target layer, its A and B matrices stacked by slot
    (``[slots, r, in]`` and ``[slots, out, r]``), and for each layer an adapter saves whole (its head), that layer's
    weight and bias stacked the same way. Slot 0 is the base itself: zero LoRA matrices, the base's own head."""

    def __init__(self, model: Any, shape: AdapterShape, capacity: int) -> None:
        import torch

        self.shape = shape
        self.capacity = 0
        self.used = 1  # slot 0: the base
        self.lora: dict[str, list[Any]] = {}  # target layer -> [A stack, B stack]
        self.heads: dict[str, list[Any]] = {}  # saved layer -> [weight stack, bias stack or None]
        self.scale: Any = None
        self.rows: Any = None  # per row of the pass running now: its slot (None: no variant of this shape in it)
        self.hooks: list[Any] = []
        for name, module in model.named_modules():
            if shape.targets_layer(name) and isinstance(module, torch.nn.Linear):
                self.lora[name] = [module.weight.new_zeros(1, shape.rank, module.in_features),
                                   module.weight.new_zeros(1, module.out_features, shape.rank)]
                self.hooks.append(module.register_forward_hook(self._lora_hook(name)))
        for saved in shape.saved:
            for name, module in model.named_modules():
                if name != saved and not name.startswith(saved + ".") and not name.endswith("." + saved):
                    continue
                if isinstance(module, torch.nn.Linear):
                    bias = None if module.bias is None else module.bias.detach().clone()[None]
                    self.heads[name] = [module.weight.detach().clone()[None], bias]
                    self.hooks.append(module.register_forward_hook(self._head_hook(name)))
        self.scale = next(iter(self.lora.values()))[0].new_zeros(1) if self.lora else None
        self.grow(capacity)

    def grow(self, capacity: int) -> None:
        """Room for ``capacity`` slots besides the base's (the stacks reallocated, their rows kept)."""
        if capacity + 1 <= self.capacity:
            return
        import torch

        def bigger(stack: Any, base_row: bool) -> Any:
            grown = stack.new_zeros(capacity + 1, *stack.shape[1:])
            grown[: stack.shape[0]].copy_(stack)
            if base_row:  # a head's unused slots hold the base's head: a row pointing there gets the base's answer
                grown[stack.shape[0]:].copy_(stack[0].expand_as(grown[stack.shape[0]:]))
            return grown

        with torch.no_grad():
            for pair in self.lora.values():
                pair[0], pair[1] = bigger(pair[0], False), bigger(pair[1], False)
            for pair in self.heads.values():
                pair[0] = bigger(pair[0], True)
                if pair[1] is not None:
                    pair[1] = bigger(pair[1], True)
            if self.scale is not None:
                self.scale = bigger(self.scale, False)
        self.capacity = capacity + 1

    def _lora_hook(self, name: str) -> Callable[..., Any]:
        def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
            rows = self.rows
            if rows is None:
                return None
            import torch

            a, b = self.lora[name]
            x = args[0]
            flat = x.reshape(x.shape[0], -1, x.shape[-1]).to(a.dtype)
            delta = torch.bmm(torch.bmm(flat, a[rows].transpose(1, 2)), b[rows].transpose(1, 2))
            delta = delta * self.scale[rows].view(-1, 1, 1)
            return output + delta.reshape(output.shape).to(output.dtype)

        return hook

    def _head_hook(self, name: str) -> Callable[..., Any]:
        def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
            rows = self.rows
            if rows is None:
                return None
            import torch

            weight, bias = self.heads[name]
            x = args[0]
            flat = x.reshape(x.shape[0], -1, x.shape[-1]).to(weight.dtype)
            out = torch.bmm(flat, weight[rows].transpose(1, 2))
            if bias is not None:
                out = out + bias[rows].unsqueeze(1)
            mine = (rows > 0).view(-1, *([1] * (output.dim() - 1)))  # rows of other shapes keep what they have
            return torch.where(mine, out.reshape(output.shape).to(output.dtype), output)

        return hook

    def copy_in(self, slot: int, state: dict[str, Any], scale: float) -> None:
        """Copy an adapter's tensors (its file's names) into ``slot``.

        Raises:
            ValueError: a tensor has no place in this shape's stacks, or not its size.
        """
        import torch

        with torch.no_grad():
            for key, tensor in state.items():
                target = self._target(key)
                if target is None:
                    raise ValueError(f"{key} matches no layer this adapter's shape changes")
                row = target[slot]
                if row.shape != tensor.shape:
                    raise ValueError(f"{key} is {list(tensor.shape)}, its slot takes {list(row.shape)}")
                row.copy_(tensor)
            if self.scale is not None:
                self.scale[slot] = scale

    def _target(self, key: str) -> Any:
        name = key[len(_PREFIX):] if key.startswith(_PREFIX) else key
        for suffix, index in ((".lora_A.weight", 0), (".lora_B.weight", 1)):
            if name.endswith(suffix):
                pair = self.lora.get(name[: -len(suffix)])
                return None if pair is None else pair[index]
        layer, _, kind = name.rpartition(".")
        pair = self.heads.get(layer)
        if pair is None:
            return None
        return pair[0] if kind == "weight" else pair[1] if kind == "bias" else None

    def to(self, device: Any) -> None:
        for pair in [*self.lora.values(), *self.heads.values()]:
            pair[0] = pair[0].to(device)
            if pair[1] is not None:
                pair[1] = pair[1].to(device)
        if self.scale is not None:
            self.scale = self.scale.to(device)
        if self.rows is not None:
            self.rows = self.rows.to(device)

    def close(self) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []

    def nbytes(self) -> int:
        tensors = [t for pair in [*self.lora.values(), *self.heads.values()] for t in pair if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


class AdapterPool:
    """The variants of one loaded base in adapter slots (see the module docstring). Not thread-safe: the worker
    that owns the base calls it from its forward passes.

    The slots are stacked tensors beside the base's layers (``_Shape``), read by forward hooks on those layers: a
    pass of rows of many variants costs two batched products per LoRA layer whatever the number of variants in it
    (as Punica's and S-LoRA's kernels gather each row's adapter), and a slot is a row of those stacks.

    Args:
        model: the loaded base (a transformers model).
        slots: most variants resident at once, per adapter shape.
        host_bytes: most bytes of adapter weights kept in host memory for later copies.
    """

    def __init__(self, model: Any, slots: int, host_bytes: int) -> None:
        self.base = model
        self.slots = slots
        self.host_bytes = host_bytes
        self._shapes: dict[str, AdapterShape] = {}
        self._stacks: dict[AdapterShape, _Shape] = {}
        #: Variant id -> (its shape, its slot), least recently used first.
        self._resident: OrderedDict[str, tuple[AdapterShape, int]] = OrderedDict()
        self._free: dict[AdapterShape, list[int]] = {}
        self._host: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._host_used = 0
        self.swap_ins = 0

    @property
    def model(self) -> Any:
        """What the forward pass calls: the base (the slots are read by hooks on its layers)."""
        return self.base

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

    @contextmanager
    def rows(self, variants: Sequence[ModelSpec | None]) -> Iterator[None]:
        """Within it, a forward pass of the base gives each row its variant's answer (None: the base's own): every
        variant brought into a slot first."""
        wanted = {v.id: v for v in variants if v is not None}
        if not wanted:
            yield
            return
        for variant in wanted.values():
            self._bring_in(variant, keep=wanted.keys())
        import torch

        device = next(self.base.parameters()).device
        for shape, stack in self._stacks.items():
            slots = [self._resident[v.id][1] if v is not None and self._resident[v.id][0] == shape else 0
                     for v in variants]
            stack.rows = torch.tensor(slots, device=device) if any(slots) else None
        for variant_id in wanted:
            self._resident.move_to_end(variant_id)
        try:
            yield
        finally:
            for stack in self._stacks.values():
                stack.rows = None

    def _bring_in(self, variant: ModelSpec, keep: Iterable[str]) -> None:
        if variant.id in self._resident:
            return
        shape = self._shapes.get(variant.id)
        if shape is None:
            shape = self._shapes[variant.id] = adapter_shape(variant, None)
        slot = self._slot(shape, set(keep))
        try:
            self._stacks[shape].copy_in(slot, self._weights(variant), shape.scale)
        except (RuntimeError, ValueError) as err:  # its jobs fail alone: the runner isolates them
            self._free[shape].append(slot)
            raise PredictionFailed(variant.id, f"adapter does not fit its base: {err}") from err
        self._resident[variant.id] = (shape, slot)
        self.swap_ins += 1

    def _slot(self, shape: AdapterShape, keep: set[str]) -> int:
        """A slot for an adapter of ``shape``: a free one, a new one while under ``slots``, else the least recently
        used one's whose variant is not in ``keep``."""
        free = self._free.setdefault(shape, [])
        if free:
            return free.pop()
        stack = self._stacks.get(shape)
        if stack is None:
            stack = self._stacks[shape] = _Shape(self.base, shape, min(self.slots, 8))
        if stack.used <= self.slots:
            if stack.used + 1 > stack.capacity:
                stack.grow(min(self.slots, 2 * (stack.capacity - 1)))
            stack.used += 1
            return stack.used - 1
        for variant_id, (held_shape, slot) in self._resident.items():
            if variant_id not in keep and held_shape == shape:
                del self._resident[variant_id]
                return slot
        raise ModelLoadError(next(iter(keep)), f"more variants in one pass than SWAPLESS_MAX_ADAPTERS ({self.slots})")

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

    def to(self, device: Any) -> None:
        """Move the slots with their base (the host tier)."""
        for stack in self._stacks.values():
            stack.to(device)

    def close(self) -> None:
        """Take the hooks off the base and drop the slots."""
        for stack in self._stacks.values():
            stack.close()
        self._stacks.clear()
        self._resident.clear()

    @property
    def made(self) -> int:
        """Slots in use so far, of every shape."""
        return sum(stack.used - 1 for stack in self._stacks.values())

    def nbytes(self) -> int:
        """Bytes the slots take now."""
        return sum(stack.nbytes() for stack in self._stacks.values())

    def resident(self) -> list[str]:
        """The variants in slots now, least recently used first."""
        return list(self._resident)
