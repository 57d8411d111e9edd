"""The host tier seen from outside: a real worker process on the tiny real models and the real Redis (its
heartbeat, ``swapless status``, its metrics and the learned store), and placement's cost of a model in a worker's
host tier (the pure plan)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from swapless.config.settings import Settings
from swapless.tasks.client import Client
from swapless.tasks.cluster.members import Heartbeat, read_heartbeats
from swapless.tasks.cluster.plan import Demand, PlanWorker, plan
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.view import render_worker
from tests.conftest import WorkerProcess
from tests.stack import free_port


def _beat(client: redis.Redis, settings: Settings, ready: Callable[[Heartbeat], bool]) -> Heartbeat:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        beats = read_heartbeats(client, Keyspace.of(settings))
        if beats and ready(beats[0]):
            return beats[0]
        time.sleep(0.1)
    raise AssertionError(f"no heartbeat as expected: {beats}")


def test_a_worker_with_a_host_tier_swaps_in_and_shows_each_models_tier(
    start_worker: Callable[..., WorkerProcess], settings: Settings
) -> None:
    port = free_port()
    worker = start_worker("--max-models", "1", "--host-memory-budget", "1GiB", "--host-max-models", "2",
                          "--metrics-port", str(port), "--hostname", "tiers@%h",
                          env={"SWAPLESS_HEARTBEAT_INTERVAL_S": "0.3"})
    client = Client()
    first = client.submit("sentiment", "what a lovely day").get(timeout=60)
    for model_id in ["spam", "sentiment"]:  # spam evicts sentiment into host memory; sentiment comes back by a copy
        client.submit(model_id, "what a lovely day").get(timeout=60)
    again = client.submit("sentiment", "what a lovely day").get(timeout=60)
    assert again == first, "the module moved to host memory and back gives the same answer"
    log = worker.log()
    assert log.count("loaded sentiment (") == 1 and "swapped sentiment in from host memory" in log
    assert "moved sentiment to host memory" in log and "moved spam to host memory" in log

    r = redis.Redis.from_url(settings.redis.broker_url)
    # the cache counts a swap-in when it happens, the model's row when its group ends: wait for both
    beat = _beat(r, settings, lambda b: b.cache.swap_ins >= 1 and bool(b.host)
                 and "sentiment" in b.models and b.models["sentiment"].swap_ins >= 1)
    assert [e.model_id for e in beat.loaded] == ["sentiment"]
    assert [(e.model_id, e.tier) for e in beat.host] == [("spam", "host")]
    assert (beat.cache.host_max_models, beat.cache.host_budget_bytes) == (2, 1 << 30)
    assert beat.cache.host_used_bytes == beat.host[0].bytes > 0
    assert beat.cache.loads == 2 and beat.cache.swap_outs == 2 and beat.models["sentiment"].swap_ins == 1

    console = Console(width=400, record=True)
    console.print(render_worker(beat, time.time()))
    text = console.export_text()
    assert "host tier 1/2 models" in text and "swap-ins 1" in text
    spam_row = next(line for line in text.splitlines() if " spam " in line)
    assert "│ host" in spam_row, "spam waits in host memory"

    found = {(s.name, frozenset(s.labels.items())): s.value
             for family in text_string_to_metric_families(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
             for s in family.samples}
    assert found[("swapless_model_tier", frozenset({("model", "sentiment"), ("tier", "device")}))] == 1
    assert found[("swapless_model_tier", frozenset({("model", "spam"), ("tier", "host")}))] == 1
    assert found[("swapless_models_host", frozenset())] == 1
    assert found[("swapless_model_swap_in_seconds_count", frozenset({("model", "sentiment")}))] == 1

    deadline = time.monotonic() + 20
    learned: dict[str, object] = {}
    while time.monotonic() < deadline and "host_load_s" not in learned:  # written at a heartbeat
        raw = r.hget(Keyspace.of(settings).learned("cpu"), "sentiment")
        learned = json.loads(raw) if raw else {}
        time.sleep(0.1)
    assert "host_load_s" in learned and "load_s" in learned
    r.close()


def test_placement_counts_a_model_in_a_workers_host_tier_as_a_swap_in_not_a_load() -> None:
    workers = [PlanWorker("a", slots=2), PlanWorker("b", slots=2, host=frozenset({"m"}))]
    cold = Demand("m", queued=10, job_s=0.01, load_s=2.0, host_load_s=0.2)
    # b holds nothing on its device either, but m waits in its host memory: a copy away there, a load on a
    assert plan("b", workers, [cold]).claim == (("m", 1, None),)
    assert plan("a", workers, [cold]).claim == ()
    # without a measured swap-in, the host tier does not count: the tie goes by the hash
    unknown = Demand("m", queued=10, job_s=0.01, load_s=2.0)
    assert cold.load_on(workers[1]) == 0.2 and unknown.load_on(workers[1]) == 2.0
    busy = [PlanWorker("a", slots=2), PlanWorker("b", slots=2, loaded=frozenset({"x"}), host=frozenset({"m"}))]
    other = Demand("x", queued=100, job_s=0.01, load_s=2.0, holders=("b",))
    # b is busy for 1 s with x, then m is 0.2 s away; on a it is 2 s away: b is still done sooner
    assert plan("b", busy, [cold, other]).claim == (("m", 1, None),)
