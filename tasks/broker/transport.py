"""kombu's Redis transport, with a fetch that cannot lose a message, and fetches many messages per round trip.

kombu takes a message off the queue with ``BRPOP`` and only then, in a second round trip, records it as unacked
(``ZADD`` + ``HSET``; celery/kombu#305). A worker killed, or cut off from Redis, between the two holds the only
copy of that job: it is lost. Here one Lua script (``FETCH``) pops up to ``n`` messages from the queue's priority
lists **and** records each in kombu's unacked hash and index, atomically: a message is on the queue or in the
unacked records at every instant, and kombu's ``restore_visible`` sweep brings back those of a dead worker after
the visibility timeout, like any other unacked message.

Fetching many messages per round trip also takes most of the consumer thread's per-message Redis work away
(``BRPOP`` and the ``MULTI/EXEC`` of its unacked record, for every job): one script call now serves up to
``fetch_limit`` jobs, bounded by the prefetch credit.

Lua cannot block, so an idle worker waits with ``BLMOVE key key RIGHT RIGHT timeout`` on the queue's first
(priority 0) list, sent together with the script: Redis returns from the wait as soon as a message is there (it
moves nothing: the message stays where it was) and runs the script at once, in the same round trip. Other lists
(the bulk priorities, other queues) are checked at least every ``idle_poll_s`` (0.1 s by default, transport option
``swapless_idle_poll_s``: the script runs when the wait runs out, too); a worker with work in hand never waits.

With placement (the worker calls ``use_affinity``), the channel fetches from the lists of the models this worker
claimed too, routes the shared lists' messages to their models' lists, and acks, refreshes and restores those
messages' records in their model's keys (``tasks.broker.placed``).

Everything else (key prefixes, TLS, reconnects, the shared lists' acks and restores) is kombu's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from redis.exceptions import ResponseError

from tasks.broker.acks import ACK_UNACKED
from tasks.broker.connection import is_refused_write, worker_health
from tasks.broker.placed import PlacedChannel, PlacedQoS, current_affinity, use_affinity, use_intake

__all__ = ["FETCH", "Channel", "QoS", "Transport", "broker_connection", "use_affinity", "use_intake"]

#: KEYS: unacked hash, unacked index, then the queue lists in the order they are served.
#: ARGV: most messages to take, the time to stamp (kombu's client clock, as its own ``QoS.append`` uses).
#: Returns ``[key index, message, key index, message, ...]``. The unacked entry is kombu's
#: ``[payload, exchange, routing_key]``, built around the raw payload text so the payload is stored byte for byte.
FETCH = """
local limit = tonumber(ARGV[1])
local out = {}
local taken = 0
for i = 3, #KEYS do
  if taken >= limit then break end
  local items = redis.call('RPOP', KEYS[i], limit - taken)
  if items then
    for _, raw in ipairs(items) do
      local ok, msg = pcall(cjson.decode, raw)
      local props = ok and type(msg) == 'table' and msg['properties']
      local tag = type(props) == 'table' and props['delivery_tag']
      if type(tag) == 'string' then
        local info = props['delivery_info']
        local exchange, rkey = '', ''
        if type(info) == 'table' then
          if type(info['exchange']) == 'string' then exchange = info['exchange'] end
          if type(info['routing_key']) == 'string' then rkey = info['routing_key'] end
        end
        redis.call('HSET', KEYS[1], tag, '[' .. raw .. ',' .. cjson.encode(exchange) .. ',' .. cjson.encode(rkey) .. ']')
        redis.call('ZADD', KEYS[2], ARGV[2], tag)
      end
      -- a message without a delivery tag cannot be acked; kombu's own path would fail on it too: hand it over
      -- and let the worker reject it (it is logged there, not silently dropped here)
      out[#out + 1] = i - 2
      out[#out + 1] = raw
      taken = taken + 1
    end
  end
end
return out
"""

_FETCH, _WAIT = "fetch", "wait"

logger = logging.getLogger(__name__)


class QoS(PlacedQoS, kombu_redis.QoS):
    """kombu's Redis QoS, minus the unacked record for messages ``FETCH`` has already recorded, with a restore
    sweep that waits quietly while Redis refuses writes (its lock and its pushes are writes), and with the records
    of messages from a model's lists kept in the model's keys (``PlacedQoS``)."""

    def ack(self, delivery_tag: str) -> None:
        if delivery_tag in self.channel._held:
            with self.channel.conn_or_acquire() as client:
                self.placed_ack([delivery_tag], client)
            virtual.QoS.ack(self, delivery_tag)
            return
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if delivery_tag in self.channel._held:
            with self.channel.conn_or_acquire() as client:
                (self.placed_restore if requeue else self.placed_ack)([delivery_tag], client)
            virtual.QoS.ack(self, delivery_tag)
            return
        super().reject(delivery_tag, requeue=requeue)

    def restore_by_tag(self, tag: Any, client: Any = None, leftmost: bool = False) -> None:
        tag = bytes_to_str(tag)
        if tag in self.channel._held:
            with self.channel.conn_or_acquire(client) as conn:
                self.placed_restore([tag], conn)
            return
        super().restore_by_tag(tag, client=client, leftmost=leftmost)

    def restore_unacked(self, client: Any = None) -> None:
        with self.channel.conn_or_acquire(client) as conn:
            rest = self.placed_restore(list(self._delivered), conn)
            for tag in rest:
                super().restore_by_tag(tag, client=conn)
        self._delivered.clear()

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().restore_visible(*args, **kwargs)
        except ResponseError as err:
            if not is_refused_write(err):
                raise
            worker_health.failed(err, "restoring a dead worker's jobs")  # the next sweep tries again

    def append(self, message: Any, delivery_tag: str) -> None:
        recorded = self.channel._recorded
        if delivery_tag in recorded:
            recorded.discard(delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)
        else:
            super().append(message, delivery_tag)


class Channel(PlacedChannel, kombu_redis.Channel):
    """kombu's Redis channel with the atomic bulk fetch (see the module docstring)."""

    QoS = QoS
    from_transport_options = kombu_redis.Channel.from_transport_options + (  # type: ignore[assignment]
        "swapless_idle_poll_s",
        "swapless_fetch_limit",
    )

    #: Longest an idle worker takes to see a message on any list but the queue's priority-0 one.
    swapless_idle_poll_s = 0.1
    #: Most messages one script call takes (also bounded by the prefetch credit).
    swapless_fetch_limit = 256
    #: Seconds the consumer waits before fetching again when Redis refuses the fetch (a read-only replica).
    swapless_refused_pause_s = 0.5

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._recorded: set[str] = set()
        self._mode = _FETCH
        self._fetch_queues: list[str] = []
        self._fetch_keys: list[str] = []
        self._sent: list[str] = []
        self._placed_init()

    def _prefixed(self, key: str) -> str:
        return f"{self.global_keyprefix or ''}{key}"

    # A worker must start, and reconnect, while Redis is over maxmemory too (it is how a full Redis gets drained):
    # kombu counts a queue in a MULTI, which Redis then refuses whole, and re-adds a binding that is already there
    # with SADD, which it refuses too.

    def _size(self, queue: str) -> int:
        with self.conn_or_acquire() as client:
            with client.pipeline(transaction=False) as pipe:
                for pri in self.priority_steps:
                    pipe.llen(self._q_for_pri(queue, pri))
                return sum(size for size in pipe.execute() if isinstance(size, int))

    def maybe_refresh_binding_expiry(self) -> None:
        try:
            super().maybe_refresh_binding_expiry()
        except ResponseError as err:
            if not is_refused_write(err):
                raise
            worker_health.failed(err, "refreshing the queue's binding")  # the next cycle tries again

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        try:
            super()._queue_bind(exchange, routing_key, pattern, queue)
        except ResponseError as err:
            if not is_refused_write(err):
                raise
            worker_health.failed(err, f"binding queue {queue!r}")  # bound at an earlier start: it still is

    def _brpop_start(self, timeout: float | None = None) -> None:
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        conn = self.client.connection
        affinity = current_affinity()
        wait = timeout if timeout is not None else self.brpop_timeout
        wait = min(wait or self.swapless_idle_poll_s, self.swapless_idle_poll_s)
        if affinity is not None:
            commands = self._placed_fetch_commands(affinity, queues[0], self._shared_fetch(queues))
            if self._mode == _WAIT:
                commands.insert(0, self._placed_wait_command(affinity, queues[0], wait))
        else:
            commands = [tuple(self._shared_fetch(queues))]
            if self._mode == _WAIT:
                key = self._prefixed(self._q_for_pri(queues[0], 0))
                commands.insert(0, ("BLMOVE", key, key, "RIGHT", "RIGHT", wait))
        # An idle worker sends the wait and the fetch together: Redis runs the fetch the moment the wait returns (a
        # message came, or the idle poll ran out), so a job that wakes the worker is fetched in the same round trip.
        conn.send_packed_command(conn.pack_commands(commands))
        self._sent = [str(command[0]) for command in commands]  # what the replies of this round answer
        self._in_poll = conn
        self._brpop_sent_at = time.monotonic()  # type: ignore[assignment]  # kombu declares it None

    def _read_round(self) -> tuple[list[Any], ResponseError | None]:
        """Read every reply of the round ``_brpop_start`` sent (one per command); a refused write (a read-only replica) reads as
        None and is returned, so the connection stays in step. Any other failure drops the connection (the next
        poll reconnects) and is raised."""
        conn = self.client.connection
        replies: list[Any] = []
        refused: ResponseError | None = None
        for name in self._sent:
            try:
                replies.append(self.client.parse_response(conn, name))
            except self.connection_errors:
                conn.disconnect()
                self._mode = _FETCH
                raise
            except ResponseError as err:
                if not is_refused_write(err):
                    conn.disconnect()  # the round's other replies are still on the wire
                    raise
                refused = err
                replies.append(None)
        return replies, refused

    def _shared_fetch(self, queues: list[str]) -> list[Any]:
        """The ``FETCH`` command over the shared lists of ``queues``."""
        keys = [(q, self._q_for_pri(q, pri)) for pri in self.priority_steps for q in queues]
        # priority_steps may map several steps to one list; serve each list once
        keys = list(dict.fromkeys(keys))
        self._fetch_queues = [q for q, _ in keys]
        limit = self.qos.can_consume_max_estimate()
        limit = self.swapless_fetch_limit if limit is None else min(limit, self.swapless_fetch_limit)
        return [
            "EVAL",
            FETCH,
            2 + len(keys),
            self._prefixed(self.unacked_key),
            self._prefixed(self.unacked_index_key),
            *(self._prefixed(k) for _, k in keys),
            max(limit, 1),
            repr(time.time()),
        ]

    def _brpop_read(self, **options: Any) -> bool:
        affinity = current_affinity()
        if affinity is not None:
            return self._placed_read(affinity)
        try:
            replies, refused = self._read_round()
            if refused is not None:
                # a read-only replica (a failover), a failed save: nothing can be fetched now; try again shortly
                worker_health.failed(refused, "fetching jobs")
                self._mode = _FETCH
                time.sleep(self.swapless_refused_pause_s)
                raise Empty() from None
            if not replies[-1]:
                self._mode = _WAIT  # nothing anywhere: wait for the next message
                raise Empty()
            self._mode = _FETCH  # work is flowing: fetch again at once
            self._deliver_fetched(replies[-1])
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # as kombu does
            self._flush_brpop_reauth()

    def _placed_read(self, affinity: Any) -> bool:
        queue = self._fetch_queues[0] if self._fetch_queues else next(iter(self.active_queues))
        try:
            replies, refused = self._read_round()
            if self._sent[0] == "BLPOP":
                replies = replies[1:]  # the bell's
            if refused is not None:
                worker_health.failed(refused, "fetching jobs")
                time.sleep(self.swapless_refused_pause_s)
            if not self._placed_deliver(affinity, replies, queue):
                self._mode = _WAIT
                raise Empty()
            self._mode = _FETCH
            return True
        finally:
            self._in_poll = None  # type: ignore[assignment]  # as kombu does
            self._flush_brpop_reauth()

    def _deliver_one(self, payload: dict[str, Any], queue: str) -> None:
        self._queue_cycle.rotate(queue)
        self.connection._deliver(payload, queue)

    def _ack_shared(self, client: Any, tags: Sequence[str]) -> None:
        if tags:
            client.execute_command(
                "EVAL", ACK_UNACKED, 2, self._prefixed(self.unacked_key), self._prefixed(self.unacked_index_key), *tags
            )

    def _deliver_fetched(self, reply: list[Any]) -> None:
        payloads = []
        for index, raw in zip(reply[::2], reply[1::2]):
            queue = self._fetch_queues[int(index) - 1]
            payload = self._payload(raw, queue)
            if payload is None:
                continue
            self._recorded.add(payload["properties"]["delivery_tag"])
            self._queue_cycle.rotate(queue)
            payloads.append((payload, queue))
        self._deliver_all(payloads)


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel


#: ``swapless+socket:///path`` (a Unix socket, local mode): kombu takes the transport from a ``+`` URL's prefix.
TRANSPORT_ALIASES.setdefault("swapless", "tasks.broker.transport:Transport")


def broker_connection(url: str) -> tuple[str, str | None]:
    """``(broker_url, broker_transport)`` for Celery: this transport for Redis URLs, kombu's choice otherwise."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("redis", "rediss"):
        return url, "tasks.broker.transport:Transport"
    if scheme == "redis+socket":
        return "swapless+socket://" + url.split("://", 1)[1], None
    return url, None
