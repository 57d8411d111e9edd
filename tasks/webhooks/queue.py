"""The webhook delivery queue in Redis: deliveries due, their claims by senders, and those that failed.

Due deliveries are a sorted set scored by their next attempt (``Keyspace.webhooks_due``), each one a key of its own
(``Keyspace.webhook``); failed ones a capped list (``Keyspace.webhooks_failed``). See docs/concepts/delivery.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from swapless.tasks.keyspace import Keyspace

__all__ = ["WebhookDelivery", "WebhookQueue", "read_webhooks"]

# KEYS: due, failed, then per delivery its record's key and its API key's set of waiting deliveries (``due`` again
# for a delivery of no API key). ARGV: now, ttl, max pending, max failed, max pending per API key, then per delivery
# its id, its record and whether it has an API key ('1' / '0'). A delivery already waiting is left as it is; past a
# bound it is kept as failed instead, saying which.
_ENQUEUE = """
local now, ttl, max_pending, max_failed = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local per_owner = tonumber(ARGV[5])
local queued, full = 0, 0
for i = 0, (#KEYS - 2) / 2 - 1 do
  local key, owner = KEYS[3 + 2 * i], KEYS[4 + 2 * i]
  local id, record, owned = ARGV[6 + 3 * i], ARGV[7 + 3 * i], ARGV[8 + 3 * i] == '1'
  if not redis.call('ZSCORE', KEYS[1], id) then
    local why = nil
    if redis.call('ZCARD', KEYS[1]) >= max_pending then
      why = 'the delivery queue was full (SWAPLESS_WEBHOOK_MAX_PENDING)'
    elseif owned then
      redis.call('ZREMRANGEBYSCORE', owner, '-inf', now - ttl)
      if redis.call('ZCARD', owner) >= per_owner then
        why = 'this API key had too many webhooks waiting (SWAPLESS_WEBHOOK_MAX_PENDING_PER_KEY)'
      end
    end
    if why then
      local d = cjson.decode(record)
      d['last_error'] = why
      d['failed_at'] = now
      redis.call('LPUSH', KEYS[2], cjson.encode(d))
      redis.call('LTRIM', KEYS[2], 0, max_failed - 1)
      redis.call('EXPIRE', KEYS[2], ttl)
      full = full + 1
    else
      redis.call('SET', key, record, 'EX', ttl)
      redis.call('ZADD', KEYS[1], now, id)
      if owned then
        redis.call('ZADD', owner, now, id)
        redis.call('EXPIRE', owner, ttl)
      end
      queued = queued + 1
    end
  end
end
if queued > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return {queued, full}
"""

# KEYS: due. ARGV: now, lease end, most to take. Returns the ids taken.
_CLAIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do redis.call('ZADD', KEYS[1], ARGV[2], id) end
return ids
"""


@dataclass
class WebhookDelivery:
    """One webhook to send: ``id`` (the ``webhook-id``: the job's id), its target and its signed body.

    Attributes:
        created_s: when it was first queued (epoch seconds); retries stop ``SWAPLESS_WEBHOOK_RETRY_S`` after it.
        failed_at: when it was kept as failed (epoch seconds).
    """

    id: str
    url: str
    payload: str
    created_s: float = field(default_factory=time.time)
    attempts: int = 0
    last_error: str | None = None
    failed_at: float | None = None
    #: the API key (its owner label) whose job this is, when it came through the gateway: its deliveries waiting
    #: are bounded by ``SWAPLESS_WEBHOOK_MAX_PENDING_PER_KEY``
    owner: str | None = None
    #: the job's trace context (its producer's W3C ``traceparent``): its delivery is a span of that trace
    traceparent: str | None = None

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes | str) -> WebhookDelivery:
        data = json.loads(raw)
        return cls(**{name: data.get(name) for name in cls.__dataclass_fields__ if name in data})


