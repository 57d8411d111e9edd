"""A long tail of models on one worker (simulated models: their loads and passes sleep, as a GPU's do): more models
than the cache holds and than the fetch window sees at once."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.simulated import simulated_entry
from swapless.config.settings import get_settings
from swapless.tasks.client import Client
from tests.conftest import WorkerProcess
from tests.tinymodels import write_models_file

pytestmark = pytest.mark.slow

MODELS = [f"m{i:03d}" for i in range(40)]


@pytest.fixture
def tail(swapless_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """40 simulated models, each loading in 0.1 s; every load is recorded in a file."""
    models = write_models_file(tmp_path, [simulated_entry(m, 0.1, 0.002, 0.00005) for m in MODELS])
    env = {"SWAPLESS_MODELS_FILE": str(models), "SWAPLESS_PLUGINS": "bench.simulated",
           "SIMULATED_LOADS": str(tmp_path / "loads.log")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    return {**swapless_env, **env}


def _loads(env: dict[str, str]) -> Counter[str]:
    path = Path(env["SIMULATED_LOADS"])
    return Counter(line.split("\t")[0] for line in path.read_text().splitlines()) if path.exists() else Counter()


def _zipf(n: int, seed: int = 7) -> list[str]:
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(MODELS))]
    return random.Random(seed).choices(MODELS, weights, k=n)


def test_a_burst_over_more_models_than_the_window_loads_each_model_once(
    tail: dict[str, str], start_worker: Callable[..., WorkerProcess]
) -> None:
    """3,000 bulk jobs over 40 models (Zipf: the hottest has ~750, the rarest ~10) in one ``submit_jobs``, against a
    4-slot cache and a window of 256 jobs: each model touched is loaded once, however its jobs are fetched."""
    start_worker("--max-models", "4", "--prefetch", "256", env=tail)
    picks = _zipf(3000)
    client = Client()
    jobs = client.submit_jobs([(m, f"job {i}") for i, m in enumerate(picks)], priority="bulk")
    results = client.gather(jobs, timeout=240)
    assert [r.state for r in results] == ["SUCCESS"] * len(picks)
    loads, touched = _loads(tail), set(picks)
    assert set(loads) == touched
    assert sum(loads.values()) <= len(touched) * 1.1, loads.most_common(5)


def test_a_hot_model_stays_loaded_and_its_job_waits_one_tail_load_at_most(
    tail: dict[str, str], start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    """Interactive traffic over a hot model and eight tail models, each tail model's load 1 s, on a 4-slot cache: the
    hot model is resident by its demand (one slot stays free for the tail to cycle through), so a hot job sent while
    the tail loads waits for the load in progress at most, and the hot model is never unloaded."""
    (tmp_path / "slow").mkdir()
    slow = write_models_file(tmp_path / "slow", [simulated_entry(m, 1.0, 0.002, 0.00005) for m in MODELS])
    env = {**tail, "SWAPLESS_MODELS_FILE": str(slow)}
    worker = start_worker("--max-models", "4", env=env)
    client = Client()
    for i in range(3):  # the hot model: loaded once, then one interactive job after another
        client.gather(client.submit_jobs([("m000", f"hot {i}-{j}") for j in range(10)]), timeout=60)
    tail_jobs = [client.submit(m, "rare", priority="interactive") for m in MODELS[30:38]]
    time.sleep(3.5)  # three tail loads fill the other slots: under plain LRU the next one evicts the hot model
    latencies = []
    for i in range(4):
        time.sleep(0.3)  # during the tail's loads
        sent = time.monotonic()
        client.submit("m000", f"hot during the tail {i}", priority="interactive").get(timeout=60)
        latencies.append(time.monotonic() - sent)
    assert all(r.state == "SUCCESS" for r in client.gather(tail_jobs, timeout=60))
    log = worker.log()
    assert "unloading m000" not in log and log.count("loaded m000 (") == 1, log[-3000:]
    assert max(latencies) < 1.9, latencies  # one tail load (1 s) at most, never two


def test_the_registry_listing_prints_one_aligned_line_per_model_for_a_thousand_models(tmp_path: Path) -> None:
    """``swapless models`` on a registry of 1,000: a count, a header, one line per model with every column aligned
    (the description cut to a terminal's width, whole when piped), and ``--json`` one object per model."""
    from swapless.config.settings import load_settings
    from swapless.manager.frameworks.engine import ModelEngine
    from swapless.manager.registry.store import ModelStore
    from swapless.tasks.cli.main import models_text
    from swapless.tasks.worker.runtime import load_plugins
    from tests.stack import run_cli

    entries = [simulated_entry(f"m{i:04d}", 0.8, 0.005, 0.0002) for i in range(1000)]
    entries[7]["aliases"] = ["seventh", "lucky"]
    models_file = write_models_file(tmp_path, entries)
    load_plugins(load_settings(plugins="bench.simulated").cache)
    store = ModelStore.from_file(models_file, ModelEngine().frameworks)
    count, header, *rows = models_text(store).splitlines()
    assert count == "1000 model(s)" and len(rows) == 1000
    assert header.split() == ["ID", "ALIASES", "TYPE", "FRAMEWORK", "NAME", "VERSION", "DESCRIPTION"]
    starts = [header.index(name) for name in header.split()]
    assert rows[7][starts[1]:starts[2]].strip() == "seventh,lucky" and rows[8][starts[1]:starts[2]].strip() == ""
    assert all(row[starts[3]:starts[4]].strip() == "simulated" for row in rows)  # aligned on every line
    assert rows[999][starts[6]:] == " ".join(entries[999]["description"].split())
    cut = models_text(store, width=starts[6] + 20).splitlines()
    assert all(len(line) <= starts[6] + 20 for line in cut) and cut[2].endswith("…")

    listed = run_cli("models", "--json", env={"SWAPLESS_MODELS_FILE": str(models_file),
                                              "SWAPLESS_PLUGINS": "bench.simulated"})
    assert listed.returncode == 0, listed.stderr
    objects = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [o["id"] for o in objects] == [e["id"] for e in entries] and objects[7]["aliases"] == ["seventh", "lucky"]
