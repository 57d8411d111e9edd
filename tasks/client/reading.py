"""Reading results now: job ids to their result keys, a chunk's items (``"<chunk id>:<index>"``, read from the
chunk's stored list), and a final state turned into its prediction or its error. Reads are batched MGETs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from celery import states

from swapless.config.errors import JobFailed, SwaplessError
from swapless.tasks.broker.results import ResultStore, StoredResult
from swapless.tasks.protocol import decode_outcome, split_item_id, storage_id

__all__ = ["MGET_KEYS", "item_result", "raise_for", "read_results", "read_stored"]

#: Keys read by one MGET at most.
MGET_KEYS = 1000


def item_result(job_id: str, stored: StoredResult) -> StoredResult:
    """The state of ``job_id`` from what is stored under its storage id (itself, or its chunk's)."""
    parts = split_item_id(job_id)
    if parts is None:
        return stored
    if not stored.ready:
        return StoredResult(job_id, stored.state)
    index = parts[1]
    if stored.state != states.SUCCESS:
        return StoredResult(job_id, stored.state, stored.value, trace_id=stored.trace_id)  # the chunk failed: each item
    if not isinstance(stored.value, list) or index >= len(stored.value):
        return StoredResult(job_id, states.FAILURE, JobFailed(job_id, "MalformedResult", "no such item in its chunk"))
    ok, value = decode_outcome(stored.value[index], job_id)
    return StoredResult(job_id, states.SUCCESS if ok else states.FAILURE, value, trace_id=stored.trace_id)


def read_stored(results: ResultStore, storage_ids: Iterable[str]) -> dict[str, StoredResult]:
    """What is stored under each storage id now (PENDING where nothing is), in batched MGETs.

    Raises:
        redis.RedisError: Redis cannot be reached (the callers translate it).
    """
    unique = list(dict.fromkeys(storage_ids))
    found: dict[str, StoredResult] = {}
    for start in range(0, len(unique), MGET_KEYS):
        for stored in results.fetch(unique[start : start + MGET_KEYS]):
            found[stored.job_id] = stored
    return found


def read_results(results: ResultStore, job_ids: Sequence[str]) -> list[StoredResult]:
    """The stored states of many jobs now (batched MGETs; the items of one chunk share one read)."""
    stored = read_stored(results, (storage_id(job_id) for job_id in job_ids))
    return [item_result(job_id, stored[storage_id(job_id)]) for job_id in job_ids]


def raise_for(stored: StoredResult) -> Any:
    """A final state's prediction, or its error raised (rebuilt as the worker's own where it can be)."""
    if stored.state == states.SUCCESS:
        return stored.value
    error = stored.value
    if isinstance(error, SwaplessError):
        raise error
    raise JobFailed(stored.job_id, type(error).__name__ if error is not None else stored.state, str(error))
