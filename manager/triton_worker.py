"""TritonWorker: models served by a Triton Inference Server, driven over its HTTP API (``tritonclient.http``).

The model lives in the server (``remote = True``, ``memory_bytes == 0``); the cache counts these workers in
their own pool (``remote_max_models``). Nothing about a model is hard-coded: names, datatypes, shapes and
``max_batch_size`` come from the server's metadata and config, read by ``load()``.

- ``load()``: ``POST /v2/repository/models/{name}/load`` (the server runs with ``--model-control-mode=explicit``),
  then waits for readiness (at most ``load_timeout_s``) and reads metadata, config and the ``labels_file``.
- ``prepare(value)`` checks one job against the metadata; a bad input fails its job alone (``InputError``):

  * a base64 image, for a model with one image-shaped input (``[3, H, W]`` NCHW or ``[H, W, 3]`` NHWC; 1 channel
    works too). Resized to H x W (bilinear, aspect ratio not kept, like Triton's ``image_client`` example for
    densenet_onnx; a ``-1`` side keeps the image's size). FP32/FP16 inputs get pixels scaled to [0, 1] and
    normalised with the ImageNet mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225), what torchvision-
    trained classifiers expect; UINT8 inputs get the raw pixels.
  * raw tensors ``{"inputs": {input_name: nested list}}``: every required input, no unknown name, the shape of
    one item (``-1``: any size), values of the datatype's kind and range (no 1.5 for an INT32 input).

- ``predict(batch)``: the whole group in as few requests as the model's ``max_batch_size`` allows (or the
  entry's ``max_batch_size`` when smaller; ``max_batch_size: 0`` models get one job per request; jobs of
  different shapes go in different requests). With a ``labels_file`` (line i names class i) a job gets the
  ``top_k`` ``{"label", "score"}`` of the model's first output, best first. A row that already is a probability
  distribution (values in [0, 1] summing to 1 within 1e-3) is kept as it is; any other row is taken as logits
  and softmaxed, so scores are always probabilities. Without labels a job gets ``{output_name: nested list}``.
- ``unload()``: ``POST .../unload``, then waits (at most ``unload_timeout_s``) until the server has unloaded
  it, so the memory is free before the cache loads the next model.

Failures: a refused connection, a timeout or a 502/503/504 is retried after 0.2, 0.4 and 0.8 s
(``retry_delays_s``), then raises ``BackendUnavailable`` naming the URL; a load request that times out (after
``load_timeout_s``) raises it at once, as sending it again would only wait for the same load. A model the server
cannot load (not in the repository, broken) raises ``ModelLoadError`` with the server's message. A request the
server rejects raises ``PredictionFailed`` (the runner then splits the batch). If the server lost the model
(restarted, or someone unloaded it), ``predict`` loads it again once.

The URL is the entry's ``triton_url``, else ``SWAPLESS_TRITON_URL``, as ``host:port`` (an ``http://`` or
``https://`` prefix is accepted). The gevent-based HTTP client cannot be shared between threads, so the worker
keeps one per thread.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import tritonclient.http as httpclient
from gevent import Timeout as GeventTimeout
from PIL import Image
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from manager.errors import BackendUnavailable, InputError, ModelLoadError, PredictionFailed
from manager.images import decode_image
from manager.specs import InputType, ModelSpec
from manager.worker import ModelWorker, WorkerLimits

__all__ = ["TritonWorker"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
_UNAVAILABLE_STATUS = {"502", "503", "504"}
_INT_KINDS = "iu"


@dataclass(frozen=True)
class _Tensor:
    """One model input or output: name, Triton datatype, and the shape of ONE item (no batch dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False

    def describe(self) -> str:
        return f"{self.name} {self.datatype} {list(self.shape)}"


@dataclass(frozen=True)
class _ModelInfo:
    """What the server says about the loaded model."""

    inputs: tuple[_Tensor, ...]
    outputs: tuple[_Tensor, ...]
    max_batch_size: int  # 0: the model takes no batch dimension
    image_layout: str | None  # "NCHW" or "NHWC" when the model takes one image-shaped input


class TritonWorker(ModelWorker, framework="triton"):
    """A model on a Triton server, named by the entry's ``name``. See the module docstring for the behaviour.

    Attributes (class defaults; set on an instance to change one worker):
        retry_delays_s: pauses between tries of a call the server did not answer; one more try than delays.
        connection_timeout_s: seconds to open a connection.
        network_timeout_s: seconds to wait for the answer to a request (inference, metadata, unload, ...).
        load_timeout_s: seconds to wait for the answer to the load request (the server answers when the load is
            done) and then for readiness. A load request without an answer is not sent again: the server may
            still be loading, and a second request would only wait for the same load.
        unload_timeout_s: seconds to wait for the server to finish unloading.
    """

    remote = True
    retry_delays_s: tuple[float, ...] = (0.2, 0.4, 0.8)
    connection_timeout_s: float = 5.0
    network_timeout_s: float = 60.0
    load_timeout_s: float = 300.0
    unload_timeout_s: float = 120.0

    def __init__(self, spec: ModelSpec, limits: WorkerLimits | None = None) -> None:
        super().__init__(spec, limits)
        url = spec.triton_url or self.limits.triton_url
        self.ssl = url.startswith("https://")
        self.url: str = url.removeprefix("https://").removeprefix("http://").rstrip("/")
        self.info: _ModelInfo | None = None
        self.labels: list[str] = []
        self._load_requested = False  # the server took a load request: unload() must undo it
        self._local = threading.local()
        self._clients: list[httpclient.InferenceServerClient] = []
        self._clients_lock = threading.Lock()
        self._generation = 0

    # -- the contract ------------------------------------------------------------------------------------

    def load(self) -> None:
        """Load the model on the server, wait until it is ready, read its metadata and the labels file.

        Raises:
            BackendUnavailable: the server did not answer after the retries.
            ModelLoadError: the server could not load the model (its message included), it did not become ready
                within ``load_timeout_s``, or the labels file cannot be read.
        """
        name = self.spec.name
        try:
            try:
                self._call("load", lambda client: client.load_model(name), timeout_s=self.load_timeout_s)
            except InferenceServerException:
                # The server answered: unload() cleans up whatever it did load. Not set on BackendUnavailable,
                # so that the cache's cleanup after a load against a dead server does not wait a second backoff.
                self._load_requested = True
                raise
            self._load_requested = True
            deadline = time.monotonic() + self.load_timeout_s
            while not self._call("readiness check", lambda client: client.is_model_ready(name)):
                if time.monotonic() > deadline:
                    problem = f"{name!r} on {self.url} not ready after {self.load_timeout_s:g} s"
                    raise ModelLoadError(self.spec.id, problem)
                time.sleep(0.05)
            metadata = self._call("metadata", lambda client: client.get_model_metadata(name))
            config = self._call("config", lambda client: client.get_model_config(name))
        except InferenceServerException as err:
            raise ModelLoadError(self.spec.id, f"Triton at {self.url}: {err.message()}") from None
        self.info = _parse_info(metadata, config)
        self.labels = self._read_labels()
        if self.labels and self.info.outputs:
            classes = math.prod(self.info.outputs[0].shape)
            if classes > 0 and classes != len(self.labels):
                logger.warning("%s: %d labels for %d scores", self.spec.id, len(self.labels), classes)

    def prepare(self, value: Any) -> dict[str, np.ndarray]:
        """Check one job's input against the model's metadata and turn it into named arrays (one item each).

        Raises:
            InputError: the image or tensors do not fit the model; the message says what is wrong.
        """
        info = self._loaded_info()
        if isinstance(value, dict):
            return self._prepare_tensors(info, value)
        if self.spec.type is InputType.TEXT or info.image_layout is None:
            expected = ", ".join(t.describe() for t in info.inputs)
            raise InputError(
                self.spec.id,
                f'send tensors as {{"inputs": {{name: nested list}}}}; this Triton model takes {expected}',
            )
        return self._prepare_image(info, self.prepare_image_bytes(value))

    def predict(self, batch: Sequence[dict[str, np.ndarray]]) -> list[Any]:
        """Run prepared inputs in as few requests as ``max_batch_size`` allows; one output per input, in order.

        Raises:
            BackendUnavailable: the server did not answer after the retries.
            ModelLoadError: the server lost the model and could not load it again.
            PredictionFailed: the server rejected a request.
        """
        info = self._loaded_info()
        per_request = max(1, min(info.max_batch_size, self.spec.max_batch_size or info.max_batch_size))
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, item in enumerate(batch):
            signature = tuple((name, array.shape, array.dtype.str) for name, array in sorted(item.items()))
            groups.setdefault(signature, []).append(index)
        results: list[Any] = [None] * len(batch)
        for indices in groups.values():
            for start in range(0, len(indices), per_request):
                chunk = indices[start : start + per_request]
                for index, output in zip(chunk, self._infer([batch[i] for i in chunk]), strict=True):
                    results[index] = output
        return results

    def unload(self) -> None:
        """Unload the model on the server and wait until it is gone. Safe to call twice, or before ``load``.

        Raises:
            BackendUnavailable: the server did not answer after the retries (the worker counts as unloaded).
        """
        self.info = None
        if not self._load_requested:
            self._close_clients()
            return
        self._load_requested = False
        name = self.spec.name
        try:
            self._call("unload", lambda client: client.unload_model(name))
            deadline = time.monotonic() + self.unload_timeout_s
            while self._server_state() in ("READY", "UNLOADING"):
                if time.monotonic() > deadline:
                    logger.warning("%s: %r still unloading on %s after %g s", self.spec.id, name, self.url,
                                   self.unload_timeout_s)
                    break
                time.sleep(0.05)
        except InferenceServerException as err:
            logger.warning("%s: unloading %r on %s failed: %s", self.spec.id, name, self.url, err.message())
        finally:
            self._close_clients()

    # -- inputs --------------------------------------------------------------------------------------------

    def _prepare_image(self, info: _ModelInfo, data: bytes) -> dict[str, np.ndarray]:
        tensor = info.inputs[0]
        layout = info.image_layout
        channels, height, width = tensor.shape if layout == "NCHW" else (tensor.shape[2], *tensor.shape[:2])
        image = decode_image(self.spec.id, data, self.limits.max_image_pixels)
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

    def _prepare_tensors(self, info: _ModelInfo, value: dict[str, Any]) -> dict[str, np.ndarray]:
        tensors = value.get("inputs")
        if set(value) != {"inputs"} or not isinstance(tensors, dict):
            raise InputError(self.spec.id, 'send tensors as {"inputs": {name: nested list}}')
        by_name = {t.name: t for t in info.inputs}
        unknown = sorted(set(tensors) - set(by_name))
        if unknown:
            raise InputError(self.spec.id, f"unknown input {unknown[0]!r}; the model takes {', '.join(by_name)}")
        missing = [t.name for t in info.inputs if t.name not in tensors and not t.optional]
        if missing:
            raise InputError(self.spec.id, f"missing input {missing[0]!r}; the model takes {', '.join(by_name)}")
        return {name: self._to_array(by_name[name], data) for name, data in tensors.items()}

    def _to_array(self, tensor: _Tensor, data: Any) -> np.ndarray:
        def bad(problem: str) -> InputError:
            return InputError(self.spec.id, f"input {tensor.name!r} ({tensor.datatype}): {problem}")

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

    # -- requests ----------------------------------------------------------------------------------------

    def _infer(self, items: list[dict[str, np.ndarray]]) -> list[Any]:
        """One inference request for ``items`` (they share shapes); reloads the model once if the server lost it."""
        for attempt in (1, 2):
            info = self._loaded_info()
            try:
                result = self._call("inference", functools.partial(self._request, info=info, items=items))
            except InferenceServerException as err:
                message = err.message() or ""
                lost = str(err.status()) == "404" or "unknown model" in message or "not ready" in message
                if lost and attempt == 1:
                    logger.warning("%s: Triton at %s lost %r (%s); loading it again", self.spec.id, self.url,
                                   self.spec.name, message)
                    self.load()
                    continue
                raise PredictionFailed(self.spec.id, f"Triton at {self.url}: {message}") from None
            return self._outputs(info, result, len(items))
        raise AssertionError("unreachable")  # pragma: no cover

    def _request(
        self, client: httpclient.InferenceServerClient, *, info: _ModelInfo, items: list[dict[str, np.ndarray]]
    ) -> httpclient.InferResult:
        inputs = []
        for name in items[0]:
            datatype = next(t.datatype for t in info.inputs if t.name == name)
            array = np.stack([item[name] for item in items]) if info.max_batch_size else items[0][name]
            infer_input = httpclient.InferInput(name, list(array.shape), datatype)
            infer_input.set_data_from_numpy(array, binary_data=True)
            inputs.append(infer_input)
        outputs = [httpclient.InferRequestedOutput(t.name, binary_data=True) for t in info.outputs]
        return client.infer(self.spec.name, inputs, outputs=outputs)

    def _outputs(self, info: _ModelInfo, result: httpclient.InferResult, count: int) -> list[Any]:
        arrays = {t.name: result.as_numpy(t.name) for t in info.outputs}
        if not info.max_batch_size:  # no batch dimension: one item per request
            arrays = {name: None if array is None else array[np.newaxis] for name, array in arrays.items()}
        if self.labels:
            first = arrays[info.outputs[0].name]
            if first is None:
                raise PredictionFailed(self.spec.id, f"Triton returned no output {info.outputs[0].name!r}")
            scores = first.reshape(count, -1).astype(np.float64)
            return [self._top_k(_probabilities(row)) for row in scores]
        return [{name: None if array is None else _jsonable(array[i].tolist()) for name, array in arrays.items()}
                for i in range(count)]

    def _top_k(self, probabilities: np.ndarray) -> list[dict[str, Any]]:
        best = np.argsort(-probabilities, kind="stable")[: self.spec.top_k]
        return [
            {"label": self.labels[i] if i < len(self.labels) else f"LABEL_{i}", "score": float(probabilities[i])}
            for i in best
        ]

    # -- plumbing ----------------------------------------------------------------------------------------

    def _call(
        self, what: str, fn: Callable[[httpclient.InferenceServerClient], T], *, timeout_s: float | None = None
    ) -> T:
        """Run ``fn(client)``; retry with backoff while the server does not answer, then raise BackendUnavailable.

        Errors the server answers with (``InferenceServerException``, except 502/503/504) pass through.

        Args:
            timeout_s: the request's network timeout; given (the load request), a timeout is not retried.
        """
        started = time.monotonic()
        tries = len(self.retry_delays_s) + 1
        for attempt in range(tries):
            client = self._client(timeout_s or self.network_timeout_s)
            try:
                return fn(client)
            except InferenceServerException as err:
                if str(err.status()) not in _UNAVAILABLE_STATUS:
                    raise
                problem = f"HTTP {err.status()}: {err.message()}"
            except (OSError, HTTPException, GeventTimeout) as err:
                self._drop_client(client)  # its connection may be left half-open
                if timeout_s is not None and isinstance(err, TimeoutError | GeventTimeout):
                    problem = f"{what} of {self.spec.name!r} got no answer within {timeout_s:g} s"
                    raise BackendUnavailable(self.url, problem) from None
                problem = f"{type(err).__name__}: {err}"
            if attempt < tries - 1:
                delay = self.retry_delays_s[attempt]
                logger.warning("%s: Triton at %s: %s failed (%s); retrying in %g s", self.spec.id, self.url, what,
                               problem, delay)
                time.sleep(delay)
        elapsed_s = time.monotonic() - started
        problem = f"{what} of {self.spec.name!r} failed {tries} times in {elapsed_s:.1f} s ({problem})"
        raise BackendUnavailable(self.url, problem)

    def _client(self, network_timeout_s: float) -> httpclient.InferenceServerClient:
        """This thread's client for this timeout (made after the last ``unload``, else a new one)."""
        if getattr(self._local, "generation", None) != self._generation:
            self._local.clients, self._local.generation = {}, self._generation
        clients: dict[float, httpclient.InferenceServerClient] = self._local.clients
        client = clients.get(network_timeout_s)
        if client is None:
            client = httpclient.InferenceServerClient(
                self.url,
                ssl=self.ssl,
                connection_timeout=self.connection_timeout_s,
                network_timeout=network_timeout_s,
            )
            with self._clients_lock:
                self._clients.append(client)
            clients[network_timeout_s] = client
        return client

    def _drop_client(self, client: httpclient.InferenceServerClient) -> None:
        clients: dict[float, httpclient.InferenceServerClient] = getattr(self._local, "clients", {})
        for key in [key for key, value in clients.items() if value is client]:
            del clients[key]
        with self._clients_lock:
            if client in self._clients:
                self._clients.remove(client)
        _close(client)

    def _close_clients(self) -> None:
        with self._clients_lock:
            clients, self._clients = self._clients, []
            self._generation += 1
        for client in clients:
            _close(client)

    def _server_state(self) -> str:
        index = self._call("repository index", lambda client: client.get_model_repository_index())
        states = [entry.get("state", "UNAVAILABLE") for entry in index if entry.get("name") == self.spec.name]
        return "READY" if "READY" in states else (states[0] if states else "UNAVAILABLE")

    def _loaded_info(self) -> _ModelInfo:
        if self.info is None:
            raise ModelLoadError(self.spec.id, "the Triton worker was used before load()")
        return self.info

    def _read_labels(self) -> list[str]:
        path: Path | None = self.spec.labels_file
        if path is None:
            return []
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise ModelLoadError(self.spec.id, f"cannot read labels_file {path}: {err}") from None
        return [line.strip() for line in lines if line.strip()]


def _parse_info(metadata: dict[str, Any], config: dict[str, Any]) -> _ModelInfo:
    max_batch_size = int(config.get("max_batch_size") or 0)
    optional = {entry["name"] for entry in config.get("input", []) if entry.get("optional")}
    formats = {entry["name"]: entry.get("format", "") for entry in config.get("input", [])}

    def tensors(entries: list[dict[str, Any]]) -> tuple[_Tensor, ...]:
        return tuple(
            _Tensor(e["name"], e["datatype"], tuple(int(d) for d in e["shape"])[1 if max_batch_size else 0 :],
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
    return _ModelInfo(inputs, tensors(metadata.get("outputs", [])), max_batch_size, layout)


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


def _close(client: httpclient.InferenceServerClient) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001 - closing a broken connection must not fail an unload
        logger.debug("closing a Triton client failed", exc_info=True)
