"""Routes through a real worker on the real Redis: splits, sticky keys, shadows, routing by input type, and weights
changed at run time. The versions are ``crashy`` models (tests/crashy.py): each ``echo`` result names the model that
computed it, two ``labels`` models agree on every top label, and every input that reaches a model is logged.

One worker serves the module (``one_worker``); each test reads only its own jobs, and after each the run-time
weights, the shadow counts and the models file are as the module began. The tests that change the weights at run
time come last: the worker caches weights for up to a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swapless.config.errors import InputError
from swapless.manager.registry.store import ModelStore
from swapless.tasks.client import Client
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import PREDICT_TASK
from swapless.tasks.routing import read_shadow
from tests.crashy import crashy_entry
from tests.faultkit import FaultEnv, wait_for

pytestmark = pytest.mark.slow

#: How long producers and workers reuse the run-time weights they read (tasks.routing.RouteOverrides).
WEIGHTS_TTL_S = 1.0
#: A read in flight when the weights change can return the old ones and be stamped a little later.
READ_MARGIN_S = 0.25


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``swapless ARGS`` with this test's environment, its tables unwrapped."""
    return subprocess.run(
        [sys.executable, "-m", "swapless", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


ROUTES = [
    crashy_entry("sent-v1"),
    crashy_entry("sent-v2"),
    crashy_entry("sent-v3"),
    crashy_entry("lab-v1", "labels"),
    crashy_entry("lab-v2", "labels"),
    {"id": "sentiment", "route": {"sent-v1": 75, "sent-v2": 25}, "shadow": {"sent-v3": 50}},
    {"id": "classify", "by_type": {"text": "sentiment"}},
    {"id": "agreeing", "route": {"lab-v1": 1}, "shadow": {"lab-v2": 100}},
]


@pytest.fixture(scope="module")
def module_faults(module_faults: FaultEnv) -> FaultEnv:
    """The module's environment, its models file with the routes above (written before its worker starts)."""
    module_faults.write_models(real=False, extra=ROUTES)
    return module_faults


@pytest.fixture
def routes(one_worker: FaultEnv) -> Iterator[FaultEnv]:
    """The module's worker; afterwards the file's weights hold again and no shadow has been counted."""
    yield one_worker
    # a test's shadow copies (bulk priority, never awaited by the callers) may still run: counted after the counts
    # are cleared, they would be the next test's
    one_worker.wait_broker_idle(60)
    one_worker.write_models(real=False, extra=ROUTES)
    with one_worker.broker() as client:
        keyspace = Keyspace(one_worker.queue, one_worker.key_prefix)
        client.delete(keyspace.routes, keyspace.shadow_counts)


def _store(faults: FaultEnv) -> ModelStore:
    return ModelStore.from_file(faults.models_file)


def test_a_route_splits_by_weight_sticks_by_key_and_says_which_model_served(routes: FaultEnv) -> None:
    client = Client()
    jobs = client.submit_jobs([("sentiment", f"split-{i}") for i in range(400)])
    stored = client.gather(jobs, timeout=60)
    assert all(s.state == "SUCCESS" for s in stored)
    assert all(s.model == s.value["model"] for s in stored)  # the result names the model that computed it
    served = Counter(s.model for s in stored)
    assert set(served) == {"sent-v1", "sent-v2"} and 230 <= served["sent-v1"] <= 370, served  # 75 % of 400 ± 7 sd
    # a sticky key: the version its key picks, every time
    keys = [f"user-{i % 5}" for i in range(30)]
    keyed = client.submit_jobs([("sentiment", f"keyed-{i}") for i in range(30)], keys=keys)
    store = _store(routes)
    for key, result in zip(keys, client.gather(keyed, timeout=60), strict=True):
        assert result.model == store.route("sentiment", "x", key).model_id, (key, result)
    # a plain Celery producer's job to the route: the worker routes it by its id, as Client would
    sent = client.app.send_task(PREDICT_TASK, args=["sentiment", "plain-celery"], queue=routes.queue)
    result = client.job(sent.id)
    assert result.get(timeout=30)["echo"] == "plain-celery"
    assert result.status().model == store.route("sentiment", "plain-celery", sent.id).model_id


def test_a_plain_celery_job_for_a_route_follows_placement_and_a_chunk_for_it_runs_each_item_on_its_version(
    faults: FaultEnv,
) -> None:
    """Two workers, one model slot each, one copy per model: each version of the split is held by one worker. A
    plain Celery producer's job to the route lands in the ingress; the worker that takes it moves it to the list of
    the version the route picks (by the job's id), so that version's holder runs it. A chunk for the route is run by
    the worker that takes it, each item on the version its id picks."""
    faults.write_models(real=False, extra=[*ROUTES[:2], {"id": "sentiment", "route": {"sent-v1": 50, "sent-v2": 50}}])
    faults.set(SWAPLESS_MAX_MODELS="1", SWAPLESS_MAX_COPIES="1")
    faults.worker("--hostname", "one@%h")
    faults.worker("--hostname", "two@%h")
    client = Client()
    for version in ("sent-v1", "sent-v2"):  # each version claimed, by one worker each
        client.submit(version, f"warm-{version}").get(timeout=60)
    holder = {version: faults.pids_of(f"warm-{version}")[0] for version in ("sent-v1", "sent-v2")}
    assert holder["sent-v1"] != holder["sent-v2"], "one slot each: the versions are on two workers"
    store = ModelStore.from_file(faults.models_file)
    sent = [client.app.send_task(PREDICT_TASK, args=["sentiment", f"plain-{i}"], queue=faults.queue) for i in range(12)]
    for i, job in enumerate(sent):
        result = client.job(job.id)
        assert result.get(timeout=60)["echo"] == f"plain-{i}"
        picked = store.route("sentiment", f"plain-{i}", job.id).model_id
        assert result.status().model == picked
        assert faults.pids_of(f"plain-{i}") == [holder[picked]], f"plain-{i} ran off its version's holder"
    assert {store.route("sentiment", f"plain-{i}", job.id).model_id for i, job in enumerate(sent)} == {
        "sent-v1", "sent-v2"}, "both versions were picked"
    items = client.submit_many("sentiment", [f"item-{i}" for i in range(8)], chunk_size=8)
    stored = client.gather(items, timeout=60)
    assert [s.value["echo"] for s in stored] == [f"item-{i}" for i in range(8)]
    assert {s.value["model"] for s in stored} == {"sent-v1", "sent-v2"}  # each item on the version its id picks
    assert len({pid for i in range(8) for pid in faults.pids_of(f"item-{i}")}) == 1, "one worker ran the chunk"


def test_shadow_copies_run_apart_and_never_reach_the_caller(routes: FaultEnv) -> None:
    client = Client()
    jobs = client.submit_jobs([("sentiment", f"shadowed-{i}") for i in range(200)])
    stored = client.gather(jobs, timeout=60)
    assert {s.model for s in stored} <= {"sent-v1", "sent-v2"}  # the caller never gets the shadow's result
    assert all(s.value["model"] == s.model for s in stored)
    # the shadow's own result is stored apart, under <job id>.shadow0, for the jobs the route gave a copy
    store = _store(routes)
    copied = [i for i, job in enumerate(jobs) if store.route("sentiment", f"shadowed-{i}", job.id).shadows]
    assert 60 <= len(copied) <= 140, len(copied)  # 50 % of 200 ± 6 sd
    shadows = client.gather([client.job(f"{jobs[i].id}.shadow0") for i in copied], timeout=60)
    assert all(s.state == "SUCCESS" and s.model == s.value["model"] == "sent-v3" for s in shadows), shadows[:3]
    assert [s.value["echo"] for s in shadows] == [f"shadowed-{i}" for i in copied]
    uncopied = [job for i, job in enumerate(jobs) if i not in copied]
    assert all(s.state == "PENDING" for s in client.fetch([f"{job.id}.shadow0" for job in uncopied]))

    def compared() -> int:
        return sum(
            total
            for (route, _, shadow), (_, total) in read_shadow(
                client.redis, Keyspace(routes.queue, routes.key_prefix)
            ).items()
            if route == "sentiment" and shadow == "sent-v3"
        )

    wait_for(lambda: compared() == len(shadows), 30, "every shadow copy to be compared",
             on_timeout=lambda: f"{compared()} compared, {len(shadows)} shadow copies")
    agreement = read_shadow(client.redis, Keyspace(routes.queue, routes.key_prefix))
    for (route, _, _), (agreed, total) in agreement.items():
        assert route == "sentiment" and agreed == 0 < total  # echoes name their own model: top outputs differ
    status = cli("status", "--json")
    assert status.returncode == 0, status.stderr
    shown = [entry for entry in json.loads(status.stdout)["shadow"] if entry["shadow"] == "sent-v3"]
    assert sum(entry["compared"] for entry in shown) == len(shadows) and all(entry["agreed"] == 0 for entry in shown)
    listed = cli("models")
    assert "sent-v1 vs sent-v3: 0/" in listed.stdout or "sent-v2 vs sent-v3: 0/" in listed.stdout, listed.stdout


def test_a_shadow_that_agrees_is_counted_as_agreeing(routes: FaultEnv) -> None:
    client = Client()
    jobs = client.submit_jobs([("agreeing", f"agree-{i}") for i in range(20)])
    stored = client.gather(jobs, timeout=60)
    assert [s.value for s in stored] == [[{"label": f"agree-{i}", "score": 1.0}] for i in range(20)]
    assert {s.model for s in stored} == {"lab-v1"}  # the served version's result, never the shadow's
    shadows = client.gather([client.job(f"{job.id}.shadow0") for job in jobs], timeout=60)
    assert all(s.state == "SUCCESS" and s.model == "lab-v2" for s in shadows)  # every job shadowed (100 %)

    def counted() -> dict[tuple[str, str, str], tuple[int, int]]:
        return read_shadow(client.redis, Keyspace(routes.queue, routes.key_prefix))

    wait_for(lambda: counted().get(("agreeing", "lab-v1", "lab-v2")) == (20, 20), 30,
             "20 agreeing comparisons of lab-v2 with lab-v1", on_timeout=lambda: str(counted()))
    listed = cli("models")
    assert "lab-v1 vs lab-v2: 20/20" in listed.stdout, listed.stdout


def test_routing_by_input_type_and_an_input_no_branch_takes(routes: FaultEnv) -> None:
    client = Client()
    text = client.submit("classify", "some text")
    assert text.get(timeout=30)["echo"] == "some text" and text.status().model in ("sent-v1", "sent-v2")
    bad = client.submit("classify", 5)  # not text, not an image: the worker answers it alone
    with pytest.raises(InputError, match="route 'classify' takes text inputs, not a number input"):
        bad.get(timeout=30)
    assert client.submit("echo", "still fine").get(timeout=30)["echo"] == "still fine"


def test_the_gateway_routes_with_a_sticky_key_and_names_the_serving_model(routes: FaultEnv) -> None:
    from fastapi.testclient import TestClient

    from swapless.tasks.gateway.app import create_app

    store = _store(routes)
    picks: dict[str, str] = {}  # a key for each version: ignoring the key would send some requests elsewhere
    for key in (f"user-{i}" for i in range(200)):
        picks.setdefault(store.route("sentiment", "x", key).model_id, key)
    assert set(picks) == {"sent-v1", "sent-v2"}
    with TestClient(create_app(), base_url="http://localhost") as http:
        for version, key in picks.items():
            replies = [http.post("/predict", json={"model_id": "sentiment", "input": f"web-{key}-{i}", "key": key})
                       for i in range(10)]
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
            assert [r.json()["model"] for r in replies] == [version] * 10, key  # one key, its one version
            assert all(r.json()["result"]["model"] == version for r in replies)
        queued = http.post("/jobs", json={"model_id": "classify", "input": "typed"}).json()
        wait_for(lambda: http.get(queued["status_url"]).json()["state"] != "PENDING", 30, "the routed job's result")
        state = http.get(queued["status_url"]).json()
        assert state["state"] == "SUCCESS" and state["model"] in ("sent-v1", "sent-v2")


def test_bulk_routes_each_record_and_a_key_field_keeps_a_key_on_one_version(routes: FaultEnv, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": f"r{i}", "text": f"bulk-{i}", "user": f"u{i % 7}"}) + "\n"
                              for i in range(300)))
    out = tmp_path / "out.jsonl"
    done = cli("bulk", "sentiment", str(source), "-o", str(out), "--id-field", "id", "--key-field", "user",
               "--chunk-size", "50", "--no-local")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["key"] for line in lines] == [f"r{i}" for i in range(300)]
    by_user: dict[str, set[str]] = {}
    for i, line in enumerate(lines):
        by_user.setdefault(f"u{i % 7}", set()).add(line["result"]["model"])
    assert all(len(models) == 1 for models in by_user.values()), by_user  # one version per key, across chunks
    store = _store(routes)
    assert all(models == {store.route("sentiment", "x", user).model_id} for user, models in by_user.items())
    unkeyed = cli("bulk", "sentiment", str(source), "-o", str(tmp_path / "unkeyed.jsonl"), "--chunk-size", "50",
                  "--no-local")
    assert unkeyed.returncode == 0, unkeyed.stderr
    served = Counter(json.loads(line)["result"]["model"]
                     for line in (tmp_path / "unkeyed.jsonl").read_text().splitlines())
    assert set(served) == {"sent-v1", "sent-v2"} and 170 <= served["sent-v1"] <= 280, served  # split per record


