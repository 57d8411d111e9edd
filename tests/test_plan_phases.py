"""Each phase of the placement plan alone, over plain data."""

from swapless.tasks.cluster.plan import (
    Board,
    Demand,
    PlanWorker,
    Take,
    copy_hot,
    drop_idle_copies,
    hand_over,
    place_cold,
)


def _board(workers: list[PlanWorker], demand: list[Demand]) -> Board:
    return Board(workers, {d.model_id: d for d in demand})


def test_place_cold_puts_each_cold_model_on_the_worker_done_soonest_and_leaves_its_input_alone() -> None:
    workers = [PlanWorker("a", 1), PlanWorker("b", 1)]
    demand = [Demand("long", queued=500, job_s=0.01), Demand("short", queued=10, job_s=0.01)]
    board = _board(workers, demand)
    after, takes = place_cold(board, demand)
    assert [t.model_id for t in takes] == ["long", "short"]  # the longest first
    assert {t.worker_id for t in takes} == {"a", "b"} and all(t.victim is None and t.most_holders == 1 for t in takes)
    assert board.claims == {"a": [], "b": []} and sorted(after.claims["a"] + after.claims["b"]) == ["long", "short"]


def test_copy_hot_copies_measured_work_whose_holders_are_the_long_pole_only() -> None:
    workers = [PlanWorker("a", 2, frozenset({"hot"})), PlanWorker("b", 2)]
    hot = Demand("hot", queued=1000, job_s=0.01, holders=("a",), load_s=1.0)
    _, takes = copy_hot(_board(workers, [hot]), [hot], copy_backlog_s=2.0, copies_cap=2)
    assert takes == [Take("hot", "b", None, 2)]
    guessed = Demand("hot", queued=1000, job_s=0.01, holders=("a",), load_s=1.0, measured=False)
    assert copy_hot(_board(workers, [guessed]), [guessed], copy_backlog_s=2.0, copies_cap=2)[1] == []
    assert copy_hot(_board(workers, [hot]), [hot], copy_backlog_s=2.0, copies_cap=1)[1] == []


def test_drop_idle_copies_keeps_the_first_holder_s_copy() -> None:
    idle = Demand("m", holders=("a", "b"))
    assert drop_idle_copies(PlanWorker("b", 1, idle_s={"m": 60.0}), [idle], copy_idle_s=10.0) == ["m"]
    assert drop_idle_copies(PlanWorker("a", 1, idle_s={"m": 60.0}), [idle], copy_idle_s=10.0) == []
    assert drop_idle_copies(PlanWorker("b", 1, idle_s={"m": 5.0}), [idle], copy_idle_s=10.0) == []


def test_hand_over_releases_an_unloaded_idle_claim_when_another_worker_has_room() -> None:
    demand = [Demand(f"m{i}", holders=("a",)) for i in range(3)]
    by_model = {d.model_id: d for d in demand}
    workers = [PlanWorker("a", 2), PlanWorker("b", 2)]
    assert hand_over(Board(workers, by_model), "a", set(), by_model) == ["m0"]
    assert hand_over(Board(workers, by_model), "a", {"m0"}, by_model) == ["m1"]
    assert hand_over(Board([PlanWorker("a", 3), PlanWorker("b", 2)], by_model), "a", set(), by_model) == []
