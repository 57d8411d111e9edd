"""A Swapless model as the Open Inference Protocol shows it: its signature, its jobs' inputs, its output tensors.

Pure functions over the registry and parsed requests; a request that does not fit raises ``InputError``.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from swapless.config.errors import InputError, PredictionFailed, SwaplessError
from swapless.manager.registry.specs import InputType, ModelSpec
from swapless.manager.registry.store import ModelStore
from swapless.tasks.gateway.tensors import InferRequest, OutputTensor, bytes_elements

__all__ = [
    "INPUTS",
    "OUTPUTS",
    "Signature",
    "UnknownVersion",
    "chosen_outputs",
    "job_inputs",
    "metadata",
    "output_tensors",
    "route_models",
    "signature",
]

#: The input tensor's name per model type, and the output tensors' names.
INPUTS = {InputType.TEXT: "TEXT", InputType.IMAGE: "IMAGE"}
OUTPUTS = ("LABELS", "SCORES")
_WHAT = {InputType.TEXT: "one UTF-8 string per text", InputType.IMAGE: "one encoded PNG/JPEG/WebP per image"}


class UnknownVersion(SwaplessError, KeyError):
    """A request named a version its model does not have (``current`` None: it addressed a route)."""

    def __init__(self, model_id: str, version: str, current: str | None) -> None:
        super().__init__(model_id, version, current)
        self.model_id, self.version, self.current = model_id, version, current

    @property
    def message(self) -> str:
        if self.current is None:
            return f"{self.model_id!r} is a route, which has no versions: address /v2/models/{self.model_id}"
        return (f"model {self.model_id!r} has no version {self.version!r}: address version {self.current!r}, "
                "or leave the version out")


@dataclass(frozen=True)
class Signature:
    """A model or route as the protocol shows it: ``version`` None for a route."""

    id: str
    version: str | None
    platform: str
    types: tuple[InputType, ...]
    top_k: int


def route_models(store: ModelStore, route_id: str) -> list[ModelSpec]:
    """The models a route may serve a job from, following routes to routes (shadows left out: they serve none)."""
    route = store.routes[route_id]
    found: list[ModelSpec] = []
    for target in [*(route.route or {}), *(route.by_type or {}).values()]:
        found += route_models(store, target) if store.is_route(target) else [store.get(target)]
    return found


def signature(store: ModelStore, name: str, version: str | None = None) -> Signature:
    """The model or route ``name`` as one v2 model; ``version``: the one the request names.

    Raises:
        UnknownModel: no model, alias or route of that name.
        UnknownVersion: the model's version is another, or the name is a route's.
    """
    if store.is_route(name):
        if version is not None:
            raise UnknownVersion(name, version, None)
        models = route_models(store, name)
        types = tuple(t for t in InputType if any(m.type is t for m in models))
        return Signature(name, None, "swapless_route", types, max(m.top_k for m in models))
    spec = store.get(name)
    if version is not None and version != spec.version:
        raise UnknownVersion(spec.id, version, spec.version)
    return Signature(spec.id, spec.version, spec.framework, (spec.type,), spec.top_k)


def metadata(sig: Signature) -> dict[str, Any]:
    """The model metadata response: name, versions, platform (the framework), inputs and outputs."""
    k = sig.top_k
    return {
        "name": sig.id,
        "versions": [sig.version] if sig.version is not None else [],
        "platform": sig.platform,
        "inputs": [{"name": INPUTS[t], "datatype": "BYTES", "shape": [-1]} for t in sig.types],
        "outputs": [{"name": "LABELS", "datatype": "BYTES", "shape": [-1, k]},
                    {"name": "SCORES", "datatype": "FP32", "shape": [-1, k]}],
    }


def _job_value(kind: InputType, element: bytes | str, where: str, model_id: str) -> str:
    """One element of the input tensor as the job's input: the text, or the image as the base64 the worker takes."""
    if kind is InputType.TEXT:
        try:
            text = element.decode("utf-8") if isinstance(element, bytes) else element
        except UnicodeDecodeError:
            raise InputError(model_id, f"{where} is not UTF-8 text: send texts in UTF-8") from None
        if not text.strip():
            raise InputError(model_id, f"{where} is empty text: send at least one non-blank character")
        return text
    if isinstance(element, bytes):
        if not element:
            raise InputError(model_id, f"{where} is empty: send the bytes of an encoded image")
        return base64.b64encode(element).decode("ascii")
    text = element.strip()
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    try:
        if base64.b64decode(text, validate=True):
            return text
    except (binascii.Error, ValueError):
        pass
    raise InputError(model_id, f"{where} is not a base64 image: in JSON send each image as base64 (binary data "
                     "takes the raw encoded bytes)")


