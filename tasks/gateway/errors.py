"""The gateway's own errors, and its one map from any error to an HTTP status and a safe message.

    SwaplessError
    ├── UnknownJob          no job of that id for this caller (404)
    ├── ResultExpired       the job finished, but its result has expired (410)
    ├── ModelForbidden      the caller's key may not call that model (403)
    ├── BodyTooLarge        a compressed body is over the limit once decompressed (413)
    ├── TooManyElements     an Open Inference Protocol request declares too many jobs (413; ``tensors``)
    ├── UnknownFile         no batch file of that id for this caller (404)
    ├── UnknownBatch        no batch of that id for this caller (404)
    ├── BadBatchFile        an uploaded batch file is refused (400)
    ├── BadBatch            a batch cannot be created or changed as asked (400, or 409)
    ├── OverLimit           a caller is over its rate or in-flight limit (429; ``quotas``)
    └── GatewayBusy         the gateway holds as many waiting requests as it may (503; ``quotas``)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Literal

from fastapi.exceptions import RequestValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from swapless.config.errors import (
    BackendUnavailable,
    InputError,
    JobCancelled,
    JobExpired,
    ModelLoadError,
    ModelTooLarge,
    QueueFull,
    QueueUnavailable,
    SwaplessError,
    UnknownModel,
    WebhookRefused,
)
from swapless.tasks.broker.connection import translate
from swapless.tasks.gateway.quotas import GatewayBusy, OverLimit
from swapless.tasks.gateway.signature import UnknownVersion
from swapless.tasks.gateway.tensors import TooManyElements

__all__ = [
    "BadBatch",
    "BadBatchFile",
    "BodyTooLarge",
    "LogThrottle",
    "ModelForbidden",
    "Problem",
    "QuotaExceeded",
    "ResultExpired",
    "TooManyElements",
    "UnknownBatch",
    "UnknownFile",
    "UnknownJob",
    "job_status",
    "problem",
]

logger = logging.getLogger(__name__)

#: Seconds a caller is told to wait before sending again when the queue refuses jobs (``Retry-After``).
QUEUE_RETRY_AFTER_S = 5


class UnknownJob(SwaplessError):
    """No job of this id that the caller may read: never accepted here, another caller's, or long gone."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id

    @property
    def message(self) -> str:
        return (f"no job {self.job_id} for this caller: use the job_id that POST /jobs returned to this key (records "
                "are kept until its result expires)")


class ResultExpired(SwaplessError):
    """The job finished, but its result is no longer kept."""

    def __init__(self, job_id: str, expires_s: int) -> None:
        super().__init__(job_id, expires_s)
        self.job_id, self.expires_s = job_id, expires_s

    @property
    def message(self) -> str:
        return (f"job {self.job_id} finished, but its result has expired (results are kept "
                f"{self.expires_s} s, SWAPLESS_RESULT_EXPIRES_S): send the job again")


class ModelForbidden(SwaplessError):
    """The caller's key may not call the model a request addresses."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    @property
    def message(self) -> str:
        return self.detail


class BodyTooLarge(SwaplessError):
    """A compressed request body is over the gateway's limit once decompressed."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.max_bytes = max_bytes

    @property
    def message(self) -> str:
        return (f"the request body is over the limit of {self.max_bytes} bytes once decompressed "
                "(SWAPLESS_GATEWAY_MAX_BODY_BYTES): send fewer inputs per request")


class UnknownFile(SwaplessError):
    """No batch file of this id that the caller may read (never uploaded, another caller's, deleted, expired)."""

    def __init__(self, file_id: str) -> None:
        super().__init__(file_id)
        self.file_id = file_id

    @property
    def message(self) -> str:
        return (f"no file {self.file_id} for this caller: use an id POST /v1/files or a batch returned to this key "
                "(files are kept SWAPLESS_BATCH_FILE_RETENTION_S)")


class UnknownBatch(SwaplessError):
    """No batch of this id that the caller may read."""

    def __init__(self, batch_id: str) -> None:
        super().__init__(batch_id)
        self.batch_id = batch_id

    @property
    def message(self) -> str:
        return f"no batch {self.batch_id} for this caller: use an id POST /v1/batches returned to this key"


class BadBatchFile(SwaplessError):
    """An uploaded batch file is refused as a whole: ``line`` (1-based; 0: the file itself) and what is wrong."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(line, problem)
        self.line, self.problem = line, problem

    @property
    def message(self) -> str:
        where = f"line {self.line}" if self.line else "the file"
        return f"{where}: {self.problem}; nothing was kept: fix it and upload the file again"


class QuotaExceeded(SwaplessError):
    """An API key is at one of its batch quotas (``setting``); 413 when ``too_large``, else 429."""

    def __init__(self, detail: str, setting: str, too_large: bool = False) -> None:
        super().__init__(detail, setting, too_large)
        self.detail, self.setting, self.too_large = detail, setting, too_large

    @property
    def message(self) -> str:
        return f"{self.detail} ({self.setting}): delete some, or wait for them to end and expire, then send again"


class BadBatch(SwaplessError):
    """A batch request that cannot be done: ``conflict`` (409) when the batch's state forbids it, else 400."""

    def __init__(self, detail: str, conflict: bool = False) -> None:
        super().__init__(detail, conflict)
        self.detail, self.conflict = detail, conflict

    @property
    def message(self) -> str:
        return self.detail


