"""The placement policy (tasks.cluster.plan): pure code over plain data, no Redis, no workers."""

from __future__ import annotations

from swapless.tasks.cluster.plan import Demand, Moves, PlanWorker, plan


def _workers(*ids: str, slots: int = 2, **loaded: set[str]) -> list[PlanWorker]:
    return [PlanWorker(w, slots, frozenset(loaded.get(w, set()))) for w in ids]


def _everyone(workers: list[PlanWorker], demand: list[Demand], **options: float) -> dict[str, Moves]:
    return {w.worker_id: plan(w.worker_id, workers, demand, **options) for w in workers}  # type: ignore[arg-type]


def test_cold_models_spread_over_free_slots_and_each_goes_to_one_worker() -> None:
    workers = _workers("a", "b", "c")
    demand = [Demand(f"m{i}", queued=10) for i in range(6)]
    moves = _everyone(workers, demand)
    claimed = [m for mv in moves.values() for m, _, _ in mv.claim]
    assert sorted(claimed) == [f"m{i}" for i in range(6)]  # each model once: no herd
    assert all(len(mv.claim) == 2 for mv in moves.values())  # two slots each, all used
    assert all(most == 1 for mv in moves.values() for _, most, _ in mv.claim)  # a cold claim admits one holder


def test_every_worker_computes_the_same_plan() -> None:
    workers = _workers("a", "b")
    demand = [Demand("x", queued=3), Demand("y", queued=30), Demand("z", queued=1)]
    first = _everyone(workers, demand)
    again = _everyone(list(reversed(workers)), list(reversed(demand)))
    assert first == again


def test_a_lone_worker_claims_everything_and_swaps_in_its_own_cache() -> None:
    workers = _workers("solo")
    demand = [Demand(f"m{i}", queued=5) for i in range(5)]
    assert sorted(m for m, _, _ in plan("solo", workers, demand).claim) == [f"m{i}" for i in range(5)]


def test_with_no_free_slot_the_worker_whose_victim_idled_longest_takes_the_model() -> None:
    workers = [
        PlanWorker("a", 1, idle_s={"old": 100.0}),
        PlanWorker("b", 1, idle_s={"recent": 5.0}),
    ]
    demand = [Demand("old", holders=("a",)), Demand("recent", holders=("b",)), Demand("new", queued=10)]
    assert plan("a", workers, demand) == Moves(claim=(("new", 1, "old"),))
    assert plan("b", workers, demand) == Moves()


def test_a_model_in_use_between_sparse_jobs_is_no_victim_until_idle_as_long_as_its_load() -> None:
    # interactive traffic: a job every few tenths of a second, none waiting between them
    other = PlanWorker("b", 1, frozenset({"x"}), idle_s={"x": 0.1})
    workers = [PlanWorker("a", 1, frozenset({"chat"}), idle_s={"chat": 0.4}), other]
    demand = [Demand("chat", holders=("a",), load_s=2.0), Demand("x", holders=("b",), load_s=2.0),
              Demand("bulk", queued=100, load_s=2.0)]
    claims = [c for w in ("a", "b") for c in plan(w, workers, demand).claim]
    assert [victim for _, _, victim in claims] == [None]  # taken with no victim: chat keeps its place
    workers = [PlanWorker("a", 1, frozenset({"chat"}), idle_s={"chat": 2.5}), other]
    assert plan("a", workers, demand).claim == (("bulk", 1, "chat"),)  # idle longer than a load: it goes
    # resident (it served interactive jobs lately, in an idle stretch since): no victim however long it idled
    resident = PlanWorker("a", 1, frozenset({"chat"}), idle_s={"chat": 15.0}, resident=frozenset({"chat"}))
    claims = [c for w in ("a", "b") for c in plan(w, [resident, other], demand).claim]
    assert [victim for _, _, victim in claims] == [None]
    # alone too: giving chat up would leave it without a holder until its next job (a joining worker would take it
    # cold), then claiming it back would give up another at every job
    alone = [PlanWorker("a", 1, frozenset({"chat"}), idle_s={"chat": 0.4})]
    assert plan("a", alone, demand[:1] + demand[2:]).claim == (("bulk", 1, None),)


