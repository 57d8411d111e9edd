"""Warm start: every local model warmed once while the worker is idle, its tuner seeded, nothing left loaded; the
first job ends it, so a job never waits for the registry's warm-up, only for the one model being warmed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from swapless.config.settings import get_settings
from swapless.manager import ModelEngine, ModelManager, ModelStore, WorkerLimits
from swapless.manager.batching.warmup import WARM_TEXT, warm_input, warm_steps
from swapless.manager.cache.lru import DEFAULT_LOAD_COST_S
from swapless.manager.registry.specs import InputType
from swapless.tasks.client import Client
from tests.conftest import WorkerProcess, Workers
from tests.faultkit import wait_for

pytestmark = pytest.mark.images


def test_warm_start_warms_each_local_model_seeds_its_tuner_and_leaves_the_cache_empty(models_file: Path) -> None:
    # batch sizes up to 4 and no time budget: every model climbs 1, 2, 4 however loaded the machine (the budget
    # is not what this tests)
    engine = ModelEngine(WorkerLimits(device="cpu", max_batch_size=4))
    store = ModelStore.from_file(models_file, engine.frameworks)
    manager = ModelManager(store, engine, max_models=1)
    took = dict(warm_steps(manager, engine, budget_s=float("inf")))
    local = [spec.id for spec in store if not engine.build(spec).remote]
    assert sorted(took) == sorted(local) and local
    assert manager.loaded_ids() == []
    for model_id in local:
        tuner = engine.tuner(model_id)
        assert tuner is not None and len(tuner.cost_s) >= 2, (model_id, tuner and tuner.cost_s)
        assert all(cost > 0 for cost in tuner.cost_s.values())
        assert manager.load_cost_s(model_id) != DEFAULT_LOAD_COST_S  # measured, for the scheduler's choices
    assert manager.stats.evictions >= len(local)


def test_a_tight_budget_stops_the_climb_early(models_file: Path) -> None:
    engine = ModelEngine(WorkerLimits(device="cpu", max_batch_size=64))
    store = ModelStore.from_file(models_file, engine.frameworks)
    manager = ModelManager(store, engine, max_models=1)
    took = dict(warm_steps(manager, engine, budget_s=0.0))
    assert sorted(took) == sorted(store.ids()) == sorted(["sentiment", "spam", "topic", "vision"])  # all local
    for spec in store:
        tuner = engine.tuner(spec.id)
        assert tuner is not None, spec.id  # every local model is tuned (tuning is on by default)
        assert len(tuner.sizes) > 1 and tuner.sizes[0] == 1, (spec.id, tuner.sizes)  # there was a climb to stop
        assert list(tuner.cost_s) == [1], ("only the first size fits a budget of zero", spec.id, tuner.cost_s)


def test_warm_inputs_pass_the_models_own_checks(models_file: Path) -> None:
    import torch

    engine = ModelEngine(WorkerLimits(device="cpu"))
    store = ModelStore.from_file(models_file, engine.frameworks)
    manager = ModelManager(store, engine, max_models=1)
    seen = set()
    for spec in store:
        value = warm_input(spec)
        # the model's own input check, as a job's input goes through it (an image model's needs its transforms)
        with manager.use(spec.id) as worker:
            prepared = worker.prepare(value)  # raises InputError if the warm input is not one the model takes
        seen.add(spec.type)
        if spec.type is InputType.TEXT:
            assert prepared == value == WARM_TEXT
        else:
            assert isinstance(prepared, torch.Tensor) and prepared.dtype == torch.float32, prepared
            assert tuple(prepared.shape) == (3, 224, 224), prepared.shape  # mobilenet_v2's input, after transforms
    assert seen == {InputType.TEXT, InputType.IMAGE}  # both kinds of warm input were checked
    assert manager.stats.load_failures == 0
    manager.close()


@pytest.fixture(scope="module")
def warmed(module_env: dict[str, str], module_workers: Workers) -> WorkerProcess:
    """The module's worker with a warm start, idle until it has warmed every model (its heartbeat every 0.5 s, so
    what it learned is saved soon)."""
    worker = module_workers.start("--warm-start", env={"SWAPLESS_HEARTBEAT_INTERVAL_S": "0.5"})
    wait_for(lambda: "warm start on" in worker.log(), 60, "the warm start to end")
    return worker


@pytest.mark.slow
def test_an_idle_worker_warms_every_model_after_ready_and_serves(warmed: WorkerProcess) -> None:
    log = warmed.log()
    assert log.count("] warmed ") == 4, log[-3000:]  # the four models of the models file, none skipped
    assert log.index("ready.") < log.index("] warmed "), "ready at once: the warm start is idle work"
    # on the thread that runs the jobs: part of what is warmed is per thread
    assert "warm start on swapless-scheduler: 4 model(s)" in log and "all warmed" in log, log[-3000:]
    assert Client().submit("sentiment", "a fine day").get(timeout=60)


def _simulated_registry(tmp_path: Path, count: int, load_s: float) -> dict[str, str]:
    """A models file of ``count`` simulated models (``m000``...) that each load in ``load_s``, and its env."""
    from bench.simulated import simulated_entry
    from tests.tinymodels import write_models_file

    entries = [simulated_entry(f"m{i:03d}", load_s, 0.005, 0.0002) for i in range(count)]
    models = write_models_file(tmp_path, entries)
    return {"SWAPLESS_MODELS_FILE": str(models), "SWAPLESS_PLUGINS": "bench.simulated",
            "SIMULATED_LOG": str(tmp_path / "ran.log")}


@pytest.mark.slow
def test_jobs_queued_before_the_worker_starts_are_served_before_any_warm_up(
    swapless_env: dict[str, str], start_worker: Callable[..., WorkerProcess], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registry of 40 models, each loading in 0.5 s (20 s to warm them all): a job waiting when the worker
    starts is answered within its own model's load, and the warm start ends before warming anything."""
    env = _simulated_registry(tmp_path, 40, 0.5)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    client = Client()
    job = client.submit("m020", "waiting at start")
    worker = start_worker("--warm-start", "--max-models", "4", env=env)
    ready_at = time.monotonic()
    assert job.get(timeout=30) and time.monotonic() - ready_at < 5.0
    wait_for(lambda: "warm start on" in worker.log(), 10, "the warm start's end")
    log = worker.log()
    assert "warm start on swapless-scheduler: 0 model(s)" in log and "ended by the first job" in log, log[-3000:]
    assert "] warmed " not in log


