"""Job results in Celery's Redis result-backend format, stored and read many per round trip: first-wins writes,
attempt counts, cancels (docs/concepts/delivery.md, "Results").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from celery import Celery, states
from kombu.exceptions import EncodeError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import ResponseError as RedisResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from swapless.config.errors import FORMER_MODULES, PUBLIC_MODULE, JobCancelled, JobFailed, SwaplessError
from swapless.tasks.broker.connection import RedisHealth, ReplicasBehind, ReplicaWait, is_refused_write
from swapless.tasks.broker.kombu_private import result_meta
from swapless.tasks.broker.result_scripts import CANCEL, PRIOR, SET_FIRST_WINS, START, STORE_MANY
from swapless.tasks.protocol import storage_id

__all__ = ["ALREADY_DONE", "CANCELLED", "REPLICATED_CHANNEL", "TOO_LATE", "ResultStore", "StoredResult"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: The channel a store publishes nothing to before its ``WAIT``, to wait for its replicas; no one listens.
REPLICATED_CHANNEL = "swapless-replicated"

#: Most jobs per call of ``STORE_MANY`` (a bigger batch is several calls in one pipeline).
STORE_PER_CALL = 256

#: What ``ResultStore.cancel`` says of each job, by the script's answer.
CANCELLED, TOO_LATE, ALREADY_DONE = "cancelled", "running", "done"
_CANCEL_ANSWERS = (CANCELLED, TOO_LATE, ALREADY_DONE)


@dataclass(frozen=True)
class StoredResult:
    """A job's state as read back: a Celery state, and the result or the rebuilt error."""

    job_id: str
    state: str
    value: Any = None
    #: the model that served the job (a route's pick), when the worker said
    model: str | None = None
    #: the trace id of the job's producer (its W3C ``traceparent``), when the message carried one
    trace_id: str | None = None

    @property
    def ready(self) -> bool:
        return self.state in states.READY_STATES