def test_a_model_with_waiting_work_is_never_evicted_for_another() -> None:
    workers = _workers("a", "b", slots=1)
    demand = [Demand("busy-a", queued=50, holders=("a",)), Demand("busy-b", queued=50, holders=("b",)),
              Demand("new", queued=10)]
    moves = _everyone(workers, demand)
    assert not any(mv.release for mv in moves.values())
    assert sum(1 for mv in moves.values() for m, _, _ in mv.claim if m == "new") == 1  # the least busy swaps locally


def test_a_hot_model_gets_one_more_copy_on_a_free_worker() -> None:
    workers = _workers("a", "b", "c")
    demand = [Demand("hot", queued=2000, job_s=0.01, holders=("a",))]  # 20 s of work for one copy
    moves = _everyone(workers, demand, copy_backlog_s=2.0)
    copies = [w for w, mv in moves.items() if ("hot", 2, None) in mv.claim]
    assert len(copies) == 1 and copies[0] != "a"  # one copy per round, admitting a second holder only


def test_a_copy_waits_for_the_models_own_cost_not_a_guess() -> None:
    """Work priced from other models' costs (the model has not run yet) earns no copy: its first pass measures it,
    and a guess ten times too high would make a load for nothing."""
    workers = _workers("a", "b", "c")
    guessed = [Demand("hot", queued=2000, job_s=0.01, holders=("a",), measured=False)]
    assert all(not mv.claim for mv in _everyone(workers, guessed, copy_backlog_s=2.0).values())
    measured = [Demand("hot", queued=2000, job_s=0.01, holders=("a",))]
    assert sum(1 for mv in _everyone(workers, measured, copy_backlog_s=2.0).values() if mv.claim) == 1


def test_a_model_being_loaded_is_not_handed_over() -> None:
    """A worker over its slots hands over a model it alone holds and has not loaded; one whose load has begun
    counts as loaded (the placer's own view says so), so its load is not made twice."""
    demand = [Demand(f"m{i}", queued=100, job_s=0.01, holders=("a",)) for i in range(4)]
    idle_b = PlanWorker("b", slots=2)
    assert plan("a", [PlanWorker("a", slots=2), idle_b], demand).release  # over its slots: one goes to b
    loading = PlanWorker("a", slots=2, loaded=frozenset({"m0", "m1", "m2", "m3"}))
    assert not plan("a", [loading, idle_b], demand).release


def test_a_model_with_little_work_gets_no_copy() -> None:
    workers = _workers("a", "b")
    demand = [Demand("warm", queued=50, job_s=0.01, holders=("a",))]  # 0.5 s of work
    assert _everyone(workers, demand, copy_backlog_s=2.0) == {"a": Moves(), "b": Moves()}


def test_copies_stop_at_max_copies() -> None:
    workers = _workers("a", "b", "c")
    demand = [Demand("hot", queued=100_000, job_s=0.01, holders=("a", "b"))]
    assert all(not mv.claim for mv in _everyone(workers, demand, max_copies=2).values())


def test_an_idle_extra_copy_is_dropped_and_the_first_holder_keeps_the_last() -> None:
    workers = [PlanWorker("a", 2, idle_s={"m": 60.0}), PlanWorker("b", 2, idle_s={"m": 60.0})]
    demand = [Demand("m", holders=("a", "b"))]
    assert plan("a", workers, demand, copy_idle_s=10.0) == Moves()
    assert plan("b", workers, demand, copy_idle_s=10.0) == Moves(drop=("m",))
    busy = [Demand("m", queued=3, holders=("a", "b"))]
    assert plan("b", workers, busy, copy_idle_s=10.0) == Moves()


def test_an_overloaded_worker_hands_a_model_it_has_not_loaded_to_a_joining_worker() -> None:
    workers = [PlanWorker("old", 2, frozenset({"m1", "m3"})), PlanWorker("new", 2)]
    demand = [Demand(m, queued=5, held=3, holders=("old",)) for m in ("m0", "m1", "m2", "m3")]
    moves = plan("old", workers, demand)
    assert len(moves.release) == 1 and moves.release[0] in {"m0", "m2"}  # never one it has loaded
    assert plan("new", workers, demand) == Moves()  # it claims the model once it is free


