"""Interactive models keep their place through a bulk burst, on a real worker and the simulated device: a model that
served interactive jobs stays loaded (resident), and a bulk group's cold model loads aside while interactive jobs
go on running, instead of holding them for its load."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.simulated import simulated_entry
from swapless.tasks.client import Client
from tests.conftest import WorkerProcess
from tests.faultkit import wait_for
from tests.stack import run_cli
from tests.tinymodels import write_models_file

pytestmark = pytest.mark.slow

#: The bulk model's load (simulated: it sleeps): long enough that an interactive job sent once it began surely
#: finishes before it, if it does not wait for it.
BULK_LOAD_S = 3.0


def test_an_interactive_job_runs_while_a_bulk_model_loads_and_its_model_stays(
    swapless_env: dict[str, str], start_worker: Callable[..., WorkerProcess], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    models = write_models_file(tmp_path, [simulated_entry("chat", 0.2, 0.005, 0.0002),
                                          simulated_entry("bulk-a", BULK_LOAD_S, 0.01, 0.001),
                                          simulated_entry("bulk-b", 0.5, 0.01, 0.001)])
    monkeypatch.setenv("SWAPLESS_MODELS_FILE", str(models))
    env = {"SWAPLESS_MODELS_FILE": str(models), "SWAPLESS_PLUGINS": "bench.simulated", "SWAPLESS_MAX_MODELS": "2",
           "SWAPLESS_WARM_START": "false"}
    worker = start_worker(env=env)
    with Client() as client:
        assert client.submit("chat", "hello", priority="interactive").get(timeout=30)
        # then bulk-b: chat is the least recently used model now, which plain LRU would evict for bulk-a
        client.gather(client.submit_jobs([("bulk-b", f"b {i}") for i in range(20)], priority="bulk"), timeout=30)
        bulk = client.submit_jobs([("bulk-a", f"a {i}") for i in range(50)], priority="bulk")
        wait_for(lambda: "loading bulk-a aside" in worker.log(), 20, "bulk-a to load aside")
        assert client.submit("chat", "during the load", priority="interactive").get(timeout=30)
        results = client.gather(bulk, timeout=60)
    assert [r.state for r in results] == ["SUCCESS"] * 50
    log = worker.log()
    # by order in the log, not by the clock: the interactive job ran between the start and the end of the load
    aside, loaded = log.index("loading bulk-a aside"), log.index("loaded bulk-a (")
    assert "ran 1 job(s) on chat" in log[aside:loaded], log[aside:loaded]
    # bulk-b, not chat (the least recently used), made room; chat was never unloaded
    assert "unloading bulk-b" in log and "unloading chat" not in log
    assert log.count("loaded chat (") == 1


def test_a_model_kept_loaded_by_the_models_file_is_loaded_before_ready_and_stays(
    swapless_env: dict[str, str], start_worker: Callable[..., WorkerProcess], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chat = {**simulated_entry("chat", 0.5, 0.005, 0.0002), "keep_loaded": True}
    models = write_models_file(tmp_path, [simulated_entry("bulk-a", 0.3, 0.01, 0.001), chat,
                                          simulated_entry("bulk-b", 0.3, 0.01, 0.001)])
    monkeypatch.setenv("SWAPLESS_MODELS_FILE", str(models))
    env = {"SWAPLESS_MODELS_FILE": str(models), "SWAPLESS_PLUGINS": "bench.simulated", "SWAPLESS_MAX_MODELS": "2",
           "SWAPLESS_WARM_START": "false"}
    worker = start_worker(env=env)
    log = worker.log()
    assert log.index("loaded chat (") < log.index("swapless worker ready"), log[-2000:]  # no job asked for it
    with Client() as client:
        for model_id in ["bulk-a", "bulk-b", "bulk-a"]:  # under plain LRU the second group evicts chat, never used
            client.gather(client.submit_jobs([(model_id, f"{model_id} {i}") for i in range(20)], priority="bulk"),
                          timeout=30)
        assert client.submit("chat", "hello", priority="interactive").get(timeout=30)
    log = worker.log()
    assert "unloading chat" not in log and log.count("loaded chat (") == 1
    assert log.count("unloading bulk-") >= 2  # the bulk models made room for each other
    listed = run_cli("models", env=env)
    assert listed.returncode == 0, listed.stderr
    count, header, *rows = listed.stdout.splitlines()
    kept = header.index("KEPT")
    assert count == "3 model(s)" and [row[kept:kept + 4].strip() for row in rows] == ["", "yes", ""], listed.stdout
    as_json = run_cli("models", "--json", env=env)
    assert [json.loads(line)["keep_loaded"] for line in as_json.stdout.splitlines()] == [False, True, False]


def test_a_worker_joining_a_fleet_leaves_the_kept_models_to_it(
    swapless_env: dict[str, str], start_worker: Callable[..., WorkerProcess], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chat = {**simulated_entry("chat", 0.3, 0.005, 0.0002), "keep_loaded": True}
    models = write_models_file(tmp_path, [chat, simulated_entry("bulk", 0.3, 0.01, 0.001)])
    monkeypatch.setenv("SWAPLESS_MODELS_FILE", str(models))
    env = {"SWAPLESS_MODELS_FILE": str(models), "SWAPLESS_PLUGINS": "bench.simulated", "SWAPLESS_WARM_START": "false"}
    first = start_worker(env=env)
    assert "loaded chat (" in first.log()
    joining = start_worker(env=env)  # placement routing (the default): the fleet holds chat already
    assert "loaded chat (" not in joining.log()
    with Client() as client:
        assert client.submit("chat", "hello", priority="interactive").get(timeout=30)
    assert "loaded chat (" not in joining.log() and first.log().count("loaded chat (") == 1  # served where it was
