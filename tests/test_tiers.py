"""The cache's host tier: evicted models kept built in host memory, swapped back in by a copy instead of a load.

Through the real config path and the real engine: the fake framework (``tests.fakes``) counts loads and moves, and
the tiny real models (``tests.tinymodels``) show that what a swap-in brings back is the very module that was built,
moved to host memory and back (on this CPU machine, ``.to("cpu")`` keeps it where it is: device and host are the
same memory; the cache's mechanics are the same).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from swapless.config.errors import ModelLoadError
from swapless.manager import ModelEngine, ModelManager, ModelStore
from swapless.manager.cache.costs import LoadCosts
from swapless.manager.cache.entries import DEFAULT_LOAD_COST_S, HOST_COST_FRACTION, Tier
from tests.fakes import FakeWorker, make_manager, use

pytestmark = pytest.mark.images


@pytest.fixture(autouse=True)
def _reset_fake() -> Iterator[None]:
    FakeWorker.reset()
    yield
    FakeWorker.reset()


def test_an_evicted_model_waits_in_host_memory_and_comes_back_by_a_copy(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 100, "b": 100}, max_models=1, host_max_models=4,
                           host_memory_budget_bytes=10_000)
    use(manager, "a")
    use(manager, "b")  # a leaves the device for host memory, built
    assert manager.loaded_ids() == ["b"] and manager.host.ids() == ["a"]
    assert (manager.tier("a"), manager.tier("b")) == (Tier.HOST, Tier.DEVICE)
    assert FakeWorker.to_host_moves == {"a": 1} and FakeWorker.unloads == {}
    assert manager.host.used_bytes() == 100
    use(manager, "a")  # a copy back, not a load; b goes to host memory in turn
    assert FakeWorker.loads == {"a": 1, "b": 1} and FakeWorker.to_device_moves == {"a": 1}
    assert manager.loaded_ids() == ["a"] and manager.host.ids() == ["b"]
    s = manager.stats
    assert (s.loads, s.swap_ins, s.swap_outs, s.evictions, s.host_evictions, s.misses) == (2, 1, 2, 2, 0, 3)
    assert len(s.swap_in_seconds["a"]) == 1 and "host_load_s" in manager.learned("a")
    manager.close()
    assert FakeWorker.unloads == {"a": 1, "b": 1} and manager.host.ids() == []


def test_the_host_count_limit_drops_the_least_recently_stored_to_disk(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, dict.fromkeys("abcd", 100), max_models=1, host_max_models=2,
                           host_memory_budget_bytes=10_000)
    for model_id in "abcd":
        use(manager, model_id)
    assert manager.host.ids() == ["b", "c"], "a was stored first: it goes to disk to make room for c"
    assert FakeWorker.unloads == {"a": 1} and manager.stats.host_evictions == 1
    use(manager, "a")  # from disk again: a second load
    assert FakeWorker.loads["a"] == 2 and manager.host.ids() == ["c", "d"]


def test_the_host_byte_budget_counts_the_model_being_moved(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 400, "b": 400, "c": 300, "huge": 900}, max_models=1,
                           host_max_models=10, host_memory_budget_bytes=800)
    use(manager, "a")
    use(manager, "b")
    use(manager, "c")  # b comes in: 400 + 400 = 800 fits exactly
    assert manager.host.ids() == ["a", "b"] and manager.host.used_bytes() == 800
    use(manager, "huge")  # c (300) comes in: 1100 > 800, so a goes to disk
    assert manager.host.ids() == ["b", "c"] and manager.host.used_bytes() == 700
    use(manager, "a")  # huge (900) is larger than the whole host budget: unloaded, as without the tier
    assert "huge" not in manager.host.ids() and FakeWorker.unloads["huge"] == 1
    assert FakeWorker.to_host_moves["huge"] == 0 and manager.host.used_bytes() <= 800


def test_with_the_host_tier_off_an_evicted_model_is_unloaded_as_ever(tmp_path: Path) -> None:
    for kwargs in ({}, {"host_max_models": 4}, {"host_memory_budget_bytes": 10_000}):
        FakeWorker.reset()
        manager = make_manager(tmp_path, {"a": 1, "b": 1}, max_models=1, **kwargs)
        for model_id in "aba":
            use(manager, model_id)
        assert FakeWorker.loads == {"a": 2, "b": 1} and FakeWorker.unloads == {"a": 1, "b": 1}, kwargs
        assert FakeWorker.to_host_moves == {} and manager.host.ids() == [] and manager.stats.swap_ins == 0


def test_models_with_waiting_work_stay_in_host_memory_longest(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, dict.fromkeys("abcd", 100), max_models=1, host_max_models=2,
                           host_memory_budget_bytes=10_000)
    use(manager, "a")
    use(manager, "b")
    with manager.use("c", waiting={"a": 3}):  # b comes in; a has work waiting, so b (no work) would go first
        pass
    with manager.use("d", waiting={"a": 3}):  # c comes in: the tier is full; b goes to disk, a stays
        pass
    assert manager.host.ids() == ["a", "c"] and FakeWorker.unloads == {"b": 1}


def test_a_model_with_a_batch_in_flight_never_moves(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1, "b": 1}, max_models=1, host_max_models=4,
                           host_memory_budget_bytes=10_000, pin_wait_s=0.2)
    with manager.use("a"), pytest.raises(ModelLoadError, match="every loaded model is busy"):
        use(manager, "b")
    assert FakeWorker.to_host_moves == {} and manager.loaded_ids() == ["a"]


def test_out_of_host_memory_drops_the_host_tier_and_retries_once_then_unloads(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, dict.fromkeys("abcd", 100), max_models=1, host_max_models=4,
                           host_memory_budget_bytes=10_000)
    use(manager, "a")
    use(manager, "b")  # a in host memory
    FakeWorker.oom_to_host["b"] = 1
    use(manager, "c")  # b's move runs out of host memory: a is dropped, and b's second try succeeds
    assert manager.host.ids() == ["b"] and FakeWorker.unloads == {"a": 1}
    FakeWorker.oom_to_host["c"] = 2
    use(manager, "d")  # out of host memory twice: c is unloaded, as without the tier
    assert manager.host.ids() == [] and FakeWorker.unloads == {"a": 1, "b": 1, "c": 1}
    FakeWorker.fail_to_host.add("d")
    use(manager, "a")  # another failure of the move: unloaded too, the swap goes on
    assert manager.host.ids() == [] and FakeWorker.unloads["d"] == 1 and manager.loaded_ids() == ["a"]


def test_out_of_device_memory_on_a_swap_in_evicts_idle_models_and_retries_once(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, dict.fromkeys("abc", 100), max_models=2, host_max_models=4,
                           host_memory_budget_bytes=10_000)
    use(manager, "a")
    use(manager, "b")
    use(manager, "c")  # a in host memory
    FakeWorker.oom_to_device["a"] = 1
    use(manager, "a")  # b goes for room; the copy runs out of memory: c goes too, and the copy is tried again
    assert manager.loaded_ids() == ["a"] and sorted(manager.host.ids()) == ["b", "c"]
    assert FakeWorker.to_device_moves == {"a": 1} and FakeWorker.loads["a"] == 1
    FakeWorker.oom_to_device["b"] = 2
    with pytest.raises(ModelLoadError, match="model 'b': swapping it in from host memory: out of memory"):
        use(manager, "b")
    assert manager.tier("b") is Tier.DISK and FakeWorker.unloads["b"] == 1
    use(manager, "b")  # from disk this time
    assert FakeWorker.loads["b"] == 2


def test_load_costs_price_each_tier() -> None:
    costs = LoadCosts()
    assert [costs.cost_s("a", tier) for tier in Tier] == [0.0, DEFAULT_LOAD_COST_S * HOST_COST_FRACTION,
                                                          DEFAULT_LOAD_COST_S]
    costs.seed("a", load_s=2.0, size_bytes=10, host_load_s=None)
    assert costs.cost_s("a", Tier.DISK) == 2.0
    assert costs.cost_s("a", Tier.HOST) == pytest.approx(2.0 * HOST_COST_FRACTION), "a share of its load from disk"
    costs.seed("a", load_s=9.0, size_bytes=None, host_load_s=0.25)
    assert costs.cost_s("a", Tier.HOST) == 0.25 and costs.cost_s("a", Tier.DISK) == 2.0, "its own kept first"
    assert costs.learned("a") == {"load_s": 2.0, "host_load_s": 0.25, "size_bytes": 10}


def test_the_scheduler_sees_a_swap_in_from_host_memory_as_cheap(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1, "b": 1, "c": 1}, max_models=1, host_max_models=4,
                           host_memory_budget_bytes=10_000)
    for model_id in "abc":
        manager.seed(model_id, load_s=2.0)
    use(manager, "a")
    use(manager, "b")  # a in host memory
    manager.seed("a", host_load_s=0.25)  # never swapped in here yet: an earlier worker's measurement
    assert manager.load_cost_s("b") == 0.0 and manager.load_cost_s("a") == 0.25
    assert manager.load_cost_s("c") == 2.0
    use(manager, "a")
    assert manager.load_cost_s("a") == 0.0 and manager.learned("a")["host_load_s"] < 0.25, "measured now"


def test_a_model_in_host_memory_is_swapped_in_ahead(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 100, "b": 100, "c": 100}, max_models=2, host_max_models=4,
                           host_memory_budget_bytes=10_000)
    use(manager, "a")
    use(manager, "b")
    use(manager, "c")  # a in host memory
    with manager.use("c"):
        assert manager.load_ahead("a", waiting={"a": 5, "c": 1}) is True  # b (no work) goes to host memory
        with manager.use("a"):  # waits for the swap-in, does not start a load
            pass
    assert FakeWorker.loads == {"a": 1, "b": 1, "c": 1} and FakeWorker.to_device_moves == {"a": 1}
    assert manager.host.ids() == ["b"] and manager.stats.loads_ahead == 1


def test_a_use_of_a_model_still_moving_to_host_memory_waits_for_the_move(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 100, "b": 100, "c": 100}, max_models=2, host_max_models=4,
                           host_memory_budget_bytes=10_000)
    use(manager, "a")
    use(manager, "b")
    gate = FakeWorker.load_gates["c"] = threading.Event()
    with manager.use("b"):
        assert manager.load_ahead("c", waiting={"b": 1, "c": 1}) is True  # a leaves; its move waits for c's turn
        user = threading.Thread(target=use, args=(manager, "a"))
        user.start()
        user.join(0.3)
        assert user.is_alive(), "a is neither on the device nor in host memory yet: its use waits"
        gate.set()
        user.join(10)
    assert not user.is_alive()
    assert FakeWorker.loads == {"a": 1, "b": 1, "c": 1}, "a came back by a copy, never by a second load"
    assert FakeWorker.to_host_moves["a"] == 1 and FakeWorker.to_device_moves["a"] == 1


def test_evict_moves_to_host_memory_and_the_warm_start_fills_it(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1}, host_max_models=4, host_memory_budget_bytes=10_000)
    use(manager, "a")
    assert manager.evict("a") is True and manager.host.ids() == ["a"] and manager.loaded_ids() == []
    assert manager.evict("a") is False


def test_a_real_torch_model_kept_built_in_host_memory_is_the_one_that_runs_again(models_file: Path) -> None:
    engine = ModelEngine()
    store = ModelStore.from_file(models_file, engine.frameworks)
    manager = ModelManager(store, engine, max_models=1, host_max_models=2, host_memory_budget_bytes=1 << 30)
    texts = ["i love this movie", "terrible"]
    with manager.use("sentiment") as worker:
        before = worker.predict([worker.prepare(t) for t in texts])
        module = worker.model  # type: ignore[attr-defined]
    with manager.use("vision") as vision:
        assert vision.model is not None  # type: ignore[attr-defined]
    assert manager.tier("sentiment") is Tier.HOST and manager.tier("vision") is Tier.DEVICE
    assert all(p.device.type == "cpu" for p in module.parameters())
    with manager.use("sentiment") as worker:
        assert worker.model is module, "the module built by the load, moved back: nothing rebuilt"  # type: ignore[attr-defined]
        after = worker.predict([worker.prepare(t) for t in texts])
    assert manager.stats.loads == 2 and manager.stats.swap_ins == 1 and manager.tier("vision") is Tier.HOST
    for row_before, row_after in zip(before, after, strict=True):
        assert [r["label"] for r in row_before] == [r["label"] for r in row_after]
        assert torch.allclose(torch.tensor([r["score"] for r in row_before]),
                              torch.tensor([r["score"] for r in row_after]))
    manager.close()
    assert manager.host.ids() == [] and manager.loaded_ids() == []
