"""Small torch helpers shared by the in-process workers: device choice, memory measure, real unload."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = [
    "free_memory",
    "measure_load",
    "module_bytes",
    "module_to_device",
    "module_to_host",
    "resolve_device",
    "to_dtype",
    "top_k",
]


def to_dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype of a models-file ``dtype`` (``float16``, ...); None for None."""
    return None if name is None else getattr(torch, name)


def resolve_device(name: str) -> torch.device:
    """``auto`` is ``cuda`` when a GPU is visible, else ``cpu``; any other value is passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes held by a module's parameters and buffers (shared tensors counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in list(module.parameters()) + list(module.buffers()):
        key = tensor.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


def module_to_host(module: torch.nn.Module) -> torch.nn.Module:
    """Move a built module's parameters and buffers to host memory, in place (pinned memory with CUDA, so the copy
    back can run asynchronously); returns the module.
    """
    if not torch.cuda.is_available():
        return module.to("cpu")
    with torch.no_grad():
        # private, but what Module.to itself is built on: one copy per tensor, device to pinned host memory
        module._apply(lambda t: t if t.is_pinned() else torch.empty_like(t, device="cpu", pin_memory=True).copy_(t))
    torch.cuda.empty_cache()  # hand the device blocks back: a model in the host tier must not hold device memory
    return module


def module_to_device(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """Move a module ``module_to_host`` moved back to ``device``, in place; returns the module. A copy from pinned
    memory runs asynchronously and is waited for here, so the module is ready when this returns."""
    moved = module.to(device, non_blocking=device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return moved


class _Measure:
    bytes: int = 0


@contextmanager
def measure_load(device: torch.device) -> Iterator[_Measure]:
    """Measure the CUDA allocator's growth across a load (0 on CPU). Use the larger of this and module_bytes."""
    result = _Measure()
    cuda = device.type == "cuda"
    before = torch.cuda.memory_allocated(device) if cuda else 0
    yield result
    if cuda:
        torch.cuda.synchronize(device)
        result.bytes = max(0, torch.cuda.memory_allocated(device) - before)


def free_memory(device: torch.device | None, dropped: weakref.ref[Any] | None = None) -> None:
    """Free a dropped model now: hand cached CUDA blocks back to the driver. ``dropped`` is a weak reference to it;
    the cycle collector runs only when something still holds it, as a full collection is slow.
    """
    if dropped is not None and dropped() is not None:
        gc.collect()
    if device is not None and device.type == "cuda":
        gc.collect()  # tensors held only by cycles would keep GPU memory that empty_cache cannot return
        torch.cuda.empty_cache()


def top_k(probabilities: torch.Tensor, labels: Any, k: int) -> list[list[dict[str, Any]]]:
    """Per row, the ``k`` best ``{"label", "score"}`` pairs, best first, like transformers pipelines.

    ``labels`` maps a class index to its name (a dict or a list); missing names become ``LABEL_<i>``.
    """
    k = min(k, probabilities.shape[-1])
    scores, indices = probabilities.float().topk(k, dim=-1)
    rows = []
    for row_scores, row_indices in zip(scores.tolist(), indices.tolist(), strict=True):
        row = []
        for score, index in zip(row_scores, row_indices, strict=True):
            try:
                label = labels[index]
            except (KeyError, IndexError, TypeError):
                label = f"LABEL_{index}"
            row.append({"label": str(label), "score": float(score)})
        rows.append(row)
    return rows