class WebhookQueue:
    """The webhook deliveries of one queue.

    Args:
        ttl_s: how long a delivery is retried and a failed one kept (``SWAPLESS_WEBHOOK_RETRY_S``).
        max_pending: ``SWAPLESS_WEBHOOK_MAX_PENDING``; max_failed: ``SWAPLESS_WEBHOOK_MAX_FAILED``.
        max_pending_per_key: ``SWAPLESS_WEBHOOK_MAX_PENDING_PER_KEY``.
    """

    def __init__(self, client: Any, keyspace: Keyspace, ttl_s: float, max_pending: int, max_failed: int,
                 max_pending_per_key: int = 10_000) -> None:
        self.client = client
        self.keyspace = keyspace
        self.ttl_s = max(1, int(ttl_s) + 60)  # a delivery outlives its last retry by a margin
        self.max_pending = max_pending
        self.max_failed = max_failed
        self.max_pending_per_key = max_pending_per_key
        self._enqueue = client.register_script(_ENQUEUE)
        self._claim = client.register_script(_CLAIM)

    @classmethod
    def of(cls, client: Any, settings: Any) -> WebhookQueue:
        """The queue of ``settings`` (its keyspace and its webhook bounds)."""
        hooks = settings.webhooks
        return cls(client, Keyspace.of(settings), hooks.webhook_retry_s, hooks.webhook_max_pending,
                   hooks.webhook_max_failed, hooks.webhook_max_pending_per_key)

    def enqueue(self, deliveries: Sequence[WebhookDelivery], now: float | None = None) -> tuple[int, int]:
        """Queue ``deliveries`` in one round trip; returns (queued, kept as failed: the queue was full)."""
        if not deliveries:
            return 0, 0
        k = self.keyspace
        now = time.time() if now is None else now
        keys = [k.webhooks_due, k.webhooks_failed]
        args: list[Any] = [now, self.ttl_s, self.max_pending, self.max_failed, self.max_pending_per_key]
        for d in deliveries:
            keys += [k.webhook(d.id), k.webhooks_owner(d.owner) if d.owner else k.webhooks_due]
            args += [d.id, d.encode(), "1" if d.owner else "0"]
        queued, full = self._enqueue(keys=keys, args=args)
        return int(queued), int(full)

    def claim(self, limit: int, lease_s: float, now: float | None = None) -> list[WebhookDelivery]:
        """Take up to ``limit`` due deliveries for ``lease_s`` seconds (due again after that unless settled)."""
        now = time.time() if now is None else now
        ids = [i.decode() if isinstance(i, bytes) else i
               for i in self._claim(keys=[self.keyspace.webhooks_due], args=[now, now + lease_s, limit])]
        if not ids:
            return []
        raws = self.client.mget([self.keyspace.webhook(i) for i in ids])
        gone = [i for i, raw in zip(ids, raws, strict=True) if raw is None]  # expired: past its retry window
        if gone:
            self.client.zrem(self.keyspace.webhooks_due, *gone)
        return [WebhookDelivery.decode(raw) for raw in raws if raw is not None]

    def next_due_s(self) -> float | None:
        """When the next delivery is due (epoch seconds), or None: none waits."""
        first = self.client.zrange(self.keyspace.webhooks_due, 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    def delivered(self, delivery: WebhookDelivery) -> None:
        """Forget a delivered delivery."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(self.keyspace.webhooks_due, delivery.id).delete(self.keyspace.webhook(delivery.id))
        if delivery.owner:
            pipe.zrem(self.keyspace.webhooks_owner(delivery.owner), delivery.id)
        pipe.execute()

    def retry(self, delivery: WebhookDelivery, at_s: float) -> None:
        """Try ``delivery`` (its attempts and last error updated) again at ``at_s``."""
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keyspace.webhook(delivery.id), delivery.encode(), keepttl=True)
        pipe.zadd(self.keyspace.webhooks_due, {delivery.id: at_s})
        pipe.execute()

    def fail(self, delivery: WebhookDelivery, now: float | None = None) -> None:
        """Keep ``delivery`` as failed (no more retries) and take it off the queue."""
        delivery.failed_at = time.time() if now is None else now
        k = self.keyspace
        pipe = self.client.pipeline(transaction=False)
        pipe.lpush(k.webhooks_failed, delivery.encode()).ltrim(k.webhooks_failed, 0, self.max_failed - 1)
        pipe.expire(k.webhooks_failed, self.ttl_s)
        pipe.zrem(k.webhooks_due, delivery.id).delete(k.webhook(delivery.id))
        if delivery.owner:
            pipe.zrem(k.webhooks_owner(delivery.owner), delivery.id)
        pipe.execute()

    def pending(self) -> int:
        """Deliveries waiting (due or being attempted)."""
        return int(self.client.zcard(self.keyspace.webhooks_due))

    def failed(self, limit: int = 100) -> tuple[int, list[WebhookDelivery]]:
        """How many failed deliveries are kept, and the newest ``limit`` of them."""
        pipe = self.client.pipeline(transaction=False)
        pipe.llen(self.keyspace.webhooks_failed).lrange(self.keyspace.webhooks_failed, 0, max(0, limit - 1))
        count, raws = pipe.execute()
        return int(count), [WebhookDelivery.decode(raw) for raw in raws]

    def replay(self, ids: Sequence[str] | None = None) -> int:
        """Queue failed deliveries again (``ids``: only those), attempts reset; returns how many."""
        key = self.keyspace.webhooks_failed
        raws = self.client.lrange(key, 0, -1)
        chosen = [(raw, WebhookDelivery.decode(raw)) for raw in raws]
        if ids is not None:
            wanted = set(ids)
            chosen = [(raw, d) for raw, d in chosen if d.id in wanted]
        fresh = {}
        for _, d in chosen:  # the newest failure of one id, once
            fresh[d.id] = WebhookDelivery(d.id, d.url, d.payload, owner=d.owner, traceparent=d.traceparent)
        if not fresh:
            return 0
        self.enqueue(list(fresh.values()))
        pipe = self.client.pipeline(transaction=False)
        for raw, _ in chosen:
            pipe.lrem(key, 1, raw)
        pipe.execute()
        return len(fresh)


def _shown_url(url: str) -> str:
    """A callback URL without its query (often a token) and fragment."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "…" if parts.query else "", ""))


def read_webhooks(client: Any, keyspace: Keyspace, limit: int = 20) -> dict[str, Any]:
    """The webhooks' standing for the status: pending and failed counts, the newest failed deliveries."""
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keyspace.webhooks_due).llen(keyspace.webhooks_failed)
    pipe.lrange(keyspace.webhooks_failed, 0, max(0, limit - 1))
    pending, failed, raws = pipe.execute()
    recent = []
    for raw in raws:
        d = WebhookDelivery.decode(raw)
        recent.append({"id": d.id, "url": _shown_url(d.url), "attempts": d.attempts, "last_error": d.last_error,
                       "failed_at": d.failed_at})
    return {"pending": int(pending), "failed": int(failed), "recent_failed": recent}
