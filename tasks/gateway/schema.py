"""The gateway's request and response bodies (they make its OpenAPI schema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ErrorInfo",
    "Health",
    "JobAccepted",
    "JobFailure",
    "JobRequest",
    "JobState",
    "LoadedOn",
    "ModelView",
    "ModelsView",
    "PredictTimeout",
    "Prediction",
    "WorkerView",
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class JobRequest(_Body):
    """A job: the model and one input (a string for text models, a base64 string of an image for image models)."""

    model_id: str = Field(min_length=1, max_length=128, examples=["sentiment"])
    input: Any = Field(examples=["what a lovely day"])
    priority: Literal["interactive", "bulk"] = "interactive"
    expires_s: float | None = Field(
        None, gt=0, le=7 * 24 * 3600,
        description="a deadline, in seconds from now: a job not started by then is answered JobExpired and never "
        "run",
    )
    key: str | None = Field(
        None, min_length=1, max_length=256,
        description="a sticky key for a route (a user id): the same key always gets the same version",
    )
    callback_url: str | None = Field(
        None, min_length=1, max_length=2048,
        description="where the job's final state (result or error, the serving model, timings) is posted once it is "
        "stored, signed per the Standard Webhooks spec; its host must be allowed (SWAPLESS_WEBHOOK_ALLOWED_HOSTS)",
    )


class ErrorInfo(_Body):
    type: str
    message: str


class JobAccepted(_Body):
    job_id: str
    status_url: str


class JobState(_Body):
    job_id: str
    state: Literal["PENDING", "SUCCESS", "FAILURE"]
    #: the model that served it (a route's pick)
    model: str | None = None
    result: Any = None
    error: ErrorInfo | None = None
    note: str | None = None
    #: the trace id of the job's producer (its W3C traceparent), when the job carried one and has finished
    trace_id: str | None = None


class CancelReply(_Body):
    job_id: str
    #: cancelled: it will not run; running: too late, it has started and keeps its result; done: it has a result
    status: Literal["cancelled", "running", "done"]
    detail: str


class Prediction(_Body):
    job_id: str
    model: str | None = None
    result: Any


class JobFailure(_Body):
    detail: str
    job_id: str
    error: ErrorInfo


class PredictTimeout(_Body):
    detail: str
    job_id: str
    status_url: str


class LoadedOn(_Body):
    worker: str
    bytes: int
    load_s: float
    hits: int
    busy: bool


class ModelView(_Body):
    id: str
    aliases: list[str]
    type: str
    framework: str
    name: str
    version: str
    description: str
    keep_loaded: bool = Field(False, description="loaded when a worker starts and kept loaded (its models-file entry)")
    waiting: int = Field(description="messages waiting in Redis: in the model's own lists (exact) and the ingress")
    held: int = Field(0, description="jobs fetched by workers, not yet finished")
    claimed_by: list[str] = Field(default_factory=list, description="workers holding a claim: they fetch its jobs")
    loaded_on: list[LoadedOn]
    host_on: list[LoadedOn] = Field(
        default_factory=list, description="workers keeping it built in their host tier: a copy away from their device"
    )
    base: str | None = Field(
        None, description="set on a variant (an adapter): the model it runs over; its jobs wait, are held and load "
        "with that model's, whose figures it shows",
    )


class WorkerView(_Body):
    hostname: str
    worker_id: str = ""
    queue: str
    heartbeat_age_s: float
    loaded: list[str]
    used_bytes: int
    max_models: int
    memory_budget_bytes: int | None
    jobs_done: int
    jobs_failed: int
    backlog: int


class ModelsView(_Body):
    models: list[ModelView]
    workers: list[WorkerView]
    waiting_estimated: bool = Field(description="per-model waiting counts are scaled up from a sample of the queue")


class Health(_Body):
    status: Literal["ok", "unavailable"]
    redis: str
    workers: int | None = None
