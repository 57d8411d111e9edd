"""Remote-control commands: ``swapless_drain`` (drain chosen workers) and Celery's ``revoke`` as Swapless's cancel.

A revoke cancels a job not yet started; one that has started runs to its end and keeps its result.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import WorkerShutdown
from celery.utils.functional import maybe_list
from celery.worker import state as worker_state
from celery.worker.control import control_command, ok

from swapless.config.errors import JobCancelled
from swapless.tasks.broker.results import ResultStore

__all__ = ["revoke", "swapless_drain"]

logger = logging.getLogger(__name__)

#: Seconds a revoke retries Redis before it gives up (it runs on the consumer's thread, which must not stall).
_RETRY_S = 5.0


@control_command(variadic="task_id", signature="[id1 [id2 [... [idN]]]]")
def revoke(state: Any, task_id: Any, terminate: bool = False, signal: str | None = None, **_: Any) -> dict[str, Any]:
    """Cancel jobs by id (or list of ids): those not started never run; those running finish with their result."""
    task_ids = list(dict.fromkeys(maybe_list(task_id) or []))
    worker_state.revoked.update(task_ids)  # the scheduler cancels them again before a group if Redis failed here
    if terminate:
        logger.warning("revoke with terminate=True: a running job is never terminated here; it runs to its end")
    context = getattr(getattr(state.consumer, "controller", None), "swapless", None)
    hold_s = context.settings.jobs.cancel_hold_s if context is not None else None
    try:
        answers = ResultStore(state.app, retry_s=_RETRY_S).cancel(task_ids, JobCancelled, hold_s)
    except Exception as err:  # noqa: BLE001 - the consumer thread must outlive a Redis failure
        logger.warning(
            "could not store the cancel of %d revoked job(s) (%s); this worker skips them", len(task_ids), err
        )
        return ok(f"tasks {task_ids} flagged as revoked on this worker")
    logger.info("revoked: %s", answers)
    return ok(", ".join(f"{job_id} {answer}" for job_id, answer in answers.items()))


@control_command(variadic="worker_id", signature="[id1 [id2 [... [idN]]]]")
def swapless_drain(state: Any, worker_id: Any, **_: Any) -> dict[str, Any]:
    """Stop this worker as SIGTERM does when its worker id is among those given; the others ignore it."""
    context = getattr(getattr(state.consumer, "controller", None), "swapless", None)
    me = context.reporting.worker_id if context is not None else None
    if me is None or me not in set(maybe_list(worker_id) or []):
        return ok("not drained: not named")
    logger.warning("drain asked for %s: stopping as on SIGTERM", me)
    raise WorkerShutdown("drained")
