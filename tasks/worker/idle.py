"""Idle work: done a step at a time on the scheduler's thread while no job has come yet (the warm start).

It begins once the backlog has been empty for ``IDLE_AFTER_S`` after start-up, so that jobs already queued when the
worker starts are fetched first and it does not begin at all; the first job ends it for good, after the step in
progress. A step that raises ends it too (it only saves time later).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["IDLE_AFTER_S", "IdleWork"]

logger = logging.getLogger(__name__)

#: How long the backlog must have been empty after start-up before the first step.
IDLE_AFTER_S = 0.5


class IdleWork:
    """Steps ``steps`` while ``has_work`` (read under ``cond``) says no job waits.

    Args:
        steps: the work, one step per ``next``; closed when it ends early, so a generator can say so.
        cond: the scheduler's condition, notified when jobs come.
        has_work: whether jobs (or a stop) wait now.
    """

    def __init__(self, steps: Iterator[Any], cond: threading.Condition, has_work: Callable[[], bool]) -> None:
        self.steps = steps
        self.cond = cond
        self.has_work = has_work
        self._grace_s = IDLE_AFTER_S

    def run(self) -> None:
        """Step while idle; returns once the work has ended (done, failed, or stopped by a job)."""
        while True:
            with self.cond:
                if self._grace_s > 0 and not self.has_work():
                    self.cond.wait(self._grace_s)
                self._grace_s = 0.0
                if self.has_work():
                    break
            try:
                next(self.steps)
            except StopIteration:
                break
            except Exception:  # a failed warm-up only costs speed
                logger.exception("the warm start failed; going on without it")
                break
        close = getattr(self.steps, "close", None)
        if close is not None:
            close()
