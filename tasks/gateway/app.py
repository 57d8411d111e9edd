"""The gateway's composition root: ``create_app`` builds every part once and wires them (docs/concepts/gateway.md)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from swapless.config.settings import GatewaySettings, Settings, get_settings
from swapless.manager.registry.specs import InputType
from swapless.manager.registry.store import ModelStore
from swapless.tasks import tracing
from swapless.tasks.client import Client
from swapless.tasks.gateway.auth import install_api_keys
from swapless.tasks.gateway.batches import BatchRunner, batch_router
from swapless.tasks.gateway.batches.routes import UPLOAD_ENVELOPE_BYTES
from swapless.tasks.gateway.errors import LogThrottle
from swapless.tasks.gateway.framing import LOOPBACK_HOSTS, BodyLimit, RequestGuard, host_name
from swapless.tasks.gateway.keys import KeyRing
from swapless.tasks.gateway.plane import DataPlane
from swapless.tasks.gateway.rest import rest_router
from swapless.tasks.gateway.spans import TraceRequests, fastapi_traces_requests
from swapless.tasks.gateway.status_page import status_router
from swapless.tasks.gateway.v2 import v2_router

__all__ = ["allowed_hosts", "create_app", "job_body_limit"]


def allowed_hosts(settings: GatewaySettings, keys: KeyRing) -> frozenset[str] | None:
    """The host names the gateway answers to (``SWAPLESS_GATEWAY_ALLOWED_HOSTS``); None: any."""
    if settings.gateway_allowed_hosts is None:
        open_to_all = bool(keys) or settings.gateway_insecure_no_auth
        return None if open_to_all else LOOPBACK_HOSTS
    names = [name.strip() for name in settings.gateway_allowed_hosts.split(",") if name.strip()]
    return None if "*" in names else frozenset(host_name(name) for name in names)


#: A job request's JSON beside its input: the model id, a routing key, priority, deadline (generous).
JOB_ENVELOPE_BYTES = 64 * 1024
#: A batch line's JSON beside its body: custom_id, method, url.
LINE_ENVELOPE_BYTES = 1024


def job_body_limit(settings: Settings, store: ModelStore) -> BodyLimit:
    """The largest body a one-job request can need with these models: their largest input, plus envelope."""
    types = {spec.type for spec in store}
    sizes = [(0, "SWAPLESS_GATEWAY_MAX_BODY_BYTES")]
    if InputType.TEXT in types:
        sizes.append((12 * settings.inputs.max_text_chars, "SWAPLESS_MAX_TEXT_CHARS"))
    if InputType.IMAGE in types:
        sizes.append((4 * math.ceil(settings.inputs.max_image_bytes / 3), "SWAPLESS_MAX_IMAGE_BYTES"))
    largest, setting = max(sizes)
    if largest + JOB_ENVELOPE_BYTES >= settings.gateway.gateway_max_body_bytes:
        return BodyLimit(settings.gateway.gateway_max_body_bytes, "SWAPLESS_GATEWAY_MAX_BODY_BYTES", "")
    return BodyLimit(largest + JOB_ENVELOPE_BYTES, setting, "that one job's input can take here")


def create_app(settings: Settings | None = None) -> FastAPI:
    """The gateway's FastAPI app for ``settings`` (the environment's by default); Redis is reached only while it runs.

    Raises:
        ConfigError: the models file or the API keys are missing or invalid.
    """
    settings = settings or get_settings()
    store = ModelStore.from_file(settings.cache.models_file)
    plane = DataPlane(settings, store, Client(settings=settings, validate=False))
    runner = BatchRunner(settings, store) if settings.batches.batch_runner else None
    traced = tracing.wanted()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        provider = tracing.configure("swapless-gateway") if traced else None
        await plane.start()
        if runner is not None:
            runner.start()
        try:
            yield
        finally:
            if runner is not None:
                await asyncio.to_thread(runner.stop)
            await plane.stop()
            tracing.shutdown(provider)

    app = FastAPI(
        title="Swapless gateway",
        version="0.1.0",
        description="Queue inference jobs for many models and read their results.",
        lifespan=lifespan,
    )
    app.state.redis_url = settings.redis.broker_url
    app.state.log = LogThrottle()
    one_job = job_body_limit(settings, store)
    routers = [rest_router(plane), v2_router(plane), status_router(settings, store, lambda: plane.redis),
               batch_router(settings, store, one_job.bytes + LINE_ENVELOPE_BYTES)]
    for router in routers:
        app.include_router(router)
    # added first: inside the guard, so bodies are bounded already; it reads each route's declaration
    keys = install_api_keys(app, settings.gateway, store, [route for router in routers for route in router.routes])
    gateway, batches = settings.gateway, settings.batches
    origins = frozenset(o.strip().lower().rstrip("/") for o in gateway.gateway_allowed_origins.split(",") if o.strip())
    batch_file = BodyLimit(batches.batch_max_file_bytes + UPLOAD_ENVELOPE_BYTES, "SWAPLESS_BATCH_MAX_FILE_BYTES",
                           "a batch file may take", batches.batch_upload_timeout_s, "SWAPLESS_BATCH_UPLOAD_TIMEOUT_S")
    app.add_middleware(RequestGuard, max_body_bytes=gateway.gateway_max_body_bytes,
                       body_timeout_s=gateway.gateway_body_timeout_s, allowed_hosts=allowed_hosts(gateway, keys),
                       allowed_origins=origins,
                       body_limits={"/jobs": one_job, "/predict": one_job, "/v1/files": batch_file})
    if not (traced and fastapi_traces_requests()):
        # Outermost: every answer. A FastAPI that traces requests itself makes each request's span and its context
        # current (around this stack): attaching the caller's context here would put the jobs' send spans beside
        # that span instead of under it.
        app.add_middleware(TraceRequests, tracer=tracing.tracer() if traced else None)
    return app
