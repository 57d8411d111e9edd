"""The bookkeeping behind one pub/sub connection shared by many waits: which result keys are subscribed and for
whom, which subscriptions Redis has confirmed, and what each wait has been handed. Plain data, no I/O and no locks:
the two result consumers keep it under their own guard. How a wait never misses a result: docs/concepts/client.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from celery import states

from swapless.tasks.broker.results import ResultStore, StoredResult
from swapless.tasks.client.reading import item_result
from swapless.tasks.protocol import storage_id

__all__ = ["Subscriptions", "Waiter", "batches", "parse_reply"]


class Waiter:
    """One wait for some jobs: their result keys, their states so far, and what the listener has handed it.

    Args:
        results: where the results are stored.
        job_ids: the jobs (items of a chunk wait on their chunk's key).
        wake: called by the listener's side whenever there is something to look at.
    """

    def __init__(self, results: ResultStore, job_ids: Sequence[str], wake: Callable[[], None]) -> None:
        self.job_ids = list(job_ids)
        self._jobs_of: dict[str, list[str]] = {}
        for job_id in dict.fromkeys(self.job_ids):
            self._jobs_of.setdefault(storage_id(job_id), []).append(job_id)
        #: channel (the result's key) -> storage id
        self.channels: dict[str, str] = {results.key(under): under for under in self._jobs_of}
        #: channels whose subscription Redis has not confirmed yet (set by ``Subscriptions.add`` and ``lost``)
        self.unconfirmed: set[str] = set()
        #: whether the wait has read its results once
        self.started = False
        self._states: dict[str, StoredResult] = {}
        self._inbox: dict[str, StoredResult] = {}
        self._reread = False
        self._wake = wake

    # -- the listener's side (under the consumer's guard) -------------------------------------------------------

    def deliver(self, under: str, stored: StoredResult | None) -> None:
        """A publish on the key ``under``: its stored value, decoded (None: it could not be; read it instead)."""
        if stored is None:
            self._reread = True
        else:
            self._inbox[under] = stored
        self._wake()

    def confirmed(self, channel: str) -> None:
        """Redis confirmed the subscription of ``channel``: once all of the wait's are, a wait that has read
        already reads once more (what was stored before the subscriptions took effect)."""
        if channel not in self.unconfirmed:
            return
        self.unconfirmed.discard(channel)
        if self.started and not self.unconfirmed:
            self._reread = True
            self._wake()

    # -- the waiting side (the inbox under the consumer's guard; the rest the wait's own) -------------------------

    def take(self) -> tuple[dict[str, StoredResult], bool]:
        """What was handed over since the last call: the published values by storage id, and whether to read."""
        inbox, reread = self._inbox, self._reread
        self._inbox, self._reread = {}, False
        return inbox, reread

    def apply(self, stored_under: Mapping[str, StoredResult]) -> None:
        """Take what is stored under some storage ids (read, or published) as the states of their jobs; a final
        state is never replaced (a result read back as missing later was forgotten by another reader)."""
        for under, stored in stored_under.items():
            for job_id in self._jobs_of.get(under, ()):
                known = self._states.get(job_id)
                if known is None or not known.ready:
                    self._states[job_id] = item_result(job_id, stored)

    def pending(self) -> list[str]:
        """The storage ids with a job still without a final state."""
        return [under for under, jobs in self._jobs_of.items() if not all(self._is_ready(j) for j in jobs)]

    @property
    def done(self) -> bool:
        """Whether every job has a final state."""
        return all(self._is_ready(job_id) for job_id in self.job_ids)

    def states(self) -> list[StoredResult]:
        """Each job's state, in the order given: its final state, else its state at the last read (PENDING)."""
        return [self._states.get(job_id) or StoredResult(job_id, states.PENDING) for job_id in self.job_ids]

    def _is_ready(self, job_id: str) -> bool:
        known = self._states.get(job_id)
        return known is not None and known.ready


class Subscriptions:
    """The keys subscribed on one pub/sub connection, each with the waits that want it (see the module docstring)."""

    def __init__(self) -> None:
        self._waiters: dict[str, list[Waiter]] = {}  # channel -> its waits, in arrival order
        self._storage: dict[str, str] = {}  # channel -> storage id
        self._sent: Counter[str] = Counter()  # SUBSCRIBEs sent on the current connection and not yet confirmed
        self._live: set[str] = set()  # channels confirmed on the current connection

    def __len__(self) -> int:
        return len(self._waiters)

    def add(self, waiter: Waiter) -> list[str]:
        """Count ``waiter``'s keys; returns the channels to subscribe now (those it is the first to want). Its
        ``unconfirmed`` becomes its channels not confirmed on the current connection."""
        new = []
        for channel, under in waiter.channels.items():
            waits = self._waiters.get(channel)
            if waits is None:
                waits = self._waiters[channel] = []
                self._storage[channel] = under
                new.append(channel)
            waits.append(waiter)
        waiter.unconfirmed = {channel for channel in waiter.channels if channel not in self._live}
        return new

    def remove(self, waiter: Waiter) -> list[str]:
        """Uncount ``waiter``'s keys; returns the channels to unsubscribe (those no wait wants any more)."""
        gone = []
        for channel in waiter.channels:
            waits = self._waiters.get(channel)
            if waits is None:
                continue
            waits[:] = [w for w in waits if w is not waiter]
            if not waits:
                del self._waiters[channel], self._storage[channel]
                self._live.discard(channel)
                gone.append(channel)
        return gone

    def sent(self, channels: Sequence[str]) -> None:
        """A SUBSCRIBE of ``channels`` went out on the current connection."""
        self._sent.update(channels)

    def confirm(self, channel: str) -> None:
        """Redis confirmed one SUBSCRIBE of ``channel``; once the last one sent is, its waits are told."""
        if self._sent[channel] > 0:
            self._sent[channel] -= 1
        if self._sent[channel] > 0:
            return
        del self._sent[channel]
        if channel in self._waiters and channel not in self._live:
            self._live.add(channel)
            for waiter in list(self._waiters[channel]):
                waiter.confirmed(channel)

    def lost(self) -> list[str]:
        """The connection dropped: nothing is subscribed any more, for any wait. Returns every channel, to subscribe
        again."""
        self._sent.clear()
        self._live.clear()
        for waits in self._waiters.values():
            for waiter in waits:
                waiter.unconfirmed = set(waiter.channels)
        return list(self._waiters)

    def channels(self) -> list[str]:
        """Every channel some wait wants."""
        return list(self._waiters)

    def published(self, channel: str) -> tuple[str, list[Waiter]] | None:
        """The storage id of ``channel`` and its waits, or None when no wait wants it (a late message)."""
        under = self._storage.get(channel)
        return None if under is None else (under, list(self._waiters[channel]))


def batches(channels: Sequence[str], size: int = 1000) -> Iterator[list[str]]:
    """``channels`` in groups of ``size`` at most: a gather's thousands of keys go in commands of a bounded size."""
    for start in range(0, len(channels), size):
        yield list(channels[start : start + size])


def parse_reply(reply: Any) -> tuple[str, str, Any] | None:
    """``(kind, channel, payload)`` of a pub/sub reply that matters here (``subscribe``: a confirmation;
    ``message``: a publish and its payload); None for anything else."""
    if not isinstance(reply, list) or len(reply) < 3:
        return None
    kind, channel = (part.decode() if isinstance(part, bytes) else str(part) for part in reply[:2])
    return (kind, channel, reply[2]) if kind in ("subscribe", "message") else None
