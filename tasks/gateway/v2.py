"""The Open Inference Protocol (KServe v2, Triton's HTTP API) under ``/v2``: ``V2Endpoints`` and its route table.

Every error is ``{"error": "..."}``; docs/concepts/gateway.md describes the models as v2 shows them.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import zlib
from typing import Any

from celery import states
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from swapless.config.errors import InputError
from swapless.manager.registry.store import ModelStore
from swapless.tasks.broker.connection import aping
from swapless.tasks.broker.results import StoredResult
from swapless.tasks.cluster.members import aread_heartbeats
from swapless.tasks.gateway.auth import Need, needs
from swapless.tasks.gateway.errors import BodyTooLarge, job_status
from swapless.tasks.gateway.http import Route, loads, router_of
from swapless.tasks.gateway.plane import Ask, DataPlane
from swapless.tasks.gateway.rest import caller_of
from swapless.tasks.gateway.signature import (
    Signature,
    chosen_outputs,
    job_inputs,
    metadata,
    output_tensors,
    route_models,
    signature,
)
from swapless.tasks.gateway.tensors import HEADER_LENGTH, InferRequest, check_declared, encode_response, parse_request

__all__ = ["V2_ROUTES", "V2Endpoints", "v2_router"]

_PING_S = 2.0
_MAX_WAIT_S = 3600.0


def _failure(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message, **extra})


def _decompressed(body: bytes, encoding: str | None, header_length: str | None, model_id: str, max_bytes: int,
                  max_elements: int) -> bytes:
    """The plain body of a gzip or deflate one, at most ``max_bytes``; a binary header's elements checked first."""
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return body
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(name)
    if wbits is None:
        raise InputError(model_id, f"Content-Encoding {encoding!r} is not supported: send gzip, deflate or identity")
    decoder = zlib.decompressobj(wbits)
    try:
        head = b""
        length = (header_length or "").strip()
        if length.isascii() and length.isdigit() and len(length) <= 12 and int(length) <= max_bytes:
            head = decoder.decompress(body, int(length))
            check_declared(head, model_id, max_elements)
            body = decoder.unconsumed_tail
        plain = head + decoder.decompress(body, max_bytes + 1 - len(head))
    except zlib.error as err:
        raise InputError(model_id, f"the {name} body cannot be decompressed ({err}): send it uncompressed") from None
    if len(plain) > max_bytes:
        raise BodyTooLarge(max_bytes)
    return plain


def _decoded(body: bytes, encoding: str | None, header_length: str | None, model_id: str, max_bytes: int,
             max_elements: int) -> InferRequest:
    """The request of a raw body (decompressed, parsed, its elements bounded); run in a worker thread."""
    plain = _decompressed(body, encoding, header_length, model_id, max_bytes, max_elements)
    return parse_request(plain, header_length, model_id, max_elements)


