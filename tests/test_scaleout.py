"""Several workers on one Redis act as one model cache (placement): real worker processes, the real Redis.

Models are ``crashy`` echoes (tests/crashy.py): every input run is logged with the pid that ran it, so each test
knows which worker ran which job, and how many times.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from swapless.tasks.client import Client, Job
from swapless.tasks.cluster.members import Heartbeat, read_heartbeats
from swapless.tasks.cluster.view import read_placement
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import CHUNK_TASK, PREDICT_TASK
from tests.conftest import WorkerProcess
from tests.crashy import GATES_ENV, LOG_ENV, crashy_entry, executions
from tests.faultkit import elsewhere_wrapper, settle, wait_for
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
        self.gates = tmp_path / "gates"
        self.gates.mkdir()
        entries = [crashy_entry(m) for m in MODELS] + [{**crashy_entry("aliased"), "aliases": ["nick"]}]
        models_file = write_models_file(tmp_path, entries)
        self.extra = {
            "SWAPLESS_PLUGINS": "tests.crashy",
            "SWAPLESS_MODELS_FILE": str(models_file),
            "SWAPLESS_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
            "SWAPLESS_VISIBILITY_TIMEOUT_S": "60",
            "SWAPLESS_VISIBILITY_REFRESH_S": "5",
            LOG_ENV: str(self.log),
            GATES_ENV: str(self.gates),
        }
        for name, value in self.extra.items():
            monkeypatch.setenv(name, value)
        from swapless.config.settings import get_settings

        get_settings.cache_clear()
        self._start = start_worker
        self.redis = redis.Redis.from_url(env["SWAPLESS_REDIS_URL"])

    def worker(self, *args: str, elsewhere: bool = False, **env: str) -> WorkerProcess:
        """A worker with two model slots (``elsewhere``: as if on another machine, ``tests.faultkit``)."""
        wrapper = elsewhere_wrapper() if elsewhere else ()
        return self._start("--max-models", "2", *args, env={**self.extra, **env}, wrapper=wrapper)

    def gate_text(self) -> str:
        """An input that holds its batch until ``open_gates`` (tests/crashy.py)."""
        return f"gate:gate-{uuid.uuid4().hex[:8]}"

    def open_gates(self) -> None:
        for _, _, text in executions(self.log):
            if text.startswith("gate:"):
                (self.gates / text.split(":", 1)[1]).touch()

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

    def worker_id(self, worker: WorkerProcess) -> str:
        """The id a worker's heartbeat gives it."""
        wait_for(lambda: any(beat.pid == worker.proc.pid for beat in self.beats()), 10, "the worker's heartbeat")
        return next(beat.worker_id for beat in self.beats() if beat.pid == worker.proc.pid)

    def holders(self) -> dict[str, tuple[str, ...]]:
        places = read_placement(self.redis, Keyspace(self.env["SWAPLESS_QUEUE"], self.env["SWAPLESS_KEY_PREFIX"]),
                                [*MODELS, "aliased"])
        return {p.model_id: p.holder_ids for p in places if p.holders}

    def held_by(self, worker_id: str) -> int:
        """Jobs the records of every model say ``worker_id`` holds (fetched, not acked, not put back)."""
        queue, prefix = self.env["SWAPLESS_QUEUE"], self.env["SWAPLESS_KEY_PREFIX"]
        keyspace = Keyspace(queue, prefix)
        owners = [owner for m in [*MODELS, "aliased"] for owner in self.redis.hvals(keyspace.model(m).owner)]
        return sum(1 for owner in owners if owner.decode().rsplit("|", 1)[0] == worker_id)


