"""BatchTuner: online choice of the batch size with the fewest seconds per input."""

from __future__ import annotations

import pytest

from swapless.manager.batching.tuning import BatchTuner


def simulate(tuner: BatchTuner, cost_per_item: dict[int, float], passes: int) -> list[int]:
    """Run ``passes`` forward passes of full batches with a fixed cost curve; return the sizes used."""
    used = []
    for _ in range(passes):
        size = tuner.next_size()
        tuner.record(size, size, cost_per_item[size] * size)
        used.append(size)
    return used


def test_sizes_are_powers_of_two_up_to_the_max() -> None:
    assert BatchTuner(64).sizes == [1, 2, 4, 8, 16, 32, 64]
    assert BatchTuner(24).sizes == [1, 2, 4, 8, 16, 24]
    assert BatchTuner(1).sizes == [1]
    with pytest.raises(ValueError, match="max_size must be at least 1"):
        BatchTuner(0)


def test_finds_a_small_optimum_like_mobilenet_on_cpu() -> None:
    # slower per image past batch 4, as mobilenet_v2 is on two CPU cores
    curve = {1: 0.020, 2: 0.014, 4: 0.011, 8: 0.013, 16: 0.016, 32: 0.018, 64: 0.02}
    used = simulate(BatchTuner(64), curve, 20)
    assert used[-10:] == [4] * 10
    assert len(set(used)) <= 4, "hill climbing measures only the neighbours of the best so far"


def test_climbs_to_the_largest_batch_when_bigger_is_always_better() -> None:
    curve = {size: 1.0 / size for size in (1, 2, 4, 8, 16, 32, 64)}
    used = simulate(BatchTuner(64), curve, 12)
    assert used[-3:] == [64, 64, 64]


def test_partial_batches_are_not_counted() -> None:
    tuner = BatchTuner(16)
    tuner.record(8, 3, 100.0)
    assert tuner.cost_s == {}


def test_revisits_a_neighbour_now_and_then() -> None:
    curve = {1: 3.0, 2: 2.0, 4: 1.0, 8: 2.0, 16: 3.0}
    tuner = BatchTuner(16, revisit_every=5)
    used = simulate(tuner, curve, 30)
    assert used.count(4) >= 20
    assert any(size != 4 for size in used[10:]), "neighbours are measured again"


def test_chunks_cover_the_total() -> None:
    tuner = BatchTuner(8, start=8)
    assert sum(tuner.chunks(21)) == 21
    assert max(tuner.chunks(21)) <= 8


def test_one_slow_pass_does_not_rule_a_size_out_for_good() -> None:
    # The machine is shared: size 4 is measured once while something else runs (3x its real cost). A later, faster
    # measurement of it is taken at once, so the tuner ends on it instead of staying on a worse neighbour.
    curve = {1: 3.0, 2: 2.0, 4: 1.0, 8: 1.5, 16: 3.0}
    tuner = BatchTuner(16, start=4, revisit_every=3)
    tuner.record(4, 4, 3.0 * 4)
    used = simulate(tuner, curve, 30)
    assert tuner.best() == 4 and tuner.cost_s[4] == pytest.approx(1.0)
    assert used[-12:].count(4) >= 9, used  # the rest are the periodic revisits of its neighbours


def test_a_slower_pass_moves_the_cost_up_only_gradually() -> None:
    tuner = BatchTuner(8, smoothing=0.3)
    tuner.record(8, 8, 8.0)
    tuner.record(8, 8, 16.0)
    assert tuner.cost_s[8] == pytest.approx(1.3)
    tuner.record(8, 8, 4.0)
    assert tuner.cost_s[8] == pytest.approx(0.5)


def test_the_first_forward_pass_after_a_load_is_not_shown_to_the_tuner() -> None:
    from swapless.manager.frameworks.worker import ModelWorker
    from swapless.manager.registry.specs import InputType, ModelSpec

    class Counting(ModelWorker):
        def load(self) -> None: ...
        def unload(self) -> None: ...

        def predict(self, batch):  # type: ignore[no-untyped-def]
            return [len(chunk) for chunk in self.batched(batch) for _ in chunk]

    worker = Counting(ModelSpec(id="m", name="m", framework="none", type=InputType.TEXT))
    worker.tuner = BatchTuner(8, start=4)
    worker.predict(["x"] * 4)  # pays the one-off costs: not recorded
    assert worker.tuner.cost_s == {}
    worker.predict(["x"] * 4)
    assert set(worker.tuner.cost_s) == {4}
