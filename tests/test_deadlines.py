"""Deadlines: a job not started by its deadline is answered ``JobExpired`` and never reaches a model.

Real worker processes on the real Redis, with the ``crashy`` models (tests/crashy.py): every input that reaches a
model is logged, so "never ran" is read from the log, not assumed. A ``hold`` job keeps the worker busy while the
jobs under test wait in its backlog past their deadlines.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from config.errors import JobExpired
from manager.batching.runner import Backlog, Job
from tasks.client import Client
from tasks.protocol import PREDICT_TASK, deadline_of, expires_header
from tests.faultkit import FaultEnv, hold

pytestmark = pytest.mark.slow


def test_a_job_not_started_by_its_deadline_never_runs(faults: FaultEnv) -> None:
    faults.worker()
    client = Client()
    held, _ = hold(client, faults, 2)
    late = client.submit("echo", "late-1", expires=0.5)
    late_many = client.submit_jobs([("echo", f"late-{i}") for i in range(2, 5)], expires=0.5)
    patient = client.submit("echo", "patient")
    assert held.get(timeout=30)["echo"].startswith("sleep:2")
    assert patient.get(timeout=30)["echo"] == "patient"
    for job in [late, *late_many]:
        with pytest.raises(JobExpired) as caught:
            job.get(timeout=30)
        assert "was not started by its deadline" in str(caught.value) and "'echo'" in str(caught.value)
    ran = faults.executions()
    assert all(ran[f"late-{i}"] == 0 for i in range(1, 5)), ran  # never reached the model
    assert ran["patient"] == 1


def test_plain_celery_expires_is_honoured(faults: FaultEnv) -> None:
    faults.worker()
    client = Client()
    held, _ = hold(client, faults, 2)
    sent = client.app.send_task(PREDICT_TASK, args=["echo", "celery-late"], queue=faults.queue, expires=0.5)
    in_time = client.app.send_task(PREDICT_TASK, args=["echo", "celery-in-time"], queue=faults.queue, expires=60)
    held.get(timeout=30)
    with pytest.raises(JobExpired):
        client.job(sent.id).get(timeout=30)
    assert client.job(in_time.id).get(timeout=30)["echo"] == "celery-in-time"
    assert faults.executions()["celery-late"] == 0


def test_a_default_deadline_applies_to_interactive_jobs_only(faults: FaultEnv) -> None:
    faults.set(SWAPLESS_INTERACTIVE_EXPIRES_S="0.5")
    faults.worker()
    client = Client()
    held, _ = hold(client, faults, 2)
    interactive = client.submit("echo", "default-late")
    bulk = client.submit("echo", "bulk-no-default", priority="bulk")
    own = client.submit("echo", "own-deadline", expires=60)  # a job's own deadline wins over the default
    held.get(timeout=30)
    with pytest.raises(JobExpired):
        interactive.get(timeout=30)
    assert bulk.get(timeout=30)["echo"] == "bulk-no-default"
    assert own.get(timeout=30)["echo"] == "own-deadline"
    assert faults.executions()["default-late"] == 0


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
    backlog.add([Job("a", "m", "x", expires_at=100.0), Job("b", "m", "x"), Job("c", "n", "x", expires_at=300.0),
                 Job("d", "n", "x", expires_at=50.0)])
    assert [job.id for job in backlog.take_expired(200.0)] == ["a", "d"]
    assert backlog.counts() == {"m": 1, "n": 1}
    assert backlog.take_expired(200.0) == []
    assert [job.id for job in backlog.take_expired(301.0)] == ["c"]
    assert backlog.counts() == {"m": 1}