@pytest.fixture
def cluster(start_worker: Callable[..., WorkerProcess], swapless_env: dict[str, str], tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    made = Cluster(start_worker, swapless_env, tmp_path, monkeypatch)
    yield made
    made.open_gates()
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
    # no model is claimed by a worker other than the one that ran it. A worker that took a third model while the
    # others started gives one up once its work is done (a cache holds two): all three worked, so at most one did.
    holders = cluster.holders()
    by_pid = {beat.pid: beat.worker_id for beat in cluster.beats()}
    for m in MODELS:
        assert holders.get(m) in (None, (by_pid[next(iter(ran[m]))],)), (m, holders, ran)
    assert sum(1 for m in MODELS if holders.get(m)) >= len(MODELS) - 1, holders
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
    # The first worker runs as if on another machine: the second cannot see its process die, only its heartbeat
    # expire (1.5 s after the last one); the visibility timeout (60 s) plays no part.
    first = cluster.worker(elsewhere=True, SWAPLESS_MAX_BATCH_SIZE="8")
    second = cluster.worker(SWAPLESS_MAX_BATCH_SIZE="8")
    wait_for(lambda: len(cluster.beats()) == 2, 10, "both heartbeats")
    client = Client()
    # slow jobs: batches of 8 that sleep 0.2 s, about 1.5 s of work per model, so both workers still hold work
    # when one dies
    jobs = client.submit_jobs([(m, f"sleep:0.2:{m}-{i}") for i in range(60) for m in MODELS[:4]])
    pids = {_pid_of(first), _pid_of(second)}
    wait_for(lambda: {pid for ran in cluster.ran().values() for pid in ran} == pids, 30, "both workers to run jobs")
    victim = cluster.worker_id(first)
    wait_for(lambda: cluster.held_by(victim) > 0, 5, "the worker to kill to hold jobs", pause_s=0.01)
    heartbeat_key = next(iter(cluster.redis.scan_iter(match=f"{cluster.env['SWAPLESS_KEY_PREFIX']}*worker*elsewhere*")))
    first.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    expires_at = killed_at + cluster.redis.pttl(heartbeat_key) / 1000
    first.proc.wait(10)
    # its jobs go back once its heartbeat has expired (not before: nothing else says it died), within a recovery
    # sweep (1 s) and a placement round; its claims' leases lapse with it
    jobs_back_at = wait_for(lambda: cluster.held_by(victim) == 0, 15, "the dead worker's jobs to go back", pause_s=0.02)
    claims_gone_at = wait_for(lambda: not any(victim in ids for ids in cluster.holders().values()), 15,
                              "the dead worker's claims to go", pause_s=0.02)
    assert expires_at - 0.05 <= jobs_back_at < expires_at + 2.5, (jobs_back_at - killed_at, expires_at - killed_at)
    assert claims_gone_at < expires_at + 2.5, (claims_gone_at - killed_at, expires_at - killed_at)
    stored, _ = settle(client, jobs, 60)
    assert all(s.state == "SUCCESS" for s in stored)  # nothing lost
    assert set(cluster.runs()) == {f"sleep:0.2:{m}-{i}" for i in range(60) for m in MODELS[:4]}


def test_a_stopping_worker_releases_its_claims_at_once_and_hands_its_waiting_jobs_over(cluster: Cluster) -> None:
    first = cluster.worker()
    client = Client()
    # the first worker holds m0 and is busy at a gate while a second worker starts
    busy_text = cluster.gate_text()
    busy = client.submit("m0", busy_text)
    wait_for(lambda: cluster.runs()[busy_text] == 1, 20, "the busy job to start")
    waiting = [client.submit("m1", f"waiting-{i}") for i in range(20)] + [client.submit("m0", "after-busy")]
    wait_for(lambda: "m1" in cluster.holders(), 10, "the first worker to claim m1")
    leaving = cluster.worker_id(first)
    second = cluster.worker()
    first.proc.send_signal(signal.SIGTERM)  # warm shutdown: finishes the busy job, hands the rest over
    # its claims go at once, while the batch in hand is still held at the gate
    wait_for(lambda: not any(leaving in ids for ids in cluster.holders().values()), 10, "the claims to be released")
    assert client.fetch([busy.id])[0].state == "PENDING"
    # Its waiting jobs come back when its channel closes, once the batch in hand is done (tasks/worker/placement.py:
    # released claims do not hand the backlog over): open the gate, then they run on the second worker at once,
    # long before the 60 s visibility timeout.
    cluster.open_gates()
    opened_at = time.monotonic()
    assert busy.get(timeout=30)["echo"] == busy_text  # the batch in hand finished on the stopping worker
    stored, done_at = settle(client, waiting, 30)
    assert all(s.state == "SUCCESS" for s in stored)
    assert done_at - opened_at < 10
    assert first.proc.wait(30) == 0
    assert cluster.ran()["m1"] == {_pid_of(second)}  # every waiting m1 job ran on the worker that took m1 over
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
    # Slices of 4 jobs, each holding its worker 0.05 s, and 1,000 bulk jobs: far more than the two workers hold at
    # once or take in one fetch (a few hundred), so most wait in Redis when the urgent jobs come.
    cluster.worker(SWAPLESS_MAX_BATCH_SIZE="4")
    cluster.worker(SWAPLESS_MAX_BATCH_SIZE="4")
    client = Client()
    bulk = client.submit_jobs([("m0", f"sleep:0.05:bulk-{i}") for i in range(1000)], priority="bulk")
    wait_for(lambda: len(cluster.ran()["m0"]) == 2, 30, "both workers to run the bulk model")
    urgent = [client.submit("m0", f"urgent-{i}") for i in range(10)]
    keys = Keyspace(cluster.env["SWAPLESS_QUEUE"], cluster.env["SWAPLESS_KEY_PREFIX"]).model("m0")
    in_redis = {json.loads(raw)["headers"]["id"] for name in keys.lists for raw in cluster.redis.lrange(name, 0, -1)}
    waiting = {f"sleep:0.05:bulk-{i}" for i, job in enumerate(bulk) if job.id in in_redis}
    settle(client, [*bulk, *urgent], 120)
    # (a hundred is plenty to overtake; how many are left depends on how soon the second copy started)
    assert len(waiting) >= 100, f"only {len(waiting)} bulk jobs were still in Redis when the urgent ones came"
    # By order on each worker, not by the clock: a worker fetches a model's interactive jobs before its bulk ones
    # and runs them first, so none of the bulk jobs still in Redis when the urgent ones came runs before an urgent
    # job on the same worker. (By the clock there is nothing to see: an interactive group takes the model's waiting
    # bulk jobs along, and these crashy passes take as long for 200 inputs as for 4.)
    rows = executions(cluster.log)
    compared = 0
    for pid in {pid for pid, _, text in rows if text.startswith("urgent-")}:
        mine = [text for p, _, text in rows if p == pid]
        last = max(i for i, text in enumerate(mine) if text.startswith("urgent-"))
        ahead = [text for text in mine[:last] if text in waiting]
        assert ahead == [], f"on worker {pid}, {len(ahead)} bulk jobs fetched after the urgent ones ran first"
        compared += sum(1 for text in mine[last:] if text in waiting)
    assert compared > 0, "no bulk job still in Redis ran on a worker that ran urgent jobs: nothing was overtaken"


def test_a_hot_model_gets_a_copy_and_no_worker_hoards_its_backlog(cluster: Cluster) -> None:
    cluster.worker()
    cluster.worker()
    wait_for(lambda: len(cluster.beats()) == 2, 10, "the two heartbeats")
    client = Client()
    # passes holding their worker 2 s each (of up to 256 jobs): once the first pass has measured it (at least 8 ms a
    # job), 2.7 s or more of waiting work for one copy, over SWAPLESS_COPY_BACKLOG_S (2 s) whatever that pass's size
    jobs = client.submit_jobs([("m0", f"sleep:2.0:hot-{i}") for i in range(600)])
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
