"""Acknowledging late-ack messages in bulk, and keeping held messages visible.

kombu acks a Redis message with one MULTI/EXEC (``ZREM`` + ``HDEL`` of its unacked entry) per message, which at
thousands of jobs per second is a third of the consumer thread's time. ``AckQueue`` removes many messages' entries
in one script call: atomic per call like kombu's MULTI, and, unlike a MULTI, taken by Redis over ``maxmemory``
(Redis refuses to queue any command of a transaction then, deletions included). It runs on the consumer's own thread (``Consumer.call_soon``), like Celery's own acks,
because kombu channels are not thread-safe; at shutdown ``drain()`` runs what is still queued.

``refresh_visibility`` re-stamps every message this worker still holds in kombu's unacked index, so that a live
worker never has its jobs redelivered elsewhere however long they wait or run, while a dead worker's jobs come
back after ``visibility_timeout`` (kombu's ``restore_visible`` sweep). It runs as one script whose first write
takes no memory, so it goes through even while Redis is over ``maxmemory`` (``WRITE_FIRST_NOTE``): re-stamping
grows nothing, and a refresh refused at the limit would let a live worker's jobs run twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import QoS as VirtualQoS

from tasks.broker.connection import worker_health

__all__ = ["ACK_UNACKED", "AckQueue", "refresh_visibility"]

logger = logging.getLogger(__name__)


class AckQueue:
    """Acks requests in bulk on the consumer thread.

    Args:
        call_soon: the consumer's ``call_soon`` (runs a callable on the consumer thread); None acks at once,
            on the calling thread, the ordinary way (``request.acknowledge()``). ``bind`` sets it later.
    """

    def __init__(self, call_soon: Callable[..., Any] | None = None) -> None:
        self.call_soon = call_soon
        self._pending: list[Any] = []
        self._lock = threading.Lock()

    def bind(self, call_soon: Callable[..., Any]) -> None:
        """Ack on this consumer's thread from now on (the consumer calls it at each connection)."""
        self.call_soon = call_soon

    def ack(self, requests: Iterable[Any]) -> None:
        """Mark ``requests`` acknowledged and queue their messages for one bulk ack."""
        if self.call_soon is None:
            for request in requests:
                request.acknowledge()
            return
        messages = []
        for request in requests:
            if request.acknowledged:
                continue
            request.acknowledged = True
            messages.append(request.message)
        if not messages:
            return
        with self._lock:
            first = not self._pending
            self._pending.extend(messages)
        if first:
            self.call_soon(self.drain)

    def requeue(self, requests: Iterable[Any]) -> None:
        """Put ``requests``' messages back at the head of their lists, on the consumer thread (a job handed over to
        another worker: ``BatchScheduler.hand_over``)."""
        pending = [request for request in requests if not request.acknowledged]
        if not pending:
            return

        def reject() -> None:
            for request in pending:
                request.reject(requeue=True)

        if self.call_soon is None:
            reject()
        else:
            self.call_soon(reject)

    def drain(self) -> None:
        """Ack everything queued (on the consumer thread, or at shutdown once the consumer loop has stopped)."""
        with self._lock:
            messages, self._pending = self._pending, []
        if messages:
            _ack_messages(messages)


#: KEYS: kombu's unacked hash and index. ARGV: the delivery tags. Deletions only.
ACK_UNACKED = """
for i = 1, #ARGV, 1000 do
  local tags = {unpack(ARGV, i, math.min(i + 999, #ARGV))}
  redis.call('ZREM', KEYS[2], unpack(tags))
  redis.call('HDEL', KEYS[1], unpack(tags))
end
return #ARGV
"""


def _ack_messages(messages: list[Any]) -> None:
    by_channel: dict[int, list[Any]] = {}
    for message in messages:
        by_channel.setdefault(id(message.channel), []).append(message)
    for group in by_channel.values():
        channel = group[0].channel
        qos = channel.qos
        if not isinstance(qos, kombu_redis.QoS):
            for message in group:
                message.ack_log_error(logger, channel.connection.client.connection_errors)
            continue
        prefix = channel.global_keyprefix or ""
        tags = [message.delivery_tag for message in group]
        try:
            with channel.conn_or_acquire() as client:
                placed_ack = getattr(qos, "placed_ack", None)  # messages from a model's lists (tasks.broker.placed)
                rest = placed_ack(tags, client) if placed_ack is not None else tags
                if rest:
                    client.execute_command(
                        "EVAL", ACK_UNACKED, 2, prefix + qos.unacked_key, prefix + qos.unacked_index_key, *rest
                    )
        except Exception:  # noqa: BLE001 - like kombu's ack_log_error: a failed ack is logged, not raised
            logger.critical("could not ack %d message(s); they will be redelivered", len(group), exc_info=True)
            continue
        for message in group:
            VirtualQoS.ack(qos, message.delivery_tag)
            message._state = "ACK"


# KEYS: the unacked index. ARGV: the time, then the delivery tags. XX: a message acked meanwhile is not added back.
# The first write removes nothing (see the module docstring).
_REFRESH = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(-inf')
local batch = {}
for i = 2, #ARGV do
  batch[#batch + 1] = ARGV[1]
  batch[#batch + 1] = ARGV[i]
  if #batch >= 1000 or i == #ARGV then
    redis.call('ZADD', KEYS[1], 'XX', unpack(batch))
    batch = {}
  end
end
return #ARGV - 1
"""


def refresh_visibility(channel: Any) -> int:
    """Re-stamp, with the time now, the unacked-index entries of every message ``channel`` holds.

    Run on the consumer thread.

    Returns:
        how many messages were refreshed.
    """
    qos = getattr(channel, "qos", None)
    if not isinstance(qos, kombu_redis.QoS):
        return 0
    tags = [tag for tag in list(qos._delivered) if tag not in qos._dirty]
    if not tags:
        return 0
    index = f"{channel.global_keyprefix or ''}{qos.unacked_index_key}"
    now = time.time()
    try:
        with channel.conn_or_acquire() as client:
            placed_refresh = getattr(qos, "placed_refresh", None)  # messages from a model's lists
            rest = placed_refresh(tags, client, now) if placed_refresh is not None else tags
            if rest:
                client.execute_command("EVAL", _REFRESH, 1, index, repr(now), *rest)
        worker_health.ok()
    except Exception as err:  # noqa: BLE001 - the next refresh tries again; the timeout leaves several chances
        worker_health.failed(err, f"refreshing the visibility of {len(tags)} held message(s)")
        return 0
    return len(tags)
