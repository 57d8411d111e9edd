"""JobInbox: the backlog, and the one lock the scheduler thread shares with the threads that hand it work.

Every method takes the inbox's lock; nothing else reaches the backlog. ``put`` is the consumer's, ``take`` the
scheduler thread's; the rest serve both sides and the placement thread (see docs/concepts/scheduling.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from swapless.config.errors import SwaplessError
from swapless.manager import Backlog, Job

__all__ = ["HAND_OVER_S", "STAY_S", "JobInbox", "Taken"]

#: How long the scheduler waits for the coming jobs of loaded models before it loads another (``Backlog.coming``):
#: a fetch round, which waits for a bell up to the transport's idle poll (0.1 s).
STAY_S = 0.15

#: Longest the consumer thread waits for an idle scheduler thread to take the jobs it just handed over.
HAND_OVER_S = 0.002

#: What ``take`` hands the scheduler thread: requests to answer with an error, expired jobs, the next group.
Taken = tuple[list[tuple[Any, SwaplessError]], list[Job], list[Job]]


class JobInbox:
    """The backlog of one worker behind one lock.

    Args:
        max_wait_s: how long a bulk job may wait before it is starved.
    """

    def __init__(self, max_wait_s: float) -> None:
        self.backlog = Backlog(max_wait_s)
        self._cond = threading.Condition()
        self._rejected: list[tuple[Any, SwaplessError]] = []
        self._stopping = False
        # Set while the scheduler thread waits with nothing in hand; cleared once it takes the jobs that woke it.
        self._idle_waiting = False
        self._took = threading.Event()
        self._stayed_for: frozenset[str] = frozenset()  # the loaded models ``take`` last waited for

    # -- any thread --------------------------------------------------------------------------------------

    def put(self, jobs: list[Job], rejected: Sequence[tuple[Any, SwaplessError]] = ()) -> None:
        """Add jobs (and requests to answer with an error) and wake the scheduler thread.

        An idle scheduler thread gets up to ``HAND_OVER_S`` to take them before this thread goes on.
        """
        with self._cond:
            self.backlog.add(jobs)
            if rejected:
                self._rejected.extend(rejected)
            self._cond.notify()
            handing = bool(jobs) and self._idle_waiting
            if handing:
                self._took.clear()
        if handing:
            self._took.wait(HAND_OVER_S)

    def stop(self) -> None:
        """Make ``take`` return None from now on."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def counts(self) -> dict[str, int]:
        """Jobs waiting here per model."""
        with self._cond:
            return self.backlog.counts()

    def waiting(self) -> dict[str, int]:
        """Jobs waiting per model, here and in Redis (``Backlog.queued``)."""
        with self._cond:
            held = self.backlog.counts()
        for model_id, count in self.backlog.queued().items():
            held[model_id] = held.get(model_id, 0) + count
        return held

    def wants(self, model_id: str) -> bool:
        """Whether jobs of ``model_id`` wait, here or in Redis."""
        with self._cond:
            return bool(self.backlog.counts().get(model_id) or self.backlog.queued().get(model_id))

    def take_model(self, model_id: str, choose: Callable[[list[Job]], Callable[[Job], bool]]) -> list[Job]:
        """Take the waiting jobs of ``model_id`` but those ``choose(its waiting jobs)`` says to keep."""
        with self._cond:
            return self.backlog.take_model(model_id, keep=choose(self.backlog.jobs_of(model_id)))

    # -- scheduler thread --------------------------------------------------------------------------------

    def has_work(self) -> bool:
        """Whether jobs, requests to answer or a stop wait."""
        with self._cond:
            return self._has_work()

    def _has_work(self) -> bool:
        return self._stopping or bool(self._rejected) or bool(len(self.backlog))

    def busy(self) -> bool:
        """Whether jobs or requests to answer wait (a stop aside)."""
        with self._cond:
            return bool(len(self.backlog)) or bool(self._rejected)

    def idle_wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for work; returns whether work (or a stop) waits."""
        with self._cond:
            if timeout_s > 0 and not self._has_work():
                self._cond.wait(timeout_s)
            return self._has_work()

    def take(self, loaded_ids: Callable[[], list[str]], load_cost_s: Callable[[str], float], max_group: int,
             loading_ids: Callable[[], Sequence[str]]) -> Taken | None:
        """Wait for work, then take it: the requests to reject, the expired jobs and the next group. None: stop."""
        with self._cond:
            while not self._stopping and not self._rejected and not len(self.backlog):
                self._idle_waiting = True
                self._cond.wait()
            self._idle_waiting = False
            self._took.set()
            loaded = loaded_ids()
            coming = self.backlog.coming(loaded, load_cost_s)
            if coming and not coming <= self._stayed_for:  # once for these models, until one of them has run
                self._stayed_for = coming
                self._cond.wait(STAY_S)
                loaded = loaded_ids()
            if self._stopping:
                return None
            rejected, self._rejected = self._rejected, []
            expired = self.backlog.take_expired(time.time())
            group = self.backlog.next_group(loaded, load_cost_s, max_group, loading=loading_ids())
            if group and group[0].model_id in self._stayed_for:
                self._stayed_for = frozenset()  # its jobs came: worth waiting for again
            return rejected, expired, group

    def peek_group(self, loaded: Sequence[str], load_cost_s: Callable[[str], float], max_group: int) -> list[Job]:
        """The group ``take`` would give next (``Backlog.peek_group``)."""
        with self._cond:
            return self.backlog.peek_group(loaded, load_cost_s, max_group)

    def peek_next(self, loaded: Sequence[str], load_cost_s: Callable[[str], float],
                  exclude: str) -> tuple[str | None, dict[str, int]]:
        """The model the next group needs (``Backlog.peek_next``) and the jobs waiting per model."""
        with self._cond:
            upcoming = self.backlog.peek_next(loaded, load_cost_s, exclude=exclude)
        return upcoming, self.waiting()

    def yield_to_urgent(self, pending: list[Job]) -> bool:
        """Put ``pending`` back when interactive jobs wait; returns whether it did."""
        with self._cond:
            if not self.backlog.urgent:
                return False
            self.backlog.add(pending)
            return True

    def put_back_until(self, group: Sequence[Job], waiting: Callable[[], bool], poll_s: float = 0.05) -> None:
        """Put ``group`` back and wait while ``waiting()`` holds, until interactive jobs, rejects or a stop come."""
        with self._cond:
            self.backlog.add(group)
            while not self._stopping and not self.backlog.urgent and not self._rejected and waiting():
                self._cond.wait(poll_s)
