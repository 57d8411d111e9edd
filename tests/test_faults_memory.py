"""Fault injection, Redis under memory pressure: a private redis-server with a small ``maxmemory`` and
``noeviction`` (the policy for a queue), real worker processes, real producers.

What must hold: producers get one clear ``QueueFull`` (the gateway 503 with ``Retry-After``); the worker never
wedges: it keeps its jobs, drains a full Redis by itself (each result replaces its message), says "Redis refusing
writes: OOM" in its heartbeat meanwhile, and starts even at the wall; a queue bound refuses before the wall; and
results read with ``forget=True`` leave Redis's memory where it was. Each scenario is a row of the memory table
printed at the end of the run (``tests.faultkit.PressureRow``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
import pytest

from swapless.config.errors import QueueFull
from swapless.tasks.client import Client, Job
from swapless.tasks.client.stream import ChunkEvent
from swapless.tasks.keyspace import Keyspace
from tests.conftest import REPO
from tests.faultkit import FaultEnv, PressureRow, gate, settle, wait_for
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: A small Redis: about 3,000 jobs of 2 KB fill it.
MAXMEMORY = "12mb"
TEXT = "x" * 2000
#: Every accepted job has its answer this long after the worker can run again (generous: a 2-core machine shared
#: with the rest of the suite; the measured figure is in the table).
ANSWER_BOUND_S = 60.0


def _full_redis(private_redis: Callable[..., RedisServer], maxmemory: str = MAXMEMORY) -> RedisServer:
    return private_redis(extra_args=["--maxmemory", maxmemory, "--maxmemory-policy", "noeviction",
                                     "--appendonly", "no"])


#: Refusals in a row after which a fill stops: Redis is at its wall.
WALL_REFUSALS = 200


def _fill(client: Client, row: PressureRow, count: int) -> list[Job]:
    """Submit up to ``count`` jobs of 2 KB, one at a time as a web app does, until Redis has refused
    ``WALL_REFUSALS`` in a row; tally what Redis accepted and refused."""
    accepted = []
    in_a_row = 0
    for i in range(count):
        row.submitted += 1
        try:
            accepted.append(client.submit("echo", f"{i} {TEXT}"))
            in_a_row = 0
        except QueueFull as err:
            row.refused["QueueFull"] += 1
            in_a_row += 1
            assert "Redis is out of memory (maxmemory)" in str(err) and "\n" not in str(err)
        except Exception as err:  # noqa: BLE001 - anything else is a failure of the promise, counted to show it
            row.refused[type(err).__name__] += 1
        if in_a_row >= WALL_REFUSALS:
            break
    row.accepted = len(accepted)
    return accepted


def _queued_messages(server: RedisServer, faults: FaultEnv) -> list[bytes]:
    """Every message in the queue's lists (every model, every priority, and the shared lists)."""
    ids = [entry["id"] for entry in json.loads(faults.models_file.read_text())["models"]]
    keyspace = Keyspace(faults.queue, faults.key_prefix)
    names = [name for lists in (*(keyspace.model(m) for m in ids), keyspace.ingress_lists) for name in lists.lists]
    with server.client() as admin:
        return [raw for name in names for raw in admin.lrange(name, 0, -1)]


def _status(faults: FaultEnv) -> dict:
    done = subprocess.run([sys.executable, "-m", "swapless", "status", "--json"], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, **faults.env}, timeout=60, check=True)
    return json.loads(done.stdout)


def _answered(client: Client, row: PressureRow, jobs: Sequence[Job], started: float) -> None:
    stored, done_at = settle(client, jobs, ANSWER_BOUND_S)
    row.answered = sum(1 for s in stored if s.state == "SUCCESS")
    row.lost = sum(1 for s in stored if not s.ready)
    row.recovery_s = done_at - started
    assert (row.answered, row.lost) == (len(jobs), 0), row


