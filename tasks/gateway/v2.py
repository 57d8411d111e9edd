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
(``tasks.gateway.tensors``); a gzip or deflate request body is decompressed, up to the gateway's body limit.

Every error is ``{"error": "..."}``: 400 bad input (the job's own ``InputError`` too), 404 unknown model, version or
endpoint, 413 body too large once decompressed, 503 Redis down or full, 504 no result in time (naming the jobs).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import time
import zlib
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import redis.asyncio as aredis
from celery import states
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from redis.exceptions import RedisError

from config.settings import Settings
from manager.errors import BackendUnavailable, InputError, ModelLoadError, ModelTooLarge, SwaplessError, UnknownModel
from manager.store import ModelStore
from tasks.broker.connection import translate
from tasks.broker.results import StoredResult
from tasks.client import Client
from tasks.errors import JobCancelled, JobExpired, QueueFull
from tasks.gateway.signature import (
    Signature,
    UnknownVersion,
    chosen_outputs,
    job_inputs,
    metadata,
    output_tensors,
    route_models,
    signature,
)
from tasks.gateway.tensors import HEADER_LENGTH, encode_response, parse_request
from tasks.observe.heartbeat import aread_heartbeats

__all__ = ["BodyTooLarge", "Gateway", "v2_router"]

logger = logging.getLogger(__name__)

_PING_S = 2.0
_MAX_WAIT_S = 3600.0


class Gateway(Protocol):
    """What the routes use of the gateway's shared state (``tasks.gateway.app``)."""

    settings: Settings
    store: ModelStore
    client: Client

    @property
    def redis(self) -> aredis.Redis: ...

    async def wait(self, job_id: str, timeout_s: float) -> StoredResult: ...


class BodyTooLarge(SwaplessError):
    """A compressed request body is over the gateway's limit once decompressed."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.max_bytes = max_bytes

    @property
    def message(self) -> str:
        return (f"the request body is over the limit of {self.max_bytes} bytes once decompressed "
                "(SWAPLESS_GATEWAY_MAX_BODY_BYTES): send fewer inputs per request")


def _status(err: BaseException) -> int:
    if isinstance(err, (UnknownModel, UnknownVersion)):
        return 404
    if isinstance(err, InputError):
        return 400
    if isinstance(err, BodyTooLarge):
        return 413
    if isinstance(err, JobCancelled):
        return 409
    if isinstance(err, JobExpired):
        return 504
    if isinstance(err, QueueFull) or (isinstance(err, (BackendUnavailable, ModelLoadError))
                                      and not isinstance(err, ModelTooLarge)):
        return 503
    return 500


def _failure(status: int, message: str, retry_after_s: int, **extra: Any) -> JSONResponse:
    headers = {"Retry-After": str(retry_after_s)} if status == 503 else None
    return JSONResponse(status_code=status, content={"error": message, **extra}, headers=headers)


def _decompressed(body: bytes, encoding: str | None, max_bytes: int, model_id: str) -> bytes:
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return body
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(name)
    if wbits is None:
        raise InputError(model_id, f"Content-Encoding {encoding!r} is not supported: send gzip, deflate or identity")
    decoder = zlib.decompressobj(wbits)
    try:
        plain = decoder.decompress(body, max_bytes + 1)
    except zlib.error as err:
        raise InputError(model_id, f"the {name} body cannot be decompressed ({err}): send it uncompressed") from None
    if len(plain) > max_bytes:
        raise BodyTooLarge(max_bytes)
    return plain


async def _wait_all(gw: Gateway, job_ids: list[str], timeout_s: float) -> tuple[dict[str, StoredResult], list[str]]:
    """The jobs' final states, and the ids still pending after ``timeout_s``. Jobs are consumed in order, so it waits
    on the last one pending (one pub/sub wait), then reads the others in one batched read."""
    deadline = time.monotonic() + timeout_s
    found: dict[str, StoredResult] = {}
    pending = list(job_ids)
    while pending:
        last = pending[-1]
        stored = await gw.wait(last, max(0.0, deadline - time.monotonic()))
        if not stored.ready:
            break
        found[last] = stored
        others = pending[:-1]
        if others:
            for job_id, other in zip(others, await asyncio.to_thread(gw.client.fetch, others), strict=True):
                if other.ready:
                    found[job_id] = other
        pending = [job_id for job_id in pending if job_id not in found]
    return found, pending


#: The infer body for the OpenAPI schema (the route reads it raw: it may be JSON followed by binary tensors).
_INFER_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": f"an inference request; with {HEADER_LENGTH}, that many bytes of JSON and then binary tensors",
        "content": {"application/json": {"schema": {"type": "object"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def v2_router(gw: Gateway, *, retry_after_s: int = 5) -> APIRouter:
    """The ``/v2`` routes over the gateway's state; any error in them answers ``{"error": ...}`` (see the module).

    Args:
        gw: the gateway's shared state.
        retry_after_s: the ``Retry-After`` of a 503, seconds.
    """
    redis_url = gw.settings.broker_url

    def answer(err: Exception) -> Response:
        better = translate(err, redis_url) if isinstance(err, (RedisError, OSError)) else err
        if not isinstance(better, SwaplessError):
            logger.exception("%s in an Open Inference Protocol request", type(err).__name__, exc_info=err)
            return _failure(500, f"internal error ({type(err).__name__}): see the gateway's log", retry_after_s)
        return _failure(_status(better), str(better), retry_after_s)

    class _Route(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def guarded(request: Request) -> Response:
                try:
                    return await handler(request)
                except Exception as err:  # noqa: BLE001 - every error under /v2 answers in the protocol's shape
                    return answer(err)

            return guarded

    router = APIRouter(prefix="/v2", route_class=_Route, tags=["Open Inference Protocol (KServe v2)"])

    async def ping() -> None:
        await asyncio.wait_for(gw.redis.ping(), timeout=_PING_S)

    @router.get("")
    async def server_metadata() -> dict[str, Any]:
        """The server's name, version and protocol extensions."""
        try:
            version = importlib.metadata.version("swapless")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return {"name": "swapless", "version": version, "extensions": ["binary_tensor_data", "model_repository"]}

    @router.get("/health/live")
    async def live() -> dict[str, bool]:
        """200 while the gateway answers."""
        return {"live": True}

    @router.get("/health/ready")
    async def ready() -> dict[str, bool]:
        """200 when Redis answers (jobs can be queued), else 503."""
        await ping()
        return {"ready": True}

    @router.get("/models/{model_name}")
    async def model_metadata(model_name: str) -> dict[str, Any]:
        """The model's input and outputs; a model or route by id or alias."""
        return metadata(signature(gw.store, model_name))

    @router.get("/models/{model_name}/versions/{model_version}")
    async def version_metadata(model_name: str, model_version: str) -> dict[str, Any]:
        """The model's input and outputs, if it has this version."""
        return metadata(signature(gw.store, model_name, model_version))

    async def is_ready(sig: Signature) -> dict[str, Any]:
        await ping()
        return {"name": sig.id, "ready": True}

    @router.get("/models/{model_name}/ready")
    async def model_ready(model_name: str) -> dict[str, Any]:
        """200 when the model exists and Redis answers: one not loaded now is loaded for its first job."""
        return await is_ready(signature(gw.store, model_name))

    @router.get("/models/{model_name}/versions/{model_version}/ready")
    async def version_ready(model_name: str, model_version: str) -> dict[str, Any]:
        """200 when the model has this version and Redis answers."""
        return await is_ready(signature(gw.store, model_name, model_version))

    @router.post("/models/{model_name}/infer", openapi_extra=_INFER_BODY)
    async def model_infer(model_name: str, request: Request) -> Response:
        """Run the inputs as jobs (one per element, interactive priority) and answer LABELS and SCORES."""
        return await infer(signature(gw.store, model_name), request)

    @router.post("/models/{model_name}/versions/{model_version}/infer", openapi_extra=_INFER_BODY)
    async def version_infer(model_name: str, model_version: str, request: Request) -> Response:
        """Inference on the model if it has this version."""
        return await infer(signature(gw.store, model_name, model_version), request)

    async def infer(sig: Signature, request: Request) -> Response:
        body = _decompressed(await request.body(), request.headers.get("content-encoding"),
                             gw.settings.gateway_max_body_bytes, sig.id)
        parsed = parse_request(body, request.headers.get(HEADER_LENGTH), sig.id)
        target, values = job_inputs(gw.store, sig, parsed)
        chosen = chosen_outputs(parsed, sig)
        timeout_us = parsed.parameters.get("timeout")
        wait_s = gw.settings.predict_timeout_s
        if isinstance(timeout_us, (int, float)) and not isinstance(timeout_us, bool) and timeout_us > 0:
            wait_s = min(timeout_us / 1e6, _MAX_WAIT_S)
        jobs = await asyncio.to_thread(gw.client.submit_jobs, [(target, v) for v in values], priority="interactive")
        job_ids = [job.id for job in jobs]
        found, pending = await _wait_all(gw, job_ids, wait_s)
        if pending:
            message = (f"no result after {wait_s:g} s for {len(pending)} of {len(job_ids)} jobs, still queued or "
                       f"running: poll GET /jobs/{{job_id}} for {', '.join(pending)}")
            return _failure(504, message, retry_after_s, job_ids=pending)
        for index, job_id in enumerate(job_ids):
            stored = found[job_id]
            if stored.state != states.SUCCESS:
                prefix = f"input {parsed.inputs[0].name!r} element {index}: " if len(job_ids) > 1 else ""
                return _failure(_status(stored.value), prefix + str(stored.value), retry_after_s, job_id=job_id)
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

    @router.post("/repository/index")
    async def repository_index(request: Request) -> Any:
        """Every model and route: READY when loaded on a live worker now (a route: all its models), else
        UNAVAILABLE; either way it takes requests. ``{"ready": true}`` lists only the READY ones."""
        body = await request.body()
        try:
            options = json.loads(body) if body.strip() else {}
        except (UnicodeDecodeError, json.JSONDecodeError):
            options = None
        if not isinstance(options, dict) or not isinstance(options.get("ready", False), bool):
            return _failure(400, 'the body is not a repository index request: send {} or {"ready": true}',
                            retry_after_s)
        where: dict[str, list[str]] = {}
        for beat in await aread_heartbeats(gw.redis, gw.settings.key_prefix):
            for loaded in beat.loaded:
                where.setdefault(loaded.model_id, []).append(beat.hostname)
        later = "not loaded on any live worker: its first request loads it"
        index = []
        for spec in gw.store:
            hosts = where.get(spec.id)
            index.append({"name": spec.id, "version": spec.version, "state": "READY" if hosts else "UNAVAILABLE",
                          "reason": f"loaded on {', '.join(hosts)}" if hosts else later})
        for route_id in gw.store.routes:
            models = list(dict.fromkeys(m.id for m in route_models(gw.store, route_id)))
            missing = [m for m in models if m not in where]
            reason = f"route over {', '.join(models)}" + (f"; {', '.join(missing)} {later}" if missing else "")
            index.append({"name": route_id, "version": "", "state": "UNAVAILABLE" if missing else "READY",
                          "reason": reason})
        return [entry for entry in index if entry["state"] == "READY"] if options.get("ready") else index

    @router.post("/repository/models/{model_name}/load")
    @router.post("/repository/models/{model_name}/unload")
    async def load_or_unload(model_name: str) -> Response:
        """Refused: workers load models on demand and evict them when memory runs short."""
        sig = signature(gw.store, model_name)
        return _failure(400, f"Swapless loads and unloads models on demand: send requests to "
                        f"/v2/models/{sig.id}/infer and a worker loads {sig.id!r} for them", retry_after_s)

    @router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
    async def no_such_endpoint(path: str, request: Request) -> Response:
        return _failure(404, f"no endpoint {request.method} /v2/{path}: the Open Inference Protocol endpoints are "
                        "listed at /docs", retry_after_s)

    return router
