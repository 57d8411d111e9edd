"""Benchmark of the cache's host tier: one worker with it against the same worker without it, in the same run.

    python -m bench.tiers                    # 3 repetitions; writes bench/TIERS.md
    python -m bench.tiers --repeats 1 --out bench/out/TIERS-quick.md

Two workloads, each a mixed burst in waves (every wave: bulk jobs for a few models drawn by popularity, and one
interactive job), run on a fresh worker with the host tier and a fresh worker without it:

1. **sim** (simulated rows: ``bench/simulated.py``, whose load, forward pass and tier moves *sleep*, with stated
   costs: a load from disk 2 s, a move between host memory and the device 0.2 s either way, a forward pass 20 ms +
   1 ms per input; 500 MiB per model): 24 models, room for 4 on the device, room for 16 in host memory
   (``SWAPLESS_HOST_MAX_MODELS=16``, ``SWAPLESS_HOST_MEMORY_BUDGET_BYTES`` 16 x 500 MiB). 20 models take nearly all
   the traffic, 4 are rare. Both workers are primed first with one job per model (the rare ones first), as a worker
   that has served for a while is: not counted. The two workers run side by side (their work sleeps; each has its
   own queue), so both see the same moment of this shared machine.
2. **real** (the CPU code path: real tiny torch models, ``bench.common.build_models``, whose module the host tier
   keeps built and moves back with ``.to()``; on a CPU device and host are the same memory, so the copy is free and
   what the tier saves is the load from disk): 6 models, room for 2 on the device and 4 in host memory, run one
   after the other (they need the CPU).

Per run: loads from disk (the workers' log lines, after priming), swap-ins from host memory, makespan (first send
to last result) and the latency of the interactive jobs (send to result). Medians of the repetitions, with their
ranges.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import OUT, REPO, Process, build_models, cleanup, collect, fresh_prefix, inputs_for, percentile
from bench.scaleout import REDIS_URL
from bench.simulated import MEMORY_BYTES, simulated_entry

SIM_MODELS = [f"sim-{i:02d}" for i in range(24)]
SIM_RARE = SIM_MODELS[:4]
SIM_COSTS = {"load_s": 2.0, "host_s": 0.2, "batch_s": 0.02, "item_s": 0.001}
REAL_IMAGE = "vision"


@dataclass(frozen=True)
class Workload:
    """A mixed burst in waves (see the module docstring)."""

    name: str
    models: list[str]
    rare: list[str]
    max_models: int
    host_max_models: int
    host_budget_bytes: int
    waves: int
    interval_s: float
    models_per_wave: int
    jobs_per_model: int


SIM = Workload("sim", SIM_MODELS, SIM_RARE, 4, 16, 16 * MEMORY_BYTES, waves=24, interval_s=0.5, models_per_wave=2,
               jobs_per_model=16)
REAL = Workload("real", [], [], 2, 4, 4 << 30, waves=16, interval_s=0.5, models_per_wave=2, jobs_per_model=8)


@dataclass
class Result:
    """One run of one worker."""

    disk_loads: int
    swap_ins: int
    makespan_s: float
    interactive_s: list[float]
    jobs: int


def _sim_models_file(directory: Path) -> Path:
    from swapless.manager.demo.tiny import write_models_file

    directory.mkdir(parents=True, exist_ok=True)
    c = SIM_COSTS
    return write_models_file(directory, [simulated_entry(m, c["load_s"], c["batch_s"], c["item_s"], c["host_s"])
                                         for m in SIM_MODELS])


def _waves(workload: Workload, seed: int) -> list[list[tuple[str, str, str]]]:
    """Per wave, its jobs as ``(model, input, priority)``: the same for both workers of a repetition."""
    rng = random.Random(seed)
    weights = [0.25 if m in workload.rare else 1.0 for m in workload.models]
    waves = []
    for i in range(workload.waves):
        chosen: list[str] = []
        while len(chosen) < workload.models_per_wave:
            model = rng.choices(workload.models, weights)[0]
            if model not in chosen:
                chosen.append(model)
        jobs = [(m, value, "bulk") for m in chosen for value in _inputs(m, rng, workload.jobs_per_model)]
        interactive = rng.choices(workload.models, weights)[0]
        jobs.append((interactive, _inputs(interactive, rng, 1)[0], "interactive"))
        waves.append(jobs)
        del i
    return waves


def _inputs(model_id: str, rng: random.Random, n: int) -> list[str]:
    if model_id.startswith("sim-"):
        return [f"input {rng.random():.6f}" for _ in range(n)]
    return inputs_for(model_id, rng, n)


class Worker:
    """One fresh worker on a fresh queue, with or without the host tier."""

    def __init__(self, name: str, workload: Workload, models_file: Path, host_tier: bool, plugins: str) -> None:
        self.prefix = fresh_prefix(f"tiers-{name}")
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.models_file = models_file
        env = {
            "SWAPLESS_REDIS_URL": REDIS_URL,
            "SWAPLESS_KEY_PREFIX": self.prefix,
            "SWAPLESS_QUEUE": self.prefix + "jobs",
            "SWAPLESS_MODELS_FILE": str(models_file),
            "SWAPLESS_MAX_MODELS": str(workload.max_models),
            "SWAPLESS_HOST_MAX_MODELS": str(workload.host_max_models),
            "SWAPLESS_HOST_MEMORY_BUDGET_BYTES": str(workload.host_budget_bytes if host_tier else 0),
            "SWAPLESS_PLUGINS": plugins,
            "SWAPLESS_WARM_START": "false",
            "SWAPLESS_DEVICE": "cpu",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
        self.process = Process([sys.executable, "-m", "swapless", "worker", "--hostname", f"{name}@bench"], env,
                               OUT / "tiers" / f"{name}.log")
        self.process.wait_for("ready.")
        self._mark = 0

    def client(self) -> object:
        from swapless.config.settings import Settings
        from swapless.tasks.client import Client

        return Client(settings=Settings(redis_url=REDIS_URL, key_prefix=self.prefix, queue=self.prefix + "jobs",
                                        models_file=self.models_file))

    def mark(self) -> None:
        self._mark = len(self.process.text())

    def counts(self) -> tuple[int, int]:
        """Loads from disk and swap-ins from host memory since the mark."""
        text = self.process.text()[self._mark :]
        return len(re.findall(r"loaded \S+ \(", text)), len(re.findall(r"swapped \S+ in from host memory", text))

    def close(self) -> None:
        self.process.stop()
        cleanup(self.redis, self.prefix)
        self.redis.close()


def _prime(worker: Worker, models: list[str], rng: random.Random) -> None:
    """One job per model, one model after the other: a worker that has served each model once."""
    client = worker.client()
    for model in models:
        job = client.submit(model, _inputs(model, rng, 1)[0])  # type: ignore[attr-defined]
        job.get(timeout=120)
    client.close()  # type: ignore[attr-defined]


def _drive(worker: Worker, waves: list[list[tuple[str, str, str]]], interval_s: float, out: dict[str, Result],
           key: str) -> None:
    """Send the waves on time, then wait for every result."""
    client = worker.client()
    worker.mark()
    sent: dict[str, float] = {}
    interactive: list[str] = []
    started = time.time()
    for i, wave in enumerate(waves):
        time.sleep(max(0.0, started + i * interval_s - time.time()))
        bulk = [(m, v) for m, v, p in wave if p == "bulk"]
        now = time.time()
        for job in client.submit_jobs(bulk, priority="bulk"):  # type: ignore[attr-defined]
            sent[job.id] = now
        for m, v, p in wave:
            if p == "interactive":
                job = client.submit(m, v)  # type: ignore[attr-defined]
                sent[job.id] = time.time()
                interactive.append(job.id)
    done = collect(worker.redis, worker.prefix, list(sent), timeout_s=900, poll_s=0.05).done_wall
    client.close()  # type: ignore[attr-defined]
    disk, swaps = worker.counts()
    out[key] = Result(disk, swaps, max(done.values()) - started, [done[j] - sent[j] for j in interactive], len(sent))


def run_sim(seed: int) -> dict[str, Result]:
    models_file = _sim_models_file(OUT / "tiers" / "sim-models")
    workers = {"host tier": Worker(f"sim-host-{seed}", SIM, models_file, True, "bench.simulated"),
               "baseline": Worker(f"sim-base-{seed}", SIM, models_file, False, "bench.simulated")}
    order = SIM.rare + [m for m in SIM.models if m not in SIM.rare]  # the rare ones served longest ago
    try:
        primers = [threading.Thread(target=_prime, args=(w, order, random.Random(seed))) for w in workers.values()]
        for t in primers:
            t.start()
        for t in primers:
            t.join()
        waves = _waves(SIM, seed)
        out: dict[str, Result] = {}
        drivers = [threading.Thread(target=_drive, args=(w, waves, SIM.interval_s, out, k)) for k, w in workers.items()]
        for t in drivers:
            t.start()
        for t in drivers:
            t.join()
        return out
    finally:
        for w in workers.values():
            w.close()


def run_real(seed: int) -> dict[str, Result]:
    models_file = build_models()
    from swapless.manager.registry.store import ModelStore

    ids = ModelStore.from_file(models_file, ["transformers", "torchvision"]).ids()
    workload = Workload("real", ids, [], REAL.max_models, REAL.host_max_models, REAL.host_budget_bytes, REAL.waves,
                        REAL.interval_s, REAL.models_per_wave, REAL.jobs_per_model)
    out: dict[str, Result] = {}
    waves = _waves(workload, seed)
    for key, host_tier in (("baseline", False), ("host tier", True)):
        worker = Worker(f"real-{'host' if host_tier else 'base'}-{seed}", workload, models_file, host_tier, "")
        try:
            _prime(worker, ids, random.Random(seed))
            _drive(worker, waves, workload.interval_s, out, key)
        finally:
            worker.close()
    return out


def _cell(values: list[float], fmt: str = "{:.3g}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def render(results: dict[str, list[dict[str, Result]]], seconds: float) -> str:
    lines = [
        "# The host tier: swap-ins that copy instead of loading",
        "",
        (f"`python -m bench.tiers` ({len(next(iter(results.values())))} repetitions, {seconds:.0f} s; medians, ranges "
        "in parentheses; both workers of a row measured in the same run). *sim* rows are simulated "
        "(`bench/simulated.py`: the load from disk sleeps 2 s, a move between host memory and the device 0.2 s, a "
        "forward pass 20 ms + 1 ms per input); *real* rows run tiny real torch models on this CPU, where device and "
        "host are the same memory (the copy back is free; what the tier saves there is the load from disk)."),
        "",
        ("| workload | worker | loads from disk | swap-ins from host | makespan (s) | interactive p50 (s) "
        "| interactive p95 (s) |"),
        "|---|---|---|---|---|---|---|",
    ]
    label = {"sim": f"sim: {SIM.waves} waves over 24 models, device room 4, host room 16",
             "real": f"real (CPU): {REAL.waves} waves over 6 models, device room 2, host room 4"}
    for workload, runs in results.items():
        for key in ("baseline", "host tier"):
            rs = [r[key] for r in runs]
            lines.append(
                f"| {label[workload]} | {key if key != 'baseline' else 'without the host tier'} "
                f"| {_cell([float(r.disk_loads) for r in rs], '{:.0f}')} "
                f"| {_cell([float(r.swap_ins) for r in rs], '{:.0f}')} "
                f"| {_cell([r.makespan_s for r in rs])} "
                f"| {_cell([percentile(r.interactive_s, 50) for r in rs])} "
                f"| {_cell([percentile(r.interactive_s, 95) for r in rs])} |"
            )
        base = [r["baseline"] for r in runs]
        host = [r["host tier"] for r in runs]
        ratio_loads = [b.disk_loads / max(h.disk_loads, 1) for b, h in zip(base, host, strict=True)]
        ratio_span = [b.makespan_s / h.makespan_s for b, h in zip(base, host, strict=True)]
        lines.append(f"| {label[workload]} | ratio (without / with) | {_cell(ratio_loads, '{:.2f}')} | | "
                     f"{_cell(ratio_span, '{:.2f}')} | | |")
    jobs = {w: runs[0]["baseline"].jobs for w, runs in results.items()}
    lines += [
        "",
        (f"Jobs per run: {', '.join(f'{w} {n}' for w, n in jobs.items())} (one interactive job per wave, the rest "
        "bulk). Loads and swap-ins are counted after priming (one job per model, the rare models first)."),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", default="sim,real")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "TIERS.md")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    results: dict[str, list[dict[str, Result]]] = {}
    runners = {"sim": run_sim, "real": run_real}
    for workload in args.workloads.split(","):
        for rep in range(args.repeats):
            run = runners[workload](seed=rep)
            results.setdefault(workload, []).append(run)
            print(workload, rep, {k: (r.disk_loads, r.swap_ins, round(r.makespan_s, 2)) for k, r in run.items()},
                  flush=True)
    text = render(results, time.perf_counter() - began)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