def test_an_over_claimed_worker_frees_an_idle_model_it_has_not_loaded_for_a_free_slot() -> None:
    demand = [Demand("m0", queued=4, holders=("old",)), Demand("m1", holders=("old",)),
              Demand("m2", holders=("old",))]
    joined = [PlanWorker("old", 2, frozenset({"m0", "m2"})), PlanWorker("new", 2)]
    assert plan("old", joined, demand) == Moves(release=("m1",))  # idle, not loaded: the new worker's slot takes it
    full = [PlanWorker("old", 2, frozenset({"m0", "m2"})), PlanWorker("new", 1)]
    taken = [*demand, Demand("x", queued=1, holders=("new",))]
    assert plan("old", full, taken) == Moves()  # no free slot elsewhere: it keeps its claims and swaps locally


def test_a_worker_alone_gives_up_the_claim_of_a_model_it_evicted_and_has_no_jobs_for() -> None:
    # claims sentiment and topic, two slots; topic was evicted for spam, whose job came through the ingress
    alone = [PlanWorker("a", 2, frozenset({"sentiment", "spam"}), idle_s={"topic": 3.0})]
    demand = [Demand("sentiment", holders=("a",)), Demand("topic", holders=("a",), load_s=2.0)]
    assert plan("a", alone, demand) == Moves(release=("topic",))  # it claims it again at its next job
    for busy in (Demand("topic", queued=1, holders=("a",)), Demand("topic", held=1, holders=("a",))):
        assert plan("a", alone, [demand[0], busy]) == Moves()  # jobs waiting or in hand: it keeps the claim
    for fresh in ({"topic": 1.0}, {}):  # it ran just now, or never: on its way in, perhaps, for jobs in hand
        assert plan("a", [PlanWorker("a", 2, frozenset({"sentiment", "spam"}), idle_s=fresh)], demand) == Moves()
    assert plan("a", [*alone, PlanWorker("b", 2)], demand) == Moves()  # not alone, and not over its slots


def test_a_cold_model_goes_to_a_free_slot_before_an_idle_victim() -> None:
    workers = [PlanWorker("a", 1, frozenset({"idle"}), idle_s={"idle": 100.0}), PlanWorker("b", 1)]
    demand = [Demand("idle", holders=("a",)), Demand("new", queued=10)]
    assert plan("b", workers, demand) == Moves(claim=(("new", 1, None),))
    assert plan("a", workers, demand) == Moves()  # its idle model stays loaded


def test_a_worker_missing_from_the_live_list_plans_nothing() -> None:
    assert plan("ghost", _workers("a"), [Demand("m", queued=1)]) == Moves()


def test_with_no_room_a_copy_is_made_only_where_it_shortens_the_run() -> None:
    workers = _workers("a", "b", slots=1)
    long_pole = [Demand("hot", queued=2000, job_s=0.01, holders=("a",)), Demand("small", queued=10, holders=("b",))]
    moves = _everyone(workers, long_pole, copy_backlog_s=2.0)
    assert moves["b"].claim == (("hot", 2, None),) and not moves["a"].claim  # 20 s of work against b's 1 s
    balanced = [Demand("hot", queued=300, job_s=0.01, holders=("a",)),
                Demand("other", queued=250, job_s=0.01, holders=("b",))]  # 3 s against 2.5 s: a load costs more
    assert all(not mv.claim for mv in _everyone(workers, balanced, copy_backlog_s=2.0).values())
    idle = [Demand("hot", queued=2000, job_s=0.01, holders=("a",)), Demand("small", holders=("b",))]
    assert _everyone(workers, idle, copy_backlog_s=2.0)["b"].claim == (("hot", 2, "small"),)  # b's victim goes


def test_a_copy_goes_to_the_long_pole_only_while_the_holders_finish_after_the_rest() -> None:
    workers = _workers("a", "b", "c", slots=3)
    # the hot model's 11 s against 8 s of loads on each of the others: one copy brings it down to the rest
    demand = [Demand("hot", queued=1000, job_s=0.01, holders=("a",)),
              *[Demand(f"m{i}", queued=20, job_s=0.001, load_s=2.0, holders=("b" if i % 2 else "c",))
                for i in range(8)]]
    moves = _everyone(workers, demand, copy_backlog_s=2.0)
    assert sum(1 for mv in moves.values() for m, _, _ in mv.claim if m == "hot") == 1
    done = [Demand("hot", queued=300, job_s=0.01, holders=("a",)), *demand[1:]]  # 3 s left: the others are longer
    assert all(not mv.claim for mv in _everyone(workers, done, copy_backlog_s=2.0).values())