@dataclass(frozen=True)
class Problem:
    """An error as a response: its status, the message shown, and its headers."""

    status: int
    message: str
    headers: dict[str, str] = field(default_factory=dict)
    #: FastAPI's own validation errors, kept as their list (REST only)
    errors: list[dict[str, object]] | None = None
    #: more fields of the REST body (an unknown model's ``known`` ids)
    extra: dict[str, object] = field(default_factory=dict)


class LogThrottle:
    """Logs a warning of each kind at most once every ``every_s`` seconds."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}

    def warning(self, kind: str, text: str) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -self.every_s) >= self.every_s:
            self._last[kind] = now
            logger.warning("%s", text)

    def unavailable(self, err: BaseException, redis_url: str) -> None:
        """Log why Redis could not be reached (what callers are told leaves it out)."""
        better = translate(err, redis_url) if isinstance(err, (RedisError, OSError)) else err
        self.warning("unavailable", f"Redis unavailable: {better or type(err).__name__}")


def _queue_problem(err: QueueFull | QueueUnavailable, log: LogThrottle) -> Problem:
    retry = {"Retry-After": str(QUEUE_RETRY_AFTER_S)}
    log.warning(type(err).__name__, f"answering 503: {err}")
    if isinstance(err, QueueFull):
        return Problem(503, f"the queue refused the job: {err.reason}", retry)
    return Problem(503, f"the queue (Redis) is unavailable: try again in {QUEUE_RETRY_AFTER_S} s", retry)


def problem(err: BaseException, protocol: Literal["rest", "v2"], redis_url: str, log: LogThrottle) -> Problem:
    """The response for ``err`` (Redis errors translated for ``redis_url``); the rest goes to ``log``."""
    if isinstance(err, (RedisError, OSError)):
        err = translate(err, redis_url)
    if isinstance(err, RequestValidationError):
        # FastAPI's default echoes each bad value back; a body can be megabytes of base64: leave the values out.
        errors = [{k: v for k, v in e.items() if k not in ("input", "ctx", "url")} for e in err.errors()]
        first = errors[0] if errors else {}
        where = ".".join(str(part) for part in first.get("loc", ()))  # type: ignore[union-attr]
        return Problem(422 if protocol == "rest" else 400, f"{where}: {first.get('msg', 'invalid request')}",
                       errors=errors)
    if isinstance(err, HTTPException):
        return Problem(err.status_code, str(err.detail), dict(err.headers or {}))
    if isinstance(err, (QueueFull, QueueUnavailable)):
        return _queue_problem(err, log)
    if isinstance(err, OverLimit):
        return Problem(429, str(err), {"Retry-After": str(err.retry_after_s)})
    if isinstance(err, GatewayBusy):
        return Problem(503, str(err), {"Retry-After": str(err.retry_after_s)})
    if isinstance(err, ClientDisconnect):  # the caller went away mid-body: nothing of its request was kept
        log.warning("disconnect", "a client disconnected before its request body had arrived; the request was dropped")
        return Problem(400, "the client disconnected before the request body had arrived")
    if not isinstance(err, SwaplessError):
        logger.exception("%s in a gateway request", type(err).__name__, exc_info=err)
        return Problem(500, f"internal error ({type(err).__name__}): see the gateway's log")
    if isinstance(err, InputError) and protocol == "rest":  # the shape of FastAPI's own 422s
        return Problem(422, str(err), errors=[{"type": "input", "loc": ["body", "input"], "msg": str(err)}])
    if isinstance(err, UnknownModel):
        return Problem(404, str(err), extra={"known": list(err.known)})
    return Problem(_status(err, protocol), str(err))


def job_status(error: object, protocol: Literal["rest", "v2"]) -> int:
    """The status a failed job's own error answers with (its kind's; 500 for one of no kind of ours)."""
    return _status(error, protocol) if isinstance(error, SwaplessError) else 500


def _status(err: SwaplessError, protocol: Literal["rest", "v2"]) -> int:
    if isinstance(err, (UnknownModel, UnknownVersion, UnknownJob, UnknownFile, UnknownBatch)):
        return 404
    if isinstance(err, BadBatchFile):
        return 400
    if isinstance(err, BadBatch):
        return 409 if err.conflict else 400
    if isinstance(err, (InputError, WebhookRefused)):
        return 422 if protocol == "rest" else 400
    if isinstance(err, ModelForbidden):
        return 403
    if isinstance(err, ResultExpired):
        return 410
    if isinstance(err, QuotaExceeded):
        return 413 if err.too_large else 429
    if isinstance(err, (BodyTooLarge, TooManyElements)):
        return 413
    if isinstance(err, JobCancelled):
        return 409
    if isinstance(err, JobExpired):
        return 504
    if isinstance(err, (BackendUnavailable, ModelLoadError)) and not isinstance(err, ModelTooLarge):
        return 503
    return 500
