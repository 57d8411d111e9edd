"""ModelManager (the LRU cache) with a fake worker, through the real config path and the real engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from manager import ModelEngine, ModelLoadError, ModelManager, ModelStore, ModelTooLarge, UnknownModel
from tests.fakes import FakeWorker, write_fake_models


@pytest.fixture(autouse=True)
def _reset_fake() -> Iterator[None]:
    FakeWorker.reset()
    yield
    FakeWorker.reset()


def make_manager(tmp_path: Path, sizes: dict[str, int], **kwargs: object) -> ModelManager:
    engine = ModelEngine()
    store = ModelStore.from_file(write_fake_models(tmp_path, sizes), engine.frameworks)
    return ModelManager(store, engine, **kwargs)  # type: ignore[arg-type]


def use(manager: ModelManager, model_id: str) -> None:
    with manager.use(model_id) as worker:
        assert worker.predict(["x"]) == [{"echo": "x", "model": model_id}]


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
    time.sleep(0.2)
    assert manager.loaded_ids() == ["a"], "b must wait: a has a batch in flight"
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
