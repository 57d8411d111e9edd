"""The Open Inference Protocol (KServe v2, Triton's HTTP API) on the gateway, so that Triton and KServe clients
(``tritonclient.http``, MLServer's and KServe's) call Swapless unchanged while it queues, groups and swaps behind.

    GET  /v2                                       server metadata: name, version, extensions
    GET  /v2/health/live | /v2/health/ready        200 when the process answers | when Redis answers, else 503
    GET  /v2/models/{m}[/versions/{v}]             model metadata: its input and outputs
    GET  /v2/models/{m}[/versions/{v}]/ready       200 when the model exists and Redis answers
    POST /v2/models/{m}[/versions/{v}]/infer       n inputs -> n jobs at interactive priority, one round trip
    POST /v2/repository/index                      every model and route: READY when loaded on a live worker

A model takes one input, ``TEXT`` or ``IMAGE`` (BYTES, shape ``[-1]``: texts, or encoded PNG/JPEG/WebP images; in
JSON an image is a base64 string), and gives ``LABELS`` (BYTES) and ``SCORES`` (FP32), shape ``[-1, k]`` with k its
``top_k``, best first (padded with "" and 0.0). A model that is not loaded is ready all the same: a worker loads it
for its first job. A route is a model of its targets' type (a ``by_type`` route over both takes either input) whose
k is the largest of theirs, and has no version. Tensors go as JSON or in Triton's binary tensor extension
(``swapless.tasks.gateway.tensors``); a gzip or deflate request body is decompressed, up to the gateway's body limit.

An infer request's jobs are bounded before anything is parsed but its JSON header: the shapes it declares may
total ``SWAPLESS_GATEWAY_MAX_ELEMENTS`` elements (413 past it). Decompressing and parsing run off the event loop.
The jobs go through the data plane (``swapless.tasks.gateway.plane``): the caller's key may call the model, each input
fits it, the caller's limits hold.

Every error is ``{"error": "..."}``: 400 bad input (the job's own ``InputError`` too), 403 a key for another model,
404 unknown model, version or endpoint, 413 too large (body, decompressed body, elements), 429 over a limit, 503
Redis down or full or the gateway too busy, 504 no result in time (naming the jobs).
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
from swapless.tasks.broker.connection import aping
from swapless.tasks.cluster.members import aread_heartbeats
from swapless.tasks.gateway.auth import Need, needs
from swapless.tasks.gateway.errors import BodyTooLarge, job_status
from swapless.tasks.gateway.http import GuardedRoute, loads
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

__all__ = ["v2_router"]

_PING_S = 2.0
_MAX_WAIT_S = 3600.0


def _failure(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message, **extra})


def _decompressed(body: bytes, encoding: str | None, header_length: str | None, model_id: str, max_bytes: int,
                  max_elements: int) -> bytes:
    """The plain body of a gzip or deflate one, at most ``max_bytes``. With a binary header, its JSON is decompressed
    and its declared elements checked first, so a bomb of a few KiB is refused before it is inflated."""
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


def v2_router(plane: DataPlane) -> APIRouter:
    """The ``/v2`` routes over the data plane; any error in them answers ``{"error": ...}`` (see the module)."""
    router = APIRouter(prefix="/v2", route_class=GuardedRoute, tags=["Open Inference Protocol (KServe v2)"])
    store, settings = plane.store, plane.settings

    async def ping() -> None:
        await aping(plane.redis, _PING_S)

    def sig_for(request: Request, name: str, version: str | None = None) -> Signature:
        plane.allow(caller_of(request), name)
        return signature(store, name, version)

    @router.get("", **needs(Need.NOTHING))
    async def server_metadata() -> dict[str, Any]:
        """The server's name, version and protocol extensions."""
        try:
            version = importlib.metadata.version("swapless")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return {"name": "swapless", "version": version, "extensions": ["binary_tensor_data", "model_repository"]}

    @router.get("/health/live", **needs(Need.NOTHING))
    async def live() -> dict[str, bool]:
        """200 while the gateway answers."""
        return {"live": True}

    @router.get("/health/ready", **needs(Need.NOTHING))
    async def ready() -> dict[str, bool]:
        """200 when Redis answers (jobs can be queued), else 503."""
        await ping()
        return {"ready": True}

    @router.get("/models/{model_name}", **needs(Need.KEY))
    async def model_metadata(request: Request, model_name: str) -> dict[str, Any]:
        """The model's input and outputs; a model or route by id or alias."""
        return metadata(sig_for(request, model_name))

    @router.get("/models/{model_name}/versions/{model_version}", **needs(Need.KEY))
    async def version_metadata(request: Request, model_name: str, model_version: str) -> dict[str, Any]:
        """The model's input and outputs, if it has this version."""
        return metadata(sig_for(request, model_name, model_version))

    async def is_ready(sig: Signature) -> dict[str, Any]:
        await ping()
        return {"name": sig.id, "ready": True}

    @router.get("/models/{model_name}/ready", **needs(Need.KEY))
    async def model_ready(request: Request, model_name: str) -> dict[str, Any]:
        """200 when the model exists and Redis answers: one not loaded now is loaded for its first job."""
        return await is_ready(sig_for(request, model_name))

    @router.get("/models/{model_name}/versions/{model_version}/ready", **needs(Need.KEY))
    async def version_ready(request: Request, model_name: str, model_version: str) -> dict[str, Any]:
        """200 when the model has this version and Redis answers."""
        return await is_ready(sig_for(request, model_name, model_version))

    @router.post("/models/{model_name}/infer", **_infer_route(Need.KEY))
    async def model_infer(request: Request, model_name: str) -> Response:
        """Run the inputs as jobs (one per element, interactive priority) and answer LABELS and SCORES."""
        return await infer(request, sig_for(request, model_name))

    @router.post("/models/{model_name}/versions/{model_version}/infer", **_infer_route(Need.KEY))
    async def version_infer(request: Request, model_name: str, model_version: str) -> Response:
        """Inference on the model if it has this version."""
        return await infer(request, sig_for(request, model_name, model_version))

    async def infer(request: Request, sig: Signature) -> Response:
        body = await request.body()
        args = (body, request.headers.get("content-encoding"), request.headers.get(HEADER_LENGTH), sig.id,
                settings.gateway.gateway_max_body_bytes, settings.gateway.gateway_max_elements)
        off_loop = len(body) > 64 * 1024 or request.headers.get("content-encoding", "identity") != "identity"
        parsed = await asyncio.to_thread(_decoded, *args) if off_loop else _decoded(*args)
        target, values = job_inputs(store, sig, parsed)
        chosen = chosen_outputs(parsed, sig)
        timeout_us = parsed.parameters.get("timeout")
        wait_s = settings.gateway.predict_timeout_s
        if isinstance(timeout_us, (int, float)) and not isinstance(timeout_us, bool) and timeout_us > 0:
            wait_s = min(timeout_us / 1e6, _MAX_WAIT_S)
        async with plane.waiting():
            name = parsed.inputs[0].name
            job_ids = await plane.submit(caller_of(request), [Ask(target, v) for v in values],
                                         label=lambda index: f"input {name!r} element {index}")
            found, pending = await plane.wait_all(job_ids, wait_s)
        if pending:
            message = (f"no result after {wait_s:g} s for {len(pending)} of {len(job_ids)} jobs, still queued or "
                       f"running: poll GET /jobs/{{job_id}} for {', '.join(pending)}")
            return _failure(504, message, job_ids=pending)
        for index, job_id in enumerate(job_ids):
            stored = found[job_id]
            if stored.state != states.SUCCESS:
                prefix = f"input {parsed.inputs[0].name!r} element {index}: " if len(job_ids) > 1 else ""
                status = job_status(stored.value, "v2")
                return _failure(status, prefix + str(stored.value), job_id=job_id)
        tensors = output_tensors(sig, [found[job_id].value for job_id in job_ids])
        header: dict[str, Any] = {"model_name": sig.id}
        if sig.version is not None:
            header["model_version"] = sig.version
        if parsed.id is not None:
            header["id"] = parsed.id
        content, json_length = encode_response(header, [(tensors[name], binary) for name, binary in chosen])
        if json_length is None:
            return Response(content, media_type="application/json")
        return Response(content, media_type="application/octet-stream", headers={HEADER_LENGTH: str(json_length)})

    @router.post("/repository/index", **needs(Need.EVERY_MODEL))
    async def repository_index(request: Request) -> Any:
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
        for beat in await aread_heartbeats(plane.redis, plane.keyspace):
            for loaded in beat.loaded:
                where.setdefault(loaded.model_id, []).append(beat.hostname)
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
        return [entry for entry in index if entry["state"] == "READY"] if options.get("ready") else index

    @router.post("/repository/models/{model_name}/load", **needs(Need.EVERY_MODEL))
    @router.post("/repository/models/{model_name}/unload", **needs(Need.EVERY_MODEL))
    async def load_or_unload(model_name: str) -> Response:
        """Refused: workers load models on demand and evict them when memory runs short."""
        sig = signature(store, model_name)
        return _failure(400, f"Swapless loads and unloads models on demand: send requests to "
                        f"/v2/models/{sig.id}/infer and a worker loads {sig.id!r} for them")

    @router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False,
                      **needs(Need.KEY))
    async def no_such_endpoint(path: str, request: Request) -> Response:
        return _failure(404, f"no endpoint {request.method} /v2/{path}: the Open Inference Protocol endpoints are "
                        "listed at /docs")

    return router
