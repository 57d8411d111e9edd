"""A message as the worker decodes it, once, at intake: ``decode`` makes the ``Delivery`` every later stage reads.

It holds the message's jobs (one per input of a chunk, each routed), its deadline, its shadow headers and its
producer's trace context. Pure functions: no Redis, no Celery.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from swapless.config.errors import InputError
from swapless.config.settings import Settings, WorkerSettings
from swapless.manager import Job
from swapless.manager.registry.store import ModelStore
from swapless.tasks.protocol import (
    CHUNK_TASK,
    KEYS_HEADER,
    SENT_AT_HEADER,
    SHADOW_HEADER,
    SHADOWED_HEADER,
    deadline_of,
    item_id,
    read_payload,
)
from swapless.tasks.routing import Router
from swapless.tasks.tracing import TRACEPARENT_HEADER

__all__ = ["Delivery", "decode"]


@dataclass(frozen=True)
class Delivery:
    """One message, decoded and routed.

    Attributes:
        request: what acks and rejects go through (Celery's request, or the intake's ``LeanRequest``).
        jobs: its jobs, each addressed to the model that serves it (a chunk: one per input).
        chunk: whether it is a chunk.
        shadow_of: ``(served job id, route id)`` when it is a shadow copy.
        shadowed: whether it is a routed job with shadow copies.
    """

    request: Any
    jobs: tuple[Job, ...]
    chunk: bool = False
    shadow_of: tuple[str, str] | None = None
    shadowed: bool = False

    @property
    def id(self) -> str:
        return str(self.request.id)


def _headers(request: Any) -> dict[str, Any]:
    return getattr(request, "request_dict", None) or {}


def _sent_at(request: Any) -> float | None:
    """The producer's send time (epoch seconds), where the message carries one."""
    sent_at = _headers(request).get(SENT_AT_HEADER)
    return float(sent_at) if isinstance(sent_at, (int, float)) else None


def _deadline(request: Any, urgent: bool, settings: WorkerSettings, sent_at: float | None) -> float | None:
    deadline = deadline_of(request)
    if deadline is not None:
        return deadline
    default_s = settings.interactive_expires_s if urgent else settings.bulk_expires_s
    if default_s is None:
        return None
    return (sent_at if sent_at is not None else time.time()) + default_s


def _queued_at(sent_at: float | None, received_s: float, wall_s: float) -> float:
    """When the job was queued, on the monotonic clock: its producer's send time if stamped, else when taken."""
    if sent_at is None:
        return received_s
    return received_s - max(wall_s - sent_at, 0.0)  # a producer's clock ahead of ours: no wait yet


def _chunk_jobs(request: Any, router: Router, received_s: float, trace: str | None) -> list[Job]:
    model_id, values, urgent = read_payload(request, "chunk", "[model_id, [input, ...]]")
    if not isinstance(values, (list, tuple)) or not values:
        raise InputError(model_id, "malformed chunk payload: inputs must be a non-empty list")
    ids = [item_id(request.id, index) for index in range(len(values))]
    if router.store.is_route(model_id):
        keys = _headers(request).get(KEYS_HEADER)
        if not isinstance(keys, list) or len(keys) != len(values):
            keys = [None] * len(values)
        targets = [router.resolve(model_id, value, key if isinstance(key, str) else i).model_id
                   for i, value, key in zip(ids, values, keys, strict=True)]
    else:
        targets = [router.store.resolve(model_id)] * len(values)
    return [Job(id=i, model_id=target, input=value, received_s=received_s, urgent=urgent, trace=trace)
            for i, target, value in zip(ids, targets, values, strict=True)]


def _homed(jobs: list[Job], store: ModelStore) -> list[Job]:
    """Jobs of variants as jobs of their base (grouped, loaded and run with it), each carrying its variant."""
    homed = []
    for job in jobs:
        home = store.home(job.model_id)
        homed.append(job if home == job.model_id else dataclasses.replace(job, model_id=home, variant=job.model_id))
    return homed


def decode(
    request: Any, router: Router, settings: Settings, received_s: float, wall_s: float | None = None
) -> Delivery:
    """The delivery of one request.

    Args:
        request: a Celery request (or the intake's ``LeanRequest``).
        router: resolves routes (with the run-time weights).
        settings: the default deadlines.
        received_s: when the worker took it (``time.monotonic()``).
        wall_s: the same moment on the wall clock (one reading per hand-over keeps the jobs' order).

    Raises:
        InputError: the payload is malformed; a route has no branch for an input.
        UnknownModel: the model id is not in the registry.
    """
    chunk = request.name == CHUNK_TASK
    headers = _headers(request)
    sent_at = _sent_at(request)
    received_s = _queued_at(sent_at, received_s, time.time() if wall_s is None else wall_s)
    trace = headers.get(TRACEPARENT_HEADER)
    trace = trace if isinstance(trace, str) else None
    if chunk:
        jobs = _chunk_jobs(request, router, received_s, trace)
    else:
        model_id, value, urgent = read_payload(request, "job", "[model_id, input]")
        target = router.resolve(model_id, value, request.id).model_id
        jobs = [Job(id=request.id, model_id=target, input=value, received_s=received_s, urgent=urgent, trace=trace)]
    if router.store.has_variants:
        jobs = _homed(jobs, router.store)
    deadline = _deadline(request, jobs[0].urgent, settings.worker, sent_at)
    if deadline is not None:
        jobs = [dataclasses.replace(job, expires_at=deadline) for job in jobs]
    of = headers.get(SHADOW_HEADER)
    shadow_of = (str(of[0]), str(of[1])) if isinstance(of, list) and len(of) >= 2 else None
    return Delivery(request, tuple(jobs), chunk, shadow_of, bool(headers.get(SHADOWED_HEADER)))
