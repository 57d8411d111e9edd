"""ModelManager (the LRU cache) with a fake worker, through the real config path and the real engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from swapless.config.errors import ModelLoadError, ModelTooLarge, UnknownModel
from tests.fakes import FakeWorker, make_manager, use


@pytest.fixture(autouse=True)
def _reset_fake() -> Iterator[None]:
    FakeWorker.reset()
    yield
    FakeWorker.reset()


def test_hit_miss_and_lru_eviction_like_the_original_design(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"sentiment": 1, "spam": 1, "image": 1}, max_models=2)
    for model_id in ["sentiment", "spam", "image", "sentiment"]:
        use(manager, model_id)
    # the walk-through of the original article: image evicts sentiment, sentiment evicts spam
    assert manager.loaded_ids() == ["image", "sentiment"]
    assert FakeWorker.loads == {"sentiment": 2, "spam": 1, "image": 1}
    assert FakeWorker.unloads == {"sentiment": 1, "spam": 1}
    assert (manager.stats.hits, manager.stats.misses, manager.stats.evictions) == (0, 4, 2)
    use(manager, "sentiment")
    assert manager.stats.hits == 1 and manager.loaded_ids() == ["image", "sentiment"]


def test_memory_budget_counts_measured_bytes(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 400, "b": 400, "c": 300}, max_models=10, memory_budget_bytes=1000)
    use(manager, "a")
    use(manager, "b")
    assert manager.used_bytes() == 800
    use(manager, "c")  # 1100 > 1000: the least recently used goes
    assert manager.loaded_ids() == ["b", "c"]
    assert manager.used_bytes() == 700


def test_model_larger_than_budget_fails_clearly_and_frees_itself(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"small": 100, "huge": 5000}, memory_budget_bytes=1000)
    use(manager, "small")
    with pytest.raises(ModelTooLarge) as caught:
        use(manager, "huge")
    assert "model 'huge' needs 4.9 KiB, more than the whole memory budget of 1000 B" in str(caught.value)
    assert "huge" not in manager.loaded_ids()
    assert FakeWorker.unloads["huge"] == 1
    # now its size is known: it fails before loading again
    with pytest.raises(ModelTooLarge):
        use(manager, "huge")
    assert FakeWorker.loads["huge"] == 1


def test_unknown_model(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1})
    with pytest.raises(UnknownModel, match=r"unknown model 'nope' \(known: a\)"):
        use(manager, "nope")


def test_load_failure_becomes_model_load_error(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1})
    FakeWorker.fail_load.add("a")
    with pytest.raises(ModelLoadError, match="could not load model 'a': RuntimeError: weights file is corrupt"):
        use(manager, "a")
    assert manager.loaded_ids() == [] and manager.stats.load_failures == 1


def test_model_with_batch_in_flight_is_never_evicted(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1, "b": 1}, max_models=1, pin_wait_s=10)
    entered = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def hold_a() -> None:
        with manager.use("a"):
            entered.set()
            release.wait(5)
            order.append("a done")

    holder = threading.Thread(target=hold_a)
    holder.start()
    entered.wait(5)

    def load_b() -> None:
        with manager.use("b"):
            order.append("b loaded")

    loader = threading.Thread(target=load_b)
    loader.start()
    # b's miss is counted under the cache's lock, which the loader then holds until it waits for room (that wait
    # releases it): once the miss shows, loaded_ids() (which takes the lock) runs only while b waits or after
    wait_until(lambda: manager.stats.misses == 2)
    assert manager.loaded_ids() == ["a"], "b must wait: a has a batch in flight"
    assert loader.is_alive() and order == [] and FakeWorker.loads == {"a": 1}, (order, FakeWorker.loads)
    release.set()
    holder.join(5)
    loader.join(5)
    assert order == ["a done", "b loaded"]
    assert manager.loaded_ids() == ["b"]


def test_evict_and_close_unload_for_real(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1, "b": 1})
    use(manager, "a")
    use(manager, "b")
    assert manager.evict("a") is True and manager.evict("a") is False
    manager.close()
    assert manager.loaded_ids() == []
    assert FakeWorker.unloads == {"a": 1, "b": 1}


def test_load_cost_estimate_comes_from_measured_loads(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1, "b": 1}, max_models=1)
    assert manager.load_cost_s("a") == 1.0  # default before any load
    use(manager, "a")
    assert manager.load_cost_s("a") == 0.0  # loaded
    use(manager, "b")
    assert 0.0 < manager.load_cost_s("a") < 1.0  # measured


# -- loading ahead ---------------------------------------------------------------------------------------------


def test_a_model_loads_ahead_while_another_one_is_in_use(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1, "b": 1}, max_models=2)
    gate = FakeWorker.load_gates["b"] = threading.Event()
    with manager.use("a") as worker:
        assert manager.load_ahead("b", {"b": 5})
        assert manager.loading_ids() == ["b"] and manager.load_cost_s("b") == 0.0
        assert worker.predict(["x"]) == [{"echo": "x", "model": "a"}]  # "a" works while "b" loads
        use(manager, "a")  # and the cache is not locked by the load
        gate.set()
    wait_until(lambda: manager.is_loaded("b"))
    use(manager, "b")
    assert FakeWorker.loads == {"a": 1, "b": 1} and manager.stats.loads_ahead == 1
    assert manager.stats.hits == 2 and manager.stats.misses == 1  # "b" was a hit: its load came first


def test_using_a_model_that_is_loading_ahead_waits_for_that_load(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1, "b": 1}, max_models=2)
    gate = FakeWorker.load_gates["b"] = threading.Event()
    assert manager.load_ahead("b", {})
    used = threading.Event()
    user = threading.Thread(target=lambda: (use(manager, "b"), used.set()))
    user.start()
    assert not used.wait(0.3)  # it waits for the load in progress...
    gate.set()
    user.join(10)
    assert used.is_set() and FakeWorker.loads["b"] == 1  # ...instead of loading a second copy


def test_loading_ahead_never_evicts_a_model_with_waiting_work_or_in_use(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1, "b": 1, "c": 1}, max_models=2)
    use(manager, "c")
    with manager.use("a"):
        assert not manager.load_ahead("b", {"c": 3})  # "c" has work, "a" is in use: no room
        assert manager.loaded_ids() == ["c", "a"] and not manager.loading_ids()
        assert manager.load_ahead("b", {})  # "c" has none now: it goes
    wait_until(lambda: manager.is_loaded("b"))
    assert sorted(manager.loaded_ids()) == ["a", "b"] and FakeWorker.unloads == {"c": 1}


def test_under_a_byte_budget_only_a_model_of_known_size_loads_ahead(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 600, "b": 600}, max_models=4, memory_budget_bytes=1000)
    assert not manager.load_ahead("b", {})  # never loaded: its size is unknown, it could overrun the budget
    use(manager, "b")
    use(manager, "a")  # evicts "b" (600 + 600 > 1000): its size is known from now on
    assert manager.load_ahead("b", {})  # evicts "a", which has no work
    wait_until(lambda: manager.is_loaded("b"))
    assert manager.loaded_ids() == ["b"] and manager.used_bytes() <= 1000


def test_a_load_ahead_that_fails_leaves_the_error_to_the_group(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1}, max_models=2)
    FakeWorker.fail_load.add("a")
    assert manager.load_ahead("a", {})
    wait_until(lambda: not manager.loading_ids())
    with pytest.raises(ModelLoadError, match="weights file is corrupt"):
        use(manager, "a")


def test_local_loads_take_turns_and_one_loads_ahead_at_a_time(tmp_path: Path) -> None:
    # two loads of a lazily-importing library (transformers) in two threads can fail: local loads never overlap
    manager = make_manager(tmp_path, {"a": 1, "b": 1, "c": 1}, max_models=3)
    gate = FakeWorker.load_gates["b"] = threading.Event()
    assert manager.load_ahead("b", {})
    assert not manager.load_ahead("c", {})  # one load ahead at a time
    used = threading.Event()
    user = threading.Thread(target=lambda: (use(manager, "a"), used.set()))
    user.start()
    assert not used.wait(0.3) and FakeWorker.loads["a"] == 0  # "a" waits for the load in progress to end
    gate.set()
    user.join(10)
    assert used.is_set() and FakeWorker.loads == {"a": 1, "b": 1}


def test_out_of_memory_on_load_evicts_idle_models_and_retries_once(tmp_path: Path) -> None:
    import torch

    assert torch.OutOfMemoryError is torch.cuda.OutOfMemoryError  # what a GPU raises is what is injected here
    manager = make_manager(tmp_path, {"a": 1, "b": 1, "c": 1}, max_models=3)
    use(manager, "a")
    use(manager, "b")
    FakeWorker.oom_loads["c"] = 1
    use(manager, "c")  # out of memory once: every idle model goes, the load is tried again and works
    assert manager.loaded_ids() == ["c"] and (FakeWorker.unloads["a"], FakeWorker.unloads["b"]) == (1, 1)
    FakeWorker.oom_loads["a"] = 2
    with pytest.raises(ModelLoadError, match=r"model 'a'.*out of memory"):
        use(manager, "a")  # out of memory twice: one clear error, tried only once more
    assert FakeWorker.oom_loads["a"] == 0 and manager.stats.load_failures == 1


def test_no_room_while_every_loaded_model_is_busy_is_a_clear_error(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"a": 1, "b": 1}, max_models=1, pin_wait_s=0.2)
    with manager.use("a"), pytest.raises(ModelLoadError, match="no room: every loaded model is busy"):
        use(manager, "b")
    use(manager, "b")  # once "a" is free, "b" takes its place


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- interactive models stay -------------------------------------------------------------------------------------


def test_a_model_serving_interactive_jobs_is_resident_for_a_while(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"chat": 1, "a": 1, "b": 1, "c": 1}, max_models=2, keep_interactive_s=0.5)
    with manager.use("chat", interactive=True):
        pass
    with manager.use("a"):
        # a load ahead never evicts it, though it is the least recently used and has no work waiting
        assert not manager.load_ahead("b", {})
        assert manager.loaded_ids() == ["chat", "a"] and not manager.loading_ids()
    use(manager, "b")  # a load a group needs evicts the other model first
    assert manager.loaded_ids() == ["chat", "b"] and FakeWorker.unloads == {"a": 1}
    assert manager.resident(manager.snapshot()[0])
    time.sleep(0.6)  # no interactive job for keep_interactive_s: plain LRU again
    assert not manager.resident(manager.snapshot()[0])
    use(manager, "c")
    assert manager.loaded_ids() == ["b", "c"] and FakeWorker.unloads == {"a": 1, "chat": 1}


def test_a_model_kept_loaded_by_its_spec_is_resident_without_any_traffic(tmp_path: Path) -> None:
    manager = make_manager(tmp_path, {"chat": 1, "a": 1, "b": 1}, kept={"chat"}, max_models=2)
    use(manager, "chat")
    time.sleep(0.01)  # keep_interactive_s is 0 here: only the spec keeps it
    with manager.use("a"):
        assert not manager.load_ahead("b", {})  # a load ahead never evicts it
    use(manager, "b")  # a group's load evicts every other model first
    assert manager.loaded_ids() == ["chat", "b"] and FakeWorker.unloads == {"a": 1}
    assert all(manager.resident(e) == (e.model_id == "chat") for e in manager.snapshot())


def test_kept_models_are_loaded_at_start_as_many_as_the_cache_holds(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    from swapless.manager.batching.warmup import load_kept, warm_steps

    manager = make_manager(tmp_path, {"bulk": 1, "chat": 1, "code": 1, "vision": 1}, kept={"chat", "code", "vision"},
                           max_models=2)
    # the warm start warms every model, the kept ones last, and leaves those loaded
    took = dict(warm_steps(manager, manager.factory))  # type: ignore[arg-type]
    assert next(iter(took)) == "bulk" and sorted(took) == ["bulk", "chat", "code", "vision"]
    assert manager.loaded_ids() == ["code", "vision"]
    manager.evict("code")
    manager.evict("vision")
    with caplog.at_level("WARNING"):
        assert load_kept(manager, skip={"chat"}) == ["code", "vision"]
        assert load_kept(manager) == []  # two kept models fill the cache: chat does not push one out
    assert manager.loaded_ids() == ["code", "vision"]
    assert "chat is kept loaded by its spec but the cache already holds 2 kept model(s), its limit" in caplog.text
    assert "raise SWAPLESS_MAX_MODELS" in caplog.text


def test_every_cache_counter_is_published_in_the_heartbeat() -> None:
    from swapless.manager.cache.entries import CacheCounters
    from swapless.tasks.cluster.members import CacheInfo

    assert set(CacheCounters().counts()) <= set(CacheInfo.model_fields)