# -- weights changed at run time (last: the worker keeps weights it read for up to a second) ----------------------


def test_swapless_route_changes_the_split_without_a_restart(routes: FaultEnv) -> None:
    moved = cli("route", "sentiment", "sent-v2=1")
    changed_at = time.monotonic()
    assert moved.returncode == 0, moved.stderr
    assert "sent-v2 100.0 % (run-time)" in moved.stdout
    client = Client()  # reads the weights on its first routed job: the new ones
    stored = client.gather(client.submit_jobs([("sentiment", f"moved-{i}") for i in range(50)]), timeout=60)
    assert {s.model for s in stored} == {"sent-v2"}
    # The worker routes plain Celery jobs with weights it may have read up to a second before the change: once
    # that second (and a read in flight) is over, every one goes to v2 (1 in 4 would by the file's weights).
    time.sleep(max(0.0, changed_at + WEIGHTS_TTL_S + READ_MARGIN_S - time.monotonic()))
    plain = [client.job(client.app.send_task(PREDICT_TASK, args=["sentiment", f"plain-after-move-{i}"],
                                             queue=routes.queue).id) for i in range(10)]
    assert {s.model for s in client.gather(plain, timeout=30)} == {"sent-v2"}
    unknown = cli("route", "sentiment", "sent-v9=1")
    assert unknown.returncode == 2 and "'sent-v9' is not one of its versions" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    cleared = cli("route", "sentiment", "--clear")
    assert cleared.returncode == 0 and "sent-v1 75.0 %, sent-v2 25.0 %" in cleared.stdout


