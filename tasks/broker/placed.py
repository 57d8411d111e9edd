"""The transport's side of placement: fetching from the lists of the models this worker claimed, routing what
plain Celery producers put on the shared queue to the models' lists, and acking, refreshing and restoring the
records of what was fetched (``tasks.broker.affinity`` has the keys and scripts).

Mixed into ``tasks.broker.transport``'s channel and QoS when the worker consumes with placement (it calls
``use_affinity`` at start-up); without it the transport fetches the shared queue only, as kombu would.

One fetch round is one round trip: a ``FETCH`` per claimed model (each bounded by the room that model has left
under its ``hold_limit`` and by the prefetch credit) and one of the shared lists, pipelined. Messages from the
shared lists are routed (pushed to their model's list, then acked, in a second round trip: a crash in between
leaves two copies, and the second finds its result stored and is acked without running); the rare one that names
no model is delivered here and answered with its error. An idle worker waits on the bells of its models and on
the queue's placement bell (``BLPOP``): a producer's job wakes a holder at once; the shared lists and new claims
are looked at every ``swapless_idle_poll_s``.
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from kombu.utils.encoding import bytes_to_str

from tasks.broker.affinity import ACK, FETCH, REFRESH, RESTORE, Affinity, ModelKeys
from tasks.broker.publish import ModelPush, push_to_models
from tasks.protocol import placement_bell_key

__all__ = ["PlacedChannel", "PlacedQoS", "current_affinity", "current_intake", "use_affinity", "use_intake"]

logger = logging.getLogger(__name__)

_affinity: Affinity | None = None
_intake: Intake | None = None


class Intake(Protocol):
    """Takes the messages of one fetch round that need no Celery request (``tasks.worker.intake``)."""

    def eligible(self, payload: dict[str, Any]) -> bool:
        """Whether this message may skip Celery's request machinery."""

    def __call__(self, messages: Sequence[Any]) -> None:
        """The round's eligible messages, as kombu messages already recorded as delivered."""


def use_affinity(affinity: Affinity | None) -> None:
    """Consume with placement from now on (the worker, at start-up); None: the shared lists only."""
    global _affinity
    _affinity = affinity


def current_affinity() -> Affinity | None:
    return _affinity


def use_intake(intake: Intake | None) -> None:
    """Hand eligible messages to ``intake`` from now on instead of Celery's consumer (the worker, at start-up)."""
    global _intake
    _intake = intake


def current_intake() -> Intake | None:
    return _intake


def _by_keys(tags: Iterable[str], held: dict[str, ModelKeys]) -> dict[ModelKeys, list[str]]:
    grouped: dict[ModelKeys, list[str]] = {}
    for tag in tags:
        keys = held.get(tag)
        if keys is not None:
            grouped.setdefault(keys, []).append(tag)
    return grouped


class PlacedQoS:
    """QoS methods for messages fetched from a model's lists: their records are the model's, not kombu's."""

    channel: Any

    def _forget(self, tags: Iterable[str]) -> dict[ModelKeys, list[str]]:
        grouped = _by_keys(tags, self.channel._held)
        for keys, model_tags in grouped.items():
            self.channel._release(keys, model_tags)
        return grouped

    def placed_ack(self, tags: Sequence[str], client: Any) -> list[str]:
        """Delete the model records of those of ``tags`` that came from a model's list; returns the others."""
        grouped = self._forget(tags)
        for keys, model_tags in grouped.items():
            client.execute_command("EVAL", ACK, 3, *keys.records, *model_tags)
        return _others(tags, grouped)

    def placed_restore(self, tags: Sequence[str], client: Any) -> list[str]:
        """Put those of ``tags`` that came from a model's list back at its head; returns the others."""
        grouped = self._forget(tags)
        for keys, model_tags in grouped.items():
            client.execute_command("EVAL", RESTORE, 7, *keys.queue_and_records, *model_tags)
        return _others(tags, grouped)

    def placed_refresh(self, tags: Sequence[str], client: Any, now: float) -> list[str]:
        """Re-stamp the model records of those of ``tags`` that came from a model's list; returns the others."""
        grouped = _by_keys(tags, self.channel._held)
        for keys, model_tags in grouped.items():
            client.execute_command("EVAL", REFRESH, 1, keys.part("seen"), repr(now), *model_tags)
        return _others(tags, grouped)


def _others(tags: Sequence[str], grouped: dict[ModelKeys, list[str]]) -> list[str]:
    """Those of ``tags`` that came from no model's list (the shared queue's: kombu's own records)."""
    placed = {tag for model_tags in grouped.values() for tag in model_tags}
    return [tag for tag in tags if tag not in placed]


