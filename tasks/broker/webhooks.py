"""Webhook deliveries in Redis: the delivery queue a worker's sender reads, the failed deliveries kept after their
last retry, and which targets a ``callback_url`` may name.

- **The queue** (``Keyspace.webhooks_due``): a sorted set of delivery ids scored by the time of their next attempt,
  each delivery a key of its own (``Keyspace.webhook``: its target, payload and attempts) that expires after the
  retry window. At most ``SWAPLESS_WEBHOOK_MAX_PENDING`` deliveries wait: beyond that, a delivery is kept as
  failed at once rather than grow Redis without bound. A delivery already waiting is not queued twice (its id is
  the job's id: a redelivered job's second enqueue is a no-op while the first still waits).
- **Claims.** A sender takes the due deliveries by moving their score past a lease (the attempt's timeout and a
  margin): a sender that dies mid-attempt leaves them due again when the lease ends, for any worker's sender.
- **Failed** (``Keyspace.webhooks_failed``): a list, newest first, of at most ``SWAPLESS_WEBHOOK_MAX_FAILED``
  deliveries (the oldest go first), kept ``SWAPLESS_WEBHOOK_RETRY_S`` after the last one; ``replay`` queues them
  again (``swapless webhooks replay``), ``failed`` lists them (``swapless status``, the status page).
- **Targets** (``check_target``): ``http`` or ``https`` only; a host in ``SWAPLESS_WEBHOOK_ALLOWED_HOSTS`` may be
  anything; with that list unset, only hosts whose every address is public (no loopback, private, link-local,
  reserved or multicast address: no callbacks into the deployment's own network). The producer checks what it can
  without DNS; the sender checks again, resolving the host, before each attempt.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from swapless.config.errors import WebhookRefused
from swapless.tasks.keyspace import Keyspace

__all__ = ["Delivery", "WebhookQueue", "allowed_hosts", "check_target", "read_webhooks", "resolve_host"]

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
class Delivery:
    """One webhook to send: ``id`` (the ``webhook-id``: the job's id), its target and its signed body.

    Attributes:
        payload: the JSON text sent (and signed) as it is.
        created_s: when it was first queued (epoch seconds): retries stop ``SWAPLESS_WEBHOOK_RETRY_S`` after it.
        attempts: attempts made so far.
        last_error: why the last attempt failed.
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
    def decode(cls, raw: bytes | str) -> Delivery:
        data = json.loads(raw)
        return cls(**{name: data.get(name) for name in cls.__dataclass_fields__ if name in data})


def allowed_hosts(setting: str) -> frozenset[str]:
    """The hosts of ``SWAPLESS_WEBHOOK_ALLOWED_HOSTS`` (comma-separated), lower case."""
    return frozenset(h.strip().lower().strip("[]") for h in setting.split(",") if h.strip())


def _listed(host: str, allowed: frozenset[str]) -> bool:
    return host in allowed or any(a.startswith("*.") and host.endswith(a[1:]) for a in allowed)


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_loopback or ip.is_link_local)


