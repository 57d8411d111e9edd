"""Variants as adapters over one loaded base, at run time: ``AdapterPool``.

A variant is a PEFT adapter (LoRA matrices, optionally its own head). Its base loads once; the pool keeps adapter
slots per adapter shape as stacked tensors beside the base's layers, read by forward hooks, so one forward pass
serves inputs of many variants (as Punica and S-LoRA batch adapters). See docs/guides/adapters.md.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from swapless.config.errors import ModelLoadError, PredictionFailed
from swapless.manager.frameworks.adapter_checks import _PREFIX, AdapterShape, adapter_shape, read_adapter
from swapless.manager.registry.specs import ModelSpec

__all__ = ["AdapterInput", "AdapterPool"]

class AdapterInput(NamedTuple):
    """A prepared input of a variant: the text, and the variant's entry."""

    text: str
    variant: ModelSpec


class _Shape:
    """The slots of one adapter shape over a base: per LoRA layer, A and B stacked by slot (``[slots, r, in]``,
    ``[slots, out, r]``); per layer saved whole, its weight and bias stacked the same way. Slot 0 is the base itself.
    """

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
    """The variants of one loaded base in adapter slots. Not thread-safe: the worker that owns the base calls it.

    Args:
        model: the loaded base (a transformers model).
        slots: most variants resident at once, per adapter shape.
        host_bytes: most bytes of adapter weights kept in host memory for later copies.
        shapes: the variants' shapes as the start-up checks found them.
    """

    def __init__(self, model: Any, slots: int, host_bytes: int, shapes: Mapping[str, AdapterShape] | None = None,
                 ) -> None:
        self.base = model
        self.slots = slots
        self.host_bytes = host_bytes
        self._shapes: dict[str, AdapterShape] = dict(shapes or {})
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
        assert variant.adapter is not None
        state = read_adapter(variant.adapter)
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
