"""Does the queue keep a device busy? A real ``swapless worker`` on a *simulated* device against that device's limit.

    python -m bench.device             # 3 repetitions, a few minutes on 2 cores; writes bench/DEVICE.md
    python -m bench.device --quick     # 1 repetition, small workloads (CI); writes bench/out/DEVICE-quick.md

The device is ``bench/simulated.py``'s: a forward pass *sleeps* (5 ms + 0.2 ms per input, passes of up to 64
inputs), leaving the CPU free as a GPU's work does, so every CPU cycle the worker spends is the queue's and every
gap between passes is the queue's too. Every row is simulated; no GPU is involved. Each repetition measures:

1. the device limit, in this process: the same model's passes back to back over the stream's inputs (sleep's own
   overshoot on this machine included), jobs/s;
2. the rate Celery's ``send_task`` alone reaches from this process (to a queue no worker reads);
3. a fresh ``swapless worker`` (``--no-warm-start``) fed a single-model stream by ``Client.submit_jobs`` (calls of
   256 jobs, one after the other), then by ``send_task``: jobs/s against the limit (send_task: against
   min(limit, send_task's rate)), and the worker's CPU per job (all its threads, from ``/proc``);
   and the user's path: a fresh ``swapless worker`` at its default flags, one ``submit_jobs`` call of every job as
   soon as it is ready, one ``gather``: jobs/s from the call's start to the gather's end, against the limit;
4. lone jobs on a zero-cost model of the same worker: submit to the result in the caller, p50;
5. interactive jobs, one every 0.1 s, while a bulk backlog of the device model drains: their p50 in device passes
   (one pass of 64 inputs, measured in 1.);
6. the overlap workload of ``bench.scheduler`` (24 models whose loads take as long as their group's compute, load
   ahead on) against max(Σ loads, Σ compute).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bench.common import OUT, REPO, collect, percentile, summary, target_lines, write_table
from bench.systems import OVERLAP, Run, SimulatedSwapless, burst, overlap_bound_s, priority, simulated_models

__all__ = ["BATCH_S", "ITEM_S", "MAX_BATCH", "main"]

#: The simulated device's pass: seconds per pass and per input, and its largest batch.
BATCH_S, ITEM_S, MAX_BATCH = 0.005, 0.0002, 64


@dataclass(frozen=True)
class Sizes:
    stream_jobs: int
    send_task_jobs: int
    lone_jobs: int
    bulk_jobs: int
    interactive_jobs: int
    overlap: bool


FULL = Sizes(stream_jobs=6000, send_task_jobs=6000, lone_jobs=60, bulk_jobs=8000, interactive_jobs=15, overlap=True)
QUICK = Sizes(stream_jobs=1500, send_task_jobs=600, lone_jobs=10, bulk_jobs=1500, interactive_jobs=4, overlap=False)


def device_models(directory: Path) -> Path:
    """The models file of the device worker: ``dev`` (the stream's and the bulk drain's), ``dev-i`` (the same
    device costs, for the interactive jobs) and ``zero`` (costs nothing: the queue's own latency)."""
    from bench.simulated import simulated_entry
    from swapless.manager.demo.tiny import write_models_file

    directory.mkdir(parents=True, exist_ok=True)
    entries = [simulated_entry(m, 0.0, BATCH_S, ITEM_S) for m in ("dev", "dev-i")]
    entries.append(simulated_entry("zero", 0.0, 0.0, 0.0))
    for entry in entries:
        entry["max_batch_size"] = MAX_BATCH
    return write_models_file(directory, entries)


def device_limit(models_file: Path, jobs: int) -> tuple[float, float]:
    """(jobs/s of ``jobs`` inputs through the device model's passes back to back, median seconds of one full pass)."""
    from swapless.manager import ModelEngine, ModelStore, WorkerLimits

    engine = ModelEngine(WorkerLimits(device="cpu", max_batch_size=MAX_BATCH))
    worker = engine.build(ModelStore.from_file(models_file, engine.frameworks).get("dev"))
    worker.load()
    worker.tuner = None
    values = [worker.prepare(f"text {i}") for i in range(jobs)]
    started = time.perf_counter()
    for start in range(0, jobs, MAX_BATCH):
        worker.predict(values[start : start + MAX_BATCH])
    rate = jobs / (time.perf_counter() - started)
    passes = []
    for _ in range(9):
        started = time.perf_counter()
        worker.predict(values[: MAX_BATCH])
        passes.append(time.perf_counter() - started)
    return rate, statistics.median(passes)


class DeviceSwapless(SimulatedSwapless):
    name = "swapless (sim device)"
    flags = ("--no-warm-start", "--max-models", "4")  # type: ignore[assignment]  # the base's is one flag
    env: ClassVar[Mapping[str, str]] = {"SWAPLESS_PLUGINS": "bench.simulated", "OMP_NUM_THREADS": "1",
                                        "PYTHONPATH": str(REPO)}


class UserPathSwapless(DeviceSwapless):
    """``swapless worker`` at its default flags (the warm start as shipped), fresh: what a user starts."""

    name = "swapless (sim device, default flags)"
    flags = ()


def user_path(system: DeviceSwapless, jobs: list[tuple[str, str]], timeout_s: float = 600) -> dict[str, float]:
    """The user's path: one ``Client.submit_jobs`` call of every job (its default priority), then one
    ``Client.gather``; seconds of the call, of the whole, and from the call's start to its first result stored."""
    from swapless.tasks.client import Client

    client = Client(settings=system.client.settings)  # a fresh producer: its registry read is part of the call
    started = time.perf_counter()
    at = time.time()
    handles = client.submit_jobs(jobs)
    call_s = time.perf_counter() - started
    results = client.gather(handles, timeout=timeout_s)
    wall_s = time.perf_counter() - started
    if any(r.state != "SUCCESS" for r in results):
        raise RuntimeError(f"{system.name}: jobs failed; see {system.log}")
    stored = collect(system.redis, system.prefix, [job.id for job in handles], 60)  # the worker's store times
    client.close()
    return {"call_s": call_s, "wall_s": wall_s, "first_s": min(stored.done_wall.values()) - at}


#: Jobs per ``submit_jobs`` call of the stream: the producer keeps sending while the worker runs the first jobs.
STREAM_CHUNK = 256


def stream(system: DeviceSwapless, jobs: list[tuple[str, str]], timeout_s: float = 600) -> Run:
    """A stream: ``jobs`` sent as fast as the producer can (``submit_jobs`` in calls of ``STREAM_CHUNK`` jobs, or
    ``send_task`` one by one), every job timed from the first send; jobs/s over the makespan, the worker's CPU."""
    cpu_before = system.cpu_s()
    started = time.time()
    sent: list[str] = []
    if system.producer == "submit_jobs":
        for start in range(0, len(jobs), STREAM_CHUNK):
            sent += [job.id for job in system.client.submit_jobs(jobs[start : start + STREAM_CHUNK])]
    else:
        sent = [job_id for _, job_id in system.submit(jobs)]
    got = collect(system.redis, system.prefix, sent, timeout_s)
    cpu = system.cpu_s() - cpu_before
    if any(state != "SUCCESS" for state in got.states.values()):
        raise RuntimeError(f"{system.name}: jobs failed; see {system.log}")
    makespan = max(got.done_wall.values()) - started
    latencies = [at - started for at in got.done_wall.values()]
    return Run(len(jobs) / makespan, 0, percentile(latencies, 50), percentile(latencies, 99),
               {"makespan_s": makespan, "cpu_ms_per_job": 1000 * cpu / len(jobs)})


def send_task_rate(system: DeviceSwapless, jobs: int) -> float:
    """Jobs/s ``send_task`` alone reaches from this process, to a queue of this prefix that no worker reads."""
    from swapless.tasks.protocol import PREDICT_TASK

    app = system.client.app
    queue = system.prefix + "send-only"
    with app.producer_or_acquire() as producer:
        app.send_task(PREDICT_TASK, args=["dev", "warm"], queue=queue, producer=producer)
        started = time.perf_counter()
        for i in range(jobs):
            app.send_task(PREDICT_TASK, args=["dev", f"text {i}"], queue=queue, producer=producer)
        return jobs / (time.perf_counter() - started)


Add = Callable[[str, float], None]


def _system_rows(add: Add, system: DeviceSwapless, sizes: Sizes, limit: float, pass_s: float) -> None:
    """The rows of one started ``DeviceSwapless``: send_task alone, the two streams, lone jobs, priority."""
    for model_id in ("dev", "dev-i", "zero"):
        system.get_one(model_id, "warm up")
    send_rate = send_task_rate(system, sizes.send_task_jobs)
    add("send_task alone (jobs/s)", send_rate)
    run = stream(system, [("dev", f"text {i}") for i in range(sizes.stream_jobs)])
    add("stream, submit_jobs (jobs/s)", run.jobs_per_s)
    add("stream, submit_jobs: vs limit", run.jobs_per_s / limit)
    add("stream, submit_jobs: worker CPU (ms/job)", run.extra["cpu_ms_per_job"])
    system.producer = "send_task"
    run = stream(system, [("dev", f"text {i}") for i in range(sizes.send_task_jobs)])
    system.producer = "submit_jobs"
    add("stream, send_task (jobs/s)", run.jobs_per_s)
    add("stream, send_task: vs min(limit, send_task alone)", run.jobs_per_s / min(limit, send_rate))
    add("stream, send_task: worker CPU (ms/job)", run.extra["cpu_ms_per_job"])
    lone = [system.get_one("zero", "lone") for _ in range(sizes.lone_jobs)]
    add("lone job, zero-cost model: p50 (ms)", percentile(lone, 50) * 1000)
    add("lone job, zero-cost model: p99 (ms)", percentile(lone, 99) * 1000)
    bulk = [("dev", f"bulk {i}") for i in range(sizes.bulk_jobs)]
    interactive = [("dev-i", f"interactive {i}") for i in range(sizes.interactive_jobs)]
    run = priority(system, bulk, interactive, every_s=0.1)
    add("interactive during bulk: p50 (ms)", run.p50_s * 1000)
    add("interactive during bulk: p50 in passes", run.p50_s / pass_s)


def _user_rows(add: Add, redis_url: str, models_file: Path, sizes: Sizes, limit: float, rep: int) -> None:
    user = UserPathSwapless(redis_url, models_file, f"device-user-rep{rep}")
    try:
        user.start()
        path = user_path(user, [("dev", f"text {i}") for i in range(sizes.stream_jobs)])
    finally:
        user.stop()
    add("user's path, one submit_jobs + gather: vs limit", sizes.stream_jobs / path["wall_s"] / limit)
    add("user's path: the submit_jobs call (ms)", path["call_s"] * 1000)
    add("user's path: call start → first result (ms)", path["first_s"] * 1000)


def _overlap_row(add: Add, redis_url: str, rep: int) -> None:
    files = simulated_models(OUT / "simulated-models")
    import random

    rng = random.Random(rep)
    jobs = [(f"o{m:02d}", f"text {m}.{i}") for m in range(int(OVERLAP["models"]))
            for i in range(int(OVERLAP["jobs_per_model"]))]
    rng.shuffle(jobs)
    overlap = SimulatedSwapless(redis_url, files["overlap"], f"device-overlap-rep{rep}")
    overlap.env = {**overlap.env, "SWAPLESS_LOAD_AHEAD": "true", "PYTHONPATH": str(REPO)}  # type: ignore[misc]
    try:
        overlap.start()
        run = burst(overlap, jobs, 600)
    finally:
        overlap.stop()
    add("overlap: vs max(Σ loads, Σ compute)", run.jobs_per_s / (len(jobs) / overlap_bound_s()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--repeats", type=int, default=None, help="default 3, --quick 1")
    parser.add_argument("--quick", action="store_true", help="small workloads, 1 repetition, no overlap rows")
    parser.add_argument("--write", type=Path, default=None,
                        help="default bench/DEVICE.md, --quick bench/out/DEVICE-quick.md")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    repeats = args.repeats or (1 if args.quick else 3)
    write = args.write or (OUT / "DEVICE-quick.md" if args.quick else REPO / "bench" / "DEVICE.md")
    models_file = device_models(OUT / "device-models")
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)
        print(f"  {name}: {value:.4g}", flush=True)

    for rep in range(repeats):
        print(f"repetition {rep + 1}/{repeats}", flush=True)
        limit, pass_s = device_limit(models_file, sizes.stream_jobs)
        add("device limit (jobs/s)", limit)
        add("one pass of 64 (ms)", pass_s * 1000)
        system = DeviceSwapless(args.redis_url, models_file, f"device-rep{rep}")
        try:
            system.start()
            _system_rows(add, system, sizes, limit, pass_s)
        finally:
            system.stop()
        _user_rows(add, args.redis_url, models_file, sizes, limit, rep)
        if sizes.overlap:
            _overlap_row(add, args.redis_url, rep)

    write_table(write, render(rows, args, sizes, repeats), NOTES)


#: The heading of the hand-written notes under the table (where the time goes); a new run keeps them.
NOTES = "## Where the time goes"

#: (row, target, at most?) of every target
TARGETS = [
    ("stream, submit_jobs: vs limit", 0.9, False),
    ("user's path, one submit_jobs + gather: vs limit", 0.9, False),
    ("stream, send_task: vs min(limit, send_task alone)", 0.8, False),
    ("stream, send_task: worker CPU (ms/job)", 0.3, True),
    ("lone job, zero-cost model: p50 (ms)", 1.0, True),
    ("interactive during bulk: p50 in passes", 1.2, True),
    ("overlap: vs max(Σ loads, Σ compute)", 0.93, False),
]


def render(rows: dict[str, list[float]], args: argparse.Namespace, sizes: Sizes, repeats: int) -> str:
    command = "python -m bench.device" + (" --quick" if args.quick else "")
    lines = [
        "# Simulated device benchmark",
        "",
        (f"Command: `{command}` on this machine (CPU only, 2 cores, shared); {repeats} repetition(s), median "
        f"[min–max]. **Every row is simulated** (`bench/simulated.py`): the device's forward pass sleeps "
        f"{BATCH_S * 1000:g} ms + {ITEM_S * 1000:g} ms per input, passes of up to "
        f"{MAX_BATCH}, leaving the CPU free as a GPU's work does; no GPU was used. Device limit: those passes "
        f"back to back in the benchmark's process over {sizes.stream_jobs} inputs. Stream: {sizes.stream_jobs} jobs "
        f"by `Client.submit_jobs` in calls of {STREAM_CHUNK}, {sizes.send_task_jobs} by Celery's `send_task`, "
        f"to one fresh `swapless worker --no-warm-start`; worker CPU is user + system time of the worker process "
        f"(all threads) per job. User's path: a fresh `swapless worker` at its default flags (the warm start as "
        f"shipped), and as soon as it is ready one `Client.submit_jobs` of {sizes.stream_jobs} jobs (default "
        f"priority) from a fresh `Client`, then one `Client.gather`: jobs / (call start → gather end) against the "
        f"limit. Lone: "
        f"{sizes.lone_jobs} jobs one at a time on a zero-cost model, submit to result in the caller. Interactive: "
        f"{sizes.interactive_jobs} jobs 0.1 s apart on a second device model while {sizes.bulk_jobs} bulk jobs "
        f"drain, p50 in passes of {MAX_BATCH}. Overlap: `bench.scheduler`'s overlap workload, load ahead on."),
        "",
        "| measurement (simulated device) | median [min–max] |",
        "|---|---|",
    ]
    for name, values in rows.items():
        lines.append(f"| {name} | {summary(values)} |")
    return "\n".join([*lines, "", *target_lines(rows, TARGETS)]) + "\n"


if __name__ == "__main__":
    main()
