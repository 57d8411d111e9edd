"""IdleWork: work done a step at a time on the scheduler's thread while no job has come yet (the warm start)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from swapless.tasks.worker.inbox import JobInbox

__all__ = ["IDLE_AFTER_S", "IdleWork"]

logger = logging.getLogger(__name__)

#: How long the backlog must have been empty after start-up before the first step.
IDLE_AFTER_S = 0.5


class IdleWork:
    """Steps ``steps`` while no job waits in ``inbox``; a job, a stop or a failed step ends it.

    Args:
        steps: one step per ``next``; closed when it ends early.
        inbox: the scheduler's inbox.
    """

    def __init__(self, steps: Iterator[Any], inbox: JobInbox) -> None:
        self.steps = steps
        self.inbox = inbox
        self._grace_s = IDLE_AFTER_S

    def run(self) -> None:
        """Step while idle; returns once the work has ended (done, failed, or stopped by a job)."""
        while True:
            busy = self.inbox.idle_wait(self._grace_s)
            self._grace_s = 0.0
            if busy:
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