@pytest.mark.slow
def test_a_worker_joining_while_the_fleets_jobs_wait_warms_nothing(
    swapless_env: dict[str, str], start_worker: Callable[..., WorkerProcess], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jobs waiting in the queue's lists go to some worker within a placement round, so a worker that finds them
    there begins no warm-up load, even when none of them is given to it (one copy per model here)."""
    from bench.simulated import simulated_entry
    from tests.tinymodels import write_models_file

    busy = simulated_entry("busy", 0.2, 0.05, 0.002)  # 3,000 jobs: ~8 s of passes
    models = write_models_file(tmp_path, [busy, *(simulated_entry(f"m{i:03d}", 0.5, 0.005, 0.0002)
                                                 for i in range(10))])
    env = {"SWAPLESS_MODELS_FILE": str(models), "SWAPLESS_PLUGINS": "bench.simulated", "SWAPLESS_MAX_COPIES": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    first = start_worker("--no-warm-start", "--max-models", "4", env=env)
    client = Client()
    jobs = client.submit_jobs([("busy", f"job {i}") for i in range(3000)], priority="bulk")
    wait_for(lambda: "loaded busy (" in first.log(), 10, "the first worker's load of busy")
    joining = start_worker("--warm-start", "--max-models", "4", env=env)
    wait_for(lambda: "warm start on" in joining.log(), 10, "the joining worker's warm start to end")
    log = joining.log()
    assert "warm start on swapless-scheduler: 0 model(s)" in log and "ended by jobs waiting" in log, log[-3000:]
    assert "] warmed " not in log and "loaded " not in log
    assert len(client.gather(jobs, timeout=60)) == 3000


@pytest.mark.slow
def test_the_first_job_ends_the_warm_start_after_the_model_in_progress(
    swapless_env: dict[str, str], start_worker: Callable[..., WorkerProcess], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that comes while the warm start runs waits for the one model being warmed, not for the registry:
    the warm start stops there, with most of the 40 models left to warm on their first jobs."""
    env = _simulated_registry(tmp_path, 40, 0.5)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    worker = start_worker("--warm-start", "--max-models", "4", env=env)
    wait_for(lambda: worker.log().count("] warmed ") >= 2, 30, "two models warmed")
    sent = time.monotonic()
    assert Client().submit("m039", "during the warm start").get(timeout=30)
    waited = time.monotonic() - sent
    wait_for(lambda: "warm start on" in worker.log(), 10, "the warm start's end")
    log = worker.log()
    warmed = log.count("] warmed ")
    assert "ended by the first job" in log and warmed < 10, (warmed, log[-3000:])
    # one model's warm-up (a 0.5 s load and its passes) and m039's own load, with room for a loaded machine
    assert waited < 4.0, waited


def test_the_warm_start_goes_in_order_and_stops_at_its_total_budget(models_file: Path) -> None:
    engine = ModelEngine(WorkerLimits(device="cpu", max_batch_size=4))
    store = ModelStore.from_file(models_file, engine.frameworks)
    manager = ModelManager(store, engine, max_models=1)
    assert dict(warm_steps(manager, engine, total_budget_s=0.0)) == {}  # a registry of hundreds: none warmed up front
    took = dict(warm_steps(manager, engine, order=["vision", "spam"], total_budget_s=1e-9 + 0.0001))
    assert list(took) == ["vision"]  # the first in the order, then the budget was spent
    everything = dict(warm_steps(manager, engine, order=["spam"]))
    assert next(iter(everything)) == "spam" and sorted(everything) == sorted(store.ids())


def test_a_model_tuned_before_is_warmed_with_one_pass(models_file: Path) -> None:
    engine = ModelEngine(WorkerLimits(device="cpu", max_batch_size=64))
    store = ModelStore.from_file(models_file, engine.frameworks)
    manager = ModelManager(store, engine, max_models=1)
    engine.seed_tuner(store.get("spam"), {4: 0.001, 8: 0.0008})
    dict(warm_steps(manager, engine, tuned={"spam"}))
    assert engine.tuner("spam").cost_s == {4: 0.001, 8: 0.0008}  # nothing explored again
    assert len(engine.tuner("topic").cost_s) >= 2  # the others were measured as before


@pytest.mark.slow
def test_what_a_worker_learned_seeds_the_next_one(warmed: WorkerProcess, module_workers: Workers,
                                                  module_env: dict[str, str], redis_url: str) -> None:
    import json
    import time

    import redis

    from swapless.tasks.worker.learned import LEARNED_TTL_S

    first = warmed  # its warm start measured each model
    client = Client()
    client.gather(client.submit_jobs([("spam", f"win a prize {i}") for i in range(40)]), timeout=60)
    key = f"{module_env['SWAPLESS_KEY_PREFIX']}swapless:learned:cpu"
    r = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 10
    while b"spam" not in r.hkeys(key) and time.monotonic() < deadline:
        time.sleep(0.1)
    record = json.loads(r.hget(key, "spam"))
    assert record["load_s"] > 0 and record["size_bytes"] > 0 and len(record["batch_costs_s"]) >= 2
    assert 0 < r.ttl(key) <= LEARNED_TTL_S  # kept for later workers, not forever
    first.stop()
    second = module_workers.start("--warm-start")
    log = second.log()
    assert "learned from earlier workers:" in log and "spam" in log.split("learned from earlier workers:")[1]
    assert client.submit("spam", "free money").get(timeout=60)
    r.close()


def test_a_worker_on_a_machine_without_a_gpu_labels_its_device_without_importing_torch() -> None:
    """``--device auto`` with no GPU driver is ``cpu``: a worker of models that need no torch starts without it."""
    import os
    import subprocess
    import sys

    from swapless.tasks.worker.learned import GPU_DEVICE_FILES

    if any(os.path.exists(path) for path in GPU_DEVICE_FILES):
        pytest.skip("this machine has a GPU driver")
    probe = ("import sys; from swapless.tasks.worker.learned import device_label; "
             "print(device_label('auto'), device_label('cpu'), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["cpu", "cpu", "False"]


@pytest.mark.slow
def test_warm_before_ready_warms_within_its_budget_before_the_worker_takes_jobs(
    swapless_env: dict[str, str], start_worker: Callable[..., WorkerProcess], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``SWAPLESS_WARM_BEFORE_READY_S`` (behind a readiness probe): that much of the warm start runs before "ready"
    (here all of 6 models), so the first jobs find every model measured."""
    env = {**_simulated_registry(tmp_path, 6, 0.1), "SWAPLESS_WARM_BEFORE_READY_S": "60"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    worker = start_worker("--warm-start", "--max-models", "2", env=env)
    log = worker.log()
    assert log.count("] warmed ") == 6 and log.rindex("] warmed ") < log.index("ready."), log[-3000:]
    assert Client().submit("m003", "after the warm start").get(timeout=30)
