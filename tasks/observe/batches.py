"""The batches' progress for the status, read from the batch API's hashes (never a batch's owner, metadata or
files).
"""

from __future__ import annotations

from typing import Any

from swapless.tasks.keyspace import Keyspace

__all__ = ["read_batches"]

#: Most batches not final yet that the status lists (the newest of them).
MAX_ACTIVE = 50
_FIELDS = ("status", "total", "completed", "failed", "created_at", "expires_at", "owner")


def read_batches(client: Any, keyspace: Keyspace, finished: int = 5, owner: str | None = None) -> dict[str, Any]:
    """``{"active": n, "batches": [{"id", "status", "total", "completed", "failed", "created_at", "expires_at"}]}``:
    the batches not final yet (newest first, at most ``MAX_ACTIVE``), then the newest ``finished`` others; ``owner``:
    only that key's (a key that is no operator sees only its own; ``active`` counts its own then)."""
    active = sorted((m.decode() for m in client.smembers(keyspace.active_batches)), reverse=True)
    recent = [m.decode() for m in client.zrevrange(keyspace.batches, 0, finished + len(active) - 1)]
    ids = active[:MAX_ACTIVE] + [b for b in recent if b not in set(active)][:finished]
    pipe = client.pipeline(transaction=False)
    for batch_id in ids:
        pipe.hmget(keyspace.batch(batch_id), _FIELDS)
    rows = []
    for batch_id, values in zip(ids, pipe.execute() if ids else [], strict=True):
        fields = dict(zip(_FIELDS, (v.decode() if v is not None else None for v in values), strict=True))
        if fields["status"] is None:  # deleted since it was listed
            continue
        if owner is not None and fields["owner"] != owner:
            continue
        rows.append({"id": batch_id, "status": fields["status"],
                     **{name: int(float(fields[name] or 0)) for name in _FIELDS[1:-1]}})
    if owner is not None:
        return {"active": sum(1 for row in rows if row["id"] in set(active)), "batches": rows}
    return {"active": len(active), "batches": rows}
