"""The scheduler's shared parts (tasks.worker.inbox, tasks.worker.ledger) and the worker's one job count
(tasks.observe.stats): plain data, no Redis, no torch."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from swapless.config.errors import UnknownModel
from swapless.manager import Job
from swapless.tasks.observe.accounting import GroupReport
from swapless.tasks.observe.stats import WorkerStats
from swapless.tasks.worker.chunks import ChunkAssembler
from swapless.tasks.worker.delivery import Delivery
from swapless.tasks.worker.inbox import HAND_OVER_S, JobInbox
from swapless.tasks.worker.ledger import RequestLedger


@dataclass
class Request:
    id: str
    acked: list[str] = field(default_factory=list)


class Acks:
    def __init__(self) -> None:
        self.acked: list[Any] = []

    def ack(self, requests: list[Any]) -> None:
        self.acked.extend(requests)


def _delivery(job_id: str, model_id: str = "m") -> Delivery:
    return Delivery(request=Request(job_id), jobs=(Job(job_id, model_id, "x"),), chunk=False)


def _take(inbox: JobInbox) -> Any:
    return inbox.take(lambda: ["m"], lambda _: 1.0, 256, list)


def test_the_inbox_hands_jobs_and_rejects_to_the_scheduler_thread() -> None:
    inbox = JobInbox(30.0)
    taken: list[Any] = []
    thread = threading.Thread(target=lambda: taken.append(_take(inbox)))
    thread.start()
    time.sleep(0.05)  # the scheduler thread waits with nothing in hand
    started = time.perf_counter()
    inbox.put([Job("a", "m", 1), Job("b", "m", 2)], [("bad", UnknownModel("nope", ["m"]))])
    assert time.perf_counter() - started < 1.0  # the hand-over waits HAND_OVER_S at most
    thread.join(5)
    [(rejected, expired, group)] = taken
    assert [job.id for job in group] == ["a", "b"] and expired == [] and rejected[0][0] == "bad"
    assert inbox.counts() == {} and not inbox.busy() and HAND_OVER_S < 0.01
    inbox.stop()
    assert _take(inbox) is None


def test_the_inbox_counts_jobs_waiting_here_and_in_redis() -> None:
    inbox = JobInbox(30.0)
    inbox.backlog.queued = lambda: {"m": 3, "n": 1}
    inbox.put([Job("a", "m", 1)])
    assert inbox.counts() == {"m": 1} and inbox.waiting() == {"m": 4, "n": 1}
    assert inbox.wants("n") and not inbox.wants("o")
    taken = inbox.take_model("m", lambda waiting: lambda job: False)
    assert [job.id for job in taken] == ["a"] and inbox.counts() == {}


def test_the_ledger_has_a_lock_of_its_own_and_acks_copies_with_the_first() -> None:
    acks = Acks()
    ledger = RequestLedger(acks, ChunkAssembler())  # type: ignore[arg-type]
    first, copy = _delivery("a"), _delivery("a")
    assert [job.id for job in ledger.admit([first, copy, _delivery("b")])] == ["a", "b"]
    assert ledger.live("a") and ledger.unfinished([Job("b", "m", 1)])[0].id == "b"

    class Store:
        def store(self, *args: Any, **kwargs: Any) -> None:
            return None

    ledger.finish(Store(), [(first.request, 1, None)])  # type: ignore[arg-type]
    assert acks.acked == [first.request, copy.request] and not ledger.live("a")
    assert ledger.release([Job("b", "m", 1)]) == [Request("b")]


def test_the_worker_totals_are_derived_from_the_per_model_counts() -> None:
    stats = WorkerStats()
    stats(GroupReport("a", 3, {"InputError": 1}, 0.5, (0.1,) * 4, 0, 1, (), 0, ()))
    stats.skipped("a", "expired", 2)
    stats.skipped("a", "cancelled", 5)
    stats.refused(1)
    assert stats.totals() == (3, 1 + 2 + 1)
