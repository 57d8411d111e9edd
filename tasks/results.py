"""Job results in Celery's Redis result-backend format, many per round trip.

Celery's backend writes one result per round trip (``SETEX`` + ``PUBLISH`` per task) and reads one per ``GET``;
at thousands of jobs per second that is the bottleneck, so results are written and read here in pipelines,
in exactly the format ``celery.result.AsyncResult`` reads (``celery-task-meta-<id>``, the backend's encoding,
its key prefix and expiry).

Writes are first-wins: a result is stored with ``SET NX``, so a redelivered copy of a job that already has a
final result never overwrites it (at-least-once delivery, idempotent results).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, states

from manager.errors import SwaplessError

__all__ = ["ResultStore", "StoredResult"]

# Store only if absent, and publish so that Celery's own AsyncResult.get() (pub/sub) wakes up.
_SET_FIRST_WINS = """
local ok = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
if ok then
  redis.call('PUBLISH', KEYS[1], ARGV[1])
  return 1
end
return 0
"""


@dataclass(frozen=True)
class StoredResult:
    """A job's state as read back: ``state`` is a Celery state; ``value`` the result or the rebuilt error."""

    job_id: str
    state: str
    value: Any = None

    @property
    def ready(self) -> bool:
        return self.state in states.READY_STATES


class ResultStore:
    """Pipelined reads and first-wins writes of job results. Use one per thread (Celery backends are per thread).

    Args:
        app: the Celery app whose result backend (Redis) holds the results.
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.backend = app.backend
        self.client = self.backend.client
        self._set_first_wins = self.client.register_script(_SET_FIRST_WINS)
        self.expires_s = int(self.backend.expires or 0) or 365 * 86400

    def key(self, job_id: str) -> str:
        return self.backend.get_key_for_task(job_id).decode()

    def store(self, outcomes: Iterable[tuple[str, Any, SwaplessError | None]]) -> list[bool]:
        """Store ``(job_id, result, error)`` triples in one round trip; a job with ``error`` becomes FAILURE.

        Returns:
            per job, whether this write stored it (False: a final result was already there, kept as it was).
        """
        pipe = self.client.pipeline(transaction=False)
        count = 0
        for job_id, result, error in outcomes:
            if error is None:
                meta = self.backend._get_result_meta(result=result, state=states.SUCCESS, traceback=None, request=None)
            else:
                meta = self.backend._get_result_meta(
                    result=self.backend.prepare_exception(error), state=states.FAILURE, traceback=None, request=None
                )
            meta["task_id"] = job_id
            self._set_first_wins(keys=[self.key(job_id)], args=[self.backend.encode(meta), self.expires_s], client=pipe)
            count += 1
        if not count:
            return []
        return [bool(stored) for stored in pipe.execute()]

    def existing(self, job_ids: Sequence[str]) -> set[str]:
        """The ids among ``job_ids`` that already have a stored result (one MGET)."""
        if not job_ids:
            return set()
        values = self.client.mget([self.key(job_id) for job_id in job_ids])
        return {job_id for job_id, value in zip(job_ids, values, strict=True) if value is not None}

    def fetch(self, job_ids: Sequence[str]) -> list[StoredResult]:
        """Read many results in one MGET; jobs without a stored result are PENDING (queued or unknown)."""
        if not job_ids:
            return []
        values = self.client.mget([self.key(job_id) for job_id in job_ids])
        found = []
        for job_id, raw in zip(job_ids, values, strict=True):
            if raw is None:
                found.append(StoredResult(job_id, states.PENDING))
                continue
            meta = self.backend.decode_result(raw)
            found.append(StoredResult(job_id, meta["status"], meta.get("result")))
        return found