def test_a_full_redis_refuses_producers_clearly_and_the_worker_drains_it(
    faults: FaultEnv, private_redis: Callable[..., RedisServer]
) -> None:
    row = PressureRow("Redis full while the worker is busy; nothing freed")
    server = _full_redis(private_redis)
    faults.set(SWAPLESS_REDIS_URL=server.url(0))
    worker = faults.worker()
    client = Client()
    held = gate(client, faults)  # the worker is busy: producers fill Redis meanwhile
    accepted = _fill(client, row, 6000)
    assert row.refused["QueueFull"] > 0 and set(row.refused) == {"QueueFull"}, row  # the wall, and only QueueFull
    status = _status(faults)
    # status shows Redis's memory and its limit; once refusals stop, freed buffers take it well under the limit
    # (78 % seen right after a fill), so the heartbeat below, from Redis's count of refusals, is what says "full"
    assert status["redis"]["used_bytes"] >= 0.5 * status["redis"]["max_bytes"] > 0
    wait_for(lambda: "Redis refusing writes: OOM" in (_status(faults)["workers"][0]["redis_problem"] or ""), 10,
             "the heartbeat to say Redis refuses writes", on_timeout=lambda: json.dumps(_status(faults))[:3000])
    held.open()
    _answered(client, row, [held.job, *accepted], time.monotonic())  # no memory freed: the worker drains Redis itself
    assert worker.proc.poll() is None
    log = worker.log()
    assert "ready." in log and "Traceback" not in log, log[-3000:]  # the log of this worker, and no traceback in it


def test_a_full_redis_freed_by_the_operator(faults: FaultEnv, private_redis: Callable[..., RedisServer]) -> None:
    row = PressureRow("Redis full, then CONFIG SET maxmemory 200mb")
    server = _full_redis(private_redis)
    faults.set(SWAPLESS_REDIS_URL=server.url(0))
    faults.worker()
    client = Client()
    held = gate(client, faults)
    accepted = _fill(client, row, 6000)
    assert row.refused["QueueFull"] > 0 and set(row.refused) == {"QueueFull"}, row  # the wall, and only QueueFull
    with server.client() as admin:
        admin.config_set("maxmemory", "200mb")
    freed_at = time.monotonic()
    more = [client.submit("echo", f"after {i}") for i in range(100)]  # producers are taken again at once
    row.submitted += 100
    row.accepted += 100
    held.open()
    _answered(client, row, [held.job, *accepted, *more], freed_at)


def test_a_worker_killed_at_the_wall_is_replaced_by_one_that_starts_there(
    faults: FaultEnv, private_redis: Callable[..., RedisServer]
) -> None:
    row = PressureRow("worker SIGKILLed at the wall; a new one starts there")
    server = _full_redis(private_redis)
    faults.set(SWAPLESS_REDIS_URL=server.url(0))
    first = faults.worker()
    client = Client()
    held = gate(client, faults)  # never opened while the first worker lives: it dies holding it
    accepted = _fill(client, row, 6000)
    assert row.refused["QueueFull"] > 0 and set(row.refused) == {"QueueFull"}, row  # the wall, and only QueueFull
    first.stop(signal.SIGKILL)
    with server.client() as admin:
        assert admin.info("memory")["used_memory"] >= admin.info("memory")["maxmemory"] * 0.9
    held.open()  # its job runs through on the next worker
    started = time.monotonic()
    second = faults.worker()  # declares its queue and fetches at the wall
    _answered(client, row, [held.job, *accepted], started)
    assert second.proc.poll() is None


def test_at_the_wall_submit_jobs_and_swapless_submit_are_refused_and_queue_nothing(
    faults: FaultEnv, private_redis: Callable[..., RedisServer]
) -> None:
    # (Client.map is left out: at the wall it sends its refused chunk again for up to 10 minutes, as swapless bulk
    # does, where the docs say it raises QueueFull.)
    row = PressureRow("Redis full, no worker: submit_jobs, swapless submit")
    server = _full_redis(private_redis)
    faults.set(SWAPLESS_REDIS_URL=server.url(0))
    client = Client()
    _fill(client, row, 6000)  # no worker: nothing drains
    assert row.refused["QueueFull"] >= WALL_REFUSALS and set(row.refused) == {"QueueFull"}, row
    before = _queued_messages(server, faults)
    with pytest.raises(QueueFull, match="Redis is out of memory \\(maxmemory\\)"):
        client.submit_jobs([("echo", f"wall-many-{i} {TEXT}") for i in range(5)] + [("echo2", f"wall-other {TEXT}")])
    done = subprocess.run([sys.executable, "-m", "swapless", "submit", "echo", f"wall-cli {TEXT}"], cwd=REPO,
                          check=False, capture_output=True, text=True, env={**os.environ, **faults.env}, timeout=60)
    row.submitted += 2
    row.refused["QueueFull"] += 2
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: the queue at redis://127.0.0.1:{server.port}/0 refused the job: Redis is out of "
                           "memory (maxmemory)"), line
    # nothing of a refused job was queued: the lists hold exactly what the fill had put there
    after = _queued_messages(server, faults)
    assert sorted(after) == sorted(before)
    assert not [raw for raw in after if b"wall-" in raw]


