"""Each API key's index of its batch files and batches in Redis, and the per-key quotas checked against it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from swapless.config.settings import BatchSettings
from swapless.tasks.gateway.errors import QuotaExceeded
from swapless.tasks.keyspace import Keyspace

__all__ = ["OwnerFile", "OwnerIndex"]


@dataclass(frozen=True)
class OwnerFile:
    """One file in a key's index."""

    file_id: str
    created_at: int
    bytes: int


class OwnerIndex:
    """One deployment's per-key index of batch files and batches.

    Args:
        client: a synchronous Redis client.
        keyspace: the deployment's keys.
        settings: the quotas and retentions.
    """

    def __init__(self, client: redis.Redis, keyspace: Keyspace, settings: BatchSettings) -> None:
        self.redis = client
        self.keys = keyspace
        self.settings = settings

    # -- files ----------------------------------------------------------------------------------------------------

    def files(self, owner: str) -> list[OwnerFile]:
        """The key's files within their retention, newest first (expired entries are dropped from the index)."""
        raw = self.redis.hgetall(self.keys.owner_files(owner))
        oldest = time.time() - self.settings.batch_file_retention_s
        kept: list[OwnerFile] = []
        gone: list[OwnerFile] = []
        for file_id, value in raw.items():  # type: ignore[union-attr]
            created, _, size = value.decode().partition(" ")
            entry = OwnerFile(file_id.decode(), int(created), int(size or 0))
            (kept if entry.created_at > oldest else gone).append(entry)
        if gone:
            self.redis.hdel(self.keys.owner_files(owner), *(f.file_id for f in gone))
        return sorted(kept, key=lambda f: (f.created_at, f.file_id), reverse=True)

    def check_file(self, owner: str, size: int) -> None:
        """Raise ``QuotaExceeded`` when the key may not keep one more file of ``size`` bytes."""
        s = self.settings
        held = self.files(owner)
        if len(held) >= s.batch_max_files_per_key:
            raise QuotaExceeded(f"this API key keeps {len(held)} files, its limit", "SWAPLESS_BATCH_MAX_FILES_PER_KEY")
        used = sum(f.bytes for f in held)
        if used + size > s.batch_max_bytes_per_key:
            raise QuotaExceeded(f"this API key keeps {used} bytes of files; {size} more would pass its limit of "
                                f"{s.batch_max_bytes_per_key}", "SWAPLESS_BATCH_MAX_BYTES_PER_KEY", too_large=True)

    def add_file(self, owner: str, file_id: str, created_at: int, size: int) -> None:
        self.redis.hset(self.keys.owner_files(owner), file_id, f"{created_at} {size}")

    def remove_file(self, owner: str, file_id: str) -> None:
        self.redis.hdel(self.keys.owner_files(owner), file_id)

    # -- batches --------------------------------------------------------------------------------------------------

    def batch_ids(self, owner: str) -> list[str]:
        """The key's batch ids within their retention, newest first (older entries are dropped from the index)."""
        s = self.settings
        key = self.keys.owner_batches(owner)
        self.redis.zremrangebyscore(key, "-inf", time.time() - s.batch_retention_s - s.batch_max_window_s)
        return [m.decode() for m in self.redis.zrevrange(key, 0, -1)]  # type: ignore[union-attr]

    def check_batch(self, owner: str) -> None:
        """Raise ``QuotaExceeded`` when the key may not create one more batch."""
        s = self.settings
        ids = self.batch_ids(owner)
        if len(ids) >= s.batch_max_batches_per_key:
            raise QuotaExceeded(f"this API key has {len(ids)} batches kept, its limit",
                                "SWAPLESS_BATCH_MAX_BATCHES_PER_KEY")
        members: list[int] = self.redis.smismember(self.keys.active_batches, ids) if ids else []  # type: ignore[assignment]
        active = sum(1 for member in members if member)
        if active >= s.batch_max_active_per_key:
            raise QuotaExceeded(f"this API key has {active} batches not finished, its limit",
                                "SWAPLESS_BATCH_MAX_ACTIVE_PER_KEY")

    def add_batch(self, owner: str, batch_id: str, created_at: float) -> None:
        self.redis.zadd(self.keys.owner_batches(owner), {batch_id: created_at})
