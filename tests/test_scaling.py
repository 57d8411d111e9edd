"""The autoscaling signals (``swapless.tasks.observe.scaling``): the formula, the demand's window, what Redis holds read
back as seconds of work (jobs, chunks and plain Celery messages, the learned costs, the loads), the gateway's
``/metrics`` and ``swapless exporter``; and, against a real worker on the simulated device, the measured cost read
back within 20 % and ``swapless drain`` handing its jobs over to another worker without loss."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import SecretStr

from bench.simulated import simulated_entry
from swapless.config.settings import Settings
from swapless.tasks.app import make_app
from swapless.tasks.client import Client
from swapless.tasks.cluster.members import Heartbeat, LoadedEntry, ModelActivity
from swapless.tasks.gateway import create_app
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.backlog import ClusterReading, ModelBacklog, job_seconds, read_cluster
from swapless.tasks.observe.scaling import (
    DemandTracker,
    ScalingSignals,
    busy_workers,
    desired_workers,
    removal_costs,
    signals_registry,
)
from swapless.tasks.protocol import PREDICT_TASK
from tests.conftest import CliProcess, WorkerProcess
from tests.faultkit import wait_for
from tests.redis_server import free_port
from tests.stack import run_cli
from tests.tinymodels import write_models_file

FULL = "sk-scaling-full-0123456789abcdef"
LIMITED = "sk-scaling-limited-0123456789abcdef"


# -- the formula and the window ---------------------------------------------------------------------------------


def test_job_seconds_takes_the_largest_batch_the_backlog_fills() -> None:
    costs = {8: 0.004, 64: 0.001, 16: 0.002}
    assert job_seconds(costs, 1000) == 0.001
    assert job_seconds(costs, 20) == 0.002
    assert job_seconds(costs, 3) == 0.004  # fills none: the smallest measured
    assert job_seconds({}, 10) is None


@pytest.mark.parametrize(
    ("demand", "backlog_s", "jobs", "expected"),
    [
        (0.0, 0.0, 0, 0),  # idle: scale to zero
        (0.0, 0.01, 1, 1),  # any job waiting: at least one worker
        (1.6, 0.0, 0, 2),  # 1.6 workers' worth arriving at 0.8 target: 2
        (1.7, 0.0, 0, 3),
        (0.0, 600.0, 5000, 2),  # 600 s of backlog to drain in 300 s
        (0.8, 300.0, 100, 2),  # both: one for the arrivals, one for the backlog
        (0.0, 1e6, 10**7, 16),  # never above the maximum
    ],
)
def test_desired_workers_follows_the_formula(demand: float, backlog_s: float, jobs: int, expected: int) -> None:
    assert desired_workers(demand, backlog_s, jobs, target_utilization=0.8, drain_s=300, min_workers=0,
                           max_workers=16) == expected


def test_the_minimum_holds_when_idle() -> None:
    assert desired_workers(0.0, 0.0, 0, target_utilization=0.8, drain_s=300, min_workers=2, max_workers=4) == 2


def _beat(worker: str, started_at: float, busy_s: float) -> Heartbeat:
    return Heartbeat.model_validate({
        "hostname": worker, "worker_id": worker, "pid": 1, "queue": "q", "started_at": started_at, "sent_at": 0,
        "interval_s": 1, "cache": {"max_models": 1, "memory_budget_bytes": None, "used_bytes": 0, "hits": 0,
                                   "misses": 0, "loads": 0, "evictions": 0, "load_failures": 0},
        "loaded": [], "models": {"m": {"run_s_total": busy_s}}, "jobs_done": 0, "jobs_failed": 0, "backlog": 0,
        "queue_wait": {},
    })


def _reading(now: float, backlog_s: float, *beats: Heartbeat) -> ClusterReading:
    model = ModelBacklog("m", waiting_jobs=int(backlog_s * 100), held=0, job_s=0.01, load_s=0.0, measured=True)
    return ClusterReading(now=now, models={"m": model} if backlog_s else {}, workers=list(beats))


def test_demand_is_the_work_arriving_not_the_work_done() -> None:
    tracker = DemandTracker(window_s=30)
    # one worker busy half of each second, the backlog steady: half a worker's worth arrives
    for t in range(0, 31, 5):
        demand = tracker.update(_reading(1000 + t, 1.0, _beat("a", 900, 100 + t * 0.5)))
    assert demand == pytest.approx(0.5)
    # it drains a backlog at full speed and nothing new arrives: the busy time is the backlog's, demand 0
    tracker = DemandTracker(window_s=30)
    for t in range(0, 31, 5):
        demand = tracker.update(_reading(1000 + t, 40.0 - t, _beat("a", 900, 100 + t)))
    assert demand == pytest.approx(0.0)


def test_a_burst_is_backlog_not_a_rate() -> None:
    tracker = DemandTracker(window_s=30)
    # steady: 0.5 s of work arrives per second; at t=15 a burst of 60 s of work lands at once
    for t in range(0, 31, 5):
        backlog = 60.0 if t >= 15 else 0.0
        demand = tracker.update(_reading(1000 + t, backlog + 1.0, _beat("a", 900, 100 + t * 0.5)))
    assert demand == pytest.approx(0.5)  # not 0.5 + 60 / 30


def test_a_worker_that_joins_counts_all_it_did_and_one_that_leaves_keeps_it() -> None:
    tracker = DemandTracker(window_s=60)
    tracker.update(_reading(1000, 0.0, _beat("a", 900, 50)))
    tracker.update(_reading(1010, 0.0, _beat("a", 900, 53), _beat("b", 1002, 4)))  # b: 4 s since it joined
    tracker.update(_reading(1020, 0.0, _beat("a", 900, 61)))  # b gone: its 4 s stay counted
    demand = tracker.update(_reading(1030, 0.0, _beat("a", 900, 69)))
    assert demand == pytest.approx((3 + 4 + 8) / 20)  # the largest of the three steps (8 s) left out


def test_the_demand_waits_for_three_steps() -> None:
    tracker = DemandTracker(window_s=60)
    tracker.update(_reading(1000, 0.0, _beat("a", 900, 50)))
    assert tracker.update(_reading(1001, 0.0, _beat("a", 900, 52))) == 0.0  # a load at start: no rate yet
    assert tracker.update(_reading(1002, 0.0, _beat("a", 900, 52))) == 0.0


def _holding(worker: str, backlog: int, *loaded: tuple[str, float], interactive: tuple[str, ...] = ()) -> Heartbeat:
    beat = _beat(worker, 0, 0)
    entries = [LoadedEntry(model_id=m, bytes=1, load_s=s, hits=0, remote=False, busy=False, loaded_at=0,
                           interactive=m in interactive)
               for m, s in loaded]
    return beat.model_copy(update={"loaded": entries, "backlog": backlog})


def test_the_removal_cost_counts_the_models_only_that_worker_holds() -> None:
    a = _holding("a", 0, ("big", 12.0), ("shared", 1.0))
    b = _holding("b", 7, ("shared", 1.0))
    c = _holding("c", 0)
    costs = removal_costs([a, b, c])
    assert (costs["a"].models, costs["a"].load_s, costs["a"].held) == (("big",), 12.0, 0)
    assert (costs["b"].models, costs["b"].load_s, costs["b"].held) == ((), 0.0, 7)
    assert costs["a"].text() == "removing it: 12.0 s of loads elsewhere (big)"
    assert costs["b"].text() == "removing it: no model only it holds; hands back 7 held job(s)"
    assert min(costs, key=lambda w: costs[w].load_s) in {"b", "c"}  # the cheapest to remove


def test_the_worker_serving_interactive_traffic_alone_is_removed_last_and_a_busy_one_after_idle_ones() -> None:
    chat = _holding("chat", 0, ("chat-a", 1.0), ("chat-b", 1.0), interactive=("chat-a", "chat-b"))
    busy = _holding("busy", 400, ("bulk-1", 2.0), ("bulk-2", 2.0))
    idle = _holding("idle", 0, ("bulk-3", 2.0), ("bulk-4", 2.0), ("bulk-5", 2.0))
    costs = removal_costs([chat, busy, idle])
    # fewer load seconds alone would pick chat: its callers would wait for both reloads
    assert sorted(costs, key=lambda w: costs[w].rank) == ["idle", "busy", "chat"]
    assert costs["chat"].interactive == ("chat-a", "chat-b") and costs["chat"].interactive_load_s == 2.0
    assert costs["chat"].text() == "removing it: 2.0 s of loads elsewhere (chat-a interactive, chat-b interactive)"
    # a copy elsewhere makes it cheap again
    copy = _holding("copy", 0, ("chat-a", 1.0), ("chat-b", 1.0), interactive=("chat-a", "chat-b"))
    assert removal_costs([chat, copy])["chat"].rank == (0.0, False, 0.0)


def test_a_busy_worker_is_never_asked_away() -> None:
    def holding(worker: str, jobs: int, claimed: bool = False) -> Heartbeat:
        activity = ModelActivity(backlog=jobs, claimed=claimed)
        return _beat(worker, 0, 0).model_copy(update={"models": {"m": activity}})

    # 2 s and 0.5 s of fetched work at 10 ms a job: one busy worker (SWAPLESS_SCALE_BUSY_S 1 s)
    reading = _reading(1000, 0.01, holding("a", 200), holding("b", 50), holding("c", 0))  # 1 job, claimed by none
    assert busy_workers(reading, 1.0, unknown_job_s=0.05) == 1
    assert busy_workers(reading, 0.4, unknown_job_s=0.05) == 2
    # 1.2 s of m's jobs still wait in Redis: b and c claim m, 0.6 s each on top of what they hold
    reading = _reading(1000, 1.2, holding("a", 200), holding("b", 50, claimed=True), holding("c", 0, claimed=True))
    assert busy_workers(reading, 1.0, unknown_job_s=0.05) == 2  # a, and b (0.5 + 0.6 s); c has 0.6 s
    assert busy_workers(reading, 0.6, unknown_job_s=0.05) == 3
    # the backlog alone asks for 1 worker; three busy ones keep three, within the maximum
    assert desired_workers(0.0, 5.0, 100, target_utilization=0.8, drain_s=10, min_workers=0, max_workers=4,
                           busy=3) == 3
    assert desired_workers(0.0, 5.0, 100, target_utilization=0.8, drain_s=10, min_workers=0, max_workers=2,
                           busy=3) == 2


# -- what Redis holds, read back ----------------------------------------------------------------------------------


@pytest.fixture
def scaling_env(redis_url: str, key_prefix: str, tmp_path: Path) -> Settings:
    models_file = write_models_file(tmp_path, [simulated_entry("sim", 0.5, 0.005, 0.0002),
                                               simulated_entry("other", 2.0, 0.01, 0.001)])
    return Settings(redis_url=redis_url, key_prefix=key_prefix, queue=key_prefix + "jobs", models_file=models_file,
                    scale_drain_s=10.0)


def _learn(client: redis.Redis, keyspace: Keyspace, device: str, model_id: str, **record: Any) -> None:
    client.hset(keyspace.learned(device), model_id, json.dumps(record))
    client.sadd(keyspace.learned_devices, device)


def test_queued_jobs_chunks_and_plain_celery_messages_read_as_seconds_of_work(scaling_env: Settings) -> None:
    s = scaling_env
    keyspace = Keyspace.of(s)
    client = redis.Redis.from_url(s.redis.broker_url)
    _learn(client, keyspace, "cpu", "sim", batch_costs_s={"8": 0.002, "64": 0.0005}, load_s=1.5)
    sent_at = time.time()
    with Client(settings=s) as producer:
        producer.submit_jobs([("sim", f"text {i}") for i in range(300)])  # one message per job
        producer.submit_many("sim", [f"bulk {i}" for i in range(500)], priority="bulk")  # chunks
    make_app(s).send_task(PREDICT_TASK, args=["sim", "plain celery"], queue=s.jobs.queue)  # through the ingress
    make_app(s).send_task(PREDICT_TASK, args=["other", "never measured"], queue=s.jobs.queue)
    time.sleep(0.2)

    reading = read_cluster(client, keyspace, ["sim", "other"], unknown_job_s=s.scaling.scale_unknown_job_s,
                           unknown_load_s=s.scaling.scale_unknown_load_s)
    sim, other = reading.models["sim"], reading.models["other"]
    assert (sim.waiting_jobs, sim.held, sim.job_s, sim.load_s, sim.measured) == (801, 0, 0.0005, 1.5, True)
    assert sim.seconds == pytest.approx(801 * 0.0005 + 1.5)
    assert (other.waiting_jobs, other.job_s, other.load_s, other.measured) == (1, 0.05, 10.0, False)
    assert set(sim.oldest_age_s) == {0, 6}  # interactive and bulk
    assert 0.2 <= sim.oldest_age_s[0] <= time.time() - sent_at + 0.01

    signals = ScalingSignals(client, s, ["sim", "other"]).read()
    assert signals.without_capacity  # work waiting, no worker live: scale from zero
    expected = sim.seconds + other.seconds
    assert signals.desired == -(-expected // s.scaling.scale_drain_s)

    text = httpx.Response(200, content=_exposition(signals_registry(ScalingSignals(client, s, ["sim", "other"]))))
    metrics = _parse(text.text)
    assert metrics[("swapless_queued_jobs", (("model", "sim"),))] == 801
    assert metrics[("swapless_backlog_seconds", (("model", "sim"),))] == pytest.approx(sim.seconds)
    assert metrics[("swapless_backlog_without_capacity", ())] == 1
    assert metrics[("swapless_workers_live", ())] == 0
    assert metrics[("swapless_signals_up", ())] == 1
    assert ("swapless_oldest_job_age_seconds", (("model", "sim"), ("priority", "bulk"))) in metrics


def test_the_signals_say_redis_is_down_instead_of_failing_the_scrape(scaling_env: Settings) -> None:
    s = scaling_env.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    client = redis.Redis.from_url(s.redis.broker_url, socket_connect_timeout=0.5)
    metrics = _parse(_exposition(signals_registry(ScalingSignals(client, s, ["sim"]))).decode())
    assert metrics == {("swapless_signals_up", ()): 0}


def _exposition(registry: Any) -> bytes:
    from prometheus_client import generate_latest

    return generate_latest(registry)


def _parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.fixture
def gateway(scaling_env: Settings) -> Iterator[TestClient]:
    settings = scaling_env.model_copy(update={"api_keys": SecretStr(f"{FULL},{LIMITED}:sim")})
    with TestClient(create_app(settings), base_url="http://localhost") as http:
        yield http


def test_the_gateway_serves_the_signals_to_an_operators_key_only(gateway: TestClient, scaling_env: Settings) -> None:
    with Client(settings=scaling_env) as producer:
        producer.submit_jobs([("sim", x) for x in "abc"])
    assert gateway.get("/metrics").status_code == 401
    limited = gateway.get("/metrics", headers={"Authorization": f"Bearer {LIMITED}"})
    assert limited.status_code == 403  # the signals name every model
    answer = gateway.get("/metrics", headers={"Authorization": f"Bearer {FULL}"})
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    metrics = _parse(answer.text)
    assert metrics[("swapless_queued_jobs", (("model", "sim"),))] == 3
    # never measured: 3 x 0.05 s + a 10 s load, drained in 10 s: two workers
    assert metrics[("swapless_backlog_seconds", (("model", "sim"),))] == pytest.approx(10.15)
    assert metrics[("swapless_workers_desired", ())] == 2


# -- against a real worker on the simulated device ----------------------------------------------------------------


@pytest.fixture
def simulated(swapless_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The test's environment with two simulated models: ``sim`` (5 ms + 0.2 ms per input: a small GPU classifier)
    and ``slow`` (0.2 s + 10 ms per input: 400 jobs take 6 s)."""
    models_file = write_models_file(tmp_path, [simulated_entry("sim", 0.3, 0.005, 0.0002),
                                               simulated_entry("slow", 0.1, 0.2, 0.01)])
    env = {**swapless_env, "SWAPLESS_MODELS_FILE": str(models_file), "SWAPLESS_PLUGINS": "bench.simulated",
           "SWAPLESS_HEARTBEAT_INTERVAL_S": "0.5", "SIMULATED_LOG": str(tmp_path / "ran.log")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from swapless.config.settings import get_settings

    get_settings.cache_clear()
    return env


def _live(env: dict[str, str]) -> list[Heartbeat]:
    from swapless.tasks.cluster.members import read_heartbeats

    s = Settings()
    return [b for b in read_heartbeats(redis.Redis.from_url(env["SWAPLESS_REDIS_URL"]), Keyspace.of(s))
            if b.queue == s.jobs.queue]


@pytest.mark.slow
def test_a_queue_of_n_jobs_reads_n_times_the_measured_cost(
    simulated: dict[str, str], start_worker: Callable[..., WorkerProcess]
) -> None:
    """A real worker measures the models (its warm start); a second one joining warms none of them; both are
    drained; then 3,000 jobs wait: the signal reads 3,000 x the device's true seconds per job at batches of 64
    (plus the load), within 20 %."""
    worker = start_worker(env={**simulated, "SWAPLESS_WARM_START": "true"})
    s = Settings()
    client = redis.Redis.from_url(s.redis.broker_url)
    keyspace = Keyspace.of(s)
    wait_for(lambda: all(json.loads(client.hget(keyspace.learned("cpu"), m) or "{}").get("batch_costs_s")
                         for m in ("sim", "slow")), 20, "the worker's learned costs of both models")
    # a second worker joins the fleet: it warms nothing measured, so it serves as soon as it starts
    joining = start_worker(env={**simulated, "SWAPLESS_WARM_START": "true"})
    assert "joining 1 live worker(s) on cpu: not warming the 2 model(s) measured there before" in joining.log()
    wait_for(lambda: "warm start on" in joining.log(), 10, "the joining worker's warm start")
    assert "warm start on swapless-scheduler: 0 model(s)" in joining.log()
    # the first worker's closing line follows its last measurement by a moment
    wait_for(lambda: "warm start on swapless-scheduler: 2 model(s)" in worker.log(), 10,
             "the first worker's warm start")

    drained = run_cli("drain", "--all", "--timeout", "30", env=simulated)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert "drained 2 worker(s)" in drained.stdout
    assert worker.proc.wait(15) == 0 and joining.proc.wait(15) == 0
    assert not _live(simulated)

    jobs = 3000
    with Client(settings=s) as producer:
        producer.submit_jobs([("sim", f"job {i}") for i in range(jobs)], priority="bulk")
    reading = read_cluster(client, keyspace, ["sim", "slow"], unknown_job_s=1.0, unknown_load_s=99.0)
    sim = reading.models["sim"]
    assert sim.measured and sim.jobs == jobs
    assert 0.25 <= sim.load_s <= 0.3 * 1.2, sim.load_s  # its measured load: the model sleeps 0.3 s
    # what the worker measured: seconds per input of its largest pass
    costs = json.loads(client.hget(keyspace.learned("cpu"), "sim"))["batch_costs_s"]
    size = max(int(n) for n in costs)
    measured_per_job = costs[str(size)]
    ratio = (sim.seconds - sim.load_s) / (jobs * measured_per_job)
    read_s, measured_s = sim.seconds - sim.load_s, jobs * measured_per_job
    assert 0.8 <= ratio <= 1.2, f"read {read_s:.3f} s of work, measured {measured_s:.3f} s"
    # and the measurement is the device's: its pass sleeps 5 ms + 0.2 ms per input (a loaded machine oversleeps)
    true_per_job = (0.005 + 0.0002 * size) / size
    assert 0.9 <= measured_per_job / true_per_job <= 1.6, (costs, size)


@pytest.mark.slow
def test_drain_hands_the_jobs_over_to_another_worker_without_loss(
    simulated: dict[str, str], start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """Worker A holds a backlog of slow jobs; ``swapless drain`` it while B (same node name, same machine) is live:
    only A stops, cleanly, and B answers the rest: every job once."""
    a = start_worker(env=simulated)
    s = Settings()
    with Client(settings=s) as producer:
        jobs = producer.submit_jobs([("slow", f"job {i}") for i in range(400)])
        wait_for(lambda: sum(b.backlog for b in _live(simulated)) > 100, 20, "worker A holding a backlog")
        b = start_worker(env=simulated)
        wait_for(lambda: len(_live(simulated)) == 2, 20, "worker B live")
        a_id = next(beat.worker_id for beat in _live(simulated) if beat.pid == a.proc.pid)
        drained = run_cli("drain", a_id, "--timeout", "30", env=simulated)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert a.proc.wait(15) == 0
        assert b.proc.poll() is None
        results = producer.gather(jobs, timeout=60)
    assert [r.state for r in results] == ["SUCCESS"] * 400
    ran = Counter(Path(simulated["SIMULATED_LOG"]).read_text().splitlines())
    assert sorted(ran) == sorted(f"job {i}" for i in range(400))
    assert set(ran.values()) == {1}, [job for job, n in ran.items() if n > 1][:5]
    assert [beat.pid for beat in _live(simulated)] == [b.proc.pid]
    # A handed its waiting jobs back (as its claim went, or at its channel's close), and B ran them
    assert ("handed" in a.log() or "Restoring" in a.log()) and "ran " in b.log()


@pytest.mark.slow
def test_the_exporter_serves_the_signals(simulated: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    exporter = CliProcess(["exporter", "--port", str(port)], simulated, tmp_path / "exporter.log")
    try:
        with Client(settings=Settings()) as producer:
            producer.submit_jobs([("sim", "x")] * 5)
        wait_for(lambda: _get(f"http://127.0.0.1:{port}/metrics"), 30, "the exporter's /metrics")
        metrics = _parse(_get(f"http://127.0.0.1:{port}/metrics") or "")
        assert metrics[("swapless_queued_jobs", (("model", "sim"),))] == 5
        assert metrics[("swapless_backlog_without_capacity", ())] == 1
        assert metrics[("swapless_workers_desired", ())] == 1
    finally:
        exporter.stop()
    assert "Traceback" not in exporter.log()


def _get(url: str) -> str | None:
    try:
        return httpx.get(url, timeout=2).text
    except httpx.HTTPError:
        return None
