"""Cancellation: a job cancelled before it starts is answered ``JobCancelled`` and never reaches a model; one that
has started runs to its end and keeps its result.

Real worker processes on the real Redis, with the ``crashy`` models (tests/crashy.py): every input that reaches a
model is logged, so "never ran" is read from the log, not assumed. A gate job (``tests.faultkit.gate``) keeps the
worker busy while the jobs under test wait in its backlog, until the test opens it. The tests that need nothing
of their own share one worker (``one_worker``); the others start theirs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from swapless.config.errors import JobCancelled, JobExpired
from swapless.tasks.broker.results import ALREADY_DONE, CANCELLED, TOO_LATE
from swapless.tasks.client import Client
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import PREDICT_TASK
from tests.faultkit import FaultEnv, gate, wait_for

pytestmark = pytest.mark.slow


def test_a_cancelled_queued_job_never_runs_and_a_running_one_finishes(one_worker: FaultEnv) -> None:
    client = Client()
    held = gate(client, one_worker)
    queued = client.submit("echo", "cancel-me")
    kept = client.submit("echo", "keep-me")
    assert held.job.cancel() == TOO_LATE  # it has started: it runs to its end
    assert queued.cancel() == CANCELLED
    # answered at once, while the worker is still held at the gate: not when the worker gets to the job
    with pytest.raises(JobCancelled, match="was cancelled before it started"):
        queued.get(timeout=2)
    assert held.job.status().state == "PENDING" and kept.status().state == "PENDING"
    held.open()
    assert held.job.get(timeout=30)["echo"] == held.text  # its result is kept
    assert kept.get(timeout=30)["echo"] == "keep-me"
    assert kept.cancel() == ALREADY_DONE
    assert kept.get(timeout=5)["echo"] == "keep-me"
    one_worker.wait_broker_idle()  # the cancelled job's message was acked, not left to be redelivered
    ran = one_worker.executions()
    assert ran["cancel-me"] == 0 and ran["keep-me"] == 1, ran


def test_cancelling_an_item_of_a_chunk_cancels_its_chunk_and_none_of_it_runs(one_worker: FaultEnv) -> None:
    client = Client()
    held = gate(client, one_worker)
    chunk = client.submit_many("echo", [f"chunk-item-{i}" for i in range(6)], chunk_size=6)
    other = client.submit_many("echo", [f"other-item-{i}" for i in range(3)], chunk_size=3)
    answers = client.cancel([chunk[2].id])
    assert answers == {chunk[2].id: CANCELLED}
    held.open()
    held.job.get(timeout=30)
    for stored in client.gather(chunk, timeout=30):
        assert stored.state == "FAILURE" and isinstance(stored.value, JobCancelled)
    assert [s.value["echo"] for s in client.gather(other, timeout=30)] == [f"other-item-{i}" for i in range(3)]
    one_worker.wait_broker_idle()
    ran = one_worker.executions()
    assert all(ran[f"chunk-item-{i}"] == 0 for i in range(6)), ran
    assert all(ran[f"other-item-{i}"] == 1 for i in range(3)), ran


def test_a_cancel_survives_a_worker_restart_and_reaches_the_next_worker(faults: FaultEnv) -> None:
    first = faults.worker()
    client = Client()
    held = gate(client, faults)
    doomed = client.submit("echo", "cancelled-across-restart")
    assert doomed.cancel() == CANCELLED
    first.stop(signal.SIGKILL)  # dies holding both messages: both are redelivered to the next worker
    held.open()
    faults.worker()
    with pytest.raises(JobCancelled):
        doomed.get(timeout=5)
    held.job.get(timeout=60)  # re-run after the death
    faults.wait_broker_idle(timeout_s=60)
    assert faults.executions()["cancelled-across-restart"] == 0


def test_celery_revoke_cancels_a_queued_job(one_worker: FaultEnv) -> None:
    client = Client()
    held = gate(client, one_worker)
    sent = client.app.send_task(PREDICT_TASK, args=["echo", "revoked"], queue=one_worker.queue)
    client.app.control.revoke([sent.id, held.job.id])  # a plain Celery producer's cancel: a broadcast to the workers
    # the broadcast has reached the worker once the revoke is stored as the job's result: open the gate only then
    wait_for(lambda: client.job(sent.id).status().state == "FAILURE", 10, "the revoke to be recorded")
    held.open()
    with pytest.raises(JobCancelled):
        client.job(sent.id).get(timeout=30)
    assert held.job.get(timeout=30)["echo"] == held.text  # running when revoked: it ends with its result
    one_worker.wait_broker_idle()
    assert one_worker.executions()["revoked"] == 0


def test_swapless_cancel_and_delete_on_the_gateway(one_worker: FaultEnv) -> None:
    from swapless.tasks.gateway.app import create_app

    client = Client()
    with TestClient(create_app(), base_url="http://localhost") as http:
        held_text = one_worker.gate_text()
        held = client.job(http.post("/jobs", json={"model_id": "hold", "input": held_text}).json()["job_id"])
        one_worker.wait_executed(held_text)
        by_cli = client.submit("echo", "cancelled-by-cli")
        posted = http.post("/jobs", json={"model_id": "echo", "input": "cancelled-by-http"})
        by_http = client.job(posted.json()["job_id"])
        run = subprocess.run(
            [sys.executable, "-m", "swapless", "cancel", by_cli.id, held.id],
            check=False, capture_output=True, text=True, timeout=60,
        )
        lines = [json.loads(line) for line in run.stdout.splitlines()]
        assert lines == [{"job_id": by_cli.id, "status": "cancelled"}, {"job_id": held.id, "status": "running"}]
        assert run.returncode == 1  # one of them could not be cancelled
        running = http.delete(f"/jobs/{held.id}")
        assert running.status_code == 409 and running.json()["status"] == "running"
        reply = http.delete(f"/jobs/{by_http.id}")
        assert reply.status_code == 200 and reply.json()["status"] == "cancelled"
        again = http.delete(f"/jobs/{by_http.id}")
        assert again.status_code == 409 and again.json()["status"] == "done"
        assert http.get(f"/jobs/{by_http.id}").json()["error"]["type"] == "JobCancelled"
        # a job some other producer sent is no job of the gateway's: refused, nothing written
        assert http.delete(f"/jobs/{by_cli.id}").status_code == 404
    one_worker.open_gates()  # the gate the gateway's job waits at
    held.get(timeout=30)
    one_worker.wait_broker_idle()
    ran = one_worker.executions()
    assert ran["cancelled-by-cli"] == 0 and ran["cancelled-by-http"] == 0, ran


def test_cancelled_and_expired_jobs_are_counted_per_model_in_the_status(one_worker: FaultEnv) -> None:
    from swapless.tasks.cluster.members import read_heartbeats

    client = Client()
    held = gate(client, one_worker)
    # echo2: a model no other test of this module sends to, so the worker's counts of it are this test's
    cancelled = [client.submit("echo2", f"counted-cancel-{i}") for i in range(3)]
    expired = [client.submit("echo2", f"counted-expire-{i}", expires=0.3) for i in range(2)]
    assert set(client.cancel([job.id for job in cancelled]).values()) == {CANCELLED}
    _sleep_past_deadline(0.3)
    held.open()
    held.job.get(timeout=30)
    for job in expired:
        with pytest.raises(JobExpired, match="was not started by its deadline"):
            job.get(timeout=30)

    def counted() -> tuple[int, int] | None:
        beats = read_heartbeats(client.redis, Keyspace(one_worker.queue, one_worker.key_prefix))
        echo2 = beats[0].models.get("echo2") if beats else None
        return (echo2.jobs_cancelled, echo2.jobs_expired) if echo2 is not None else None

    wait_for(lambda: counted() == (3, 2), 30, "the heartbeat to count 3 cancelled and 2 expired echo2 jobs",
             on_timeout=lambda: f"counted {counted()}")


def _sleep_past_deadline(expires_s: float) -> None:
    """Sleep until a deadline of ``expires_s`` set just before has passed (with a margin for clock reads)."""
    time.sleep(expires_s + 0.1)


def _bulk(*args: str, log: Path) -> subprocess.Popen[bytes]:
    def default_sigint() -> None:  # a suite started in the background inherits SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    with log.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "swapless", "bulk", *args, "--no-local", "--progress", "log"],
            stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=default_sigint,  # noqa: PLW1509 - it only sets a signal disposition
        )


def _records(path: Path, prefix: str, count: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"k{i}", "text": f"{prefix}-{i}"}) + "\n" for i in range(count)))
    return path


def test_ctrl_c_on_bulk_cancels_its_chunks_in_flight_and_a_rerun_resumes(one_worker: FaultEnv, tmp_path: Path) -> None:
    client = Client()
    held = gate(client, one_worker)
    source = _records(tmp_path / "in.jsonl", "bulk-sigint", 20)
    out = tmp_path / "out.jsonl"
    args = ("echo", str(source), "-o", str(out), "--id-field", "id", "--chunk-size", "5", "--max-in-flight", "4")
    first = _bulk(*args, log=tmp_path / "first.log")
    # every chunk is sent and waits behind the gate job (the gate job itself is in flight too)
    wait_for(lambda: one_worker.queued() + one_worker.unacked() >= 5, 30, "the producer to send its 4 chunks")
    first.send_signal(signal.SIGINT)
    assert first.wait(60) == 130
    held.open()
    held.job.get(timeout=30)
    one_worker.wait_broker_idle()  # the cancelled chunks were taken and acked, not left behind
    assert sum(one_worker.executions()[f"bulk-sigint-{i}"] for i in range(20)) == 0  # none computed after Ctrl-C
    assert not out.exists() or out.read_text() == ""
    second = subprocess.run([sys.executable, "-m", "swapless", "bulk", *args, "--no-local"],
                            check=False, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["key"] for line in lines] == [f"k{i}" for i in range(20)]
    assert all(line["ok"] for line in lines)


def test_a_bulk_deadline_stops_the_run_resumably_and_nothing_late_is_computed(
    one_worker: FaultEnv, tmp_path: Path
) -> None:
    client = Client()
    held = gate(client, one_worker)
    source = _records(tmp_path / "in.jsonl", "bulk-late", 20)
    out = tmp_path / "out.jsonl"
    args = ("echo", str(source), "-o", str(out), "--id-field", "id", "--chunk-size", "5", "--max-in-flight", "4")
    late = subprocess.Popen([sys.executable, "-m", "swapless", "bulk", *args, "--no-local", "--expires", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # the gate opens once the chunks sent wait behind it and their deadline has passed: none may start
    wait_for(lambda: one_worker.queued() + one_worker.unacked() >= 5, 30, "the producer to send its 4 chunks")
    _sleep_past_deadline(1.0)
    held.open()
    stderr = late.communicate(timeout=120)[1]
    assert late.returncode == 3, stderr
    assert "has passed: the records not started by then were not computed; rerun with a later --expires" in stderr
    assert "Traceback" not in stderr
    held.job.get(timeout=30)
    one_worker.wait_broker_idle()
    assert sum(one_worker.executions()[f"bulk-late-{i}"] for i in range(20)) == 0
    assert not out.exists() or out.read_text() == ""
    bad = subprocess.run([sys.executable, "-m", "swapless", "bulk", *args, "--no-local", "--expires", "yesterday"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--expires must be seconds from now or a date-time" in bad.stderr
    resumed = subprocess.run([sys.executable, "-m", "swapless", "bulk", *args, "--no-local", "--expires", "600"],
                             check=False, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert [json.loads(line)["key"] for line in out.read_text().splitlines()] == [f"k{i}" for i in range(20)]


def test_on_celery_s_own_request_path_cancels_and_deadlines_hold_too(faults: FaultEnv) -> None:
    faults.worker("--task-events")  # with task events on, every message takes Celery's request machinery
    client = Client()
    held = gate(client, faults)
    cancelled = client.submit("echo", "events-cancelled")
    expired = client.submit("echo", "events-expired", expires=0.3)
    served = client.submit("echo", "events-served")
    assert cancelled.cancel() == CANCELLED
    _sleep_past_deadline(0.3)
    held.open()
    held.job.get(timeout=30)
    with pytest.raises(JobCancelled):
        cancelled.get(timeout=30)
    with pytest.raises(JobExpired):
        expired.get(timeout=30)
    assert served.get(timeout=30)["echo"] == "events-served"
    faults.wait_broker_idle()
    ran = faults.executions()
    assert ran["events-cancelled"] == 0 and ran["events-expired"] == 0 and ran["events-served"] == 1, ran


def test_submit_many_and_map_take_a_deadline(one_worker: FaultEnv) -> None:
    import threading

    client = Client()
    held = gate(client, one_worker)
    late = client.submit_many("echo", [f"many-late-{i}" for i in range(4)], chunk_size=2, expires=0.3)
    mapped = client.map("echo", (f"map-late-{i}" for i in range(4)), chunk_size=2, expires=0.3, return_exceptions=True)

    def open_once_all_are_late() -> None:  # map sends its chunks when first asked for a result, and waits there
        wait_for(lambda: one_worker.queued() + one_worker.unacked() >= 5, 30, "the gate job and four chunks")
        _sleep_past_deadline(0.3)
        held.open()

    opener = threading.Thread(target=open_once_all_are_late)
    opener.start()
    first = next(mapped)  # waits behind the gate: the deadline passes first
    opener.join(30)
    assert isinstance(first, JobExpired)
    assert all(isinstance(value, JobExpired) for value in mapped)
    held.job.get(timeout=30)
    for stored in client.gather(late, timeout=30):
        assert stored.state == "FAILURE" and isinstance(stored.value, JobExpired)
    one_worker.wait_broker_idle()
    ran = one_worker.executions()
    assert sum(ran[f"many-late-{i}"] + ran[f"map-late-{i}"] for i in range(4)) == 0, ran
