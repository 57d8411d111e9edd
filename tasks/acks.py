"""Acknowledging late-ack messages in bulk, and keeping held messages visible.

kombu acks a Redis message with one MULTI/EXEC (``ZREM`` + ``HDEL`` of its unacked entry) per message, which at
thousands of jobs per second is a third of the consumer thread's time. ``AckQueue`` sends the removals of many
messages in one pipeline. It runs on the consumer's own thread (``Consumer.call_soon``), like Celery's own acks,
because kombu channels are not thread-safe; at shutdown ``drain()`` runs what is still queued.

``refresh_visibility`` re-stamps every message this worker still holds in kombu's unacked index, so that a live
worker never has its jobs redelivered elsewhere however long they wait or run, while a dead worker's jobs come
back after ``visibility_timeout`` (kombu's ``restore_visible`` sweep).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport.virtual import QoS as VirtualQoS

__all__ = ["AckQueue", "refresh_visibility"]

logger = logging.getLogger(__name__)


class AckQueue:
    """Acks requests in bulk on the consumer thread.

    Args:
        call_soon: the consumer's ``call_soon`` (runs a callable on the consumer thread); None acks at once,
            on the calling thread, the ordinary way (``request.acknowledge()``).
    """

    def __init__(self, call_soon: Callable[..., Any] | None) -> None:
        self.call_soon = call_soon
        self._pending: list[Any] = []
        self._lock = threading.Lock()

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

    def drain(self) -> None:
        """Ack everything queued (on the consumer thread, or at shutdown once the consumer loop has stopped)."""
        with self._lock:
            messages, self._pending = self._pending, []
        if messages:
            _ack_messages(messages)


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
        try:
            with qos.pipe_or_acquire() as pipe:
                for message in group:
                    qos._remove_from_indices(message.delivery_tag, pipe)
                pipe.execute()
        except Exception:  # noqa: BLE001 - like kombu's ack_log_error: a failed ack is logged, not raised
            logger.critical("could not ack %d message(s); they will be redelivered", len(group), exc_info=True)
            continue
        for message in group:
            VirtualQoS.ack(qos, message.delivery_tag)
            message._state = "ACK"


def refresh_visibility(channel: Any) -> int:
    """Re-stamp, with the time now, the unacked-index entries of every message ``channel`` holds.

    Run on the consumer thread. ``XX``: a message acked meanwhile is not added back.

    Returns:
        how many messages were refreshed.
    """
    qos = getattr(channel, "qos", None)
    if not isinstance(qos, kombu_redis.QoS):
        return 0
    tags = [tag for tag in list(qos._delivered) if tag not in qos._dirty]
    if not tags:
        return 0
    now = time.time()
    try:
        with qos.pipe_or_acquire() as pipe:
            pipe.zadd(qos.unacked_index_key, {tag: now for tag in tags}, xx=True)
            pipe.execute()
    except Exception:  # noqa: BLE001 - the next refresh tries again; the timeout leaves several chances
        logger.warning("could not refresh the visibility of %d held message(s)", len(tags), exc_info=True)
        return 0
    return len(tags)
