"""What a worker's channel holds: the records' QoS, the jobs held per model, and what the next fetch may take."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from redis.exceptions import ResponseError

from swapless.tasks.broker.connection import is_refused_write
from swapless.tasks.broker.kombu_private import RedisChannel, delivered
from swapless.tasks.broker.queues import ACK, FETCH, REFRESH, RESTORE, WAKE, ChannelHooks
from swapless.tasks.keyspace import JobLists, Keyspace

__all__ = ["HeldQoS", "HoldingChannel"]


def _by_lists(tags: Iterable[str], held: dict[str, JobLists]) -> dict[JobLists, list[str]]:
    grouped: dict[JobLists, list[str]] = {}
    for tag in tags:
        lists = held.get(tag)
        if lists is not None:
            grouped.setdefault(lists, []).append(tag)
    return grouped


def _others(tags: Sequence[str], grouped: dict[JobLists, list[str]]) -> list[str]:
    placed = {tag for group in grouped.values() for tag in group}
    return [tag for tag in tags if tag not in placed]


#: Messages a first fetch of a model asks for at most, before this worker knows how many jobs its messages carry.
_FIRST_FETCH = 4


class HeldQoS(kombu_redis.QoS):
    """kombu's QoS whose acks, rejects and restores run the records' scripts for the messages its channel holds."""

    channel: HoldingChannel
    #: The holds the last ``_forget`` freed room in (models, the ingress).
    _freed: set[str] = set()  # noqa: RUF012 - replaced, never changed in place

    def _forget(self, tags: Iterable[str]) -> dict[JobLists, list[str]]:
        grouped = _by_lists(tags, self.channel._held)
        freed: set[str] = set()
        for lists, group in grouped.items():
            freed |= self.channel._release(lists, group)
        self._freed = freed
        return grouped

    def held_ack(self, tags: Sequence[str], client: Any) -> list[str]:
        """Delete the records of those of ``tags`` this channel holds; returns the others."""
        grouped = self._forget(tags)
        for lists, group in grouped.items():
            client.execute_command("EVAL", ACK, 3, *lists.records, *group)
        self.channel._wake_for(self._freed, client)
        return _others(tags, grouped)

    def held_restore(self, tags: Sequence[str], client: Any) -> list[str]:
        """Put those of ``tags`` this channel holds back at the head of their lists; returns the others."""
        grouped = self._forget(tags)
        for lists, group in grouped.items():
            client.execute_command("EVAL", RESTORE, 7, *lists.queue_and_records, *group)
        self.channel._wake_for(self._freed, client)
        return _others(tags, grouped)

    def held_refresh(self, tags: Sequence[str], client: Any, now: float) -> list[str]:
        """Re-stamp the records of those of ``tags`` this channel holds; returns the others."""
        grouped = _by_lists(tags, self.channel._held)
        for lists, group in grouped.items():
            client.execute_command("EVAL", REFRESH, 1, lists.seen, repr(now), *group)
        return _others(tags, grouped)

    def ack(self, delivery_tag: str) -> None:
        if delivery_tag in self.channel._held:
            with self.channel.conn_or_acquire() as client:
                self.held_ack([delivery_tag], client)
            virtual.QoS.ack(self, delivery_tag)
            return
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if delivery_tag in self.channel._held:
            with self.channel.conn_or_acquire() as client:
                (self.held_restore if requeue else self.held_ack)([delivery_tag], client)
            virtual.QoS.ack(self, delivery_tag)
            return
        super().reject(delivery_tag, requeue=requeue)

    def restore_by_tag(self, tag: Any, client: Any = None, leftmost: bool = False) -> None:
        tag = bytes_to_str(tag)
        if tag in self.channel._held:
            with self.channel.conn_or_acquire(client) as conn:
                self.held_restore([tag], conn)
            return
        super().restore_by_tag(tag, client=client, leftmost=leftmost)

    def restore_unacked(self, client: Any = None) -> None:
        with self.channel.conn_or_acquire(client) as conn:
            for tag in self.held_restore(list(delivered(self)), conn):
                super().restore_by_tag(tag, client=conn)
        delivered(self).clear()

    def restore_visible(self, *args: Any, **kwargs: Any) -> None:
        if self.channel.swapless_hooks is not None:
            return  # a worker's records are recovered by the cluster (RECOVER), not by kombu's unacked sweep
        super().restore_visible(*args, **kwargs)

    def append(self, message: Any, delivery_tag: str) -> None:
        if delivery_tag in self.channel._held:
            virtual.QoS.append(self, message, delivery_tag)  # recorded by FETCH already
        else:
            super().append(message, delivery_tag)


class HoldingChannel(RedisChannel):
    """kombu's Redis channel that counts what it holds per model and plans each fetch by the room left."""

    QoS = HeldQoS
    qos: HeldQoS

    #: Most messages one round takes from one set of lists (also bounded by the prefetch credit).
    swapless_fetch_limit = 256
    #: The worker's hooks (a transport option); None: kombu's own channel.
    swapless_hooks: ChannelHooks | None = None
    #: Lifetime of a rung wake bell (a worker that dies waiting leaves it behind this long at most).
    swapless_wake_ttl_ms = 60_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: delivery tag -> the lists it came from, while held
        self._held: dict[str, JobLists] = {}
        #: jobs held per model (a chunk counts its items) and per delivery tag
        self._held_per_model: Counter[str] = Counter()
        self._weight: dict[str, int] = {}
        #: per model, the jobs per message of its last delivered messages (chunks carry many): what a fetch asks for
        #: is the room left in jobs over this; unknown, a fetch asks for a few messages first
        self._per_message: dict[str, float] = {}
        #: delivery tag -> the model it counts under, for ingress messages delivered here (recorded in the ingress's)
        self._counted_as: dict[str, str] = {}
        self._plan: list[JobLists] = []
        #: How many messages each fetch of the round asked for, in ``_plan``'s order.
        self._asked: list[int] = []
        self._rotation = 0
        #: Models the last round had no room for (at their hold limit).
        self._full: set[str] = set()
        #: The wake bell the outstanding wait listens on while a model it had no room for waits; None: no wake due.
        self._wake_key: str | None = None

    def _release(self, lists: JobLists, tags: Sequence[str]) -> set[str]:
        """Forget held messages; returns the names (models, the ingress) whose holds they counted under."""
        freed = set()
        for tag in tags:
            if self._held.pop(tag, None) is not None:
                name = self._counted_as.pop(tag, lists.name)
                self._held_per_model[name] -= self._weight.pop(tag, 1)
                freed.add(name)
        return freed

    def _wake_for(self, freed: set[str], client: Any) -> None:
        """Ring this worker's wake bell, once per wait, when acks freed room for a model the waiting fetch skipped."""
        key = self._wake_key
        if key is None or not freed & self._full:
            return
        self._wake_key = None
        try:
            client.execute_command("EVAL", WAKE, 1, key, self.swapless_wake_ttl_ms)
        except ResponseError as err:
            self._refused(err, "waking the fetch")  # the idle poll fetches it a little later

    def _keyspace(self, queue: str) -> Keyspace:
        return Keyspace(queue, self.global_keyprefix or "")


    def _refused(self, err: ResponseError, what: str) -> None:
        if not is_refused_write(err):
            raise err
        if self.swapless_hooks is not None:
            self.swapless_hooks.health.failed(err, what)


    def _fetch_commands(self, hooks: ChannelHooks, keyspace: Keyspace) -> list[tuple[Any, ...]]:
        """A ``FETCH`` per claimed model with room left, then one of the ingress."""
        affinity = hooks.affinity
        credit = self.qos.can_consume_max_estimate()
        credit = self.swapless_fetch_limit if credit is None else max(1, credit)
        claimed = list(affinity.claimed())
        if claimed:  # start with another model each round, so that no model always gets the credit first
            self._rotation = (self._rotation + 1) % len(claimed)
            claimed = claimed[self._rotation :] + claimed[: self._rotation]
        # With more models than the cache holds, those loaded (or loading) first, each up to its share of the
        # window: their jobs run without a load, so a model with more jobs than one fetch is not evicted and loaded
        # again between two fetches, and one hot model's jobs leave room for the next model's. Of each other model
        # one job is held: seen (the scheduler weighs its jobs still in Redis too), not a share of the window.
        first = getattr(affinity, "fetch_first", None)
        chosen = first() if first is not None and claimed else None
        loaded = set(claimed) if chosen is None else set(chosen)
        claimed.sort(key=lambda model_id: model_id not in loaded)
        share = None
        if chosen is not None and self.qos.prefetch_count:
            ahead = sum(1 for model_id in claimed if model_id in loaded)
            share = max(1, (self.qos.prefetch_count - (len(claimed) - ahead)) // max(1, ahead))
        now = repr(time.time())
        commands: list[tuple[Any, ...]] = []
        self._plan = []
        self._asked = []
        self._full = set()
        for model_id in claimed:
            room = min(
                self._messages_for(model_id, affinity.hold_limit(model_id) - self._held_per_model[model_id]), credit,
                self.swapless_fetch_limit,
            )
            if model_id not in loaded:
                room = min(room, 1 - self._held_per_model[model_id])
            elif share is not None:
                room = min(room, share - self._held_per_model[model_id])
            if room <= 0:
                self._full.add(model_id)
                continue
            keys = keyspace.model(model_id)
            commands.append(("EVAL", FETCH, 7, *keys.queue_and_records, room, now, affinity.worker_id))
            self._plan.append(keys)
            self._asked.append(room)
            credit = max(1, credit - room)
        ingress = keyspace.ingress_lists
        commands.append(("EVAL", FETCH, 7, *ingress.queue_and_records, min(credit, self.swapless_fetch_limit), now,
                         affinity.worker_id))
        self._plan.append(ingress)
        self._asked.append(min(credit, self.swapless_fetch_limit))
        return commands

    def _messages_for(self, model_id: str, jobs: int) -> int:
        """Messages of ``model_id`` to fetch for room for ``jobs`` more jobs (a chunk message carries many)."""
        if jobs <= 0:
            return 0
        per_message = self._per_message.get(model_id)
        if per_message is None:
            return min(jobs, _FIRST_FETCH)
        return max(1, math.ceil(jobs / per_message))

