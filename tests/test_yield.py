"""Interactive jobs overtake a bulk group that is already running: the group yields between slices."""

from __future__ import annotations

import time

import pytest

from swapless.tasks.client import Client
from tests.crashy import executions
from tests.faultkit import FaultEnv, wait_for

pytestmark = pytest.mark.slow


def test_an_interactive_job_waits_one_slice_of_a_running_bulk_group_not_the_whole_group(faults: FaultEnv) -> None:
    # Slices of 4 jobs; each slice of the bulk group holds 0.3 s: the whole group of 40 takes about 3 s.
    worker = faults.worker(env={"SWAPLESS_MAX_BATCH_SIZE": "4"})
    client = Client()
    # the worker's first fetch of a model takes a few messages (it does not know yet how many jobs they carry):
    # one job first, so that the 40 below come in one fetch and make one group
    client.submit("echo", "first").get(timeout=30)
    bulk = client.submit_jobs([("echo", f"sleep:0.3:bulk-{i}") for i in range(40)], priority="bulk")
    faults.wait_executed("sleep:0.3:bulk-0")
    sent = time.monotonic()
    interactive = client.submit("echo2", "now please")
    assert interactive.get(timeout=30)["echo"] == "now please"
    waited = time.monotonic() - sent
    done_then = sum(1 for r in client.fetch([job.id for job in bulk]) if r.ready)
    assert done_then < 40, "the interactive job finished before the bulk group did"
    # by order, not by the clock: it ran after the slice in flight when it came (and at most the one being taken
    # then), not after the whole group
    order = [text for _, _, text in executions(faults.exec_log)]
    ran_before = sum(1 for text in order[: order.index("now please")] if text.startswith("sleep:0.3:bulk-"))
    assert ran_before <= 8, f"{ran_before} bulk jobs ran before the interactive one (waited {waited:.2f} s)"
    wait_for(lambda: "yielding to interactive jobs" in worker.log(), 10, "the bulk group to yield")
    results = client.gather(bulk, timeout=60)
    assert [r.value["echo"] for r in results] == [f"sleep:0.3:bulk-{i}" for i in range(40)]
    assert all(n == 1 for n in (faults.executions()[f"sleep:0.3:bulk-{i}"] for i in range(40))), "yielded jobs ran once"
