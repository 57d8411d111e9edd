"""The gateway's REST routes (``/jobs``, ``/predict``, ``/models``, ``/healthz``) over the data plane."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from celery import states
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse

from swapless.tasks.broker.connection import aping
from swapless.tasks.broker.results import CANCELLED, TOO_LATE, StoredResult
from swapless.tasks.cluster.members import Heartbeat, aread_heartbeats
from swapless.tasks.cluster.view import aread_placement
from swapless.tasks.gateway.auth import Caller, Need, needs
from swapless.tasks.gateway.errors import job_status
from swapless.tasks.gateway.http import Route, router_of
from swapless.tasks.gateway.plane import Ask, DataPlane
from swapless.tasks.gateway.schema import (
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
)
from swapless.tasks.observe.queue import aread_queue_depth

__all__ = ["REST_ROUTES", "RestEndpoints", "rest_router"]

_JOB_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"
_PING_S = 2.0


def caller_of(request: Request) -> Caller:
    """The caller ``Callers`` found for this request."""
    caller: Caller = request.state.caller
    return caller


def _error_info(error: Any) -> ErrorInfo:
    return ErrorInfo(type=type(error).__name__ if error is not None else "Unknown", message=str(error))


def _job_state(stored: StoredResult) -> JobState:
    if stored.state == states.SUCCESS:
        return JobState(job_id=stored.job_id, state="SUCCESS", model=stored.model, result=stored.value,
                        trace_id=stored.trace_id)
    if stored.state == states.FAILURE:
        return JobState(job_id=stored.job_id, state="FAILURE", error=_error_info(stored.value),
                        trace_id=stored.trace_id)
    return JobState(job_id=stored.job_id, state="PENDING", note="queued or running")


_JOB_ID_PATH = Path(pattern=_JOB_ID, description="the id POST /jobs returned")
_TIMEOUT_QUERY = Query(None, gt=0, le=3600, description="seconds to wait [default: SWAPLESS_PREDICT_TIMEOUT_S]")
_REJECTIONS: dict[int | str, dict[str, Any]] = {
    403: {"description": "the API key may not call this model"},
    404: {"description": "unknown model; the message names the known ids"},
    413: {"description": "request body too large"},
    422: {"description": "the input does not fit the model (its type, or a size limit)"},
    429: {"description": "over this caller's rate or in-flight limit; see Retry-After"},
}


def _loaded_on(beats: list[Heartbeat], home: str, host: bool) -> list[LoadedOn]:
    """Where ``home`` is loaded: on each worker's device, or (``host``) in its host memory."""
    return [
        LoadedOn(worker=beat.hostname, bytes=e.bytes, load_s=e.load_s, hits=e.hits, busy=False if host else e.busy)
        for beat in beats
        for e in (beat.host if host else beat.loaded)
        if e.model_id == home
    ]


def _worker_view(beat: Heartbeat, now: float) -> WorkerView:
    return WorkerView(
        hostname=beat.hostname, worker_id=beat.worker_id, queue=beat.queue,
        heartbeat_age_s=round(beat.age_s(now), 3),
        loaded=[e.model_id for e in beat.loaded], used_bytes=beat.cache.used_bytes,
        max_models=beat.cache.max_models, memory_budget_bytes=beat.cache.memory_budget_bytes,
        jobs_done=beat.jobs_done, jobs_failed=beat.jobs_failed, backlog=beat.backlog,
    )