def test_a_queue_bound_refuses_before_the_wall(faults: FaultEnv, private_redis: Callable[..., RedisServer]) -> None:
    row = PressureRow("SWAPLESS_MAX_QUEUED=200 (per model), no worker yet")
    server = _full_redis(private_redis)
    faults.set(SWAPLESS_REDIS_URL=server.url(0), SWAPLESS_MAX_QUEUED="200")
    client = Client()
    accepted = []
    for i in range(300):
        row.submitted += 1
        try:
            accepted.append(client.submit("echo", f"bounded {i}"))
        except QueueFull as err:
            row.refused["QueueFull"] += 1
            assert "model 'echo' has 200 messages queued, its bound is 200 (SWAPLESS_MAX_QUEUED)" in str(err)
    row.accepted = len(accepted)
    assert (row.accepted, row.refused["QueueFull"]) == (200, 100)
    with pytest.raises(QueueFull):
        client.submit_jobs([("echo", "one"), ("echo", "two")])  # all or nothing
    with server.client() as admin:
        memory = admin.info("memory")
        assert memory["used_memory"] < memory["maxmemory"] / 2  # refused long before the wall
        keys = list(Keyspace(faults.queue, faults.key_prefix).model("echo").lists)
        assert sum(admin.llen(key) for key in keys) == 200
    started = time.monotonic()
    faults.worker()
    _answered(client, row, accepted, started)


def test_map_sends_a_refused_chunk_again_until_room_appears_or_raises_at_once_without_a_wait(
    faults: FaultEnv, private_redis: Callable[..., RedisServer]
) -> None:
    row = PressureRow("Client.map, SWAPLESS_MAX_QUEUED=2, worker started on the first refusal")
    server = _full_redis(private_redis, "200mb")
    faults.set(SWAPLESS_REDIS_URL=server.url(0), SWAPLESS_MAX_QUEUED="2")
    client = Client()
    lists = list(Keyspace(faults.queue, faults.key_prefix).model("echo").lists)

    def queued() -> int:
        with server.client() as admin:
            return sum(admin.llen(key) for key in lists)

    with pytest.raises(QueueFull, match=r"model 'echo' has 2 messages queued, its bound is 2"):
        list(client.map("echo", [f"at once {i}" for i in range(6)], chunk_size=2, max_in_flight=3, refused_wait_s=0))
    assert queued() == 2  # two chunks were sent before the bound; nothing of the refused third is queued
    with server.client() as admin:
        for key in lists:
            admin.delete(key)

    refusals: list[str] = []

    def on_event(event: ChunkEvent) -> None:
        if event.kind == "refused":
            refusals.append(event.detail)
            if len(refusals) == 1:
                faults.worker()  # room appears: the worker drains the lists and the refused chunk goes out

    inputs = [f"later {i}" for i in range(12)]
    started = time.monotonic()
    answers = list(client.map("echo", inputs, chunk_size=2, max_in_flight=4, refused_wait_s=120, on_event=on_event))
    row.submitted = row.accepted = row.answered = len(answers)
    row.refused["QueueFull, sent again"] = len(refusals)
    row.recovery_s = time.monotonic() - started
    assert refusals and "its bound is 2 (SWAPLESS_MAX_QUEUED)" in refusals[0]
    assert [answer["echo"] for answer in answers] == inputs
    assert queued() == 0


def test_bulk_waits_while_the_queue_is_full_and_says_so(
    faults: FaultEnv, private_redis: Callable[..., RedisServer], tmp_path: Path
) -> None:
    row = PressureRow("swapless bulk, 2,000 records, SWAPLESS_MAX_QUEUED=2")
    server = _full_redis(private_redis, "200mb")
    # the worker holds two chunks at most, so the producer's eight in flight leave six queued against a bound of 2
    faults.set(SWAPLESS_REDIS_URL=server.url(0), SWAPLESS_MAX_QUEUED="2", SWAPLESS_PREFETCH_PER_MODEL="2")
    faults.worker()
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": f"sleep:0.01:record {i}"}) + "\n" for i in range(2000)))
    out = tmp_path / "out.jsonl"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "swapless", "bulk", "echo", str(source), "-o", str(out), "--chunk-size", "50",
         "--max-in-flight", "8", "--no-local", "--progress", "log", "--log-every", "1"],
        cwd=REPO, check=False, capture_output=True, text=True, env={**os.environ, **faults.env}, timeout=300,
    )
    row.submitted = row.accepted = 2000
    row.refused["QueueFull, sent again"] = done.stderr.count("sending the chunk again")
    lines = out.read_text().splitlines()
    row.answered = sum(1 for line in lines if json.loads(line)["ok"])
    row.lost = 2000 - len(lines)
    row.recovery_s = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert row.refused["QueueFull, sent again"] > 0, done.stderr
    assert "model 'echo' has 2 messages queued, its bound is 2 (SWAPLESS_MAX_QUEUED)" in done.stderr
    assert (row.answered, row.lost) == (2000, 0)


