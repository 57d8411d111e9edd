"""The whole status as plain JSON data (``swapless status --json``, the gateway's ``GET /status.json``): one
builder over plain readings (``status_payload``) and two readers around it (``read_status``, ``aread_status``).

The shape::

    {"now": epoch seconds of the reading,
     "shadow": [{"route", "served", "shadow", "agreed", "compared"}, ...],
     "redis": RedisMemory's fields,
     "models": [ModelPlacement's fields and "waiting", ...],
     "queue": QueueDepth's fields and "total",
     "workers": [Heartbeat and "removal": {"models", "load_s", "held", "interactive", "interactive_load_s"}: what
                 removing it costs, ...],
     "webhooks": {"pending", "failed", "recent_failed": [{"id", "url", "attempts", "last_error", "failed_at"}]},
     "batches": {"active", "batches": [{"id", "status", "total", "completed", "failed", "created_at",
                                         "expires_at"}, ...]}}
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aredis

from swapless.tasks.cluster.members import Heartbeat, aread_heartbeats, read_heartbeats
from swapless.tasks.cluster.view import ModelPlacement, aread_placement, read_placement
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.batches import read_batches
from swapless.tasks.observe.memory import RedisMemory, read_redis_memory
from swapless.tasks.observe.queue import DEFAULT_SAMPLE, QueueDepth, aread_queue_depth, read_queue_depth
from swapless.tasks.observe.scaling import removal_costs
from swapless.tasks.routing import read_shadow
from swapless.tasks.webhooks import read_webhooks

__all__ = ["aread_status", "read_status", "status_payload"]

Shadow = dict[tuple[str, str, str], tuple[int, int]]


def status_payload(
    *,
    depth: QueueDepth,
    workers: Sequence[Heartbeat],
    places: Sequence[ModelPlacement],
    memory: RedisMemory,
    shadow: Shadow,
    now: float,
    webhooks: dict[str, Any] | None = None,
    batches: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The status as JSON-ready data (the module docstring shows its shape)."""
    removal = removal_costs(workers)
    return {
        "now": now,
        "shadow": [
            {"route": route, "served": served, "shadow": copy, "agreed": agreed, "compared": total}
            for (route, served, copy), (agreed, total) in shadow.items()
        ],
        "redis": dataclasses.asdict(memory),
        "models": [{**dataclasses.asdict(p), "waiting": p.waiting_messages} for p in places],
        "queue": {**dataclasses.asdict(depth), "total": depth.total},
        "workers": [{**beat.model_dump(), "removal": dataclasses.asdict(removal[beat.worker_id or beat.hostname])}
                    for beat in workers],
        "webhooks": webhooks or {"pending": 0, "failed": 0, "recent_failed": []},
        "batches": batches or {"active": 0, "batches": []},
    }


def _active(places: Sequence[ModelPlacement]) -> list[str]:
    """The models with jobs waiting or held, or a claim: the only ones whose keys hold anything."""
    return [p.model_id for p in places if p.waiting_messages or p.held or p.holders]


def read_status(
    client: redis.Redis, keyspace: Keyspace, model_ids: Sequence[str], sample: int = DEFAULT_SAMPLE
) -> dict[str, Any]:
    """The status now (``model_ids``: the models file's; ``sample``: messages read per list at most)."""
    places = read_placement(client, keyspace, model_ids)
    return status_payload(
        depth=read_queue_depth(client, keyspace, model_ids, sample, {p.model_id: p.queued for p in places}),
        workers=read_heartbeats(client, keyspace),
        places=places,
        memory=read_redis_memory(client, keyspace, _active(places)),
        shadow=read_shadow(client, keyspace),
        now=time.time(),
        webhooks=read_webhooks(client, keyspace),
        batches=read_batches(client, keyspace),
    )


async def aread_status(
    client: aredis.Redis,
    sync_client: redis.Redis,
    keyspace: Keyspace,
    model_ids: Sequence[str],
    sample: int = DEFAULT_SAMPLE,
    owner: str | None = None,
) -> dict[str, Any]:
    """``read_status`` for asyncio code (``sync_client``: for the readers without an asyncio twin, run in a thread).
    ``owner``: a caller that is no operator sees its own batches only, and no failed webhook deliveries."""
    places = await aread_placement(client, keyspace, model_ids)
    depth, workers, memory, shadow, (webhooks, batches) = await asyncio.gather(
        aread_queue_depth(client, keyspace, model_ids, sample, {p.model_id: p.queued for p in places}),
        aread_heartbeats(client, keyspace),
        asyncio.to_thread(read_redis_memory, sync_client, keyspace, _active(places)),
        asyncio.to_thread(read_shadow, sync_client, keyspace),
        asyncio.to_thread(lambda: (read_webhooks(sync_client, keyspace), read_batches(sync_client, keyspace,
                                                                                      owner=owner))),
    )
    if owner is not None:
        webhooks = {**webhooks, "recent_failed": []}
    return status_payload(depth=depth, workers=workers, places=places, memory=memory, shadow=shadow, now=time.time(),
                          webhooks=webhooks, batches=batches)