def test_reload_applies_the_file_s_weights_during_a_burst_losing_nothing_and_refuses_a_bad_file(
    routes: FaultEnv,
) -> None:
    client = Client()
    sent: list[tuple[float, Any]] = []  # (when its submit began, the job)
    stop = threading.Event()

    def burst() -> None:
        while not stop.is_set():
            began = time.monotonic()
            sent.append((began, client.submit("sentiment", f"burst-{len(sent)}")))
            time.sleep(0.005)

    sender = threading.Thread(target=burst)
    sender.start()
    wait_for(lambda: len(sent) >= 50, 30, "the burst to send 50 jobs with the file's weights")
    edited = [dict(entry) for entry in ROUTES]
    edited[5] = {"id": "sentiment", "route": {"sent-v2": 1}}  # everything to v2 now
    routes.write_models(real=False, extra=edited)
    reloaded = cli("reload")
    reloaded_at = time.monotonic()  # the new weights were in Redis before this
    assert reloaded.returncode == 0, reloaded.stderr
    assert "sent-v2 100.0 % (run-time)" in reloaded.stdout
    settled_at = reloaded_at + WEIGHTS_TTL_S + READ_MARGIN_S  # from then on the producer can only use the new ones
    wait_for(lambda: sum(1 for began, _ in sent if began >= settled_at) >= 30, 30, "30 jobs sent after that")
    stop.set()
    sender.join(30)
    stored = client.gather([job for _, job in sent], timeout=120)
    assert all(s.state == "SUCCESS" for s in stored)  # nothing lost
    assert all(s.model == s.value["model"] for s in stored)  # each job ran whole on the version it names
    served = [(began, s.model) for (began, _), s in zip(sent, stored, strict=True)]
    assert "sent-v1" in [model for _, model in served[:50]]  # the file's split before the reload
    late = [model for began, model in served if began >= settled_at]
    assert set(late) == {"sent-v2"}, Counter(late)  # within a second of the reload, every job goes to v2
    broken = [dict(entry) for entry in ROUTES]
    broken[5] = {"id": "sentiment", "route": {"ghost": 1}}
    routes.write_models(real=False, extra=broken)
    refused = cli("reload")
    assert refused.returncode == 2 and "unknown target 'ghost'" in refused.stderr
    assert "nothing was reloaded: the running routes stay as they were" in refused.stderr
    after = client.gather([client.submit("sentiment", f"after-{i}") for i in range(20)], timeout=60)
    assert {s.model for s in after} == {"sent-v2"}
