"""The pure scheduling and eviction policy."""

from __future__ import annotations

from swapless.manager.batching.order import Waiting, choose_next
from swapless.manager.cache.eviction import Cached, choose_victims


def test_nothing_waiting() -> None:
    assert choose_next([], ["a"], 30) is None
    assert choose_next([Waiting("a", 0)], ["a"], 30) is None


def test_loaded_models_first_even_with_less_work() -> None:
    waiting = [Waiting("cold", 50, load_cost_s=1.0), Waiting("warm", 3, load_cost_s=0.0)]
    assert choose_next(waiting, ["warm"], 30) == "warm"


def test_cold_models_by_work_per_load_second() -> None:
    waiting = [Waiting("slow-load", 40, load_cost_s=4.0), Waiting("fast-load", 20, load_cost_s=0.5)]
    assert choose_next(waiting, [], 30) == "fast-load"


def test_starved_job_goes_first_even_if_cold() -> None:
    waiting = [Waiting("warm", 100, oldest_wait_s=1.0, load_cost_s=0), Waiting("rare", 1, oldest_wait_s=31.0)]
    assert choose_next(waiting, ["warm"], 30) == "rare"


def test_interactive_jobs_before_bulk() -> None:
    waiting = [Waiting("bulk", 500, load_cost_s=0), Waiting("web", 1, urgent=1, load_cost_s=1.0)]
    assert choose_next(waiting, ["bulk"], 30) == "web"


def test_cold_interactive_models_take_turns_by_the_wait_of_their_jobs_together() -> None:
    """Among cold interactive models, the one whose jobs have waited longest together: many callers of a model
    waiting a little go before one caller waiting a little longer, but a rare model's turn comes as its wait grows."""
    waiting = [Waiting("popular", 5, oldest_wait_s=0.5, urgent=5), Waiting("rare", 1, oldest_wait_s=2.0, urgent=1)]
    assert choose_next(waiting, [], 30) == "popular"
    waiting = [Waiting("popular", 5, oldest_wait_s=0.5, urgent=5), Waiting("rare", 1, oldest_wait_s=3.0, urgent=1)]
    assert choose_next(waiting, [], 30) == "rare"
    bulk = [Waiting("popular", 30, oldest_wait_s=0.5), Waiting("rare", 1, oldest_wait_s=2.0)]
    assert choose_next(bulk, [], 30) == "popular"  # bulk: the most work per load


def test_forty_tail_models_are_each_served_within_one_turn_of_the_tail() -> None:
    """40 cold interactive models with 1 to 5 jobs each, one arriving every 0.1 s, each turn a 1 s load: the busiest
    goes first, and none waits longer than one turn of the whole tail (40 loads)."""
    load_s, arrivals = 1.0, {f"m{i:02d}": 0.1 * i for i in range(40)}
    jobs = {m: 1 + int(m[1:]) % 5 for m in arrivals}
    now, served, waited = 4.0, [], {}
    pending = dict(arrivals)
    while pending:
        waiting = [Waiting(m, jobs[m], oldest_wait_s=now - at, urgent=1, load_cost_s=load_s)
                   for m, at in pending.items() if at <= now]
        chosen = choose_next(waiting, [], max_wait_s=1e9)
        assert chosen is not None
        served.append(chosen)
        waited[chosen] = now - pending.pop(chosen)
        now += load_s
    assert jobs[served[0]] == 5 and sorted(served) == sorted(arrivals)
    assert max(waited.values()) <= len(arrivals) * load_s, waited


def test_no_eviction_when_it_fits() -> None:
    assert choose_victims([Cached("a", 10)], incoming_bytes=10, max_models=2, memory_budget_bytes=None) == []


def test_lru_victim_by_count() -> None:
    cached = [Cached("old", 10), Cached("new", 10)]
    assert choose_victims(cached, incoming_bytes=10, max_models=2, memory_budget_bytes=None) == ["old"]


def test_pinned_models_are_never_victims() -> None:
    cached = [Cached("old", 10, pinned=True), Cached("new", 10)]
    assert choose_victims(cached, incoming_bytes=10, max_models=2, memory_budget_bytes=None) == ["new"]
    all_pinned = [Cached("a", 10, pinned=True), Cached("b", 10, pinned=True)]
    assert choose_victims(all_pinned, incoming_bytes=10, max_models=2, memory_budget_bytes=None) is None