def check_target(
    url: str, allowed: frozenset[str], resolve: Callable[[str], Sequence[str]] | None = None
) -> str:
    """Check that ``url`` may be called back; returns its host.

    Args:
        url: the ``callback_url``.
        allowed: ``allowed_hosts(SWAPLESS_WEBHOOK_ALLOWED_HOSTS)``.
        resolve: host -> its addresses (the sender's DNS lookup); None: check only what needs no lookup (a
            literal address, ``localhost``), as producers do.

    Raises:
        WebhookRefused: not http(s), no host, a port out of range, a host outside the allow-list, or one that is
            (or resolves to) an address that is not public.
    """
    if not isinstance(url, str) or len(url) > 2048:
        raise WebhookRefused(str(url)[:100], "it must be an http or https URL of at most 2048 characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookRefused(url, "it must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise WebhookRefused(url, "it must not carry a user or password (the signature authenticates the sender)")
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number from 0 to 65535
    except ValueError:
        raise WebhookRefused(url, "its port must be a number from 1 to 65535") from None
    if parts.port == 0:
        raise WebhookRefused(url, "its port must be a number from 1 to 65535")
    host = parts.hostname.lower()
    if allowed:
        if not _listed(host, allowed):
            raise WebhookRefused(url, f"host {host!r} is not in SWAPLESS_WEBHOOK_ALLOWED_HOSTS; add it there")
        return host
    if host == "localhost" or host.endswith(".localhost"):
        raise WebhookRefused(url, "it names this machine; list the host in SWAPLESS_WEBHOOK_ALLOWED_HOSTS to allow it")
    try:
        addresses: Sequence[str] = [str(ipaddress.ip_address(host))]
    except ValueError:
        if resolve is None:
            return host
        try:
            addresses = resolve(host)
        except OSError as err:
            raise WebhookRefused(url, f"host {host!r} does not resolve ({err})") from None
    _refuse_internal(url, host, addresses)
    return host


def _refuse_internal(url: str, host: str, addresses: Sequence[str]) -> None:
    private = [a for a in addresses if not _public(a)]
    if private:
        raise WebhookRefused(url, f"host {host!r} is at an internal address ({private[0]}); list the host in "
                                  "SWAPLESS_WEBHOOK_ALLOWED_HOSTS to allow it")


def connect_address(url: str, allowed: frozenset[str], resolve: Callable[[str], Sequence[str]]) -> str:
    """The one address a sender connects to for ``url``, checked as ``check_target`` checks it and looked up once:
    the connection goes to the address that was checked, so a name that resolves to an internal address a moment
    after the check (DNS rebinding) is never followed. An allow-listed host may be internal; it is pinned too.

    Raises:
        WebhookRefused: as ``check_target``.
        OSError: the host does not resolve now (a sender tries again later).
    """
    host = check_target(url, allowed)  # what needs no lookup: scheme, user, allow-list, literal and local names
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    addresses = list(resolve(host))
    if not addresses:
        raise OSError(f"host {host!r} has no address")
    if not allowed:
        _refuse_internal(url, host, addresses)
    return addresses[0]


def pinned(url: str, address: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """``url`` sent to ``address``: (the URL to connect to, its ``Host`` header, the request's TLS server name),
    so the receiver sees its own name and a certificate is checked against it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        ipaddress.ip_address(host)
        return url, {}, {}  # a literal address needs no pinning
    except ValueError:
        pass
    at = f"[{address}]" if ":" in address else address
    netloc = f"{at}:{parts.port}" if parts.port is not None else at
    return urlunsplit(parts._replace(netloc=netloc)), {"Host": parts.netloc}, {"sni_hostname": host}


def resolve_host(host: str) -> list[str]:
    """Every address ``host`` resolves to (the sender's lookup for ``check_target``)."""
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})


class WebhookQueue:
    """The webhook deliveries of one queue (see the module docstring).

    Args:
        client: a redis-py client.
        keyspace: the queue's keys.
        ttl_s: how long a delivery is retried and a failed one kept (``SWAPLESS_WEBHOOK_RETRY_S``).
        max_pending: ``SWAPLESS_WEBHOOK_MAX_PENDING``.
        max_failed: ``SWAPLESS_WEBHOOK_MAX_FAILED``.
        max_pending_per_key: ``SWAPLESS_WEBHOOK_MAX_PENDING_PER_KEY`` (deliveries of one API key's jobs waiting).
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

    def enqueue(self, deliveries: Sequence[Delivery], now: float | None = None) -> tuple[int, int]:
        """Queue ``deliveries`` (due now) in one round trip; returns (queued, kept as failed: the queue was full).
        One already waiting is left as it was."""
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

    def claim(self, limit: int, lease_s: float, now: float | None = None) -> list[Delivery]:
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
        return [Delivery.decode(raw) for raw in raws if raw is not None]

    def next_due_s(self) -> float | None:
        """When the next delivery is due (epoch seconds), or None: none waits."""
        first = self.client.zrange(self.keyspace.webhooks_due, 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    def delivered(self, delivery: Delivery) -> None:
        """Forget a delivered delivery."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(self.keyspace.webhooks_due, delivery.id).delete(self.keyspace.webhook(delivery.id))
        if delivery.owner:
            pipe.zrem(self.keyspace.webhooks_owner(delivery.owner), delivery.id)
        pipe.execute()

    def retry(self, delivery: Delivery, at_s: float) -> None:
        """Try ``delivery`` (its attempts and last error updated) again at ``at_s``."""
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keyspace.webhook(delivery.id), delivery.encode(), keepttl=True)
        pipe.zadd(self.keyspace.webhooks_due, {delivery.id: at_s})
        pipe.execute()

    def fail(self, delivery: Delivery, now: float | None = None) -> None:
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

    def failed(self, limit: int = 100) -> tuple[int, list[Delivery]]:
        """How many failed deliveries are kept, and the newest ``limit`` of them."""
        pipe = self.client.pipeline(transaction=False)
        pipe.llen(self.keyspace.webhooks_failed).lrange(self.keyspace.webhooks_failed, 0, max(0, limit - 1))
        count, raws = pipe.execute()
        return int(count), [Delivery.decode(raw) for raw in raws]

    def replay(self, ids: Sequence[str] | None = None) -> int:
        """Queue failed deliveries again (``ids``: only those; None: all), each with a fresh retry window and its
        attempts reset; returns how many."""
        key = self.keyspace.webhooks_failed
        raws = self.client.lrange(key, 0, -1)
        chosen = [(raw, Delivery.decode(raw)) for raw in raws]
        if ids is not None:
            wanted = set(ids)
            chosen = [(raw, d) for raw, d in chosen if d.id in wanted]
        fresh = {}
        for _, d in chosen:  # the newest failure of one id, once
            fresh[d.id] = Delivery(d.id, d.url, d.payload, owner=d.owner, traceparent=d.traceparent)
        if not fresh:
            return 0
        self.enqueue(list(fresh.values()))
        pipe = self.client.pipeline(transaction=False)
        for raw, _ in chosen:
            pipe.lrem(key, 1, raw)
        pipe.execute()
        return len(fresh)


def _shown_url(url: str) -> str:
    """A callback URL as the status shows it: its query (often a token) and fragment left out."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "…" if parts.query else "", ""))


def read_webhooks(client: Any, keyspace: Keyspace, limit: int = 20) -> dict[str, Any]:
    """The webhooks' standing for the status: ``{"pending": n, "failed": n, "recent_failed": [delivery, ...]}``
    (the newest ``limit`` failed deliveries, without their payloads, their URLs without query)."""
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keyspace.webhooks_due).llen(keyspace.webhooks_failed)
    pipe.lrange(keyspace.webhooks_failed, 0, max(0, limit - 1))
    pending, failed, raws = pipe.execute()
    recent = []
    for raw in raws:
        d = Delivery.decode(raw)
        recent.append({"id": d.id, "url": _shown_url(d.url), "attempts": d.attempts, "last_error": d.last_error,
                       "failed_at": d.failed_at})
    return {"pending": int(pending), "failed": int(failed), "recent_failed": recent}
