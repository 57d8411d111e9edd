"""kombu's Redis transport over the queue's one layout: an atomic bulk fetch from the claimed models' lists and
the ingress, in one round trip (docs/concepts/delivery.md, "The fetch").
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from collections.abc import Sequence
from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from redis.exceptions import ResponseError

from swapless.tasks.broker.connection import is_refused_write
from swapless.tasks.broker.held import HoldingChannel
from swapless.tasks.broker.publish import ModelPush, push_to_models
from swapless.tasks.broker.queues import ChannelHooks
from swapless.tasks.broker.sentinel import is_sentinel_url
from swapless.tasks.keyspace import INGRESS
from swapless.tasks.protocol import ITEMS_HEADER

__all__ = ["SENTINEL_SCHEME", "Channel", "Transport", "broker_connection"]

logger = logging.getLogger(__name__)

_FETCH, _WAIT = "fetch", "wait"


def _weight(payload: dict[str, Any]) -> int:
    """The jobs a message carries: a chunk's items (``ITEMS_HEADER``), else 1."""
    items = (payload.get("headers") or {}).get(ITEMS_HEADER)
    return items if isinstance(items, int) and items > 1 else 1


class Channel(HoldingChannel):
    """kombu's Redis channel with the atomic bulk fetch over the models' lists and the ingress."""

    from_transport_options = (  # type: ignore[assignment]
        *kombu_redis.Channel.from_transport_options,
        "swapless_idle_poll_s",
        "swapless_fetch_limit",
        "swapless_hooks",
    )

    #: Longest an idle worker takes to see a message on the ingress, or a new claim.
    swapless_idle_poll_s = 0.1
    #: Seconds the consumer waits before fetching again when Redis refuses the fetch (a read-only replica).
    swapless_refused_pause_s = 0.5

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._mode = _FETCH
        self._sent: list[str] = []  # the commands of this channel's round in flight; empty: kombu's own BRPOP
        self._queue = ""

    # A worker must start, and reconnect, while Redis is over maxmemory too (it is how a full Redis gets drained):
    # kombu counts a queue in a MULTI, which Redis then refuses whole, and re-adds a binding that is already there
    # with SADD, which it refuses too.

    def queue_size(self, queue: str) -> int:
        with self.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
            for pri in self.priority_steps:
                pipe.llen(self.priority_list(queue, pri))
            return sum(size for size in pipe.execute() if isinstance(size, int))

    def maybe_refresh_binding_expiry(self) -> None:
        try:
            super().maybe_refresh_binding_expiry()
        except ResponseError as err:
            self._refused(err, "refreshing the queue's binding")  # the next cycle tries again

    def bind_queue(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        try:
            super().bind_queue(exchange, routing_key, pattern, queue)
        except ResponseError as err:
            self._refused(err, f"binding queue {queue!r}")  # bound at an earlier start: it still is

    # -- one fetch round ---------------------------------------------------------------------------------------

    def _hooks(self) -> ChannelHooks | None:
        """The worker's hooks when this channel consumes the worker's queue; None: kombu's own channel."""
        hooks = self.swapless_hooks
        return hooks if hooks is not None and hooks.queue in self.active_queues else None

    def send_fetch(self, timeout: float | None = None) -> None:
        hooks = self._hooks()
        if hooks is None:
            self._sent = []
            super().send_fetch(timeout)
            return
        self._queue = hooks.queue
        keyspace = self._keyspace(self._queue)
        commands = self._fetch_commands(hooks, keyspace)
        if self._mode == _WAIT:
            wait = min(timeout or self.swapless_idle_poll_s, self.swapless_idle_poll_s)
            bells = [keyspace.model(m).bell for m in hooks.affinity.claimed()]
            wake = keyspace.wake(hooks.affinity.worker_id)  # rung by new claims, and by acks that free room
            self._wake_key = wake if self._full else None
            commands.insert(0, ("BLPOP", *bells, wake, keyspace.placement_bell, wait))
        # An idle worker sends the wait and the fetch together: Redis runs the fetch the moment the wait returns (a
        # message came, or the idle poll ran out), so a job that wakes the worker is fetched in the same round trip.
        conn = self.client.connection
        conn.send_packed_command(conn.pack_commands(commands))
        self._sent = [str(command[0]) for command in commands]  # what the replies of this round answer
        self.polling(conn)

    def _read_round(self) -> tuple[list[Any], ResponseError | None]:
        """Read every reply of the round ``send_fetch`` sent.

        Returns:
            the replies, and the refused write (a read-only replica) read as None, if any.

        Raises:
            any other failure, after dropping the connection (the next poll reconnects).
        """
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

    def read_fetch(self, **options: Any) -> bool:
        # the round's sender decides whose reply this is: the worker's queue can become active between the two
        # (``celery worker -Q``), while kombu's own BRPOP is still out
        hooks = self.swapless_hooks if self._sent else None
        if hooks is None:
            return bool(super().read_fetch(**options))
        try:
            replies, refused = self._read_round()
            woken = False
            if self._sent[0] == "BLPOP":
                bell, replies = replies[0], replies[1:]
                self._wake_key = None
                if bell:
                    keyspace = self._keyspace(self._queue)
                    rung = bytes_to_str(bell[0])
                    woken = rung.startswith(keyspace.wake(""))
                    if rung == keyspace.placement_bell:  # jobs for a model no worker holds: place them now
                        getattr(hooks.affinity, "wake", lambda: None)()
            if refused is not None:
                hooks.health.failed(refused, "fetching jobs")
                time.sleep(self.swapless_refused_pause_s)
            if not self._deliver_round(hooks, replies):
                # nothing anywhere: wait for the next message; woken by acks: fetch the model they made room for
                self._mode = _FETCH if woken else _WAIT
                raise Empty()
            # Work is flowing: fetch again at once, unless the round emptied every list it fetched from and the
            # ingress had nothing: what comes next rings a bell (a lone job's worker then spends nothing on an
            # empty round while its job runs).
            drained = not replies[-1] and all(
                len(reply or ()) < asked for reply, asked in zip(replies, self._asked, strict=True)
            )
            self._mode = _WAIT if drained else _FETCH
            return True
        finally:
            self.poll_done()

    # -- what a round fetched ----------------------------------------------------------------------------------

    def _deliver_round(self, hooks: ChannelHooks, replies: Sequence[Any]) -> int:
        """Deliver what one round fetched; returns how many were delivered here."""
        fetched: list[dict[str, Any]] = []
        ingress: list[tuple[dict[str, Any], str]] = []
        unclaimed: list[str] = []
        held, held_per_model = self._held, self._held_per_model
        claimed = set(hooks.affinity.claimed())
        for lists, reply in zip(self._plan, replies, strict=True):
            if not reply:
                continue
            from_ingress = lists.name == INGRESS
            # a claim given up while this round was out (placement moved the model on): its jobs go straight back
            # for the worker that holds it now, rather than waiting here behind another model's loads
            given_up = not from_ingress and lists.name not in claimed
            count = messages = 0
            for raw in reply:
                payload = self._envelope(raw)
                if payload is None:
                    continue
                tag = payload["properties"]["delivery_tag"]
                held[tag] = lists
                weight = _weight(payload)
                if weight != 1:
                    self._weight[tag] = weight
                count += weight
                messages += 1
                if from_ingress:
                    ingress.append((payload, bytes_to_str(raw)))
                elif given_up:
                    unclaimed.append(tag)
                else:
                    fetched.append(payload)
            held_per_model[lists.name] += count
            if messages and not from_ingress:
                self._per_message[lists.name] = count / messages
        if unclaimed:
            with self.conn_or_acquire() as client:
                self.qos.held_restore(unclaimed, client)
        if ingress:
            fetched += self._move_ingress(hooks, ingress)
        self._deliver_all(hooks, fetched)
        return len(fetched)

    def _envelope(self, raw: Any) -> dict[str, Any] | None:
        try:
            payload = json.loads(raw)  # a kombu envelope is plain JSON
            if isinstance(payload["properties"]["delivery_tag"], str):
                return payload  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001, S110 - not a kombu message at all: logged below, nothing to run, ack or answer
            pass
        logger.error("Dropped a message on queue %r that is not a kombu message: %.200r", self._queue, raw)
        return None

    def _move_ingress(
        self, hooks: ChannelHooks, messages: Sequence[tuple[dict[str, Any], str]]
    ) -> list[dict[str, Any]]:
        """Push ingress messages to their models' lists and ack them; returns those kept here."""
        keyspace = self._keyspace(self._queue)
        affinity = hooks.affinity
        claimed = set(affinity.claimed())
        pushes: dict[tuple[str, int], list[str]] = {}
        moved: list[str] = []
        kept: list[dict[str, Any]] = []
        for payload, raw in messages:
            model_id = affinity.route(payload)
            if model_id is None:
                kept.append(payload)
                continue
            if model_id in claimed and self._held_per_model[model_id] < affinity.hold_limit(model_id):
                # This worker holds the model and has room for the job: it runs here, recorded where it came from
                # (the ingress's records) and counted under the model's hold, with no second push and fetch.
                tag = payload["properties"]["delivery_tag"]
                self._counted_as[tag] = model_id
                weight = self._weight.get(tag, 1)
                self._held_per_model[INGRESS] -= weight
                self._held_per_model[model_id] += weight
                kept.append(payload)
                continue
            level = self._level(payload["properties"].get("priority"))
            pushes.setdefault((model_id, level), []).append(raw)
            moved.append(payload["properties"]["delivery_tag"])
        if pushes:
            with self.conn_or_acquire() as client:
                push_to_models(
                    client,
                    [ModelPush(keyspace.model(m), level, raws) for (m, level), raws in pushes.items()],
                    bound=None,
                    placement_bell=keyspace.placement_bell,
                )
                self.qos.held_ack(moved, client)
        return kept

    def _level(self, priority: Any) -> int:
        steps = list(self.priority_steps)
        if not isinstance(priority, int):
            return steps[0]
        return steps[max(0, bisect.bisect_right(steps, priority) - 1)]

    def _deliver_all(self, hooks: ChannelHooks, payloads: Sequence[dict[str, Any]]) -> None:
        """Hand one round's messages to the worker's intake or to Celery's consumer; on a failure midway, put the
        undelivered rest back.
        """
        intake = hooks.intake
        rotate, deliver = self.consumer_delivery()
        lean = []
        delivered = 0
        try:
            for payload in payloads:
                if intake is not None and intake.eligible(payload):
                    message = self.Message(payload, channel=self)
                    self.qos.append(message, message.delivery_tag)  # as kombu's consumer callback does
                    lean.append(message)
                else:
                    rotate(self._queue)
                    deliver(payload, self._queue)
                delivered += 1
            if lean and intake is not None:
                intake(lean)
        except BaseException:
            for payload in payloads[delivered:]:
                self.qos.restore_by_tag(payload["properties"]["delivery_tag"], leftmost=True)
            raise


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel


#: The scheme of each sentinel's broker URL, so that kombu reconnects through this transport (``sentinel://`` stays for
#: the result backend).
SENTINEL_SCHEME = "swapless-sentinel"
TRANSPORT_ALIASES.setdefault(SENTINEL_SCHEME, "swapless.tasks.broker.failover:SentinelTransport")

#: ``swapless+socket:///path`` (a Unix socket, local mode): kombu takes the transport from a ``+`` URL's prefix.
TRANSPORT_ALIASES.setdefault("swapless", "swapless.tasks.broker.transport:Transport")


def broker_connection(url: str) -> tuple[str, str | None]:
    """``(broker_url, broker_transport)`` for Celery: this transport for Redis URLs, kombu's choice otherwise."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("redis", "rediss"):
        return url, "swapless.tasks.broker.transport:Transport"
    if scheme == "redis+socket":
        return "swapless+socket://" + url.split("://", 1)[1], None
    if is_sentinel_url(url):
        # kombu reads each sentinel's URL alone: each gets the primary's credentials, written once in Celery's form
        rests = [part.split("://", 1)[1] for part in url.split(";") if part.strip()]
        auth = next((rest.split("@", 1)[0] + "@" for rest in rests if "@" in rest.split("/", 1)[0]), "")
        return ";".join(f"{SENTINEL_SCHEME}://" + (rest if "@" in rest.split("/", 1)[0] else auth + rest)
                        for rest in rests), None
    return url, None
