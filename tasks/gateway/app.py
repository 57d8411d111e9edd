"""The HTTP gateway (FastAPI): submit jobs, read their results, see what exists and what is loaded where.

    POST /jobs       {model_id, input}   202 {job_id}
    GET  /jobs/{id}                      200 {job_id, state, result | error}
    POST /predict    {model_id, input}   200 {job_id, result}; 504 {job_id} when the wait runs out (poll /jobs/{id})
    GET  /models                         the registry beside what each live worker has loaded (its heartbeat)
    GET  /healthz                        200 when Redis answers, else 503
    GET  /docs                           the OpenAPI UI (schema at /openapi.json)
    GET  /status, /status.json           the live status page and its data (``status_page``; ``/`` redirects)

With API keys set (``SWAPLESS_API_KEYS``), all but the health checks and the docs need ``Authorization: Bearer
<key>`` (``auth`` says which key each request needs).

Requests are checked before anything is queued: an unknown model is 404 naming the known ids, an input of the
wrong type for the model's ``type`` is 422 (text: a string; image: a base64 string), a body over
``SWAPLESS_GATEWAY_MAX_BODY_BYTES`` is 413.

The event loop never waits on Redis: results, heartbeats and the health check go through ``redis.asyncio`` (a
result wakes its waiter through the result backend's publish), and only the publish of a job, which is
synchronous in kombu, runs in a worker thread.

Run it with ``swapless serve`` (uvicorn), or ``uvicorn --factory tasks.gateway:create_app``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aredis
from celery import states
from fastapi import FastAPI, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from config.settings import Settings, get_settings
from manager.errors import (
    BackendUnavailable,
    InputError,
    ModelLoadError,
    ModelTooLarge,
    UnknownModel,
)
from manager.specs import ModelSpec
from manager.store import ModelStore
from tasks.broker.connection import async_redis_client, translate
from tasks.broker.results import CANCELLED, TOO_LATE, StoredResult
from tasks.client import Client
from tasks.client.waiting import aread_result, await_result
from tasks.errors import JobCancelled, JobExpired, QueueFull, QueueUnavailable
from tasks.gateway.auth import install_api_keys
from tasks.gateway.limits import BodyLimit
from tasks.gateway.schema import (
    CancelReply,
    ErrorInfo,
    Health,
    JobAccepted,
    JobFailure,
    JobRequest,
    JobState,
    LoadedOn,
    ModelsView,
    ModelView,
    Prediction,
    PredictTimeout,
    WorkerView,
    check_input,
)
from tasks.gateway.status_page import status_router
from tasks.observe.heartbeat import aread_heartbeats
from tasks.observe.placement import aread_placement
from tasks.observe.queue import aread_queue_depth

__all__ = ["create_app"]

_JOB_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"
#: Seconds a producer is told to wait before sending again when Redis refuses jobs (``Retry-After``).
RETRY_AFTER_S = 5


def _error_info(error: Any) -> ErrorInfo:
    return ErrorInfo(type=type(error).__name__ if error is not None else "Unknown", message=str(error))


def _failure_status(error: Any) -> int:
    if isinstance(error, UnknownModel):
        return 404
    if isinstance(error, InputError):
        return 422
    if isinstance(error, (BackendUnavailable, ModelLoadError)) and not isinstance(error, ModelTooLarge):
        return 503
    if isinstance(error, JobExpired):
        return 504
    if isinstance(error, JobCancelled):
        return 409
    return 500


class _Gateway:
    """What the routes share: settings, the registry, the producer client, and the asyncio Redis (per lifespan)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = ModelStore.from_file(settings.models_file)
        self.client = Client(settings=settings, validate=False)
        self._redis: aredis.Redis | None = None

    @property
    def redis(self) -> aredis.Redis:
        if self._redis is None:
            raise RuntimeError("the gateway's Redis client exists only while the app runs (lifespan)")
        return self._redis

    @asynccontextmanager
    async def lifespan(self, _: FastAPI) -> AsyncIterator[None]:
        self._redis = async_redis_client(self.settings.broker_url, connect_timeout_s=self.settings.connect_timeout_s)
        try:
            yield
        finally:
            await self._redis.aclose()
            self._redis = None
            self.client.close()

    def spec(self, model_id: str) -> ModelSpec:
        return self.store.get(model_id)

    async def submit(self, request: JobRequest) -> str:
        target = request.model_id
        if not self.store.is_route(target):  # a route's pick is checked by the worker that serves it
            spec = self.spec(target)
            check_input(spec, request.input)
            target = spec.id
        job = await asyncio.to_thread(self.client.submit, target, request.input, priority=request.priority,
                                      expires=request.expires_s, key=request.key)
        return job.id

    async def fetch(self, job_id: str) -> StoredResult:
        return await aread_result(self.redis, self.client.results, job_id)

    async def cancel(self, job_id: str) -> str:
        answers = await asyncio.to_thread(self.client.cancel, [job_id])
        return answers[job_id]

    async def wait(self, job_id: str, timeout_s: float) -> StoredResult:
        """The job's result once ready, or its PENDING state after ``timeout_s``; woken by the backend's publish."""
        return await await_result(self.redis, self.client.results, job_id, timeout_s)


