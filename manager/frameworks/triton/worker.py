"""TritonWorker: models served by a Triton Inference Server, driven over its HTTP API (``tritonclient.http``).

The model lives in the server (``remote = True``, ``memory_bytes == 0``); names, datatypes, shapes and
``max_batch_size`` come from the server's metadata and config, read by ``load()``. The HTTP calls, retries and
waits are in ``triton.client``; the tensors (input shaping, output decoding) in ``triton.io``. Its inputs, outputs
and failures are described in docs/guides/frameworks.md.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from swapless.config.errors import InputError, ModelLoadError, PredictionFailed
from swapless.manager.frameworks.triton.client import TritonConnection
from swapless.manager.frameworks.triton.io import (
    ModelInfo,
    decode_outputs,
    image_input,
    parse_info,
    read_labels,
    tensor_inputs,
)
from swapless.manager.frameworks.worker import ModelWorker, WorkerLimits
from swapless.manager.registry.specs import InputType, ModelSpec

__all__ = ["TritonWorker"]

logger = logging.getLogger(__name__)


class TritonWorker(ModelWorker, framework="triton"):
    """A model on a Triton server, named by the entry's ``name``. It has no host tier: the model lives in the server.

    Attributes (class defaults; set on an instance to change one worker):
        retry_delays_s: pauses between tries of a call the server did not answer.
        connection_timeout_s: seconds to open a connection.
        network_timeout_s: seconds to wait for the answer to a request.
        load_timeout_s: seconds to wait for a load, then for readiness; a load request is never sent twice.
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
        self.info: ModelInfo | None = None
        self.labels: list[str] = []
        self._load_requested = False  # the server took a load request: unload() must undo it
        self._triton = TritonConnection(self.url, self.ssl, spec.name, spec.id, settings=self)

    # -- the contract ------------------------------------------------------------------------------------

    def load(self) -> None:
        """Load the model on the server, wait until it is ready, read its metadata and the labels file.

        Raises:
            BackendUnavailable: the server did not answer after the retries.
            ModelLoadError: the server could not load the model, it did not become ready in time, or the labels file
                cannot be read.
        """
        name = self.spec.name
        try:
            try:
                self._triton.call("load", lambda client: client.load_model(name), timeout_s=self.load_timeout_s)
            except InferenceServerException:
                # The server answered: unload() cleans up whatever it did load. Not set on BackendUnavailable,
                # so that the cache's cleanup after a load against a dead server does not wait a second backoff.
                self._load_requested = True
                raise
            self._load_requested = True
            if not self._triton.wait_until_ready(self.load_timeout_s):
                problem = f"{name!r} on {self.url} not ready after {self.load_timeout_s:g} s"
                raise ModelLoadError(self.spec.id, problem)
            metadata = self._triton.call("metadata", lambda client: client.get_model_metadata(name))
            config = self._triton.call("config", lambda client: client.get_model_config(name))
        except InferenceServerException as err:
            raise ModelLoadError(self.spec.id, f"Triton at {self.url}: {err.message()}") from None
        self.info = parse_info(metadata, config)
        self.labels = read_labels(self.spec.id, self.spec.labels_file)
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
            return tensor_inputs(self.spec.id, info, value)
        if self.spec.type is InputType.TEXT or info.image_layout is None:
            expected = ", ".join(t.describe() for t in info.inputs)
            raise InputError(
                self.spec.id,
                f'send tensors as {{"inputs": {{name: nested list}}}}; this Triton model takes {expected}',
            )
        return image_input(self.spec.id, info, self.prepare_image_bytes(value), self.limits.max_image_pixels)

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
            self._triton.close()
            return
        self._load_requested = False
        name = self.spec.name
        try:
            self._triton.call("unload", lambda client: client.unload_model(name))
            if not self._triton.wait_until_unloaded(self.unload_timeout_s):
                logger.warning("%s: %r still unloading on %s after %g s", self.spec.id, name, self.url,
                               self.unload_timeout_s)
        except InferenceServerException as err:
            logger.warning("%s: unloading %r on %s failed: %s", self.spec.id, name, self.url, err.message())
        finally:
            self._triton.close()

    # -- requests ----------------------------------------------------------------------------------------

    def _infer(self, items: list[dict[str, np.ndarray]]) -> list[Any]:
        """One inference request for ``items`` (they share shapes); reloads the model once if the server lost it."""
        for attempt in (1, 2):
            info = self._loaded_info()
            try:
                result = self._triton.call("inference", functools.partial(self._request, info=info, items=items))
            except InferenceServerException as err:
                message = err.message() or ""
                lost = str(err.status()) == "404" or "unknown model" in message or "not ready" in message
                if lost and attempt == 1:
                    logger.warning("%s: Triton at %s lost %r (%s); loading it again", self.spec.id, self.url,
                                   self.spec.name, message)
                    self.load()
                    continue
                raise PredictionFailed(self.spec.id, f"Triton at {self.url}: {message}") from None
            return decode_outputs(self.spec.id, info, result, len(items), self.labels, self.spec.top_k)
        raise AssertionError("unreachable")  # pragma: no cover

    def _request(
        self, client: httpclient.InferenceServerClient, *, info: ModelInfo, items: list[dict[str, np.ndarray]]
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

    def _loaded_info(self) -> ModelInfo:
        if self.info is None:
            raise ModelLoadError(self.spec.id, "the Triton worker was used before load()")
        return self.info