#: The infer body for the OpenAPI schema (the route reads it raw: it may be JSON followed by binary tensors).
_INFER_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": f"an inference request; with {HEADER_LENGTH}, that many bytes of JSON and then binary tensors",
        "content": {"application/json": {"schema": {"type": "object"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def _infer_route(need: Need) -> dict[str, Any]:
    declared = needs(need)
    declared["openapi_extra"] = {**_INFER_BODY, **declared["openapi_extra"]}
    return declared


def _wait_s(parameters: dict[str, Any], default_s: float) -> float:
    """The request's ``timeout`` parameter (microseconds) in seconds, else ``default_s``."""
    timeout_us = parameters.get("timeout")
    if isinstance(timeout_us, (int, float)) and not isinstance(timeout_us, bool) and timeout_us > 0:
        return min(timeout_us / 1e6, _MAX_WAIT_S)
    return default_s


def _job_failure(parsed: InferRequest, job_ids: list[str], found: dict[str, StoredResult]) -> JSONResponse | None:
    """The answer for the first job that failed, if any did."""
    for index, job_id in enumerate(job_ids):
        stored = found[job_id]
        if stored.state != states.SUCCESS:
            prefix = f"input {parsed.inputs[0].name!r} element {index}: " if len(job_ids) > 1 else ""
            status = job_status(stored.value, "v2")
            return _failure(status, prefix + str(stored.value), job_id=job_id)
    return None


def _infer_response(sig: Signature, parsed: InferRequest, chosen: list[tuple[str, bool]],
                    values: list[Any]) -> Response:
    """LABELS and SCORES of the jobs' results, as JSON or binary tensors as the request chose."""
    tensors = output_tensors(sig, values)
    header: dict[str, Any] = {"model_name": sig.id}
    if sig.version is not None:
        header["model_version"] = sig.version
    if parsed.id is not None:
        header["id"] = parsed.id
    content, json_length = encode_response(header, [(tensors[name], binary) for name, binary in chosen])
    if json_length is None:
        return Response(content, media_type="application/json")
    return Response(content, media_type="application/octet-stream", headers={HEADER_LENGTH: str(json_length)})


def _repository_index(store: ModelStore, where: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Every model and route with its state: READY when loaded on a live worker (``where``: model -> hosts)."""
    later = "not loaded on any live worker: its first request loads it"
    index = []
    for spec in [*store, *store.variants()]:
        hosts = where.get(spec.base or spec.id)
        index.append({"name": spec.id, "version": spec.version, "state": "READY" if hosts else "UNAVAILABLE",
                      "reason": f"loaded on {', '.join(hosts)}" if hosts else later})
    for route_id in store.routes:
        models = list(dict.fromkeys(m.id for m in route_models(store, route_id)))
        missing = [m for m in models if m not in where]
        reason = f"route over {', '.join(models)}" + (f"; {', '.join(missing)} {later}" if missing else "")
        index.append({"name": route_id, "version": "", "state": "UNAVAILABLE" if missing else "READY",
                      "reason": reason})
    return index


class V2Endpoints:
    """The ``/v2`` handlers over one data plane; ``V2_ROUTES`` maps them to paths."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.store = plane.store
        self.settings = plane.settings

    async def _ping(self) -> None:
        await aping(self.plane.redis, _PING_S)

    def _sig_for(self, request: Request, name: str, version: str | None = None) -> Signature:
        self.plane.allow(caller_of(request), name)
        return signature(self.store, name, version)

    async def server_metadata(self) -> dict[str, Any]:
        """The server's name, version and protocol extensions."""
        try:
            version = importlib.metadata.version("swapless")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return {"name": "swapless", "version": version, "extensions": ["binary_tensor_data", "model_repository"]}

    async def live(self) -> dict[str, bool]:
        """200 while the gateway answers."""
        return {"live": True}

    async def ready(self) -> dict[str, bool]:
        """200 when Redis answers (jobs can be queued), else 503."""
        await self._ping()
        return {"ready": True}

    async def model_metadata(self, request: Request, model_name: str) -> dict[str, Any]:
        """The model's input and outputs; a model or route by id or alias."""
        return metadata(self._sig_for(request, model_name))

    async def version_metadata(self, request: Request, model_name: str, model_version: str) -> dict[str, Any]:
        """The model's input and outputs, if it has this version."""
        return metadata(self._sig_for(request, model_name, model_version))

    async def _is_ready(self, sig: Signature) -> dict[str, Any]:
        await self._ping()
        return {"name": sig.id, "ready": True}

    async def model_ready(self, request: Request, model_name: str) -> dict[str, Any]:
        """200 when the model exists and Redis answers: one not loaded now is loaded for its first job."""
        return await self._is_ready(self._sig_for(request, model_name))

    async def version_ready(self, request: Request, model_name: str, model_version: str) -> dict[str, Any]:
        """200 when the model has this version and Redis answers."""
        return await self._is_ready(self._sig_for(request, model_name, model_version))

    async def model_infer(self, request: Request, model_name: str) -> Response:
        """Run the inputs as jobs (one per element, interactive priority) and answer LABELS and SCORES."""
        return await self._infer(request, self._sig_for(request, model_name))

    async def version_infer(self, request: Request, model_name: str, model_version: str) -> Response:
        """Inference on the model if it has this version."""
        return await self._infer(request, self._sig_for(request, model_name, model_version))

    async def _infer(self, request: Request, sig: Signature) -> Response:
        plane, settings = self.plane, self.settings
        body = await request.body()
        args = (body, request.headers.get("content-encoding"), request.headers.get(HEADER_LENGTH), sig.id,
                settings.gateway.gateway_max_body_bytes, settings.gateway.gateway_max_elements)
        off_loop = len(body) > 64 * 1024 or request.headers.get("content-encoding", "identity") != "identity"
        parsed = await asyncio.to_thread(_decoded, *args) if off_loop else _decoded(*args)
        target, values = job_inputs(self.store, sig, parsed)
        chosen = chosen_outputs(parsed, sig)
        wait_s = _wait_s(parsed.parameters, settings.gateway.predict_timeout_s)
        async with plane.waiting():
            name = parsed.inputs[0].name
            job_ids = await plane.submit(caller_of(request), [Ask(target, v) for v in values],
                                         label=lambda index: f"input {name!r} element {index}")
            found, pending = await plane.wait_all(job_ids, wait_s)
        if pending:
            message = (f"no result after {wait_s:g} s for {len(pending)} of {len(job_ids)} jobs, still queued or "
                       f"running: poll GET /jobs/{{job_id}} for {', '.join(pending)}")
            return _failure(504, message, job_ids=pending)
        failed = _job_failure(parsed, job_ids, found)
        if failed is not None:
            return failed
        return _infer_response(sig, parsed, chosen, [found[job_id].value for job_id in job_ids])

    async def repository_index(self, request: Request) -> Any:
        """Every model and route: READY when loaded on a live worker now (a route: all its models), else
        UNAVAILABLE; either way it takes requests. ``{"ready": true}`` lists only the READY ones."""
        body = await request.body()
        try:
            options = await loads(body) if body.strip() else {}
        except (UnicodeDecodeError, json.JSONDecodeError):
            options = None
        if not isinstance(options, dict) or not isinstance(options.get("ready", False), bool):
            return _failure(400, 'the body is not a repository index request: send {} or {"ready": true}')
        where: dict[str, list[str]] = {}
        for beat in await aread_heartbeats(self.plane.redis, self.plane.keyspace):
            for loaded in beat.loaded:
                where.setdefault(loaded.model_id, []).append(beat.hostname)
        index = _repository_index(self.store, where)
        return [entry for entry in index if entry["state"] == "READY"] if options.get("ready") else index

    async def load_or_unload(self, model_name: str) -> Response:
        """Refused: workers load models on demand and evict them when memory runs short."""
        sig = signature(self.store, model_name)
        return _failure(400, f"Swapless loads and unloads models on demand: send requests to "
                        f"/v2/models/{sig.id}/infer and a worker loads {sig.id!r} for them")

    async def no_such_endpoint(self, path: str, request: Request) -> Response:
        return _failure(404, f"no endpoint {request.method} /v2/{path}: the Open Inference Protocol endpoints are "
                        "listed at /docs")


_VERSION = "/versions/{model_version}"
V2_ROUTES = [
    Route("", "server_metadata", options=needs(Need.NOTHING)),
    Route("/health/live", "live", options=needs(Need.NOTHING)),
    Route("/health/ready", "ready", options=needs(Need.NOTHING)),
    Route("/models/{model_name}", "model_metadata", options=needs(Need.KEY)),
    Route("/models/{model_name}" + _VERSION, "version_metadata", options=needs(Need.KEY)),
    Route("/models/{model_name}/ready", "model_ready", options=needs(Need.KEY)),
    Route("/models/{model_name}" + _VERSION + "/ready", "version_ready", options=needs(Need.KEY)),
    Route("/models/{model_name}/infer", "model_infer", ("POST",), _infer_route(Need.KEY)),
    Route("/models/{model_name}" + _VERSION + "/infer", "version_infer", ("POST",), _infer_route(Need.KEY)),
    Route("/repository/index", "repository_index", ("POST",), needs(Need.EVERY_MODEL)),
    Route("/repository/models/{model_name}/unload", "load_or_unload", ("POST",), needs(Need.EVERY_MODEL)),
    Route("/repository/models/{model_name}/load", "load_or_unload", ("POST",), needs(Need.EVERY_MODEL)),
    Route("/{path:path}", "no_such_endpoint", ("GET", "POST", "PUT", "PATCH", "DELETE"),
          {"include_in_schema": False, **needs(Need.KEY)}),
]


def v2_router(plane: DataPlane) -> APIRouter:
    """The ``/v2`` routes over the data plane; any error in them answers ``{"error": ...}`` (see the module)."""
    return router_of(V2Endpoints(plane), V2_ROUTES, prefix="/v2", tags=["Open Inference Protocol (KServe v2)"])