def job_inputs(store: ModelStore, sig: Signature, request: InferRequest) -> tuple[str, list[str]]:
    """The id to address and one input per job.

    Raises:
        InputError: the input tensor does not fit the model.
    """
    names = " or ".join(repr(INPUTS[t]) for t in sig.types)
    if len(request.inputs) != 1:
        given = ", ".join(repr(t.name) for t in request.inputs) or "none"
        raise InputError(sig.id, f"the model takes one input, {names}; this request has {given}")
    tensor = request.inputs[0]
    kind = next((t for t in sig.types if INPUTS[t] == tensor.name), None)
    if kind is None:
        raise InputError(sig.id, f"unknown input {tensor.name!r}: the model takes {names}")
    where = f"input {tensor.name!r}"
    if tensor.datatype != "BYTES":
        raise InputError(sig.id, f"{where} has datatype {tensor.datatype}: send BYTES, {_WHAT[kind]}")
    if not (len(tensor.shape) == 1 or (len(tensor.shape) == 2 and tensor.shape[1] == 1)):
        raise InputError(sig.id, f"{where} has shape {list(tensor.shape)}: send shape [n] (or [n, 1]), {_WHAT[kind]}")
    if tensor.size == 0:
        raise InputError(sig.id, f"{where} has no elements: send at least one")
    elements = bytes_elements(tensor, sig.id)
    values = [_job_value(kind, e, f"{where} element {i}", sig.id) for i, e in enumerate(elements)]
    target = sig.id
    while store.is_route(target) and (branches := store.routes[target].by_type) is not None:
        target = branches[kind]  # the tensor's name says the type: no guessing from the bytes
    return target, values


def chosen_outputs(request: InferRequest, sig: Signature) -> list[tuple[str, bool]]:
    """The outputs to send, each with whether it goes as binary data.

    Raises:
        InputError: an unknown output name, a classification output, a flag that is not a boolean.
    """
    default = request.parameters.get("binary_data_output", False)
    if not isinstance(default, bool):
        raise InputError(sig.id, "parameter binary_data_output is not a boolean: send true or false")
    if request.outputs is None:
        return [(name, default) for name in OUTPUTS]
    chosen = []
    for output in request.outputs:
        if output.name not in OUTPUTS:
            raise InputError(sig.id, f"unknown output {output.name!r}: the model gives 'LABELS' and 'SCORES'")
        if output.parameters.get("classification"):
            raise InputError(sig.id, "classification outputs are not supported: LABELS and SCORES are the top "
                             f"{sig.top_k} already")
        chosen.append((output.name, default if output.binary is None else output.binary))
    return chosen


def output_tensors(sig: Signature, results: list[Any]) -> dict[str, OutputTensor]:
    """LABELS and SCORES from the jobs' predictions (lists of ``{label, score}``, best first), padded to top_k.

    Raises:
        PredictionFailed: a prediction is not such a list (a Triton model without labels answers raw tensors).
    """
    k = sig.top_k
    labels: list[str] = []
    scores: list[float] = []
    for value in results:
        if not isinstance(value, list) or not all(isinstance(p, dict) and {"label", "score"} <= set(p) for p in value):
            raise PredictionFailed(sig.id, "it answered something other than labels and scores, which LABELS and "
                                   "SCORES cannot hold: read its raw output with POST /predict")
        row = value[:k]
        labels += [str(p["label"]) for p in row] + [""] * (k - len(row))
        scores += [float(p["score"]) for p in row] + [0.0] * (k - len(row))
    shape = (len(results), k)
    return {
        "LABELS": OutputTensor("LABELS", "BYTES", shape, labels),
        "SCORES": OutputTensor("SCORES", "FP32", shape, scores),
    }
