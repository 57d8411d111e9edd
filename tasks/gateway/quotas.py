"""What one caller may take of the gateway (its rate), and what the gateway holds at once (its waits)."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aredis
from limits import RateLimitItemPerSecond
from limits.aio.storage import RedisStorage
from limits.aio.strategies import SlidingWindowCounterRateLimiter

from swapless.config.errors import SwaplessError
from swapless.tasks.keyspace import Keyspace

__all__ = ["GatewayBusy", "OverLimit", "RateLimit", "WaitSlots"]

#: The rate's window: ``2 x rate`` jobs per this many seconds (a burst of twice the rate).
WINDOW_S = 2


class OverLimit(SwaplessError):
    """A caller is over one of its limits (429): ``which`` names the limit's setting."""

    def __init__(self, which: str, detail: str, retry_after_s: int) -> None:
        super().__init__(which, detail, retry_after_s)
        self.which, self.detail, self.retry_after_s = which, detail, retry_after_s

    @property
    def message(self) -> str:
        return f"{self.detail} ({self.which}): try again in {self.retry_after_s} s"


class GatewayBusy(SwaplessError):
    """The gateway holds as many waiting requests as it may (503)."""

    def __init__(self, waits: int, retry_after_s: int = 1) -> None:
        super().__init__(waits, retry_after_s)
        self.waits, self.retry_after_s = waits, retry_after_s

    @property
    def message(self) -> str:
        return (f"the gateway is holding {self.waits} requests waiting for results (SWAPLESS_GATEWAY_MAX_WAITS): try "
                f"again in {self.retry_after_s} s, or POST /jobs and poll GET /jobs/{{job_id}}")


class RateLimit:
    """Jobs per second per caller, shared through Redis.

    Args:
        redis: the gateway's asyncio Redis client.
        rate_per_s: ``SWAPLESS_GATEWAY_RATE_PER_KEY``.
        keyspace: the deployment's keys.
    """

    def __init__(self, redis: aredis.Redis, rate_per_s: float, keyspace: Keyspace) -> None:
        self.burst = max(1, math.ceil(rate_per_s * WINDOW_S))
        self.rate_per_s = rate_per_s
        self.item = RateLimitItemPerSecond(self.burst, WINDOW_S)
        options: dict[str, Any] = {"connection_pool": redis.connection_pool}  # the gateway's own connections
        storage = RedisStorage("async+redis://", implementation="redispy", key_prefix=keyspace.gateway_rate, **options)
        self.limiter = SlidingWindowCounterRateLimiter(storage)

    async def take(self, owner: str, jobs: int) -> None:
        """Take ``jobs`` from ``owner``'s budget.

        Raises:
            OverLimit: the budget has not that many jobs left now (nothing is taken).
        """
        if jobs > self.burst:
            raise OverLimit("SWAPLESS_GATEWAY_RATE_PER_KEY", f"this request has {jobs} jobs, more than a caller may "
                            f"send at once ({self.burst}, twice the rate of {self.rate_per_s:g} jobs/s): send fewer "
                            "per request", WINDOW_S)
        if await self.limiter.hit(self.item, owner, cost=jobs):
            return
        stats = await self.limiter.get_window_stats(self.item, owner)
        wait_s = max(1, math.ceil(stats.reset_time - time.time()))
        raise OverLimit("SWAPLESS_GATEWAY_RATE_PER_KEY", f"this caller has sent more than {self.rate_per_s:g} jobs/s "
                        f"(bursts of {self.burst})", min(wait_s, WINDOW_S))


class WaitSlots:
    """At most ``limit`` requests of this process wait for results at once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """One slot for the block.

        Raises:
            GatewayBusy: every slot is held.
        """
        if self.held >= self.limit:
            raise GatewayBusy(self.held)
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1
