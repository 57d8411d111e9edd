"""Bulk acks of late-ack messages on the consumer thread, and the visibility refresh of held messages
(docs/concepts/delivery.md, "Acks and visibility").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from swapless.tasks.broker.connection import RedisHealth
from swapless.tasks.broker.kombu_private import delivered, mark_acked, unacked_dirty

__all__ = ["AckQueue", "refresh_visibility"]

logger = logging.getLogger(__name__)


class AckQueue:
    """Acks requests in bulk on the consumer thread.

    Args:
        call_soon: the consumer's ``call_soon``; None acks at once on the calling thread. ``bind`` sets it later.
    """

    def __init__(self, call_soon: Callable[..., Any] | None = None) -> None:
        self.call_soon = call_soon
        self._pending: list[Any] = []
        self._lock = threading.Lock()

    def bind(self, call_soon: Callable[..., Any]) -> None:
        """Ack on this consumer's thread from now on (called at each connection)."""
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
        """Put ``requests``' messages back at the head of their lists, on the consumer thread."""
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
        """Ack everything queued (on the consumer thread, or at shutdown)."""
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
        if getattr(channel, "closed", False) or getattr(channel.connection, "client", None) is None:
            # closed since (a reconnect): it put back what it held, and the results are stored
            logger.info("%d message(s) of a closed channel come back; their stored results drop the copies",
                        len(group))
            continue
        qos = channel.qos
        held_ack = getattr(qos, "held_ack", None)  # tasks.broker.held's QoS
        if held_ack is None:
            for message in group:
                message.ack_log_error(logger, channel.connection.client.connection_errors)
            continue
        try:
            with channel.conn_or_acquire() as client:
                rest = set(held_ack([message.delivery_tag for message in group], client))
        except Exception:  # like kombu's ack_log_error: a failed ack is logged, not raised
            logger.critical("could not ack %d message(s); they will be redelivered", len(group), exc_info=True)
            continue
        acked = group
        if rest:  # not records of this channel's: kombu's own acks
            for message in group:
                if message.delivery_tag in rest:
                    message.ack_log_error(logger, channel.connection.client.connection_errors)
            acked = [message for message in group if message.delivery_tag not in rest]
        mark_acked(qos, acked)


def refresh_visibility(channel: Any, health: RedisHealth) -> int:
    """Re-stamp the records of every message ``channel`` holds; run on the consumer thread.

    Returns:
        how many messages were refreshed.
    """
    qos = getattr(channel, "qos", None)
    held_refresh = getattr(qos, "held_refresh", None)
    if qos is None or held_refresh is None:
        return 0
    dirty = unacked_dirty(qos)
    tags = [tag for tag in list(delivered(qos)) if tag not in dirty]
    if not tags:
        return 0
    try:
        with channel.conn_or_acquire() as client:
            held_refresh(tags, client, time.time())
        health.ok()
    except Exception as err:  # noqa: BLE001 - the next refresh tries again; the timeout leaves several chances
        health.failed(err, f"refreshing the visibility of {len(tags)} held message(s)")
        return 0
    return len(tags)