def test_memory_budget_evicts_as_many_as_needed() -> None:
    cached = [Cached("a", 40), Cached("b", 40), Cached("c", 10)]
    assert choose_victims(cached, incoming_bytes=50, max_models=10, memory_budget_bytes=100) == ["a"]
    assert choose_victims(cached, incoming_bytes=95, max_models=10, memory_budget_bytes=100) == ["a", "b", "c"]
    assert choose_victims(cached, incoming_bytes=90, max_models=10, memory_budget_bytes=100) == ["a", "b"]


def test_models_without_waiting_work_go_first() -> None:
    cached = [Cached("busy-old", 10), Cached("idle-new", 10)]
    victims = choose_victims(cached, incoming_bytes=10, max_models=2, memory_budget_bytes=None, keep={"busy-old": 5})
    assert victims == ["idle-new"]


def test_a_starved_bulk_model_does_not_take_an_interactive_job_s_turn() -> None:
    # a bulk burst of minutes: every bulk job is past max_wait_s, yet the interactive job still goes first
    waiting = [Waiting("bulk", 3000, oldest_wait_s=120.0, load_cost_s=0), Waiting("chat", 1, urgent=1, load_cost_s=0)]
    assert choose_next(waiting, ["bulk", "chat"], 30) == "chat"


def test_among_starved_models_the_loaded_one_keeps_its_turn() -> None:
    # all of a long burst is past max_wait_s: the model in hand goes on instead of switching at every group
    waiting = [Waiting("cold", 3000, oldest_wait_s=90.0, load_cost_s=2.0),
               Waiting("warm", 1000, oldest_wait_s=60.0, load_cost_s=0)]
    assert choose_next(waiting, ["warm"], 30) == "warm"
    # once the warm model's starved jobs are done, the cold starved one comes next, however much waits elsewhere
    waiting = [Waiting("cold", 3, oldest_wait_s=90.0, load_cost_s=2.0),
               Waiting("warm", 1000, oldest_wait_s=5.0, load_cost_s=0)]
    assert choose_next(waiting, ["warm"], 30) == "cold"


def test_resident_models_are_evicted_last() -> None:
    cached = [Cached("chat", 10, resident=True), Cached("bulk-a", 10), Cached("bulk-b", 10)]
    # LRU alone would take chat; an idle bulk model goes first, then one with work, and chat only after them
    assert choose_victims(cached, incoming_bytes=10, max_models=3, memory_budget_bytes=None) == ["bulk-a"]
    keep = {"bulk-a": 5, "bulk-b": 5}
    assert choose_victims(cached, incoming_bytes=10, max_models=3, memory_budget_bytes=None, keep=keep) == ["bulk-a"]
    assert choose_victims(cached, incoming_bytes=10, max_models=1, memory_budget_bytes=None,
                          keep=keep) == ["bulk-a", "bulk-b", "chat"]


def test_a_model_loading_ahead_goes_before_another_cold_model_even_a_starved_one() -> None:
    """With a model being loaded ahead, the next cold group is that model's: a second cold load beside it would
    evict a loaded (resident) model; the starved one loads right after."""
    waiting = [Waiting("tail-a", 1, oldest_wait_s=9.0, urgent=1), Waiting("tail-b", 3, oldest_wait_s=2.0, urgent=3)]
    assert choose_next(waiting, ["hot"], max_wait_s=5.0) == "tail-a"  # starved: its turn
    assert choose_next(waiting, ["hot"], max_wait_s=5.0, loading=["tail-b"]) == "tail-b"
    loaded = [*waiting, Waiting("hot", 2, oldest_wait_s=0.1, urgent=2)]
    assert choose_next(loaded, ["hot"], max_wait_s=5.0, starved_first=False, loading=["tail-b"]) == "hot"
    bulk_only = [Waiting("tail-a", 1, oldest_wait_s=9.0, urgent=1), Waiting("tail-b", 3, oldest_wait_s=2.0)]
    assert choose_next(bulk_only, [], max_wait_s=5.0, loading=["tail-b"]) == "tail-a"  # interactive jobs go first
