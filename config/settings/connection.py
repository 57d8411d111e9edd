"""Settings of the Redis connection and of the queue's jobs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from swapless.config.settings.units import DEFAULT_REDIS_URL

__all__ = ["JobSettings", "RedisSettings"]


class RedisSettings(BaseModel):
    """How every process reaches Redis, Sentinel and replicas."""

    model_config = ConfigDict(title="Redis connection")

    redis_url: str | None = Field(
        None,
        description="Broker and result backend. Unset: the worker uses redis://127.0.0.1:6379/0; `swapless "
        "submit`/`bulk` start an embedded Redis (local mode)",
    )
    connect_timeout_s: float = Field(
        3.0, gt=0,
        description="Producers (client, CLI, gateway) give up connecting to Redis after this, once retried",
    )
    redis_sentinel_master: str | None = Field(
        None,
        description="The master name Redis Sentinel knows the primary by; required with a "
        "`sentinel://host:26379;sentinel://host:26380` SWAPLESS_REDIS_URL (Celery's form; the primary's own user and "
        "password go in the first sentinel's URL)",
    )
    redis_sentinel_username: str | None = Field(
        None,
        description="The ACL user the sentinels themselves ask for (unset: none, or the default user)",
    )
    # A secret, so never shown in a repr.
    redis_sentinel_password: SecretStr | None = Field(
        None,
        description="The sentinels' own password (`requirepass` of the sentinels; unset: none)",
    )
    redis_sentinel_tls: bool = Field(False, description="Reach the sentinels, the primary and its replicas over TLS")
    redis_failover_wait_s: float = Field(
        15.0, ge=0,
        description="With Sentinel: how long a wait for results (`Job.get`, `gather`, the gateway's) rides out a "
        "primary that cannot be reached (a failover) before it fails `QueueUnavailable`",
    )
    redis_min_replicas: int = Field(
        0, ge=0,
        description="A submit returns, and a worker acks a job, only once this many replicas hold the job or its "
        "result (`WAIT`); 0: Redis's asynchronous replication, nothing waited for",
    )
    redis_replica_timeout_s: float = Field(
        1.0, gt=0,
        description="The longest a write waits for SWAPLESS_REDIS_MIN_REPLICAS replicas: then a submit fails "
        "`QueueUnavailable` (retryable) and a worker stores the result again before it acks",
    )

    @model_validator(mode="after")
    def _check_sentinel(self) -> RedisSettings:
        if self.redis_url and self.redis_url.lower().startswith("sentinel://") and not self.redis_sentinel_master:
            raise ValueError(
                "SWAPLESS_REDIS_URL names sentinels (sentinel://...): set SWAPLESS_REDIS_SENTINEL_MASTER to the name "
                "they know the primary by (the name in their `sentinel monitor` line)"
            )
        return self

    @property
    def failover_wait_s(self) -> float:
        """``redis_failover_wait_s`` with Sentinel, else 0."""
        sentinel = (self.redis_url or "").lower().startswith("sentinel://")
        return self.redis_failover_wait_s if sentinel else 0.0

    @property
    def broker_url(self) -> str:
        """``redis_url``, else the local default."""
        return self.redis_url or DEFAULT_REDIS_URL


class JobSettings(BaseModel):
    """The queue's keys, what producers may send, how long results stay."""

    model_config = ConfigDict(title="Queue, limits and results")

    queue: str = Field("swapless", description="Celery queue the jobs go through")
    key_prefix: str | None = Field(
        None,
        description="Prefix for every Redis key (queues and results), to share one Redis",
    )
    max_queued: int | None = Field(
        100_000, ge=1,
        description="Most messages one model's lists (or the shared lists) may hold, a chunk counting once: producers"
        " get `QueueFull` beyond it, before Redis is full",
    )
    max_message_bytes: int = Field(
        64 * 1024 * 1024, ge=1024,
        description="Largest queue message a producer sends (one job, or one chunk of a bulk job): a larger one is "
        "refused with `InputError` before anything is queued",
    )
    result_expires_s: int = Field(
        3600, ge=1,
        description="How long an unread result stays in Redis (`forget=True` deletes one once read)",
    )
    cancel_hold_s: int = Field(
        7 * 24 * 3600, ge=1,
        description="How long a job without a deadline may still wait in the queue, as far as a cancellation (kept "
        "that long) and the gateway's record of a job go",
    )
