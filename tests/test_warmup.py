"""Warm start: every local model warmed once before the first job, its tuner seeded, nothing left loaded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from manager import ModelEngine, ModelManager, ModelStore, WorkerLimits
from manager.cache import DEFAULT_LOAD_COST_S
from manager.specs import InputType
from manager.warmup import warm_input, warm_start
from tasks.client import Client
from tests.conftest import WorkerProcess


def test_warm_start_warms_each_local_model_seeds_its_tuner_and_leaves_the_cache_empty(models_file: Path) -> None:
    engine = ModelEngine(WorkerLimits(device="cpu", max_batch_size=16))
    store = ModelStore.from_file(models_file, engine.frameworks)
    manager = ModelManager(store, engine, max_models=1)
    took = warm_start(manager, engine)
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
    warm_start(manager, engine, budget_s=0.0)
    for spec in store:
        tuner = engine.tuner(spec.id)
        if tuner is not None:
            assert list(tuner.cost_s) == [1], "only the first size fits a budget of zero"


def test_warm_inputs_pass_the_models_own_checks(models_file: Path) -> None:
    engine = ModelEngine(WorkerLimits(device="cpu"))
    for spec in ModelStore.from_file(models_file, engine.frameworks):
        value = warm_input(spec)
        assert isinstance(value, str) and value
        if spec.type is InputType.IMAGE:
            assert len(value) < engine.limits.max_image_bytes


def test_a_worker_with_warm_start_warms_before_ready_and_serves(start_worker: Callable[..., WorkerProcess]) -> None:
    worker = start_worker("--warm-start")
    log = worker.log()
    assert log.count("warmed ") >= 2, log[-3000:]
    assert log.index("warmed ") < log.index("ready."), "warmed before taking jobs"
    # on the thread that runs the jobs: part of what is warmed is per thread
    assert "warm start on swapless-scheduler:" in log, log[-3000:]
    assert Client().submit("sentiment", "a fine day").get(timeout=60)
