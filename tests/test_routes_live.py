"""Routes through a real worker on the real Redis: splits, sticky keys, shadows, routing by input type, and weights
changed at run time. The versions are ``crashy`` echo models (tests/crashy.py): each result echoes the model that
computed it, and every input that reaches a model is logged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from config.errors import InputError
from manager.registry.store import ModelStore
from tasks.broker.routes import read_shadow
from tasks.client import Client
from tasks.keyspace import Keyspace
from tasks.protocol import PREDICT_TASK
from tests.crashy import crashy_entry
from tests.faultkit import FaultEnv, wait_for

pytestmark = pytest.mark.slow


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``swapless ARGS`` with this test's environment, its tables unwrapped."""
    return subprocess.run([sys.executable, "-m", "tasks.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})

ROUTES = [
    crashy_entry("sent-v1"),
    crashy_entry("sent-v2"),
    crashy_entry("sent-v3"),
    {"id": "sentiment", "route": {"sent-v1": 75, "sent-v2": 25}, "shadow": {"sent-v3": 50}},
    {"id": "classify", "by_type": {"text": "sentiment"}},
]


def test_a_route_splits_by_weight_sticks_by_key_and_says_which_model_served(faults: FaultEnv) -> None:
    faults.write_models(real=False, extra=ROUTES)
    faults.worker()
    client = Client()
    jobs = client.submit_jobs([("sentiment", f"split-{i}") for i in range(400)])
    stored = client.gather(jobs, timeout=60)
    assert all(s.state == "SUCCESS" for s in stored)
    assert all(s.model == s.value["model"] for s in stored)  # the result names the model that computed it
    served = Counter(s.model for s in stored)
    assert set(served) == {"sent-v1", "sent-v2"} and 230 <= served["sent-v1"] <= 370, served  # 75 % of 400 ± 7 sd
    # a sticky key: the same version every time
    keyed = client.submit_jobs([("sentiment", f"user-{i % 5}") for i in range(30)], keys=[f"user-{i % 5}" for i in range(30)])
    by_key: dict[str, set[str]] = {}
    for job, result in zip(keyed, client.gather(keyed, timeout=60), strict=True):
        by_key.setdefault(result.value["echo"], set()).add(result.model or "")
    assert all(len(models) == 1 for models in by_key.values()), by_key
    # a plain Celery producer's job to the route: the worker routes it by its id, as Client would
    sent = client.app.send_task(PREDICT_TASK, args=["sentiment", "plain-celery"], queue=faults.queue)
    result = client.job(sent.id)
    assert result.get(timeout=30)["echo"] == "plain-celery"
    store = ModelStore.from_file(faults.models_file)
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


def test_shadow_copies_run_apart_and_their_agreement_is_counted(faults: FaultEnv) -> None:
    faults.write_models(real=False, extra=ROUTES)
    faults.worker()
    client = Client()
    jobs = client.submit_jobs([("sentiment", f"shadowed-{i}") for i in range(200)])
    stored = client.gather(jobs, timeout=60)
    assert {s.model for s in stored} <= {"sent-v1", "sent-v2"}  # the caller never gets the shadow's result

    def compared() -> int:
        return sum(total for (route, _, shadow), (_, total) in read_shadow(client.redis, Keyspace(faults.queue, faults.key_prefix)).items()
                   if route == "sentiment" and shadow == "sent-v3")

    wait_for(lambda: compared() >= 60, 30, "shadow copies to be compared")
    ran_on_v3 = [line for line in faults.exec_log.read_text().splitlines() if "\tsent-v3\t" in line]
    assert 60 <= len(ran_on_v3) <= 140, len(ran_on_v3)  # 50 % of 200 ± 6 sd
    agreement = read_shadow(client.redis, Keyspace(faults.queue, faults.key_prefix))
    for (route, _, _), (agreed, total) in agreement.items():
        assert route == "sentiment" and agreed == 0 < total  # echoes name their own model: top outputs differ
    status = cli("status", "--json")
    assert status.returncode == 0, status.stderr
    shown = [entry for entry in json.loads(status.stdout)["shadow"] if entry["shadow"] == "sent-v3"]
    assert sum(entry["compared"] for entry in shown) >= 60 and all(entry["agreed"] == 0 for entry in shown)
    listed = cli("models")
    assert "sent-v1 vs sent-v3: 0/" in listed.stdout or "sent-v2 vs sent-v3: 0/" in listed.stdout, listed.stdout


def test_routing_by_input_type_and_an_input_no_branch_takes(faults: FaultEnv) -> None:
    faults.write_models(real=False, extra=ROUTES)
    faults.worker()
    client = Client()
    text = client.submit("classify", "some text")
    assert text.get(timeout=30)["echo"] == "some text" and text.status().model in ("sent-v1", "sent-v2")
    bad = client.submit("classify", 5)  # not text, not an image: the worker answers it alone
    with pytest.raises(InputError, match="route 'classify' takes text inputs, not a number input"):
        bad.get(timeout=30)
    assert client.submit("echo", "still fine").get(timeout=30)["echo"] == "still fine"


def test_swapless_route_changes_the_split_without_a_restart(faults: FaultEnv) -> None:
    faults.write_models(real=False, extra=ROUTES)
    faults.worker()
    client = Client()
    moved = cli("route", "sentiment", "sent-v2=1")
    assert moved.returncode == 0, moved.stderr
    assert "sent-v2 100.0 % (run-time)" in moved.stdout
    time.sleep(1.1)  # the client's cached weights are at most a second old
    stored = client.gather(client.submit_jobs([("sentiment", f"moved-{i}") for i in range(50)]), timeout=60)
    assert {s.model for s in stored} == {"sent-v2"}
    sent = client.app.send_task(PREDICT_TASK, args=["sentiment", "plain-after-move"], queue=faults.queue)
    client.job(sent.id).get(timeout=30)
    assert client.job(sent.id).status().model == "sent-v2"  # the worker follows the run-time weights too
    unknown = cli("route", "sentiment", "sent-v9=1")
    assert unknown.returncode == 2 and "'sent-v9' is not one of its versions" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    cleared = cli("route", "sentiment", "--clear")
    assert cleared.returncode == 0 and "sent-v1 75.0 %, sent-v2 25.0 %" in cleared.stdout


def test_the_gateway_routes_with_a_sticky_key_and_names_the_serving_model(faults: FaultEnv) -> None:
    from fastapi.testclient import TestClient

    from tasks.gateway.app import create_app

    faults.write_models(real=False, extra=ROUTES)
    faults.worker()
    with TestClient(create_app(), base_url="http://localhost") as http:
        replies = [http.post("/predict", json={"model_id": "sentiment", "input": f"web-{i}", "key": "user-9"})
                   for i in range(8)]
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
        models = {r.json()["model"] for r in replies}
        assert len(models) == 1 and models <= {"sent-v1", "sent-v2"}  # one key, one version
        assert all(r.json()["result"]["model"] == r.json()["model"] for r in replies)
        queued = http.post("/jobs", json={"model_id": "classify", "input": "typed"}).json()
        wait_for(lambda: http.get(queued["status_url"]).json()["state"] != "PENDING", 30, "the routed job's result")
        state = http.get(queued["status_url"]).json()
        assert state["state"] == "SUCCESS" and state["model"] in ("sent-v1", "sent-v2")


def test_bulk_routes_each_record_and_a_key_field_keeps_a_key_on_one_version(faults: FaultEnv, tmp_path: Path) -> None:
    faults.write_models(real=False, extra=ROUTES)
    faults.worker()
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
    store = ModelStore.from_file(faults.models_file)
    assert all(models == {store.route("sentiment", "x", user).model_id} for user, models in by_user.items())
    unkeyed = cli("bulk", "sentiment", str(source), "-o", str(tmp_path / "unkeyed.jsonl"), "--chunk-size", "50",
                  "--no-local")
    assert unkeyed.returncode == 0, unkeyed.stderr
    served = Counter(json.loads(line)["result"]["model"] for line in (tmp_path / "unkeyed.jsonl").read_text().splitlines())
    assert set(served) == {"sent-v1", "sent-v2"} and 170 <= served["sent-v1"] <= 280, served  # split per record


def test_reload_applies_the_file_s_weights_during_a_burst_losing_nothing_and_refuses_a_bad_file(
    faults: FaultEnv,
) -> None:
    import threading

    faults.write_models(real=False, extra=ROUTES)
    faults.worker()
    client = Client()
    jobs: list[Any] = []
    stop = threading.Event()

    def burst() -> None:
        while not stop.is_set():
            jobs.append(client.submit("sentiment", f"burst-{len(jobs)}"))
            time.sleep(0.005)

    sender = threading.Thread(target=burst)
    sender.start()
    time.sleep(0.5)
    edited = [dict(entry) for entry in ROUTES]
    edited[3] = {"id": "sentiment", "route": {"sent-v2": 1}}  # everything to v2 now
    faults.write_models(real=False, extra=edited)
    reloaded = cli("reload")
    assert reloaded.returncode == 0, reloaded.stderr
    assert "sent-v2 100.0 % (run-time)" in reloaded.stdout
    time.sleep(1.1)  # the client's cached weights are at most a second old
    followed = len(jobs)
    time.sleep(0.5)
    stop.set()
    sender.join(30)
    stored = client.gather(jobs, timeout=120)
    assert all(s.state == "SUCCESS" for s in stored)  # nothing lost
    assert all(s.model == s.value["model"] for s in stored)  # each job ran whole on the version it names
    served = [s.model for s in stored]
    assert "sent-v1" in served[:50] and len(served) > followed + 20  # the split changed mid-burst
    assert set(served[followed:]) == {"sent-v2"}  # a second after the reload, every job goes to v2
    broken = [dict(entry) for entry in ROUTES]
    broken[3] = {"id": "sentiment", "route": {"ghost": 1}}
    faults.write_models(real=False, extra=broken)
    refused = cli("reload")
    assert refused.returncode == 2 and "unknown target 'ghost'" in refused.stderr
    assert "nothing was reloaded: the running routes stay as they were" in refused.stderr
    assert {s.model for s in client.gather([client.submit("sentiment", f"after-{i}") for i in range(20)], timeout=60)} == {"sent-v2"}
