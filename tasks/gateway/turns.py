"""Each caller's turns at the gateway's own work, so one caller's flood takes turns with everyone else's requests.

At most ``SWAPLESS_GATEWAY_ACTIVE_PER_KEY`` requests of a caller are read, parsed and queued at once; a request
that waits past ``SWAPLESS_GATEWAY_TURN_WAIT_S`` is answered 429. A request waiting for results gives its turn back.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar

from swapless.tasks.gateway.quotas import OverLimit

__all__ = ["NoTurn", "Turns", "give_back"]

#: The current request's turn, given back once (None outside a turn).
_HELD: ContextVar[Callable[[], None] | None] = ContextVar("swapless_gateway_turn", default=None)


def give_back() -> None:
    """Give the current request's turn back (it now waits for results); nothing outside a turn or once given."""
    release = _HELD.get()
    if release is not None:
        release()


class NoTurn(OverLimit):
    """A request waited ``SWAPLESS_GATEWAY_TURN_WAIT_S`` for one of its caller's turns (429)."""


class _Lane:
    """One caller's turns: a semaphore, and how many requests hold or wait for one (the lane goes when none do)."""

    def __init__(self, turns: int) -> None:
        self.semaphore = asyncio.Semaphore(turns)
        self.users = 0


class Turns:
    """At most ``per_caller`` requests of each caller at work at once.

    Args:
        per_caller: ``SWAPLESS_GATEWAY_ACTIVE_PER_KEY``.
        wait_s: ``SWAPLESS_GATEWAY_TURN_WAIT_S``.
    """

    def __init__(self, per_caller: int, wait_s: float) -> None:
        self.per_caller = per_caller
        self.wait_s = wait_s
        self._lanes: dict[str, _Lane] = {}

    def active(self, owner: str) -> int:
        """How many of ``owner``'s requests hold a turn now."""
        lane = self._lanes.get(owner)
        return 0 if lane is None else self.per_caller - lane.semaphore._value  # the semaphore's own count

    @asynccontextmanager
    async def turn(self, owner: str) -> AsyncIterator[None]:
        """One of ``owner``'s turns for the block, or until ``give_back``.

        Raises:
            NoTurn: no turn came within ``wait_s`` (nothing of the request has been read).
        """
        lane = self._lanes.get(owner)
        if lane is None:
            lane = self._lanes[owner] = _Lane(self.per_caller)
        lane.users += 1
        held = False

        def release() -> None:
            nonlocal held
            if held:
                held = False
                lane.semaphore.release()

        try:
            try:
                await asyncio.wait_for(lane.semaphore.acquire(), self.wait_s)
            except TimeoutError:
                raise NoTurn("SWAPLESS_GATEWAY_ACTIVE_PER_KEY", f"this caller has more requests at work than its "
                             f"{self.per_caller} at once, and this one waited {self.wait_s:g} s for a turn: send fewer "
                             "requests at a time", max(1, math.ceil(self.wait_s))) from None
            held = True
            token = _HELD.set(release)
            try:
                yield
            finally:
                _HELD.reset(token)
                release()
        finally:
            lane.users -= 1
            if lane.users == 0 and self._lanes.get(owner) is lane:
                del self._lanes[owner]
