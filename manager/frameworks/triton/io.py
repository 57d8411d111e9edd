"""The tensors of a Triton model, for ``TritonWorker``: the server's metadata (``parse_info``), job inputs shaped to
fit it (``image_input``: a base64 image resized and normalised as torchvision classifiers expect;
``tensor_inputs``: raw tensors checked against the metadata), and results turned into job outputs
(``decode_outputs``: top-k labelled probabilities, or raw tensors). A bad input raises ``InputError``. No network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from PIL import Image
from tritonclient.utils import triton_to_np_dtype

from swapless.config.errors import InputError, ModelLoadError, PredictionFailed
from swapless.manager.frameworks.images import decode_image

__all__ = [
    "ModelInfo",
    "Tensor",
    "decode_outputs",
    "image_input",
    "parse_info",
    "read_labels",
    "tensor_inputs",
]

_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
_INT_KINDS = "iu"


@dataclass(frozen=True)
class Tensor:
    """One model input or output: name, Triton datatype, and the shape of ONE item (no batch dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False

    def describe(self) -> str:
        return f"{self.name} {self.datatype} {list(self.shape)}"


@dataclass(frozen=True)
class ModelInfo:
    """What the server says about the loaded model."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    max_batch_size: int  # 0: the model takes no batch dimension
    image_layout: str | None  # "NCHW" or "NHWC" when the model takes one image-shaped input


def parse_info(metadata: dict[str, Any], config: dict[str, Any]) -> ModelInfo:
    """The model's tensors from the server's metadata and config (``get_model_metadata``, ``get_model_config``)."""
    max_batch_size = int(config.get("max_batch_size") or 0)
    optional = {entry["name"] for entry in config.get("input", []) if entry.get("optional")}
    formats = {entry["name"]: entry.get("format", "") for entry in config.get("input", [])}

    def tensors(entries: list[dict[str, Any]]) -> tuple[Tensor, ...]:
        return tuple(
            Tensor(e["name"], e["datatype"], tuple(int(d) for d in e["shape"])[1 if max_batch_size else 0 :],
                   e["name"] in optional)
            for e in entries
        )

    inputs = tensors(metadata.get("inputs", []))
    layout = None
    if len(inputs) == 1 and len(inputs[0].shape) == 3 and inputs[0].datatype in ("FP32", "FP16", "UINT8"):
        shape, declared = inputs[0].shape, formats.get(inputs[0].name, "")
        if declared == "FORMAT_NHWC" or (declared != "FORMAT_NCHW" and shape[0] not in (1, 3) and shape[2] in (1, 3)):
            layout = "NHWC"
        elif shape[0] in (1, 3):
            layout = "NCHW"
    return ModelInfo(inputs, tensors(metadata.get("outputs", [])), max_batch_size, layout)


def read_labels(model_id: str, path: Path | None) -> list[str]:
    """The non-blank lines of the labels file (none without one).

    Raises:
        ModelLoadError: the file cannot be read.
    """
    if path is None:
        return []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ModelLoadError(model_id, f"cannot read labels_file {path}: {err}") from None
    return [line.strip() for line in lines if line.strip()]


# -- inputs --------------------------------------------------------------------------------------------------


def image_input(model_id: str, info: ModelInfo, data: bytes, max_image_pixels: int) -> dict[str, np.ndarray]:
    """The encoded image ``data`` as the model's one image-shaped input (``info.image_layout`` is set)."""
    tensor = info.inputs[0]
    layout = info.image_layout
    channels, height, width = tensor.shape if layout == "NCHW" else (tensor.shape[2], *tensor.shape[:2])
    image = decode_image(model_id, data, max_image_pixels)
    if channels == 1:
        image = image.convert("L")
    size = (image.width if width < 0 else width, image.height if height < 0 else height)
    if size != image.size:
        image = image.resize(size, Image.Resampling.BILINEAR)
    pixels = np.asarray(image, dtype=np.float32).reshape(size[1], size[0], channels)  # HWC
    if tensor.datatype != "UINT8":
        mean = _IMAGENET_MEAN if channels == 3 else _IMAGENET_MEAN.mean(keepdims=True)
        std = _IMAGENET_STD if channels == 3 else _IMAGENET_STD.mean(keepdims=True)
        pixels = (pixels / 255.0 - mean) / std
    if layout == "NCHW":
        pixels = pixels.transpose(2, 0, 1)
    return {tensor.name: np.ascontiguousarray(pixels, dtype=triton_to_np_dtype(tensor.datatype))}


def tensor_inputs(model_id: str, info: ModelInfo, value: dict[str, Any]) -> dict[str, np.ndarray]:
    """``{"inputs": {name: nested list}}`` checked against the model's inputs, as arrays of one item each.

    Raises:
        InputError: not that shape, an unknown or missing input, or a tensor that does not fit its input.
    """
    tensors = value.get("inputs")
    if set(value) != {"inputs"} or not isinstance(tensors, dict):
        raise InputError(model_id, 'send tensors as {"inputs": {name: nested list}}')
    by_name = {t.name: t for t in info.inputs}
    unknown = sorted(set(tensors) - set(by_name))
    if unknown:
        raise InputError(model_id, f"unknown input {unknown[0]!r}; the model takes {', '.join(by_name)}")
    missing = [t.name for t in info.inputs if t.name not in tensors and not t.optional]
    if missing:
        raise InputError(model_id, f"missing input {missing[0]!r}; the model takes {', '.join(by_name)}")
    return {name: _to_array(model_id, by_name[name], data) for name, data in tensors.items()}


def _to_array(model_id: str, tensor: Tensor, data: Any) -> np.ndarray:
    def bad(problem: str) -> InputError:
        return InputError(model_id, f"input {tensor.name!r} ({tensor.datatype}): {problem}")

    try:
        array = np.array(data, dtype=object if tensor.datatype == "BYTES" else None)
    except (ValueError, TypeError):
        raise bad("not a rectangular nested list of values") from None
    expected = tensor.shape
    if array.ndim != len(expected) or any(e >= 0 and e != a for e, a in zip(expected, array.shape, strict=True)):
        raise bad(f"shape {list(array.shape)}, the model expects {list(expected)} (-1: any size)")
    if tensor.datatype == "BYTES":
        if not all(isinstance(v, str) for v in array.flat):
            raise bad("expects strings")
        return np.vectorize(lambda v: v.encode("utf-8"), otypes=[object])(array) if array.size else array
    dtype = np.dtype(triton_to_np_dtype(tensor.datatype))
    kind = array.dtype.kind
    if array.size == 0:
        return array.astype(dtype)
    if dtype.kind == "b":
        if kind != "b":
            raise bad("expects true/false values")
    elif kind not in "iuf":
        raise bad(f"expects numbers, got {'true/false values' if kind == 'b' else 'other values'}")
    elif dtype.kind in _INT_KINDS:
        if kind not in _INT_KINDS:
            raise bad("expects integers, got floating-point numbers")
        limits = np.iinfo(dtype)
        if array.min() < limits.min or array.max() > limits.max:
            raise bad(f"values must lie in [{limits.min}, {limits.max}]")
    return array.astype(dtype)


# -- outputs -------------------------------------------------------------------------------------------------


def decode_outputs(
    model_id: str, info: ModelInfo, result: httpclient.InferResult, count: int, labels: list[str], top_k: int
) -> list[Any]:
    """One output per item of the request that gave ``result`` (``count`` items), in order.

    Raises:
        PredictionFailed: with labels, the server returned no first output.
    """
    arrays = {t.name: result.as_numpy(t.name) for t in info.outputs}
    if not info.max_batch_size:  # no batch dimension: one item per request
        arrays = {name: None if array is None else array[np.newaxis] for name, array in arrays.items()}
    if labels:
        first = arrays[info.outputs[0].name]
        if first is None:
            raise PredictionFailed(model_id, f"Triton returned no output {info.outputs[0].name!r}")
        scores = first.reshape(count, -1).astype(np.float64)
        return [_top_k(_probabilities(row), labels, top_k) for row in scores]
    return [{name: None if array is None else _jsonable(array[i].tolist()) for name, array in arrays.items()}
            for i in range(count)]


def _top_k(probabilities: np.ndarray, labels: list[str], top_k: int) -> list[dict[str, Any]]:
    best = np.argsort(-probabilities, kind="stable")[:top_k]
    return [
        {"label": labels[i] if i < len(labels) else f"LABEL_{i}", "score": float(probabilities[i])}
        for i in best
    ]


def _probabilities(row: np.ndarray) -> np.ndarray:
    """The row itself when it is already a distribution, else its softmax."""
    if row.size and row.min() >= 0.0 and row.max() <= 1.0 and abs(row.sum() - 1.0) < 1e-3:
        return row
    shifted = np.exp(row - row.max())
    return np.asarray(shifted / shifted.sum())


def _jsonable(value: Any) -> Any:
    """Bytes from BYTES outputs become text, so results survive a JSON result backend."""
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value
