"""Warm start: every local model warmed once before the first job, its tuner seeded, nothing left loaded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from swapless.manager import ModelEngine, ModelManager, ModelStore, WorkerLimits
from swapless.manager.batching.warmup import WARM_TEXT, warm_input, warm_start
from swapless.manager.cache.lru import DEFAULT_LOAD_COST_S
from swapless.manager.registry.specs import InputType
from swapless.tasks.client import Client
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.images


def test_warm_start_warms_each_local_model_seeds_its_tuner_and_leaves_the_cache_empty(models_file: Path) -> None:
    # batch sizes up to 4 and no time budget: every model climbs 1, 2, 4 however loaded the machine (the budget
    # is not what this tests)
    engine = ModelEngine(WorkerLimits(device="cpu", max_batch_size=4))
    store = ModelStore.from_file(models_file, engine.frameworks)
    manager = ModelManager(store, engine, max_models=1)
    took = warm_start(manager, engine, budget_s=float("inf"))
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
    took = warm_start(manager, engine, budget_s=0.0)
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


@pytest.mark.slow
def test_a_worker_with_warm_start_warms_before_ready_and_serves(start_worker: Callable[..., WorkerProcess]) -> None:
    worker = start_worker("--warm-start")
    log = worker.log()
    assert log.count("warmed ") >= 2, log[-3000:]
    assert log.index("warmed ") < log.index("ready."), "warmed before taking jobs"
    # on the thread that runs the jobs: part of what is warmed is per thread
    assert "warm start on swapless-scheduler:" in log, log[-3000:]
    assert Client().submit("sentiment", "a fine day").get(timeout=60)


def test_the_warm_start_goes_in_order_and_stops_at_its_total_budget(models_file: Path) -> None:
    engine = ModelEngine(WorkerLimits(device="cpu", max_batch_size=4))
    store = ModelStore.from_file(models_file, engine.frameworks)
    manager = ModelManager(store, engine, max_models=1)
    assert warm_start(manager, engine, total_budget_s=0.0) == {}  # a registry of hundreds: none warmed up front
    took = warm_start(manager, engine, order=["vision", "spam"], total_budget_s=1e-9 + 0.0001)
    assert list(took) == ["vision"]  # the first in the order, then the budget was spent
    everything = warm_start(manager, engine, order=["spam"])
    assert next(iter(everything)) == "spam" and sorted(everything) == sorted(store.ids())


def test_a_model_tuned_before_is_warmed_with_one_pass(models_file: Path) -> None:
    engine = ModelEngine(WorkerLimits(device="cpu", max_batch_size=64))
    store = ModelStore.from_file(models_file, engine.frameworks)
    manager = ModelManager(store, engine, max_models=1)
    engine.seed_tuner(store.get("spam"), {4: 0.001, 8: 0.0008})
    warm_start(manager, engine, tuned={"spam"})
    assert engine.tuner("spam").cost_s == {4: 0.001, 8: 0.0008}  # nothing explored again
    assert len(engine.tuner("topic").cost_s) >= 2  # the others were measured as before


@pytest.mark.slow
def test_what_a_worker_learned_seeds_the_next_one(start_worker: Callable[..., WorkerProcess], redis_url: str,
                                                  key_prefix: str) -> None:
    import json
    import time

    import redis

    from swapless.tasks.worker.learned import LEARNED_TTL_S

    first = start_worker("--warm-start", env={"SWAPLESS_HEARTBEAT_INTERVAL_S": "0.5"})
    client = Client()
    client.gather(client.submit_jobs([("spam", f"win a prize {i}") for i in range(40)]), timeout=60)
    key = f"{key_prefix}swapless:learned:cpu"
    r = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 10
    while b"spam" not in r.hkeys(key) and time.monotonic() < deadline:
        time.sleep(0.1)
    record = json.loads(r.hget(key, "spam"))
    assert record["load_s"] > 0 and record["size_bytes"] > 0 and len(record["batch_costs_s"]) >= 2
    assert 0 < r.ttl(key) <= LEARNED_TTL_S  # kept for later workers, not forever
    first.stop()
    second = start_worker("--warm-start")
    log = second.log()
    assert "learned from earlier workers:" in log and "spam" in log.split("learned from earlier workers:")[1]
    assert client.submit("spam", "free money").get(timeout=60)
    r.close()
