"""Backlog grouping and run_group's failure isolation, with the fake worker through the real cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from swapless.config.errors import InputError, PredictionFailed
from swapless.manager import Backlog, ModelEngine, ModelManager, ModelStore, WorkItem, run_group
from tests.fakes import FakeWorker, write_fake_models


@pytest.fixture(autouse=True)
def _reset_fake() -> Iterator[None]:
    FakeWorker.reset()
    yield
    FakeWorker.reset()


@pytest.fixture
def manager(tmp_path: Path) -> ModelManager:
    engine = ModelEngine()
    store = ModelStore.from_file(write_fake_models(tmp_path, {"a": 1, "b": 1, "c": 1}), engine.frameworks)
    return ModelManager(store, engine, max_models=2)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def job(n: int, model_id: str, value: object = None, at: float = 0.0, urgent: bool = False) -> WorkItem:
    return WorkItem(f"j{n}", model_id, value if value is not None else f"text {n}", received_s=at, urgent=urgent)


def test_backlog_groups_by_model_and_serves_loaded_first() -> None:
    backlog = Backlog(max_wait_s=30, clock=Clock())
    backlog.add([job(1, "a"), job(2, "b"), job(3, "a"), job(4, "b"), job(5, "b")])
    assert backlog.counts() == {"a": 2, "b": 3}
    cost = {"a": 0.0, "b": 1.0}.__getitem__
    first = backlog.next_group(loaded=["a"], load_cost_s=cost, limit=10)
    assert [j.id for j in first] == ["j1", "j3"]
    second = backlog.next_group(loaded=["a"], load_cost_s=cost, limit=2)
    assert [j.id for j in second] == ["j2", "j4"]
    assert backlog.counts() == {"b": 1}
    assert [j.id for j in backlog.next_group(["a"], cost, 10)] == ["j5"]
    assert backlog.next_group(["a"], cost, 10) == [] and len(backlog) == 0


def test_backlog_does_not_starve_a_rare_cold_model() -> None:
    clock = Clock()
    backlog = Backlog(max_wait_s=5, clock=clock)
    backlog.add([job(0, "rare", at=0.0)])
    cost = {"busy": 0.0, "rare": 1.0}.__getitem__
    served = []
    # a steady stream for the loaded model would otherwise always win
    for tick in range(1, 10):
        clock.now = float(tick)
        backlog.add([job(100 + tick, "busy", at=clock.now)])
        group = backlog.next_group(loaded=["busy"], load_cost_s=cost, limit=100)
        served.append(group[0].model_id)
    assert served[:5] == ["busy"] * 5
    assert served[5] == "rare", "the rare job waited 6 s > max_wait_s 5 s: it goes next"


def test_backlog_urgent_jobs_first_within_a_model() -> None:
    backlog = Backlog(clock=Clock())
    backlog.add([job(1, "a"), job(2, "a"), job(3, "a", urgent=True)])
    assert [j.id for j in backlog.next_group(["a"], lambda m: 0.0, 2)] == ["j3", "j1"]


def test_backlog_counts_interactive_jobs_through_every_way_out() -> None:
    clock = Clock()
    backlog = Backlog(clock=clock)

    def scanned() -> int:
        return sum(w.urgent for w in backlog.waiting(lambda m: 0.0))

    expiring = WorkItem("late", "b", "x", received_s=0.0, urgent=True, expires_at=10.0)
    backlog.add([job(1, "a", urgent=True), job(2, "a"), job(3, "a", urgent=True), job(4, "b", urgent=True), expiring])
    assert backlog.urgent == scanned() == 4
    assert [j.id for j in backlog.next_group(["a"], lambda m: 0.0, 1)] == ["j1"]  # one taken, one left in a's group
    assert backlog.urgent == scanned() == 3
    assert [j.id for j in backlog.take_expired(20.0)] == ["late"]
    assert backlog.urgent == scanned() == 2
    assert [j.id for j in backlog.take_model("a", keep=lambda j: j.urgent)] == ["j2"]  # the kept one still counts
    assert backlog.urgent == scanned() == 2
    backlog.take_model("a")
    backlog.next_group([], lambda m: 0.0, 10)
    assert backlog.urgent == scanned() == 0 and len(backlog) == 0


def test_run_group_results_in_order(manager: ModelManager) -> None:
    jobs = [job(i, "a") for i in range(5)]
    outcomes = run_group(manager, "a", jobs)
    assert [o.result for o in outcomes] == [{"echo": f"text {i}", "model": "a"} for i in range(5)]
    assert FakeWorker.batches == [("a", 5)]


def test_bad_input_fails_alone(manager: ModelManager) -> None:
    jobs = [job(1, "a"), WorkItem("bad1", "a", 42), WorkItem("bad2", "a", "   "), job(2, "a")]
    outcomes = run_group(manager, "a", jobs)
    assert [o.ok for o in outcomes] == [True, False, False, True]
    assert isinstance(outcomes[1].error, InputError)
    assert str(outcomes[1].error) == "bad input for model 'a': this is a text model; send a string, not a number"
    assert str(outcomes[2].error) == "bad input for model 'a': empty text; send at least one non-blank character"
    assert FakeWorker.batches == [("a", 2)], "only the good inputs reach the model, in one batch"


def test_poison_input_is_isolated_by_splitting(manager: ModelManager) -> None:
    jobs = [job(i, "a") for i in range(7)] + [WorkItem("poison", "a", "boom")]
    outcomes = run_group(manager, "a", jobs)
    assert [o.job.id for o in outcomes if not o.ok] == ["poison"]
    poison = outcomes[-1].error
    assert isinstance(poison, PredictionFailed)
    assert str(poison) == "model 'a' failed on this input: RuntimeError: forward pass exploded"
    assert all(o.result == {"echo": f"text {i}", "model": "a"} for i, o in enumerate(outcomes[:7]))
    assert len(FakeWorker.batches) <= 2 * 3 + 1, "halving: a logarithmic number of extra passes"


def test_out_of_memory_batch_is_split_until_it_fits(manager: ModelManager) -> None:
    jobs = [job(i, "a") for i in range(3)] + [WorkItem("big", "a", "oom")]
    outcomes = run_group(manager, "a", jobs)
    assert all(o.ok for o in outcomes)
    assert ("a", 1) in FakeWorker.batches


def test_load_failure_fails_the_whole_group_with_the_reason(manager: ModelManager) -> None:
    FakeWorker.fail_load.add("b")
    outcomes = run_group(manager, "b", [job(1, "b"), job(2, "b")])
    assert [str(o.error) for o in outcomes] == ["could not load model 'b': RuntimeError: weights file is corrupt"] * 2
    # the cache is still usable afterwards
    assert run_group(manager, "a", [job(3, "a")])[0].ok


def test_jobs_still_in_redis_count_in_a_model_s_work_and_a_loaded_model_s_are_waited_for() -> None:
    """``queued`` (jobs not fetched yet) weighs in the choice, and a loaded model with jobs on their way is worth a
    moment's wait before a load, not when the next group needs no load or nothing is on its way."""
    backlog = Backlog()
    backlog.add([job(1, "tail", at=0.0), job(2, "big", at=0.0)])
    backlog.queued = lambda: {"big": 500, "hot": 40}
    assert backlog.waiting(lambda m: 1.0)[1].jobs == 501  # "big": one held, 500 in Redis
    assert backlog.coming(["hot"], lambda m: 1.0) == {"hot"}  # next would load "big": wait for hot's jobs first
    assert backlog.coming(["hot", "big"], lambda m: 0.0) == frozenset()  # big is loaded: no load, no wait
    backlog.queued = dict
    assert backlog.coming(["hot"], lambda m: 1.0) == frozenset()  # nothing on its way


def test_after_a_starved_model_s_turn_the_loaded_models_go_before_the_next_starved_one() -> None:
    """Two tail models past the starvation bound and a hot loaded model with jobs: one tail model, then the hot
    model's jobs, then the other tail model; never two starved loads in a row ahead of a resident model's jobs."""
    clock = Clock()
    backlog = Backlog(max_wait_s=30.0, clock=clock)
    backlog.add([job(1, "tail-a", at=0.0, urgent=True), job(2, "tail-b", at=1.0, urgent=True)])
    clock.now = 40.0
    backlog.add([job(3, "hot", at=40.0, urgent=True)])
    order = [backlog.next_group(["hot"], lambda m: 0.0 if m == "hot" else 1.0, 10)[0].model_id for _ in range(3)]
    assert order == ["tail-a", "hot", "tail-b"]