class RestEndpoints:
    """The REST handlers over one data plane; ``REST_ROUTES`` maps them to paths."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    async def _submit(self, request: Request, body: JobRequest) -> str:
        ids = await self.plane.submit(caller_of(request), [Ask(body.model_id, body.input, body.key)],
                                      priority=body.priority, expires_s=body.expires_s,
                                      callback_url=body.callback_url)
        return ids[0]

    async def submit_job(self, request: Request, body: JobRequest) -> JobAccepted:
        """Queue a job and return its id at once; read its result at ``GET /jobs/{job_id}``."""
        job_id = await self._submit(request, body)
        return JobAccepted(job_id=job_id, status_url=f"/jobs/{job_id}")

    async def job_state(self, request: Request, job_id: str = _JOB_ID_PATH) -> JobState:
        """A job's state: PENDING (queued or running), SUCCESS and its result, or FAILURE and its error."""
        return _job_state(await self.plane.read(caller_of(request), job_id))

    async def cancel_job(self, request: Request, job_id: str = _JOB_ID_PATH) -> Any:
        """Cancel a job that has not started: it is answered ``JobCancelled`` and never run. One that has started
        runs to its end and keeps its result (409, ``running``); one with a result keeps it (409, ``done``)."""
        status = await self.plane.cancel(caller_of(request), job_id)
        if status == CANCELLED:
            return CancelReply(job_id=job_id, status="cancelled", detail=f"job {job_id} is cancelled: it will not run")
        detail = (
            f"job {job_id} has started: it runs to its end and keeps its result; read it at GET /jobs/{job_id}"
            if status == TOO_LATE
            else f"job {job_id} has a result already, kept: read it at GET /jobs/{job_id}"
        )
        reply = CancelReply(job_id=job_id, status="running" if status == TOO_LATE else "done", detail=detail)
        return JSONResponse(status_code=409, content=reply.model_dump())

    async def predict(self, request: Request, body: JobRequest, timeout_s: float | None = _TIMEOUT_QUERY) -> Any:
        """Queue a job and wait for its result. On timeout: 504 with the job id, to poll ``GET /jobs/{job_id}`` (the
        job still runs, unless the body's ``expires_s`` passes before it starts)."""
        wait_s = timeout_s if timeout_s is not None else self.plane.settings.gateway.predict_timeout_s
        async with self.plane.waiting():
            job_id = await self._submit(request, body)
            stored = await self.plane.wait(job_id, wait_s)
        if stored.state == states.SUCCESS:
            return Prediction(job_id=job_id, model=stored.model, result=stored.value)
        if stored.state == states.FAILURE:
            failure = JobFailure(detail=str(stored.value), job_id=job_id, error=_error_info(stored.value))
            return JSONResponse(status_code=job_status(stored.value, "rest"), content=failure.model_dump())
        timeout = PredictTimeout(
            detail=f"no result after {wait_s:g} s; the job is still queued or running: poll GET /jobs/{job_id}",
            job_id=job_id,
            status_url=f"/jobs/{job_id}",
        )
        return JSONResponse(status_code=504, content=timeout.model_dump(), headers={"Location": f"/jobs/{job_id}"})

    async def models(self) -> ModelsView:
        """What exists (the models file) beside what is loaded on which live worker right now (their heartbeats)."""
        plane = self.plane
        store = plane.store
        places = await aread_placement(plane.redis, plane.keyspace, store.ids())
        beats, depth = await asyncio.gather(
            aread_heartbeats(plane.redis, plane.keyspace),
            aread_queue_depth(plane.redis, plane.keyspace, store.ids(), known={p.model_id: p.queued for p in places}),
        )
        placed = {p.model_id: p for p in places}
        views = []
        for spec in [*store, *store.variants()]:
            home = spec.base or spec.id
            place = placed[home]
            views.append(
                ModelView(
                    id=spec.id, aliases=list(spec.aliases), type=spec.type.value, framework=spec.framework,
                    name=spec.name, version=spec.version, description=spec.description, keep_loaded=spec.keep_loaded,
                    waiting=depth.by_model.get(home, 0), held=place.held,
                    claimed_by=list(place.holder_ids), loaded_on=_loaded_on(beats, home, host=False),
                    host_on=_loaded_on(beats, home, host=True), base=spec.base,
                )
            )
        now = time.time()
        workers = [_worker_view(beat, now) for beat in beats]
        return ModelsView(models=views, workers=workers, waiting_estimated=depth.sampled)

    async def healthz(self, request: Request) -> Any:
        """200 when Redis answers (with the number of live workers), else 503."""
        plane = self.plane
        try:
            await aping(plane.redis, _PING_S)
            workers = len(await aread_heartbeats(plane.redis, plane.keyspace))
        except Exception as err:  # noqa: BLE001 - any failure to reach Redis is "unavailable"
            request.app.state.log.unavailable(err, plane.settings.redis.broker_url)
            health = Health(status="unavailable", redis="unavailable")
            return JSONResponse(status_code=503, content=health.model_dump(exclude_none=True))
        return Health(status="ok", redis="ok", workers=workers)


REST_ROUTES = [
    Route("/jobs", "submit_job", ("POST",),
          {"status_code": 202, "response_model": JobAccepted, "responses": _REJECTIONS, **needs(Need.KEY)}),
    Route("/jobs/{job_id}", "job_state", ("GET",),
          {"response_model": JobState, "response_model_exclude_none": True,
           "responses": {404: {"description": "no such job for this caller"},
                         410: {"description": "the job finished; its result has expired"}},
           **needs(Need.KEY)}),
    Route("/jobs/{job_id}", "cancel_job", ("DELETE",),
          {"response_model": CancelReply,
           "responses": {409: {"model": CancelReply, "description": "too late: the job has started or has a result"},
                         404: {"description": "no such job for this caller"}},
           **needs(Need.KEY)}),
    Route("/predict", "predict", ("POST",),
          {"response_model": Prediction,
           "responses": {
               **_REJECTIONS,
               503: {"description": "the queue is unavailable, or the gateway holds as many waits as it may"},
               504: {"model": PredictTimeout, "description": "no result in time; poll the job"},
               500: {"model": JobFailure, "description": "the job failed"},
           },
           **needs(Need.KEY)}),
    Route("/models", "models", ("GET",), {"response_model": ModelsView, **needs(Need.KEY)}),
    Route("/healthz", "healthz", ("GET",),
          {"response_model": Health, "responses": {503: {"model": Health}}, **needs(Need.NOTHING)}),
]


def rest_router(plane: DataPlane) -> APIRouter:
    """The REST routes over ``plane``."""
    return router_of(RestEndpoints(plane), REST_ROUTES)
