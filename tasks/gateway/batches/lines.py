"""The lines of batch files, pure: an input line checked and decoded, and the output and error lines written.

Input, one request per line (the body is what ``POST /predict`` takes)::

    {"custom_id": "r-1", "method": "POST", "url": "/predict", "body": {"model_id": "sentiment", "input": "great"}}

Output (``response.body`` is what ``/predict`` answers) and error lines::

    {"id": "batch_req_...", "custom_id": "r-1", "response": {"status_code": 200, "request_id": "...",
     "body": {"job_id": "...", "model": "sentiment", "result": [...]}}, "error": null}
    {"id": "batch_req_...", "custom_id": "r-2", "response": {"status_code": 422, "request_id": "...",
     "body": {"detail": "...", "job_id": "...", "error": {"type": "InputError", "message": "..."}}},
     "error": {"code": "InputError", "message": "..."}}
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, TypeGuard

from pydantic import ValidationError
from pydantic_core import from_json, to_json

import swapless.config.errors
from swapless.config.describe import kind
from swapless.tasks.gateway.errors import BadBatchFile, ModelForbidden, job_status
from swapless.tasks.gateway.schema import JobRequest

__all__ = ["ENDPOINT", "BatchLine", "LineChecker", "error_line", "output_line", "parse_line", "status_of"]

#: The one endpoint a batch's lines may name.
ENDPOINT = "/predict"
_FIELDS = frozenset({"custom_id", "method", "url", "body"})
_MAX_CUSTOM_ID = 512
#: The body fields ``_plain`` checks by hand (a body with any other field goes through the full model).
_PLAIN_FIELDS = frozenset({"model_id", "input", "priority", "key"})
_PRIORITIES = frozenset({"interactive", "bulk"})


@dataclass(frozen=True, slots=True)
class BatchLine:
    """One request of a batch input file; ``error``: why ``/predict`` would refuse its body, else None."""

    custom_id: str
    model_id: str
    input: Any
    priority: str = "interactive"
    key: str | None = None
    error: str | None = None


def parse_line(line: bytes, number: int) -> BatchLine:
    """One input line, its envelope checked for the file and its body for its own request.

    Raises:
        BadBatchFile: not JSON, not the four fields, not ``POST /predict``, or a body that is not an object.
    """
    try:
        data = from_json(line)
    except ValueError as err:
        raise BadBatchFile(number, f"not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise BadBatchFile(number, f"{kind(data)}, not an object with custom_id, method, url and body")
    extra = sorted(set(data) - _FIELDS)
    if extra:
        raise BadBatchFile(number, f"unknown field {extra[0]!r}: a line has only custom_id, method, url and body")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > _MAX_CUSTOM_ID:
        raise BadBatchFile(number, f"custom_id must be a string of 1 to {_MAX_CUSTOM_ID} characters")
    if data.get("method") != "POST":
        raise BadBatchFile(number, f"method must be \"POST\", not {data.get('method')!r}")
    if data.get("url") != ENDPOINT:
        raise BadBatchFile(number, f"url must be {ENDPOINT!r} (the batch's endpoint), not {data.get('url')!r}")
    body = data.get("body")
    if type(body) is not dict:
        raise BadBatchFile(number, f"body must be an object (a /predict body), not {kind(body)}")
    if _plain(body):
        return BatchLine(custom_id, body["model_id"], body["input"], body.get("priority", "interactive"),
                         body.get("key"))
    try:
        job = JobRequest.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(["body", *(str(part) for part in first["loc"])])
        model_id = body.get("model_id")
        return BatchLine(custom_id, model_id if isinstance(model_id, str) else "", None,
                         error=f"{where}: {first['msg']}")
    return BatchLine(custom_id, job.model_id, job.input, job.priority, job.key)


def _plain(body: Any) -> TypeGuard[dict[str, Any]]:
    """Whether ``body`` is a plain ``JobRequest`` (checked by hand, fast); else the model checks it."""
    if type(body) is not dict or "input" not in body or not body.keys() <= _PLAIN_FIELDS:
        return False
    model_id, priority, key = body.get("model_id"), body.get("priority", "interactive"), body.get("key")
    if type(model_id) is not str or not 1 <= len(model_id) <= 128:
        return False
    if type(priority) is not str or priority not in _PRIORITIES:
        return False
    return key is None or (type(key) is str and 1 <= len(key) <= 256)


class LineChecker:
    """Checks an upload line by line: each line's shape and size, the count, and unique ``custom_id``s.

    Args:
        max_lines: most requests a file may hold.
        max_line_bytes: the longest line.
    """

    def __init__(self, max_lines: int, max_line_bytes: int) -> None:
        self.max_lines = max_lines
        self.max_line_bytes = max_line_bytes
        self.lines = 0
        self.number = 0
        self._seen: set[bytes] = set()

    def check(self, line: bytes) -> None:
        """Check the next line (a blank line is skipped).

        Raises:
            BadBatchFile: as ``parse_line``; over a bound; a repeated custom_id.
        """
        self.number += 1
        if len(line) > self.max_line_bytes:
            raise BadBatchFile(self.number, f"{len(line)} bytes, over the {self.max_line_bytes} bytes one request "
                               "may take here: send a smaller input")
        if not line.strip():
            return
        parsed = parse_line(line, self.number)
        digest = hashlib.blake2b(parsed.custom_id.encode(), digest_size=12).digest()
        if digest in self._seen:
            raise BadBatchFile(self.number, f"custom_id {parsed.custom_id!r} repeats an earlier line's: each request "
                               "needs its own")
        self.lines += 1
        if self.lines > self.max_lines:
            raise BadBatchFile(self.number, f"more than {self.max_lines} requests (SWAPLESS_BATCH_MAX_LINES): split "
                               "the file into several batches")
        self._seen.add(digest)


def _request_id(batch_id: str, custom_id: str) -> str:
    return hashlib.blake2b(f"{batch_id}\0{custom_id}".encode(), digest_size=12).hexdigest()


def _dumps(value: Any) -> bytes:
    return to_json(value) + b"\n"


def output_line(batch_id: str, custom_id: str, model: str, result: Any) -> bytes:
    """The output file's line for a request that succeeded."""
    request_id = _request_id(batch_id, custom_id)
    body = {"job_id": request_id, "model": model, "result": result}
    return _dumps({"id": f"batch_req_{request_id}", "custom_id": custom_id,
                   "response": {"status_code": 200, "request_id": request_id, "body": body}, "error": None})


def status_of(type_name: str) -> int:
    """The status ``/predict`` answers a failed job of this error type with (500 for an unknown type)."""
    if type_name == ModelForbidden.__name__:
        return 403
    found = getattr(swapless.config.errors, type_name, None)
    if not isinstance(found, type) or not issubclass(found, swapless.config.errors.SwaplessError):
        return 500
    return job_status(found.__new__(found), "rest")


def error_line(batch_id: str, custom_id: str, type_name: str, message: str, status: int | None = None) -> bytes:
    """The error file's line for a request that failed (``status``: its HTTP status, else its error type's)."""
    request_id = _request_id(batch_id, custom_id)
    code = status if status is not None else status_of(type_name)
    body = {"detail": message, "job_id": request_id, "error": {"type": type_name, "message": message}}
    return _dumps({"id": f"batch_req_{request_id}", "custom_id": custom_id,
                   "response": {"status_code": code, "request_id": request_id, "body": body},
                   "error": {"code": type_name, "message": message}})