class PlacedChannel:
    """Channel methods for fetching with placement (see the module docstring)."""

    swapless_fetch_limit: int
    swapless_idle_poll_s: float
    global_keyprefix: str
    qos: Any
    priority_steps: list[int]
    _recorded: set[str]

    def _placed_init(self) -> None:
        #: delivery tag -> the keys of the model whose list it came from, while held
        self._held: dict[str, ModelKeys] = {}
        self._held_per_model: Counter[str] = Counter()
        self._plan: list[ModelKeys | None] = []
        self._rotation = 0

    def _release(self, keys: ModelKeys, tags: Sequence[str]) -> None:
        for tag in tags:
            if self._held.pop(tag, None) is not None:
                self._held_per_model[keys.model_id] -= 1

    def _placed_fetch_commands(self, affinity: Affinity, queue: str, shared: list[Any]) -> list[tuple[Any, ...]]:
        """The pipelined commands of one fetch round; ``shared`` is the shared lists' own FETCH command."""
        credit = self.qos.can_consume_max_estimate()
        credit = self.swapless_fetch_limit if credit is None else max(1, credit)
        claimed = list(affinity.claimed())
        if claimed:  # start with another model each round, so that no model always gets the credit first
            self._rotation = (self._rotation + 1) % len(claimed)
            claimed = claimed[self._rotation :] + claimed[: self._rotation]
        commands: list[tuple[Any, ...]] = []
        self._plan = []
        now = repr(time.time())
        for model_id in claimed:
            room = min(affinity.hold_limit(model_id) - self._held_per_model[model_id], credit, self.swapless_fetch_limit)
            if room <= 0:
                continue
            keys = ModelKeys(queue, model_id, self.global_keyprefix)
            commands.append(("EVAL", FETCH, 7, *keys.queue_and_records, room, now, affinity.worker_id))
            self._plan.append(keys)
            credit = max(1, credit - room)
        commands.append(tuple(shared))
        self._plan.append(None)
        return commands

    def _placed_wait_command(self, affinity: Affinity, queue: str, wait_s: float) -> tuple[Any, ...]:
        bells = [ModelKeys(queue, m, self.global_keyprefix).bell for m in affinity.claimed()]
        return ("BLPOP", *bells, placement_bell_key(queue, self.global_keyprefix), wait_s)

    def _placed_deliver(self, affinity: Affinity, replies: Sequence[Any], queue: str) -> int:
        """Deliver what one round fetched, route the shared lists' messages; returns how many were delivered."""
        fetched: list[dict[str, Any]] = []
        shared: list[Any] = []
        for keys, reply in zip(self._plan, replies, strict=True):
            if keys is None:
                shared = list(reply or [])[1::2]  # the shared FETCH returns [list index, message, ...]
                continue
            for raw in reply or []:
                payload = self._payload(raw, queue)
                if payload is None:
                    continue
                tag = payload["properties"]["delivery_tag"]
                self._held[tag] = keys
                self._held_per_model[keys.model_id] += 1
                self._recorded.add(tag)
                fetched.append(payload)
        if shared:
            fetched += self._route(affinity, shared, queue)
        self._deliver_all([(payload, queue) for payload in fetched])
        return len(fetched)

    def _deliver_all(self, messages: Sequence[tuple[dict[str, Any], str]]) -> None:
        """Deliver one round's ``(payload, queue)`` messages: those the worker's intake takes, in one hand-over; the
        rest to Celery's consumer. If delivery fails midway, the undelivered rest go back at once."""
        intake = _intake
        lean = []
        delivered = 0
        try:
            for payload, queue in messages:
                if intake is not None and intake.eligible(payload):
                    message = self.Message(payload, channel=self)  # type: ignore[attr-defined]
                    self.qos.append(message, message.delivery_tag)  # as kombu's consumer callback does
                    lean.append(message)
                else:
                    self._deliver_one(payload, queue)
                delivered += 1
            if lean and intake is not None:
                intake(lean)
        except BaseException:
            for payload, _ in messages[delivered:]:
                tag = payload["properties"]["delivery_tag"]
                self._recorded.discard(tag)
                self.qos.restore_by_tag(tag, leftmost=True)
            raise

    def _payload(self, raw: Any, queue: str) -> dict[str, Any] | None:
        try:
            payload = json.loads(raw)  # a kombu envelope is plain JSON
            if isinstance(payload["properties"]["delivery_tag"], str):
                return payload  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001 - not a kombu message at all: nothing to run, ack or answer
            pass
        logger.error("Dropped a message on queue %r that is not a kombu message: %.200r", queue, raw)
        return None

    def _route(self, affinity: Affinity, raws: Sequence[Any], queue: str) -> list[dict[str, Any]]:
        """Push the shared lists' messages to their models' lists and ack them here; returns the rest, to deliver
        here."""
        pushes: dict[tuple[str, int], list[str]] = {}
        routed: list[str] = []
        kept: list[dict[str, Any]] = []
        for raw in raws:
            payload = self._payload(raw, queue)
            if payload is None:
                continue
            tag = payload["properties"]["delivery_tag"]
            model_id = affinity.route(payload)
            if model_id is None:
                self._recorded.add(tag)
                kept.append(payload)
                continue
            level = self._level(payload["properties"].get("priority"))
            pushes.setdefault((model_id, level), []).append(bytes_to_str(raw))
            routed.append(tag)
        if pushes:
            with self.conn_or_acquire() as client:  # type: ignore[attr-defined]
                push_to_models(
                    client,
                    [ModelPush(ModelKeys(queue, m, self.global_keyprefix), level, messages)
                     for (m, level), messages in pushes.items()],
                    bound=None,
                    placement_bell=placement_bell_key(queue, self.global_keyprefix),
                )
                self._ack_shared(client, routed)
        return kept

    def _level(self, priority: Any) -> int:
        steps = list(self.priority_steps)
        if not isinstance(priority, int):
            return steps[0]
        return steps[max(0, bisect.bisect_right(steps, priority) - 1)]

    def _deliver_one(self, payload: dict[str, Any], queue: str) -> None:
        raise NotImplementedError

    def _ack_shared(self, client: Any, tags: Sequence[str]) -> None:
        raise NotImplementedError
