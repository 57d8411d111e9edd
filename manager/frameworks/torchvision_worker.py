"""TorchVisionWorker: torchvision image classifiers, with their weights' own preprocessing."""

from __future__ import annotations

import pickle
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from swapless.config.errors import ModelLoadError
from swapless.manager.frameworks.images import decode_image
from swapless.manager.frameworks.torch_utils import (
    free_memory,
    measure_load,
    module_bytes,
    module_to_device,
    module_to_host,
    resolve_device,
    to_dtype,
    top_k,
)
from swapless.manager.frameworks.worker import ModelWorker

__all__ = ["TorchVisionWorker"]

_HUB_PREFIX = "pytorch/vision:"


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Read a state dict from safetensors, or from a torch file with ``weights_only=True`` (no pickled code)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's message is many lines and suggests weights_only=False: here it stays a refusal, in one line
        raise ModelLoadError("", f"{path} holds pickled objects, not only tensors, and is refused (its code is never "
                                 "run); save the weights as safetensors, or as a plain state dict") from None
    if not isinstance(state, dict):
        raise ModelLoadError("", f"{path} does not hold a state dict")
    return state


class TorchVisionWorker(ModelWorker, framework="torchvision"):
    """An image classifier built by name (``mobilenet_v2``, ``resnet18``, ... or ``pytorch/vision:mobilenet_v2``).

    Without ``path`` the weights named by ``weights`` (default ``DEFAULT``) are downloaded by torchvision. With
    ``path`` (a ``.safetensors`` or torch state dict) those weights are loaded instead; ``weights`` still names the
    preprocessing transforms and the category names to use.
    """

    model: Any = None
    host_tier = True
    dtype: torch.dtype = torch.float32

    @classmethod
    def warm_up(cls) -> None:
        import torchvision.models  # noqa: F401 - the import is the warm-up

    def load(self) -> None:
        import torchvision

        arch = self.spec.name.removeprefix(_HUB_PREFIX)
        self.device = resolve_device(self.limits.device)
        try:
            weights_enum = torchvision.models.get_model_weights(arch)
            weights = weights_enum[self.spec.weights] if self.spec.weights != "DEFAULT" else weights_enum.DEFAULT
        except (ValueError, KeyError) as err:
            raise ModelLoadError(
                self.spec.id, f"unknown torchvision model or weights {arch!r}/{self.spec.weights!r}: {err}"
            ) from None
        try:
            with measure_load(self.device) as measured:
                if self.spec.path is not None:
                    categories = weights.meta.get("categories") or []
                    model = torchvision.models.get_model(arch, weights=None, num_classes=len(categories) or 1000)
                    model.load_state_dict(load_state_dict(self.spec.path))
                else:
                    model = torchvision.models.get_model(arch, weights=weights)
                self.dtype = to_dtype(self.spec.dtype) or torch.float32
                self.model = model.to(self.device, self.dtype).eval()
        except torch.OutOfMemoryError:
            # A RuntimeError, but it must reach the cache as is: the cache evicts idle models and retries on it.
            self.unload()
            raise
        except ModelLoadError as err:
            self.unload()
            raise ModelLoadError(self.spec.id, err.problem) from None
        except (OSError, RuntimeError) as err:
            self.unload()
            raise ModelLoadError(self.spec.id, str(err)) from err
        self.memory_bytes = max(module_bytes(self.model), measured.bytes)
        self.transform = weights.transforms()
        self.labels = list(weights.meta.get("categories") or [])

    def prepare(self, value: Any) -> torch.Tensor:
        """Decode one base64 image and apply the weights' transforms; bad images fail this job alone."""
        image = decode_image(self.spec.id, self.prepare_image_bytes(value), self.limits.max_image_pixels)
        tensor: torch.Tensor = self.transform(image)
        return tensor

    def predict(self, batch: Sequence[torch.Tensor]) -> list[Any]:
        outputs: list[Any] = []
        with torch.inference_mode():
            for chunk in self.batched(batch):
                stacked = torch.stack(list(chunk)).to(self.device, self.dtype)
                probabilities = torch.softmax(self.model(stacked).float(), dim=-1)
                outputs.extend(top_k(probabilities, self.labels, self.spec.top_k))
        return outputs

    def to_host(self) -> None:
        self.model = module_to_host(self.model)

    def to_device(self) -> None:
        self.model = module_to_device(self.model, self.device)

    def unload(self) -> None:
        dropped = weakref.ref(self.model) if self.model is not None else None
        self.model = None
        self.memory_bytes = 0
        free_memory(getattr(self, "device", None), dropped)
