"""The next group's reads sent during the last pass of the group before it: the hook where they are sent, and
``ReadAhead`` against the real result store (what it counts, what it hands back, what it clears)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis

from bench.simulated import simulated_entry
from swapless.config.errors import JobCancelled
from swapless.manager import ModelEngine, ModelManager, ModelStore, ModelWorker, WorkItem, run_group
from swapless.tasks.app import make_app
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.client import Client
from swapless.tasks.worker.ahead import ReadAhead
from tests.conftest import WorkerProcess
from tests.faultkit import wait_for
from tests.tinymodels import write_models_file


class PassCounter(ModelWorker, framework="pass-counter"):
    """Records each forward pass's size; ``hooked`` is how many passes had begun when the hook ran."""

    passes: ClassVar[list[int]] = []
    hooked: ClassVar[list[int]] = []

    def load(self) -> None:
        self.memory_bytes = 1

    def unload(self) -> None:
        pass

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        out = []
        for chunk in self.batched(batch):
            PassCounter.passes.append(len(chunk))
            out += [len(chunk)] * len(chunk)
        return out


def test_the_hook_runs_once_as_the_last_pass_begins(tmp_path: Path) -> None:
    models = tmp_path / "models.json"
    models.write_text(json.dumps({"models": [{"id": "m", "name": "m", "type": "text", "framework": "pass-counter",
                                              "description": "counts passes", "max_batch_size": 4}]}))
    engine = ModelEngine()
    manager = ModelManager(ModelStore.from_file(models, engine.frameworks), engine, max_models=1)
    PassCounter.passes.clear()

    def hook() -> None:
        PassCounter.hooked.append(len(PassCounter.passes))

    jobs = [WorkItem(f"j{i}", "m", f"text {i}") for i in range(10)]
    outcomes = run_group(manager, "m", jobs, before_last_pass=hook)
    assert [o.ok for o in outcomes] == [True] * 10
    assert PassCounter.passes == [4, 4, 2] and PassCounter.hooked == [2]  # after two passes, as the third begins
    run_group(manager, "m", jobs[:3])  # no hook given: none left over from the last group
    assert PassCounter.hooked == [2]


def _ids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def test_a_read_ahead_counts_the_first_slice_and_answers_the_group_it_covers(swapless_env: dict[str, str]) -> None:
    app = make_app()
    client = redis.Redis.from_url(app.conf.result_backend)
    store = ResultStore(app, client=client)
    group = _ids(6)
    rerun, done = group[4], group[5]
    store.start([rerun])  # in flight at one death already
    store.store([(done, "ok", None)])  # a redelivered copy of a finished job
    ahead = ReadAhead(lambda: ResultStore(app))
    try:
        ahead.launch(group, group[:3])
        assert ahead.take(group, group[:3]) == ({done}, {rerun: 1})  # what prior would answer
        assert [client.get(store.attempts_key(j)) for j in group[:4]] == [b"1", b"1", b"1", None]
        # the counted ones are this worker's: when they run they are not counted again, and a later read of their
        # counters (another group's read, before they ran) does not take them for an earlier life's attempt
        assert ahead.own({group[0]: 1, rerun: 1}) == {rerun: 1}
        assert ahead.running(group[:2]) == set(group[:2])
        assert ahead.own({group[0]: 1, group[2]: 1}) == {group[0]: 1}  # group[0] ran: a count is a death now

        # a read ahead of other jobs does not answer a group it does not cover; what it counted is still kept
        other = _ids(4)
        ahead.launch(other, other[:2])
        assert ahead.take(other[:3] + _ids(1), other[:2]) is None
        assert sorted(ahead.forget([*other, group[2]])) == sorted([*other[:2], group[2]])
    finally:
        left = ahead.close()
        store.forget([done])
        store.clear_attempts([*group, *left])


def test_a_job_is_started_once_the_last_pass_before_it_begins(
    swapless_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """Groups of one job on a model whose pass takes a second: B, waiting when A's pass began, had its reads sent
    then and counts as started (a cancel answers ``running``; it runs and keeps its result); C, which came during
    A's pass, is still only waiting (cancelled: it never runs)."""
    ran = tmp_path / "ran.log"
    models_file = write_models_file(tmp_path, [simulated_entry("second", 0.0, 1.0, 0.0)])
    env = {**swapless_env, "SWAPLESS_MODELS_FILE": str(models_file), "SWAPLESS_PLUGINS": "bench.simulated",
           "SIMULATED_LOG": str(ran), "SWAPLESS_MAX_GROUP": "1", "SWAPLESS_WARM_START": "false"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    start_worker(env=env)
    with Client() as client:
        a, b = client.submit_jobs([("second", "A"), ("second", "B")])
        wait_for(lambda: ran.exists() and ran.read_text() == "A\n", 10, "A's pass to begin")
        c = client.submit("second", "C")
        time.sleep(0.2)  # well inside A's pass
        assert client.cancel([b.id, c.id]) == {b.id: "running", c.id: "cancelled"}
        assert a.get(timeout=10) and b.get(timeout=10)
        with pytest.raises(JobCancelled):
            c.get(timeout=10)
    assert ran.read_text().splitlines() == ["A", "B"]
