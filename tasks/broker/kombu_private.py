"""Every private kombu, Celery and celery-batches member Swapless uses; the only module naming them.

Overridden private methods call public hooks of the shim classes below; private attributes are reached through
small functions. tests/test_private_api.py checks each entry of ``PRIVATE_MEMBERS`` against the installed versions:
before raising a pin in pyproject.toml, run it on the new version and follow what moved.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from celery.backends.redis import SentinelBackend as CelerySentinelBackend
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual

__all__ = [
    "PRIVATE_MEMBERS",
    "RedisChannel",
    "RedisSentinelChannel",
    "SentinelBackendShim",
    "batches_buffer",
    "delivered",
    "mark_acked",
    "request_payload",
    "result_meta",
    "socket_of",
    "unacked_dirty",
]

#: ``(owner, private member, what uses it)``: the owner as ``module:Class``; each member is a method or attribute
#: of the class (or of a class above it), or an attribute its source sets on ``self``.
PRIVATE_MEMBERS: tuple[tuple[str, str, str], ...] = (
    ("kombu.transport.redis:Channel", "_brpop_start", "overridden by RedisChannel (send_fetch)"),
    ("kombu.transport.redis:Channel", "_brpop_read", "overridden by RedisChannel (read_fetch)"),
    ("kombu.transport.redis:Channel", "_size", "overridden by RedisChannel (queue_size)"),
    ("kombu.transport.redis:Channel", "_queue_bind", "overridden by RedisChannel (bind_queue)"),
    ("kombu.transport.redis:Channel", "_q_for_pri", "RedisChannel.priority_list"),
    ("kombu.transport.redis:Channel", "_in_poll", "RedisChannel.polling, RedisChannel.poll_done"),
    ("kombu.transport.redis:Channel", "_brpop_sent_at", "RedisChannel.polling"),
    ("kombu.transport.redis:Channel", "_flush_brpop_reauth", "RedisChannel.poll_done"),
    ("kombu.transport.redis:Channel", "_queue_cycle", "RedisChannel.consumer_delivery"),
    ("kombu.transport.virtual:Transport", "_deliver", "RedisChannel.consumer_delivery"),
    ("kombu.transport.redis:Channel", "_connparams", "RedisSentinelChannel.connection_params"),
    ("kombu.transport.redis:SentinelChannel", "_sentinel_managed_pool",
     "overridden by RedisSentinelChannel (sentinel_pool)"),
    ("kombu.transport.redis:SentinelChannel", "_sentinel_manager", "RedisSentinelChannel.keep_sentinel_manager"),
    ("kombu.transport.redis:SentinelChannel", "_async_sentinel_manager",
     "RedisSentinelChannel.keep_sentinel_manager"),
    ("kombu.transport.virtual:QoS", "_delivered", "delivered"),
    ("kombu.transport.virtual:QoS", "_dirty", "unacked_dirty"),
    ("kombu.message:Message", "_state", "mark_acked"),
    ("celery.backends.redis:SentinelBackend", "_get_sentinel_instance",
     "overridden by SentinelBackendShim (sentinel_instance)"),
    ("celery.backends.redis:RedisBackend", "_transport_options", "SentinelBackendShim.backend_transport_options"),
    ("celery.backends.base:Backend", "_get_result_meta", "result_meta"),
    ("celery.worker.request:Request", "_payload", "request_payload"),
    ("celery_batches:Batches", "_buffer", "batches_buffer"),
    ("celery_batches:Batches", "_do_flush", "batches_buffer"),
    ("redis.connection:AbstractConnection", "_sock", "socket_of"),
)


class RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel with its private fetch, size and bind methods behind public hooks.

    Subclasses override ``send_fetch``, ``read_fetch``, ``queue_size`` and ``bind_queue``; ``super()`` runs kombu's.
    """

    # kombu.transport.redis.Channel._brpop_start
    def _brpop_start(self, timeout: float | None = None) -> None:
        self.send_fetch(timeout)

    # kombu.transport.redis.Channel._brpop_read
    def _brpop_read(self, **options: Any) -> Any:
        return self.read_fetch(**options)

    # kombu.transport.redis.Channel._size
    def _size(self, queue: str) -> int:
        return self.queue_size(queue)

    # kombu.transport.redis.Channel._queue_bind
    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        self.bind_queue(exchange, routing_key, pattern, queue)

    def send_fetch(self, timeout: float | None = None) -> None:
        """Send one fetch (kombu's: a ``BRPOP``)."""
        super()._brpop_start(timeout)

    def read_fetch(self, **options: Any) -> Any:
        """Read the fetch's reply and deliver it (kombu's)."""
        return super()._brpop_read(**options)

    def queue_size(self, queue: str) -> int:
        """The messages waiting in ``queue`` (kombu's)."""
        return int(super()._size(queue))

    def bind_queue(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        """Bind ``queue`` to ``exchange`` (kombu's)."""
        super()._queue_bind(exchange, routing_key, pattern, queue)

    def priority_list(self, queue: str, priority: int) -> str:
        """The Redis list of ``queue`` for one priority step."""
        return str(self._q_for_pri(queue, priority))

    def polling(self, connection: Any) -> None:
        """Tell kombu's event loop a fetch was sent on ``connection``."""
        self._in_poll = connection
        self._brpop_sent_at = time.monotonic()  # type: ignore[assignment]  # kombu declares it None

    def poll_done(self) -> None:
        """Tell kombu's event loop the fetch's reply was read."""
        self._in_poll = None  # type: ignore[assignment]  # as kombu does
        self._flush_brpop_reauth()

    def consumer_delivery(self) -> tuple[Callable[[str], Any], Callable[[Any, str], Any]]:
        """kombu's queue rotation and its hand-over of a message to Celery's consumer."""
        return self._queue_cycle.rotate, self.connection._deliver


class RedisSentinelChannel(RedisChannel, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel with its private pool factory behind ``sentinel_pool``."""

    # kombu.transport.redis.SentinelChannel._sentinel_managed_pool
    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        return self.sentinel_pool(asynchronous)

    def sentinel_pool(self, asynchronous: bool = False) -> Any:
        """The primary's connection pool (kombu's)."""
        return super()._sentinel_managed_pool(asynchronous)

    def connection_params(self, asynchronous: bool = False) -> dict[str, Any]:
        """kombu's connection parameters of this channel."""
        return dict(self._connparams(asynchronous))

    def keep_sentinel_manager(self, manager: Any, asynchronous: bool) -> None:
        """Keep the Sentinel client where kombu looks for it."""
        if asynchronous:
            self._async_sentinel_manager = manager
        else:
            self._sentinel_manager = manager


class SentinelBackendShim(CelerySentinelBackend):  # type: ignore[misc]
    """Celery's Sentinel result backend with its private Sentinel factory behind ``sentinel_instance``."""

    # celery.backends.redis.SentinelBackend._get_sentinel_instance
    def _get_sentinel_instance(self, **params: Any) -> Any:
        return self.sentinel_instance(**params)

    def sentinel_instance(self, **params: Any) -> Any:
        """The Sentinel client (Celery's)."""
        return super()._get_sentinel_instance(**params)

    @property
    def backend_transport_options(self) -> dict[str, Any]:
        """The result backend's transport options."""
        return dict(self._transport_options)


def delivered(qos: virtual.QoS) -> Any:
    """The QoS's delivered messages by delivery tag."""
    return qos._delivered


def unacked_dirty(qos: virtual.QoS) -> Any:
    """The delivery tags the QoS acked but has not forgotten yet."""
    return qos._dirty


def mark_acked(qos: virtual.QoS, messages: Iterable[Any]) -> None:
    """Forget acked messages in kombu's QoS and mark each acknowledged."""
    ack = virtual.QoS.ack
    for message in messages:
        ack(qos, message.delivery_tag)
        message._state = "ACK"


def result_meta(backend: Any, result: Any, state: str) -> dict[str, Any]:
    """Celery's result meta of one job (no traceback, no request)."""
    meta: dict[str, Any] = backend._get_result_meta(result=result, state=state, traceback=None, request=None)
    return meta


def request_payload(request: Any) -> Any:
    """A Celery ``Request``'s decoded ``(args, kwargs, embed)``; None for anything else."""
    return getattr(request, "_payload", None)


def batches_buffer(task: Any) -> tuple[Callable[[], bool], Callable[[], None]]:
    """``(empty, flush)`` of a celery-batches task's buffer of requests."""
    return task._buffer.empty, task._do_flush


def socket_of(connection: Any) -> Any:
    """A redis-py connection's socket; None while it is not connected."""
    return getattr(connection, "_sock", None)
