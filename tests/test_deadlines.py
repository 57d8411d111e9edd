"""Deadlines: a job not started by its deadline is answered ``JobExpired`` and never reaches a model.

Real worker processes on the real Redis, with the ``crashy`` models (tests/crashy.py): every input that reaches a
model is logged, so "never ran" is read from the log, not assumed. A gate job (``tests.faultkit.gate``) keeps the
worker busy while the jobs under test wait in its backlog past their deadlines. The tests that need nothing of
their own share one worker (``one_worker``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from swapless.config.errors import JobExpired
from swapless.manager.batching.runner import Backlog, WorkItem
from swapless.tasks.client import Client
from swapless.tasks.cluster.members import read_heartbeats
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import PREDICT_TASK, deadline_of, expires_header
from tests.crashy import crashy_entry
from tests.faultkit import FaultEnv, gate, wait_for

pytestmark = pytest.mark.slow

#: One forward pass of ``paced`` at a time in a group with deadlines (its max_batch_size): a group of three runs
#: in two passes, and the worker predicts when each answer would come from the model's last pass.
PACED = {**crashy_entry("paced"), "max_batch_size": 2}


@pytest.fixture(scope="module")
def module_faults(module_faults: FaultEnv) -> Iterator[FaultEnv]:
    """The module's environment with two more crashy models: ``paced`` and ``cold`` (never loaded unless a job
    of it runs)."""
    module_faults.write_models(real=False, extra=[PACED, crashy_entry("cold")])
    yield module_faults


def _sleep_past(expires_s: float) -> None:
    """Sleep until a deadline of ``expires_s`` set just before has passed (with a margin for the clock reads)."""
    time.sleep(expires_s + 0.1)


def test_a_job_not_started_by_its_deadline_never_runs(one_worker: FaultEnv) -> None:
    client = Client()
    held = gate(client, one_worker)
    late = client.submit("echo", "late-1", expires=0.3)
    late_many = client.submit_jobs([("echo", f"late-{i}") for i in range(2, 5)], expires=0.3)
    patient = client.submit("echo", "patient")
    _sleep_past(0.3)
    held.open()
    assert held.job.get(timeout=30)["echo"] == held.text
    assert patient.get(timeout=30)["echo"] == "patient"
    for job in [late, *late_many]:
        with pytest.raises(JobExpired) as caught:
            job.get(timeout=30)
        assert "was not started by its deadline" in str(caught.value) and "'echo'" in str(caught.value)
    ran = one_worker.executions()
    assert all(ran[f"late-{i}"] == 0 for i in range(1, 5)), ran  # never reached the model
    assert ran["patient"] == 1


def test_an_expired_job_costs_no_load(one_worker: FaultEnv) -> None:
    client = Client()
    held = gate(client, one_worker)
    doomed = [client.submit("cold", f"cold-late-{i}", expires=0.3) for i in range(3)]
    _sleep_past(0.3)
    held.open()
    for job in doomed:
        with pytest.raises(JobExpired):
            job.get(timeout=30)
    assert client.submit("echo", "after-cold").get(timeout=30)["echo"] == "after-cold"  # a group ran since
    assert sum(one_worker.executions()[f"cold-late-{i}"] for i in range(3)) == 0
    [beat] = read_heartbeats(client.redis, Keyspace(one_worker.queue, one_worker.key_prefix))
    assert "cold" not in [entry.model_id for entry in beat.loaded]
    cold = beat.models.get("cold")
    assert cold is None or (cold.loads, cold.misses, cold.groups) == (0, 0, 0), cold  # counted expired, not loaded
    assert "loaded cold " not in one_worker.workers[0].log()


def test_plain_celery_expires_is_honoured(one_worker: FaultEnv) -> None:
    client = Client()
    held = gate(client, one_worker)
    sent = client.app.send_task(PREDICT_TASK, args=["echo", "celery-late"], queue=one_worker.queue, expires=0.3)
    in_time = client.app.send_task(PREDICT_TASK, args=["echo", "celery-in-time"], queue=one_worker.queue, expires=60)
    _sleep_past(0.3)
    held.open()
    held.job.get(timeout=30)
    with pytest.raises(JobExpired):
        client.job(sent.id).get(timeout=30)
    assert client.job(in_time.id).get(timeout=30)["echo"] == "celery-in-time"
    assert one_worker.executions()["celery-late"] == 0


def test_a_job_whose_answer_would_come_after_its_deadline_is_not_started(one_worker: FaultEnv) -> None:
    client = Client()
    client.submit("paced", "paced-load").get(timeout=30)  # loads the model: a cold pass teaches nothing
    client.submit("paced", "sleep:2:paced-warm").get(timeout=30)  # a warm pass of 2 s per job
    held = gate(client, one_worker)
    kept = [client.submit("paced", f"paced-kept-{i}", expires=60) for i in range(2)]
    sent_at = time.time()
    doomed = client.submit("paced", "paced-doomed", expires=2.0)
    # all three in the worker before the gate opens, so that they make one group (else the kept two may run first
    # and teach the tuner that a pass is fast)
    keys = Keyspace(one_worker.queue, one_worker.key_prefix).model("paced")
    wait_for(lambda: client.redis.hlen(keys.held) == 3, 10, "the three paced jobs fetched")
    held.open()
    # Its deadline has not passed when its group starts, but the first pass of two jobs would take 4 s by the
    # last one: it is answered at once, before its deadline, and never runs.
    with pytest.raises(JobExpired, match="deadline"):
        doomed.get(timeout=max(0.1, sent_at + 2.0 - time.time()))
    assert [job.get(timeout=30)["echo"] for job in kept] == ["paced-kept-0", "paced-kept-1"]
    assert one_worker.executions()["paced-doomed"] == 0


def test_a_job_already_running_when_its_deadline_passes_finishes(one_worker: FaultEnv) -> None:
    client = Client()
    sent_at = time.time()
    running = client.submit("echo2", "sleep:1.5:overrun", expires=0.8)  # started at once, runs past its deadline
    assert running.get(timeout=30)["echo"] == "sleep:1.5:overrun"
    done_at = client.app.AsyncResult(running.id).date_done  # when the worker stored it: past the deadline
    assert done_at is not None and done_at.timestamp() > sent_at + 0.8, (done_at, sent_at)
    assert one_worker.executions()["sleep:1.5:overrun"] == 1


def test_default_deadlines_per_priority_count_from_the_send_time(faults: FaultEnv) -> None:
    # interactive jobs get 0.3 s, bulk jobs 1.5 s; a job's own deadline wins over either
    faults.set(SWAPLESS_INTERACTIVE_EXPIRES_S="0.3", SWAPLESS_BULK_EXPIRES_S="1.5")
    faults.worker()
    client = Client()
    held = gate(client, faults)
    interactive = client.submit("echo", "default-late")
    bulk = client.submit("echo", "bulk-within-its-default", priority="bulk")
    own = client.submit("echo", "own-deadline", expires=60)
    _sleep_past(0.3)  # past the interactive default, well within the bulk one
    held.open()
    with pytest.raises(JobExpired):
        interactive.get(timeout=30)
    assert bulk.get(timeout=30)["echo"] == "bulk-within-its-default"
    assert own.get(timeout=30)["echo"] == "own-deadline"

    held = gate(client, faults)
    late_bulk = client.submit("echo", "bulk-default-late", priority="bulk")
    own_bulk = client.submit("echo", "bulk-own-deadline", priority="bulk", expires=60)
    _sleep_past(1.5)
    held.open()
    with pytest.raises(JobExpired):
        late_bulk.get(timeout=30)
    assert own_bulk.get(timeout=30)["echo"] == "bulk-own-deadline"
    ran = faults.executions()
    assert ran["default-late"] == 0 and ran["bulk-default-late"] == 0, ran


# -- pure parts --------------------------------------------------------------------------------------------------


class _Request:
    def __init__(self, expires: object) -> None:
        self.request_dict = {"expires": expires}


def test_the_expires_header_is_celery_s_and_reads_back() -> None:
    header = expires_header(30)
    assert header is not None
    when = datetime.fromisoformat(header)
    assert when.tzinfo is not None and timedelta(seconds=29) < when - datetime.now(UTC) <= timedelta(seconds=30)
    assert deadline_of(_Request(header)) == pytest.approx(when.timestamp())
    naive = datetime(2099, 1, 1, 12, 0)  # naive means UTC
    assert deadline_of(_Request(expires_header(naive))) == datetime(2099, 1, 1, 12, 0, tzinfo=UTC).timestamp()
    assert deadline_of(_Request(None)) is None and deadline_of(_Request("not a time")) is None
    assert expires_header(None) is None


@pytest.mark.parametrize("bad", [0, -5, datetime(2000, 1, 1, tzinfo=UTC)])
def test_a_deadline_in_the_past_is_refused_before_anything_is_sent(bad: object) -> None:
    with pytest.raises(ValueError, match="is not in the future"):
        expires_header(bad)  # type: ignore[arg-type]


def test_the_backlog_gives_up_expired_jobs_and_keeps_the_rest() -> None:
    backlog = Backlog()
    backlog.add([WorkItem("a", "m", "x", expires_at=100.0), WorkItem("b", "m", "x"),
                 WorkItem("c", "n", "x", expires_at=300.0), WorkItem("d", "n", "x", expires_at=50.0)])
    assert [job.id for job in backlog.take_expired(200.0)] == ["a", "d"]
    assert backlog.counts() == {"m": 1, "n": 1}
    assert backlog.take_expired(200.0) == []
    assert [job.id for job in backlog.take_expired(301.0)] == ["c"]
    assert backlog.counts() == {"m": 1}