class ResultStore:
    """Pipelined reads and first-wins writes of job results; one per thread.

    Args:
        app: the Celery app whose Redis result backend holds the results.
        retry_s: how long failed writes are retried; None: for as long as they fail.
        client: the redis-py client (default: the backend's own).
        health: told about each failure and success.
        replicas: the replicas a store waits for (None: none).
    """

    def __init__(
        self, app: Celery, retry_s: float | None = 60.0, client: Any = None, health: RedisHealth | None = None,
        replicas: ReplicaWait | None = None,
    ) -> None:
        self.app = app
        self.replicas = replicas
        self.backend = app.backend
        self.client = client if client is not None else self.backend.client
        self.retry_s = retry_s
        self.health = health
        self.expires_s = int(self.backend.expires or 0) or 365 * 86400
        # the fast encoding is the backend's only for plain JSON results with no extended fields
        self._plain_json = self.backend.serializer == "json" and not app.conf.find_value_for_key("extended", "result")
        self._shas: dict[str, str] = {}  # script source -> its SHA on the server (see _sha)

    def _retrying(self, operation: Callable[[], T]) -> T:
        """Run a Redis operation, retrying connection failures and refused writes with backoff for ``retry_s``."""
        deadline = None if self.retry_s is None else time.monotonic() + self.retry_s
        pause_s = 0.1
        while True:
            try:
                done = operation()
                if self.health is not None:
                    self.health.ok()
                return done
            except NoScriptError:  # Redis restarted and lost its scripts: load ours again
                self._shas.clear()
            except (RedisConnectionError, RedisTimeoutError, RedisResponseError, ReplicasBehind) as err:
                if isinstance(err, RedisResponseError) and not is_refused_write(err):
                    raise
                if deadline is not None and time.monotonic() + pause_s > deadline:
                    raise
                if self.health is not None:
                    self.health.failed(err, "storing results")
                else:
                    logger.warning("Redis unavailable (%s); retrying in %.1f s", err, pause_s)
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 2.0)

    def _sha(self, script: str) -> str:
        """The SHA of a script loaded on the server, for EVALSHA in a pipeline."""
        sha = self._shas.get(script)
        if sha is None:
            sha = self._shas[script] = self.client.script_load(script)
        return sha

    def attempts_key(self, job_id: str) -> str:
        """Where a job's started attempts are counted."""
        return self._attempts_key(self.key(job_id))

    @staticmethod
    def _attempts_key(result_key: str) -> str:
        return result_key.replace("celery-task-meta-", "swapless-attempts-", 1)

    def record_key(self, job_id: str) -> str:
        """Where the gateway records who submitted a job; the worker marks it done with the result."""
        return self._record_key(self.key(job_id))

    def shadow_ref_key(self, job_id: str) -> str:
        """Where a shadowed job's ``[served model, top label]`` is kept for its shadows."""
        return self.key(job_id).replace("celery-task-meta-", "swapless-shadowref-", 1)

    @property
    def record_key_prefix(self) -> str:
        """What every record key starts with."""
        return self.record_key("-")[:-1]

    @staticmethod
    def _record_key(result_key: str) -> str:
        return result_key.replace("celery-task-meta-", "swapless-owner-", 1)

    def key(self, job_id: str) -> str:
        return self.backend.get_key_for_task(job_id).decode()

    def store(
        self, outcomes: Iterable[tuple[str, Any, SwaplessError | None]], models: Mapping[str, str] | None = None,
        traces: Mapping[str, str] | None = None,
    ) -> list[bool]:
        """Store ``(job_id, result, error)`` triples in one round trip; a job with ``error`` becomes FAILURE.

        Args:
            models: job id -> the model that served it.
            traces: job id -> its producer's trace id.

        Returns:
            per job, whether this write stored it (False: a result was there).
        """
        items = list(outcomes)
        if not items:
            return []
        first: list[bool] = []  # a store retried for its replicas finds its own results there: the first answer counts

        def write() -> list[bool]:
            stored, waited = self._store(items, models or {}, traces or {})
            first[:] = first or stored
            if self.replicas is not None:
                self.replicas.check(waited)
            return first

        return self._retrying(write)

    def _store(
        self, items: list[tuple[str, Any, SwaplessError | None]], models: Mapping[str, str],
        traces: Mapping[str, str],
    ) -> tuple[list[bool], Any]:
        """Per job whether this write stored it, and the ``WAIT``'s reply (None: no replicas waited for)."""
        done_at = datetime.now(UTC).isoformat()  # one instant for the batch, as Celery's app.now() gives
        if len(items) == 1 and self.replicas is None:
            job_id, result, error = items[0]
            key = self.key(job_id)
            value = self._encode(job_id, result, error, done_at, models.get(job_id), traces.get(job_id))
            return [bool(self.client.evalsha(self._sha(SET_FIRST_WINS), 3, key, self._attempts_key(key),
                                             self._record_key(key), value, self.expires_s))], None
        sha = self._sha(STORE_MANY)
        pipe = self.client.pipeline(transaction=False)
        for start in range(0, len(items), STORE_PER_CALL):
            keys: list[str] = []
            values: list[Any] = []
            for job_id, result, error in items[start : start + STORE_PER_CALL]:
                key = self.key(job_id)
                keys += (key, self._attempts_key(key), self._record_key(key))
                values.append(self._encode(job_id, result, error, done_at, models.get(job_id), traces.get(job_id)))
            pipe.evalsha(sha, len(keys), *keys, self.expires_s, *values)
        if self.replicas is None:
            return [bool(stored) for reply in pipe.execute() for stored in reply], None
        pipe.publish(self._replicated_channel, "")
        pipe.execute_command(*self.replicas.command())
        replies = pipe.execute()
        return [bool(flag) for reply in replies[:-2] for flag in reply], replies[-1]

    @property
    def _replicated_channel(self) -> str:
        return self.key("-").replace("celery-task-meta--", REPLICATED_CHANNEL, 1)

    def _encode(
        self, job_id: str, result: Any, error: SwaplessError | None, done_at: str, model: str | None = None,
        trace_id: str | None = None,
    ) -> Any:
        """The backend's encoding of one job's result meta; a result JSON cannot encode becomes a failure."""
        if error is None and self._plain_json:
            meta = {"status": states.SUCCESS, "result": result, "traceback": None, "children": None,
                    "date_done": done_at, "task_id": job_id}
            if model is not None:
                meta["model"] = model
            if trace_id is not None:
                meta["trace_id"] = trace_id
            try:
                return json.dumps(meta)
            except (TypeError, ValueError):
                pass  # a type only kombu's encoder knows (a datetime, a UUID): the backend's way below
        try:
            meta = self._meta(job_id, result, error)
            if model is not None:
                meta["model"] = model
            if trace_id is not None:
                meta["trace_id"] = trace_id
            return self.backend.encode(meta)
        except EncodeError as err:
            logger.error("the result of job %s cannot be stored as JSON (%s); storing a failure instead", job_id, err)
            failure = JobFailed(job_id, "ResultNotStorable", f"the model's output cannot be stored as JSON: {err}")
            return self.backend.encode(self._meta(job_id, None, failure))

    def _meta(self, job_id: str, result: Any, error: SwaplessError | None) -> dict[str, Any]:
        if error is None:
            meta = result_meta(self.backend, result, states.SUCCESS)
        else:
            meta = result_meta(self.backend, self.backend.prepare_exception(error), states.FAILURE)
        meta["task_id"] = job_id
        return meta

    def prior(
        self, job_ids: Sequence[str], result_ids: Sequence[str] | None = None, start: Sequence[str] = ()
    ) -> tuple[set[str], dict[str, int]]:
        """In one round trip: which jobs have a result, how often each was started, and ``start(start)``.

        Args:
            result_ids: the ids whose results to look for (default: ``job_ids``).
            start: the jobs about to run: those never started get their first attempt counted.

        Returns:
            (result ids with a result, {id: attempts started}).
        """
        if not job_ids:
            return set(), {}
        lookup = list(job_ids if result_ids is None else result_ids)
        if lookup == list(job_ids) and list(start) == list(job_ids[: len(start)]):
            return self._prior_singles(lookup, len(start))
        started_under = [storage_id(job_id) for job_id in start]

        def read() -> list[Any]:
            fresh_sha = self._sha(START) if start else ""
            pipe = self.client.pipeline(transaction=False)
            if lookup:
                pipe.mget([self.key(job_id) for job_id in lookup])
            pipe.mget([self.attempts_key(job_id) for job_id in job_ids])
            if start:
                keys = [self.attempts_key(job_id) for job_id in start] + [self.key(i) for i in started_under]
                pipe.evalsha(fresh_sha, len(keys), *keys, self.expires_s, "fresh")
            replies = pipe.execute()
            if not lookup:
                replies.insert(0, [])
            return replies if start else [*replies, []]

        values, attempts, now_done = self._retrying(read)
        done = {job_id for job_id, value in zip(lookup, values, strict=True) if value is not None}
        done.update(under for under, flag in zip(started_under, now_done, strict=True) if flag)
        started = {
            job_id: int(count)
            for job_id, count in zip(job_ids, attempts, strict=True)
            if count is not None and job_id not in done
        }
        return done, started

    def _prior_singles(self, job_ids: list[str], starting: int) -> tuple[set[str], dict[str, int]]:
        """``prior`` for jobs that are their own results, the first ``starting`` about to run: one script call."""
        results = [self.key(job_id) for job_id in job_ids]
        keys = results + [self._attempts_key(key) for key in results]

        def read() -> list[int]:
            return self.client.evalsha(self._sha(PRIOR), len(keys), *keys, self.expires_s, starting)

        found = self._retrying(read)
        done = {job_id for job_id, count in zip(job_ids, found, strict=True) if int(count) < 0}
        return done, {job_id: int(count) for job_id, count in zip(job_ids, found, strict=True) if int(count) > 0}

    def start(self, job_ids: Sequence[str]) -> set[str]:
        """Count one more started attempt of each job, in one script call.

        Returns:
            the result ids found with a result already: those jobs are not to run.
        """
        if not job_ids:
            return set()
        under = [storage_id(job_id) for job_id in job_ids]
        keys = [self.attempts_key(job_id) for job_id in job_ids] + [self.key(i) for i in under]

        def write() -> list[int]:
            return self.client.evalsha(self._sha(START), len(keys), *keys, self.expires_s, "count")

        return {result_id for result_id, flag in zip(under, self._retrying(write), strict=True) if flag}

    def cancel(
        self, job_ids: Sequence[str], error_for: Callable[[str], SwaplessError], hold_s: int | None = None
    ) -> dict[str, str]:
        """Cancel jobs that have not started, in one round trip; a chunk item cancels its chunk.

        Returns:
            per id: ``CANCELLED``, ``TOO_LATE`` (it has started) or ``ALREADY_DONE``.
        """
        unique = list(dict.fromkeys(storage_id(job_id) for job_id in job_ids))
        if not unique:
            return {}
        done_at = datetime.now(UTC).isoformat()
        keep_s = max(self.expires_s, hold_s or 0)

        def write() -> list[int]:
            sha = self._sha(CANCEL)
            pipe = self.client.pipeline(transaction=False)
            for job_id in unique:
                key = self.key(job_id)
                value = self._encode(job_id, None, error_for(job_id), done_at)
                pipe.evalsha(sha, 3, key, self._attempts_key(key), self._record_key(key), value, keep_s)
            return pipe.execute()

        answers = dict(zip(unique, self._retrying(write), strict=True))
        return {job_id: _CANCEL_ANSWERS[int(answers[storage_id(job_id)])] for job_id in job_ids}

    def clear_attempts(self, job_ids: Sequence[str]) -> None:
        """Drop the attempt counters of jobs whose results were stored under another id (chunk items)."""
        if job_ids:
            self._retrying(lambda: self.client.delete(*[self.attempts_key(job_id) for job_id in job_ids]))

    def fetch(self, job_ids: Sequence[str]) -> list[StoredResult]:
        """Read many results in one MGET; a job without a stored result is PENDING."""
        if not job_ids:
            return []
        values = self.client.mget([self.key(job_id) for job_id in job_ids])
        return [self.decode(job_id, raw) for job_id, raw in zip(job_ids, values, strict=True)]

    def decode(self, job_id: str, raw: bytes | str | None) -> StoredResult:
        """A job's state from its stored value (None: PENDING), errors rebuilt as the worker's own."""
        if raw is None:
            return StoredResult(job_id, states.PENDING)
        meta = self.backend.decode(raw)
        stored_error = meta.get("result") if meta.get("status") in states.EXCEPTION_STATES else None
        if isinstance(stored_error, dict) and stored_error.get("exc_module") in FORMER_MODULES:
            stored_error["exc_module"] = PUBLIC_MODULE  # stored by a worker of an older layout: same class by name
        meta = self.backend.meta_from_decoded(meta)
        if meta["status"] == states.REVOKED:  # Celery's own revoke (a plain Celery worker's): a cancel like ours
            return StoredResult(job_id, states.FAILURE, JobCancelled(job_id))
        return StoredResult(job_id, meta["status"], meta.get("result"), meta.get("model"), meta.get("trace_id"))

    def forget(self, job_ids: Sequence[str]) -> None:
        """Delete stored results, in one round trip."""
        if job_ids:
            self.client.delete(*[self.key(job_id) for job_id in job_ids])
