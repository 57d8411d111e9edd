"""Several workers on one Redis act as one model cache (placement): real worker processes, the real Redis.

Models are ``crashy`` echoes (tests/crashy.py): every input run is logged with the pid that ran it, so each test
knows which worker ran which job, and how many times.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tasks.client import Client, Job
from tasks.cluster.members import Heartbeat, read_heartbeats
from tasks.cluster.view import read_placement
from tasks.keyspace import Keyspace
from tasks.protocol import CHUNK_TASK, PREDICT_TASK
from tests.conftest import WorkerProcess
from tests.crashy import LOG_ENV, crashy_entry, executions
from tests.faultkit import settle, wait_for
from tests.tinymodels import write_models_file

pytestmark = pytest.mark.slow

MODELS = [f"m{i}" for i in range(6)]
#: The heartbeat TTL of these workers (interval 0.5 s, three intervals): a dead worker's claims and jobs are free
#: this long after it died.
HEARTBEAT_S = 0.5
TTL_S = 3 * HEARTBEAT_S


class Cluster:
    """Workers of one test's queue, the execution log they share, and the views of Redis the tests read."""

    def __init__(self, start_worker: Callable[..., WorkerProcess], env: dict[str, str], tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> None:
        self.env = env
        self.log = tmp_path / "executions.log"
        entries = [crashy_entry(m) for m in MODELS] + [{**crashy_entry("aliased"), "aliases": ["nick"]}]
        models_file = write_models_file(tmp_path, entries)
        self.extra = {
            "SWAPLESS_PLUGINS": "tests.crashy",
            "SWAPLESS_MODELS_FILE": str(models_file),
            "SWAPLESS_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
            "SWAPLESS_VISIBILITY_TIMEOUT_S": "60",
            "SWAPLESS_VISIBILITY_REFRESH_S": "5",
            LOG_ENV: str(self.log),
        }
        for name, value in self.extra.items():
            monkeypatch.setenv(name, value)
        from config.settings import get_settings

        get_settings.cache_clear()
        self._start = start_worker
        self.redis = redis.Redis.from_url(env["SWAPLESS_REDIS_URL"])

    def worker(self, *args: str, **env: str) -> WorkerProcess:
        return self._start("--max-models", "2", *args, env={**self.extra, **env})

    def ran(self) -> dict[str, set[int]]:
        """model -> the pids that ran its jobs."""
        found: dict[str, set[int]] = defaultdict(set)
        for pid, model_id, _ in executions(self.log):
            found[model_id].add(pid)
        return found

    def runs(self) -> Counter[str]:
        return Counter(text for _, _, text in executions(self.log))

    def beats(self) -> list[Heartbeat]:
        return read_heartbeats(self.redis, Keyspace(self.env["SWAPLESS_QUEUE"], self.env["SWAPLESS_KEY_PREFIX"]))

    def holders(self) -> dict[str, tuple[str, ...]]:
        places = read_placement(self.redis, Keyspace(self.env["SWAPLESS_QUEUE"], self.env["SWAPLESS_KEY_PREFIX"]),
                                [*MODELS, "aliased"])
        return {p.model_id: p.holder_ids for p in places if p.holders}


@pytest.fixture
def cluster(start_worker: Callable[..., WorkerProcess], swapless_env: dict[str, str], tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    made = Cluster(start_worker, swapless_env, tmp_path, monkeypatch)
    yield made
    made.redis.close()


def _pid_of(worker: WorkerProcess) -> int:
    return worker.proc.pid


def _loads(beats: list[Heartbeat]) -> int:
    return sum(beat.cache.loads for beat in beats)


def test_each_model_runs_on_one_worker_and_is_loaded_once(cluster: Cluster) -> None:
    workers = [cluster.worker() for _ in range(3)]  # three caches of 2: room for the six models
    wait_for(lambda: len(cluster.beats()) == 3, 10, "the three heartbeats")
    client = Client()
    jobs = client.submit_jobs([(m, f"{m}-{i}") for i in range(100) for m in MODELS])
    stored = client.gather(jobs, timeout=120)
    assert all(s.state == "SUCCESS" for s in stored)
    ran = cluster.ran()
    assert all(len(ran[m]) == 1 for m in MODELS), ran  # each model's 100 jobs on one worker
    assert {pid for pids in ran.values() for pid in pids} == {_pid_of(w) for w in workers}  # all three worked
    holders = cluster.holders()  # a claim still held is the worker's that ran the model
    by_pid = {beat.pid: beat.worker_id for beat in cluster.beats()}
    assert all(holders[m] == (by_pid[next(iter(ran[m]))],) for m in MODELS if m in holders), (holders, ran)
    wait_for(lambda: _loads(cluster.beats()) == len(MODELS), 10, "the heartbeats to count the loads")
    assert max(cluster.runs().values()) == 1


def test_a_cold_model_is_claimed_by_one_worker_under_a_burst_from_many_producers(cluster: Cluster) -> None:
    for _ in range(3):
        cluster.worker()
    ready = threading.Barrier(4)
    jobs: list[Job] = []
    lock = threading.Lock()

    def produce(index: int) -> None:
        client = Client()
        ready.wait()
        sent = [client.submit("m0", f"burst-{index}-{i}") for i in range(50)]
        with lock:
            jobs.extend(sent)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    stored = Client().gather(jobs, timeout=60)
    assert len(stored) == 200 and all(s.state == "SUCCESS" for s in stored)
    assert len(cluster.ran()["m0"]) == 1
    wait_for(lambda: _loads(cluster.beats()) == 1, 10, "the heartbeats to count one load")


def test_a_killed_worker_s_models_and_jobs_move_within_the_heartbeat_ttl(cluster: Cluster) -> None:
    first, second = cluster.worker(), cluster.worker()
    wait_for(lambda: len(cluster.beats()) == 2, 10, "both heartbeats")
    client = Client()
    # slow jobs: each batch of a model sleeps 0.1 s, so both workers still hold work when one dies
    jobs = client.submit_jobs([(m, f"sleep:0.1:{m}-{i}") for i in range(60) for m in MODELS[:4]])
    pids = {_pid_of(first), _pid_of(second)}
    wait_for(lambda: {pid for ran in cluster.ran().values() for pid in ran} == pids, 30, "both workers to run jobs")
    victim = next(beat.worker_id for beat in cluster.beats() if beat.pid == _pid_of(first))
    first.stop(signal.SIGKILL)
    killed_at = time.monotonic()
    stored, done_at = settle(client, jobs, 60)
    assert all(s.state == "SUCCESS" for s in stored)  # nothing lost
    assert done_at - killed_at <= TTL_S + 5, done_at - killed_at
    # the dead worker's claims are gone within the TTL (taken over where its models had jobs left, else dropped)
    held_by_victim = lambda: {m for m, ids in cluster.holders().items() if victim in ids}
    wait_for(lambda: not held_by_victim(), max(0.1, killed_at + TTL_S + 5 - time.monotonic()),
             "the dead worker's claims to go")
    assert set(cluster.runs()) == {f"sleep:0.1:{m}-{i}" for i in range(60) for m in MODELS[:4]}


def test_a_stopping_worker_hands_its_waiting_jobs_over_at_once(cluster: Cluster) -> None:
    first = cluster.worker()
    client = Client()
    # the first worker holds m0 and is busy long enough for a second worker to start meanwhile
    busy = client.submit("m0", "sleep:6:busy")
    wait_for(lambda: any(t == "sleep:6:busy" for _, _, t in executions(cluster.log)), 20, "the busy job to start")
    busy_until = time.monotonic() + 6
    waiting = [client.submit("m1", f"waiting-{i}") for i in range(20)] + [client.submit("m0", "after-busy")]
    wait_for(lambda: "m1" in cluster.holders(), 10, "the first worker to claim m1")
    second = cluster.worker()
    first.proc.send_signal(signal.SIGTERM)  # warm shutdown: finishes the busy job, hands the rest over
    stopped_at = time.monotonic()
    assert stopped_at < busy_until - 0.5, "the second worker took too long to start: the busy job was over"
    stored, done_at = settle(client, [busy, *waiting], 30)
    assert all(s.state == "SUCCESS" for s in stored)
    assert done_at - stopped_at < 10  # long before the 60 s visibility timeout
    assert cluster.ran()["m1"] <= {_pid_of(first), _pid_of(second)}
    assert _pid_of(second) in cluster.ran()["m0"]  # "after-busy" ran on the worker that took m0 over


def test_a_joining_worker_takes_a_share(cluster: Cluster) -> None:
    cluster.worker()
    client = Client()
    first_jobs = client.submit_jobs([(m, f"sleep:0.05:{m}-a{i}") for i in range(20) for m in MODELS[:4]])
    wait_for(lambda: len(cluster.holders()) == 4, 20, "the lone worker to claim the four models")
    joiner = cluster.worker()
    wait_for(lambda: len(cluster.beats()) == 2, 10, "the joiner's heartbeat")
    more: list[Job] = []
    for round_ in range(10):  # a steady stream: the joiner is given models, and their waiting jobs
        more += client.submit_jobs([(m, f"sleep:0.05:{m}-b{round_}.{i}") for i in range(5) for m in MODELS[:4]])
        time.sleep(0.2)
    stored = client.gather([*first_jobs, *more], timeout=120)
    assert all(s.state == "SUCCESS" for s in stored)
    joined = {m for m, pids in cluster.ran().items() if _pid_of(joiner) in pids}
    assert joined, cluster.ran()  # the new worker ran some models' jobs


def test_plain_celery_send_task_is_routed_to_the_holder(cluster: Cluster) -> None:
    cluster.worker()
    holder = cluster.worker()
    client = Client()
    settle(client, [client.submit("aliased", "warm")], 20)
    owner = next(iter(cluster.ran()["aliased"]))
    sent = [client.app.send_task(PREDICT_TASK, args=["nick", f"plain-{i}"], queue=cluster.env["SWAPLESS_QUEUE"])
            for i in range(20)]
    chunk = client.app.send_task(CHUNK_TASK, args=["nick", ["c0", "c1"]], queue=cluster.env["SWAPLESS_QUEUE"])
    stored = client.gather([client.job(r.id) for r in [*sent, chunk]], timeout=30)
    assert all(s.state == "SUCCESS" for s in stored), stored
    assert cluster.ran()["aliased"] == {owner}  # routed by alias to the one worker holding the model
    assert holder.proc.poll() is None


def test_interactive_jobs_overtake_bulk_work_across_workers(cluster: Cluster) -> None:
    cluster.worker()
    cluster.worker()
    client = Client()
    # Each batch of 32 bulk jobs holds its worker 0.25 s: about 10 batches, seconds of bulk work in all, so the
    # urgent jobs arrive with most of the backlog still waiting, however slow the machine is to send them.
    bulk = client.submit_jobs([("m0", f"sleep:0.25:bulk-{i}") for i in range(300)], priority="bulk")
    wait_for(lambda: len(executions(cluster.log)) >= 10, 20, "the bulk jobs to start")
    urgent = [client.submit("m0", f"urgent-{i}") for i in range(10)]
    settle(client, [*bulk, *urgent], 120)
    order = [text for _, _, text in executions(cluster.log)]
    last_urgent = max(order.index(f"urgent-{i}") for i in range(10))
    assert last_urgent < len(order) // 2, last_urgent  # served long before the bulk backlog drained


def test_a_hot_model_gets_a_copy_and_no_worker_hoards_its_backlog(cluster: Cluster) -> None:
    cluster.worker()
    cluster.worker()
    wait_for(lambda: len(cluster.beats()) == 2, 10, "the two heartbeats")
    client = Client()
    # 19 batches of 32 holding their worker 0.3 s each: about 6 s of work for one copy, over SWAPLESS_COPY_BACKLOG_S
    jobs = client.submit_jobs([("m0", f"sleep:0.3:hot-{i}") for i in range(600)])
    owners = Keyspace(cluster.env["SWAPLESS_QUEUE"], cluster.env["SWAPLESS_KEY_PREFIX"]).model("m0").owner
    most_held = 0
    deadline = time.monotonic() + 60
    while len(executions(cluster.log)) < len(jobs) and time.monotonic() < deadline:
        held = Counter(cluster.redis.hvals(owners))
        most_held = max(most_held, *held.values(), 0)
        time.sleep(0.05)
    settle(client, jobs, 60)
    assert len(cluster.ran()["m0"]) == 2  # a second copy took part of the backlog
    # with another worker live, one holds about 2 s of the model's work (200 jobs at the 10 ms a job assumed before
    # any ran), not SWAPLESS_PREFETCH_PER_MODEL (512): the rest waits in Redis for whichever copy is free
    assert 0 < most_held <= 256, most_held