def test_the_gateway_answers_503_with_retry_after_when_redis_is_full(
    faults: FaultEnv, private_redis: Callable[..., RedisServer]
) -> None:
    from fastapi.testclient import TestClient

    from swapless.config.settings import get_settings
    from swapless.tasks.gateway import create_app

    server = _full_redis(private_redis, "4mb")
    faults.set(SWAPLESS_REDIS_URL=server.url(0))
    client = Client()
    with pytest.raises(QueueFull):
        for i in range(10_000):
            client.submit("echo", f"{i} {TEXT}")
    with TestClient(create_app(get_settings()), base_url="http://localhost") as http:
        refused = http.post("/jobs", json={"model_id": "echo", "input": "one more"})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
    assert refused.json()["detail"].startswith("the queue refused the job: Redis is out of memory")
    assert str(server.port) not in refused.text  # where Redis is stays in the gateway's log


#: Jobs of the soak, in batches of 1,000: CI's size, and the full size (``--full``) that shows a leak of a few
#: hundred bytes per job in the worker's RSS as 10+ MiB.
SOAK = [pytest.param(5_000, id="5000"), pytest.param(50_000, id="50000", marks=pytest.mark.full)]


@pytest.mark.parametrize("jobs", SOAK)
def test_a_soak_with_forget_leaves_redis_and_the_worker_where_they_were(
    faults: FaultEnv, private_redis: Callable[..., RedisServer], jobs: int
) -> None:
    row = PressureRow(f"soak: {jobs:,} jobs read with forget=True")
    server = _full_redis(private_redis, "200mb")
    faults.set(SWAPLESS_REDIS_URL=server.url(0))
    worker = faults.worker()
    client = Client(forget=True)
    admin = server.client()

    def run(batches: int, tag: str) -> float:
        started = time.monotonic()
        for b in range(batches):
            sent = client.submit_jobs([("echo", f"{tag} {b}.{i}") for i in range(1000)])
            results = client.gather(sent, timeout=120)
            assert all(r.state == "SUCCESS" for r in results)
        return time.monotonic() - started

    def settled_memory() -> int:
        # nothing queued or held, and Redis's count steady over a heartbeat (attempt counters go with their
        # results, the heartbeat replaces itself)
        faults.wait_broker_idle(30)
        readings = [int(admin.info("memory")["used_memory"])]

        def steady() -> bool:
            time.sleep(1.0)
            readings.append(int(admin.info("memory")["used_memory"]))
            return abs(readings[-1] - readings[-2]) < 64 << 10

        wait_for(steady, 30, "Redis's memory to settle", pause_s=0)
        return readings[-1]

    run(5, "warm")  # the worker's caches and Redis's buffers settle first
    memory_before = settled_memory()
    rss_before = psutil.Process(worker.proc.pid).memory_info().rss
    took = run(jobs // 1000, "soak")
    memory_after = settled_memory()
    rss_after = psutil.Process(worker.proc.pid).memory_info().rss
    row.submitted = row.accepted = row.answered = jobs
    row.recovery_s = took
    results_left = sum(1 for _ in admin.scan_iter(match=f"{faults.key_prefix}celery-task-meta-*", count=10_000))
    print(f"\nsoak: {jobs:,} jobs in {took:.1f} s; Redis {memory_before} -> {memory_after} bytes; worker RSS "
          f"{rss_before >> 20} -> {rss_after >> 20} MiB; results left {results_left}")
    assert results_left == 0
    assert abs(memory_after - memory_before) < 1 << 20
    assert rss_after - rss_before < 30 << 20  # flat (at the full size, a few hundred bytes per job show here)
    admin.close()
