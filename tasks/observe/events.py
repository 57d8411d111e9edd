"""Celery task events for Swapless jobs, sent by the worker itself so that Flower and ``celery events`` see each
job (on with ``SWAPLESS_TASK_EVENTS``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from swapless.manager import Job, Outcome

__all__ = ["TaskEvents"]

_MAX_RESULT_CHARS = 200


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_RESULT_CHARS else text[: _MAX_RESULT_CHARS - 3] + "..."


@dataclass
class _Pending:
    request: Any
    items: int
    failed: int = 0
    run_s: float = 0.0


class TaskEvents:
    """Sends the task events of this worker's jobs.

    Args:
        max_entries: received tasks remembered until their outcome (older ones are forgotten: no outcome event).
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._lock = threading.Lock()

    def on_received(self, request: Any) -> None:
        """A message arrived (consumer thread): send ``task-received`` and remember the task until its outcome."""
        args = getattr(request, "args", None)
        items = len(args[1]) if isinstance(args, (list, tuple)) and len(args) == 2 and isinstance(args[1], list) else 1
        with self._lock:
            self._pending[request.id] = _Pending(request, max(items, 1))
            while len(self._pending) > self.max_entries:
                self._pending.popitem(last=False)
        request.send_event(
            "task-received",
            name=request.name,
            args=getattr(request, "argsrepr", ""),
            kwargs=getattr(request, "kwargsrepr", ""),
            root_id=getattr(request, "root_id", None),
            parent_id=getattr(request, "parent_id", None),
            retries=(getattr(request, "request_dict", None) or {}).get("retries", 0),
        )

    def on_skipped(self, model_id: str, reason: str, jobs: int) -> None:
        """Expired and cancelled jobs send no event of their own: they age out of ``_pending``."""

    def on_shadow(self, route_id: str, served: str, shadow: str, agreed: bool, jobs: int) -> None:
        """Shadow comparisons send no event."""

    def on_group(self, model_id: str, jobs: Sequence[Job], outcomes: Sequence[Outcome], run_s: float) -> None:
        """A group ran (scheduler thread): send each finished task's ``task-succeeded`` or ``task-failed``."""
        finished: list[tuple[_Pending, Outcome]] = []
        timed: set[str] = set()
        with self._lock:
            for outcome in outcomes:
                task_id = outcome.job.id
                pending = self._pending.get(task_id)
                if pending is None and ":" in task_id:  # an item of a chunk: "<chunk id>:<index>"
                    task_id = task_id.rpartition(":")[0]
                    pending = self._pending.get(task_id)
                if pending is None:
                    continue
                pending.items -= 1
                pending.failed += 0 if outcome.ok else 1
                if task_id not in timed:  # a chunk's runtime: the groups its items ran in
                    pending.run_s += run_s
                    timed.add(task_id)
                if pending.items <= 0:
                    del self._pending[task_id]
                    finished.append((pending, outcome))
        for pending, outcome in finished:
            if pending.failed == 0:
                pending.request.send_event("task-succeeded", result=_short(outcome.result), runtime=pending.run_s)
            elif outcome.error is not None and pending.failed == 1 and pending.request.id == outcome.job.id:
                pending.request.send_event("task-failed", exception=_short(outcome.error), traceback="")
            else:
                pending.request.send_event(
                    "task-failed", exception=f"{pending.failed} item(s) of the chunk failed", traceback=""
                )