def _unknown_model(_: Request, err: UnknownModel) -> JSONResponse:
    return JSONResponse(status_code=404, content={"detail": str(err), "known": err.known})


def _invalid_request(_: Request, err: RequestValidationError) -> JSONResponse:
    # FastAPI's default echoes each bad value back; a body can be megabytes of base64, so leave the values out.
    errors = [{key: value for key, value in e.items() if key != "input"} for e in err.errors()]
    return JSONResponse(status_code=422, content={"detail": jsonable_encoder(errors)})


def _queue_refused(_: Request, err: BaseException) -> JSONResponse:
    # QueueUnavailable (Redis down) and QueueFull (out of memory, at its bound): try again later
    return JSONResponse(status_code=503, content={"detail": str(err)}, headers={"Retry-After": str(RETRY_AFTER_S)})


def _job_state(stored: StoredResult) -> JobState:
    if stored.state == states.SUCCESS:
        return JobState(job_id=stored.job_id, state="SUCCESS", model=stored.model, result=stored.value)
    if stored.state == states.FAILURE:
        return JobState(job_id=stored.job_id, state="FAILURE", error=_error_info(stored.value))
    return JobState(job_id=stored.job_id, state="PENDING", note="queued, running, or unknown id")


def create_app(settings: Settings | None = None) -> FastAPI:
    """The gateway's FastAPI app for ``settings`` (the environment's by default).

    Reads the models file now (a bad one fails here); connects to Redis only while the app runs.

    Raises:
        ConfigError: the models file is missing or invalid.
    """
    gw = _Gateway(settings or get_settings())
    app = FastAPI(
        title="Swapless gateway",
        version="0.1.0",
        description="Queue inference jobs for many models and read their results.",
        lifespan=gw.lifespan,
    )
    install_api_keys(app, gw.settings, gw.store)  # inside BodyLimit: the bodies it reads are bounded already
    app.add_middleware(BodyLimit, max_bytes=gw.settings.gateway_max_body_bytes)
    app.add_exception_handler(UnknownModel, _unknown_model)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(QueueUnavailable, _queue_refused)
    app.add_exception_handler(QueueFull, _queue_refused)
    redis_url = gw.settings.broker_url

    def redis_down(request: Request, err: Exception) -> JSONResponse:
        # the asyncio reads (results, heartbeats, queue depth) raise redis-py's own errors
        return _queue_refused(request, translate(err, redis_url))

    app.add_exception_handler(RedisError, redis_down)
    job_id_path = Path(pattern=_JOB_ID, description="the id POST /jobs returned")
    rejections: dict[int | str, dict[str, Any]] = {
        404: {"description": "unknown model; the message names the known ids"},
        413: {"description": "request body too large"},
        422: {"description": "the input does not fit the model's type"},
    }

    @app.post("/jobs", status_code=202, response_model=JobAccepted, responses=rejections)
    async def submit_job(request: JobRequest) -> JobAccepted:
        """Queue a job and return its id at once; read its result at ``GET /jobs/{job_id}``."""
        job_id = await gw.submit(request)
        return JobAccepted(job_id=job_id, status_url=f"/jobs/{job_id}")

    @app.get("/jobs/{job_id}", response_model=JobState, response_model_exclude_none=True)
    async def job_state(job_id: str = job_id_path) -> JobState:
        """A job's state: PENDING (queued, running, or unknown id), SUCCESS and its result, or FAILURE and its error."""
        return _job_state(await gw.fetch(job_id))

    @app.delete(
        "/jobs/{job_id}",
        response_model=CancelReply,
        responses={409: {"model": CancelReply, "description": "too late: the job has started or has a result"}},
    )
    async def cancel_job(job_id: str = job_id_path) -> Any:
        """Cancel a job that has not started: it is answered ``JobCancelled`` and never run. One that has started
        runs to its end and keeps its result (409, ``running``); one with a result keeps it (409, ``done``)."""
        status = await gw.cancel(job_id)
        if status == CANCELLED:
            return CancelReply(job_id=job_id, status="cancelled", detail=f"job {job_id} is cancelled: it will not run")
        detail = (
            f"job {job_id} has started: it runs to its end and keeps its result; read it at GET /jobs/{job_id}"
            if status == TOO_LATE
            else f"job {job_id} has a result already, kept: read it at GET /jobs/{job_id}"
        )
        reply = CancelReply(job_id=job_id, status="running" if status == TOO_LATE else "done", detail=detail)
        return JSONResponse(status_code=409, content=reply.model_dump())

    @app.post(
        "/predict",
        response_model=Prediction,
        responses={
            **rejections,
            504: {"model": PredictTimeout, "description": "no result in time; poll the job"},
            500: {"model": JobFailure, "description": "the job failed"},
        },
    )
    async def predict(
        request: JobRequest,
        timeout_s: float | None = Query(
            None, gt=0, le=3600, description="seconds to wait [default: SWAPLESS_PREDICT_TIMEOUT_S]"
        ),
    ) -> Any:
        """Queue a job and wait for its result. On timeout: 504 with the job id, to poll ``GET /jobs/{job_id}`` (the
        job still runs, unless the body's ``expires_s`` passes before it starts)."""
        wait_s = timeout_s if timeout_s is not None else gw.settings.predict_timeout_s
        job_id = await gw.submit(request)
        stored = await gw.wait(job_id, wait_s)
        if stored.state == states.SUCCESS:
            return Prediction(job_id=job_id, model=stored.model, result=stored.value)
        if stored.state == states.FAILURE:
            failure = JobFailure(detail=str(stored.value), job_id=job_id, error=_error_info(stored.value))
            return JSONResponse(status_code=_failure_status(stored.value), content=failure.model_dump())
        timeout = PredictTimeout(
            detail=f"no result after {wait_s:g} s; the job is still queued or running: poll GET /jobs/{job_id}",
            job_id=job_id,
            status_url=f"/jobs/{job_id}",
        )
        return JSONResponse(status_code=504, content=timeout.model_dump(), headers={"Location": f"/jobs/{job_id}"})

    @app.get("/models", response_model=ModelsView)
    async def models() -> ModelsView:
        """What exists (the models file) beside what is loaded on which live worker right now (their heartbeats)."""
        s = gw.settings
        beats, depth, places = await asyncio.gather(
            aread_heartbeats(gw.redis, s.key_prefix), aread_queue_depth(gw.redis, s),
            aread_placement(gw.redis, s.queue, s.key_prefix, gw.store.ids()),
        )
        placed = {p.model_id: p for p in places}
        now = time.time()
        views = []
        for spec in gw.store:
            place = placed[spec.id]
            loaded_on = [
                LoadedOn(worker=beat.hostname, bytes=e.bytes, load_s=e.load_s, hits=e.hits, busy=e.busy)
                for beat in beats
                for e in beat.loaded
                if e.model_id == spec.id
            ]
            views.append(
                ModelView(
                    id=spec.id, aliases=list(spec.aliases), type=spec.type.value, framework=spec.framework,
                    name=spec.name, version=spec.version, description=spec.description,
                    waiting=depth.by_model.get(spec.id, 0) + place.waiting, held=place.held,
                    claimed_by=list(place.holder_ids), loaded_on=loaded_on,
                )
            )
        workers = [
            WorkerView(
                hostname=beat.hostname, worker_id=beat.worker_id, queue=beat.queue, heartbeat_age_s=round(beat.age_s(now), 3),
                loaded=[e.model_id for e in beat.loaded], used_bytes=beat.cache.used_bytes,
                max_models=beat.cache.max_models, memory_budget_bytes=beat.cache.memory_budget_bytes,
                jobs_done=beat.jobs_done, jobs_failed=beat.jobs_failed, backlog=beat.backlog,
            )
            for beat in beats
        ]
        return ModelsView(models=views, workers=workers, waiting_estimated=depth.sampled)

    @app.get("/healthz", response_model=Health, responses={503: {"model": Health}})
    async def healthz() -> Any:
        """200 when Redis answers (with the number of live workers), else 503."""
        try:
            await asyncio.wait_for(gw.redis.ping(), timeout=2.0)
            workers = len(await aread_heartbeats(gw.redis, gw.settings.key_prefix))
        except Exception as err:  # noqa: BLE001 - any failure to reach Redis is "unavailable"
            reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            health = Health(status="unavailable", redis=reason)
            return JSONResponse(status_code=503, content=health.model_dump(exclude_none=True))
        return Health(status="ok", redis="ok", workers=workers)

    from tasks.gateway.v2 import v2_router  # the Open Inference Protocol (KServe v2): its own errors, {"error": ...}

    app.include_router(v2_router(gw, retry_after_s=RETRY_AFTER_S))
    app.include_router(status_router(gw.settings, gw.store, lambda: gw.redis))
    return app
