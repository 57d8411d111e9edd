"""Benchmark of several workers on one Redis: placement (one cache across workers) against the shared queue.

    python -m bench.scaleout                 # 1..4 workers, 3 repetitions; writes bench/SCALEOUT.md
    python -m bench.scaleout --repeats 1 --workers 1,2

Each configuration runs with ``SWAPLESS_ROUTING=placement`` and with ``SWAPLESS_ROUTING=shared`` (every worker
takes any job: the baseline, measured in the same run), with fresh worker processes and a fresh queue each time:

1. **real**: the scheduler benchmark's six tiny real models, a cache of 2 per worker, 600 mixed jobs, one
   torch/OpenMP thread per worker: cluster-wide model loads and jobs/s (CPU-bound: 2 cores shared by all workers);
2. **sim-burst**: 12 simulated models (``bench/simulated.py``: load 1-3 s, forward pass 20 ms + 1 ms per input,
   sleeping like a GPU, no CPU), a cache of 3 per worker, 1,200 jobs spread evenly, sent at once;
3. **sim-skewed**: the same models, 1,200 jobs, 80 % of them for one model (forward pass 20 ms + 10 ms per input:
   about 10 s of work for one copy, under a third of the whole: the others' loads are the rest);
   **sim-hot**: the same jobs with the hot model at 30 ms per input (about 30 s for one copy, most of the work:
   with two workers or more, one copy of it is the long pole);
4. **failover**: 3 workers, the simulated burst, one worker SIGKILLed once 40 % of the results are in: lost jobs,
   the time until the dead worker's jobs and models are free again (recovery), and until every job is done.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis

from bench.common import MODEL_IDS, OUT, REPO, Process, build_models, cleanup, fresh_prefix, mixed_jobs, summary
from bench.simulated import simulated_entry

REDIS_URL = os.environ.get("SWAPLESS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
SIM_MODELS = [f"sim-{i:02d}" for i in range(12)]
HOT = SIM_MODELS[0]
WORKLOADS = ("real", "sim-burst", "sim-skewed", "sim-hot", "failover")
#: Seconds per input of the hot model, per simulated workload (the others: 1 ms).
HOT_ITEM_S = {"sim-burst": 0.01, "sim-skewed": 0.01, "sim-hot": 0.03, "failover": 0.01}
REPORTED = ("real", "sim-burst", "sim-skewed", "sim-hot")


@dataclass
class Result:
    """One run of one configuration."""

    jobs: int
    seconds: float
    loads: int
    lost: int = 0
    hot_workers: int = 0
    recovery_s: float | None = None
    done_after_kill_s: float | None = None
    loads_by_model: dict[str, int] = field(default_factory=dict)

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds


def _sim_models_file(directory: Path, hot_item_s: float) -> Path:
    from swapless.manager.demo.tiny import write_models_file

    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, model_id in enumerate(SIM_MODELS):
        load_s = 1.0 + 2.0 * i / (len(SIM_MODELS) - 1)  # 1 s .. 3 s
        entries.append(simulated_entry(model_id, load_s, 0.02, hot_item_s if model_id == HOT else 0.001))
    return write_models_file(directory, entries)


def _sim_jobs(seed: int, skewed: bool, n: int = 1200) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    if skewed:
        models = [HOT] * (n * 8 // 10) + [SIM_MODELS[1 + i % 11] for i in range(n - n * 8 // 10)]
    else:
        models = [SIM_MODELS[i % len(SIM_MODELS)] for i in range(n)]
    rng.shuffle(models)
    return [(m, f"input {i}") for i, m in enumerate(models)]


class Cluster:
    """``n`` fresh workers on a fresh queue."""

    def __init__(self, name: str, n: int, routing: str, models_file: Path, max_models: int, warm_start: bool,
                 learned: dict[bytes, bytes] | None = None) -> None:
        self.prefix = fresh_prefix(name)
        self.redis = redis.Redis.from_url(REDIS_URL)
        if learned:  # what a deployment that ran before knows: each model's load time and batch costs
            self.redis.hset(self.learned_key, mapping=learned)  # type: ignore[arg-type]
        self.env = {
            "SWAPLESS_REDIS_URL": REDIS_URL,
            "SWAPLESS_KEY_PREFIX": self.prefix,
            "SWAPLESS_QUEUE": self.prefix + "jobs",
            "SWAPLESS_MODELS_FILE": str(models_file),
            "SWAPLESS_ROUTING": routing,
            "SWAPLESS_MAX_MODELS": str(max_models),
            "SWAPLESS_PLUGINS": "bench.simulated",
            "SWAPLESS_WARM_START": "true" if warm_start else "false",
            "SWAPLESS_DEVICE": "cpu",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
        self.workers = [
            Process([sys.executable, "-m", "swapless", "worker", "--hostname", f"w{i}@bench", "--loglevel", "INFO"],
                    self.env, OUT / "scaleout" / f"{name}-w{i}.log")
            for i in range(n)
        ]
        for worker in self.workers:
            worker.wait_for("ready.")
        self._wait_heartbeats(n)
        self.mark()

    def mark(self) -> None:
        """Count loads from here on (the jobs are sent next; a warm start's loads came before)."""
        self._marks = [len(worker.text()) for worker in self.workers]

    def _since_mark(self) -> list[str]:
        return [worker.text()[mark:] for worker, mark in zip(self.workers, self._marks, strict=True)]

    @property
    def learned_key(self) -> str:
        from swapless.tasks.keyspace import Keyspace

        return Keyspace(self.prefix + "jobs", self.prefix).learned("cpu")

    def _wait_heartbeats(self, n: int, timeout_s: float = 30) -> None:
        from swapless.tasks.cluster.members import read_heartbeats
        from swapless.tasks.keyspace import Keyspace

        deadline = time.monotonic() + timeout_s
        while len(read_heartbeats(self.redis, Keyspace(self.prefix + "jobs", self.prefix))) < n:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers' heartbeats did not all appear")
            time.sleep(0.1)

    def client(self) -> object:
        from swapless.config.settings import Settings
        from swapless.tasks.client import Client

        settings = Settings(redis_url=REDIS_URL, key_prefix=self.prefix, queue=self.prefix + "jobs",
                            models_file=Path(self.env["SWAPLESS_MODELS_FILE"]), routing=self.env["SWAPLESS_ROUTING"])
        return Client(settings=settings, forget=True)

    def loads(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for text in self._since_mark():
            for model_id in re.findall(r"loaded (\S+) \(", text):
                found[model_id] = found.get(model_id, 0) + 1
        return found

    def workers_that_loaded(self, model_id: str) -> int:
        return sum(1 for text in self._since_mark() if f"loaded {model_id} (" in text)

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        cleanup(self.redis, self.prefix)
        self.redis.close()


def _run(cluster: Cluster, jobs: list[tuple[str, str]], on_progress: Callable[[int], None] | None = None,
         timeout_s: float = 600) -> tuple[float, int]:
    """Send ``jobs`` at once and wait for all; returns (seconds from the first send to the last result, lost)."""
    client = cluster.client()
    cluster.mark()
    started = time.perf_counter()
    sent = client.submit_jobs(jobs)  # type: ignore[attr-defined]
    pending = {job.id for job in sent}
    deadline = time.monotonic() + timeout_s
    done = 0
    while pending and time.monotonic() < deadline:
        ready = [s.job_id for s in client.fetch(list(pending)) if s.ready]  # type: ignore[attr-defined]
        pending.difference_update(ready)
        done += len(ready)
        if on_progress is not None:
            on_progress(done)
        if pending:
            time.sleep(0.05)
    elapsed = time.perf_counter() - started
    client.close()  # type: ignore[attr-defined]
    return elapsed, len(pending)


def learn(sim_models: Path, timeout_s: float = 120) -> dict[bytes, bytes]:
    """What one worker's warm start learns of the simulated models (the learned store's hash), to start every
    simulated cluster with, as a deployment that ran before starts."""
    cluster = Cluster("learn", 1, "placement", sim_models, 3, warm_start=True)
    try:
        deadline = time.monotonic() + timeout_s
        while cluster.redis.hlen(cluster.learned_key) < len(SIM_MODELS):  # written at the next heartbeat
            if time.monotonic() > deadline:
                raise RuntimeError("the warm start's measurements did not reach the learned store")
            time.sleep(0.2)
        return cluster.redis.hgetall(cluster.learned_key)  # type: ignore[return-value]
    finally:
        cluster.close()


def run_config(workload: str, n: int, routing: str, seed: int, real_models: Path, sim_models: Path,
               learned: dict[bytes, bytes] | None = None) -> Result:
    """One run of ``workload`` (``sim_models``: its simulated models file, ``learned``: what was learned of them)."""
    if workload == "real":
        jobs = mixed_jobs(seed, 600)
        cluster = Cluster(f"real-{routing}-{n}", n, routing, real_models, 2, warm_start=True)
    else:
        jobs = _sim_jobs(seed, skewed=workload in ("sim-skewed", "sim-hot"))
        # a simulated model has no one-off costs to warm: a warm start would only sleep through every load; what
        # it would measure (the loads' times) comes from the learned store, as in a deployment that ran before
        cluster = Cluster(f"{workload}-{routing}-{n}", n, routing, sim_models, 3, warm_start=False, learned=learned)
    try:
        if workload != "failover":
            seconds, lost = _run(cluster, jobs)
            loads = cluster.loads()
            return Result(len(jobs), seconds, sum(loads.values()), lost, cluster.workers_that_loaded(HOT),
                          loads_by_model=loads)
        return _failover(cluster, jobs)
    finally:
        cluster.close()


def _failover(cluster: Cluster, jobs: list[tuple[str, str]]) -> Result:
    from swapless.tasks.keyspace import Keyspace

    victim = cluster.workers[0]
    killed: dict[str, float] = {}

    def kill_at_40_percent(done: int) -> None:
        if not killed and done >= len(jobs) * 4 // 10:
            victim.proc.send_signal(signal.SIGKILL)
            killed["at"] = time.perf_counter()

    recovered: dict[str, float] = {}

    def free_again() -> bool:
        # the dead worker (w0) holds no claim and no job any more
        for model_id in SIM_MODELS:
            keys = Keyspace(cluster.prefix + "jobs", cluster.prefix).model(model_id)
            now_ms = int(time.time() * 1000)  # leases still running: a lapsed one waits in the set for a script
            holders = [h.decode() for h in cluster.redis.zrangebyscore(keys.holders, now_ms, "+inf")]
            owners = [o.decode() for o in cluster.redis.hvals(keys.owner)]
            if any(x.startswith("w0@bench:") for x in holders + owners):
                return False
        return True

    def progress(done: int) -> None:
        kill_at_40_percent(done)
        if "at" in killed and "at" not in recovered and free_again():
            recovered["at"] = time.perf_counter()

    started = time.perf_counter()
    seconds, lost = _run(cluster, jobs, progress)
    end = started + seconds
    loads = cluster.loads()
    return Result(len(jobs), seconds, sum(loads.values()), lost, 0,
                  recovery_s=recovered.get("at", end) - killed["at"] if "at" in killed else None,
                  done_after_kill_s=end - killed["at"] if "at" in killed else None, loads_by_model=loads)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values)


def report(results: dict[tuple[str, int, str], list[Result]], workers: Sequence[int], repeats: int,
           took_s: float) -> str:
    lines = [
        "# Scale-out benchmark",
        "",
        (f"`python -m bench.scaleout` — {time.strftime('%Y-%m-%d %H:%M')}, 2-core CPU machine, Redis 7, "
         f"{repeats} repetition(s) per row (median [min–max]); the whole run took {took_s / 60:.1f} min."),
        ("Each row: placement (`SWAPLESS_ROUTING=placement`, this design) / shared queue (`shared`, the baseline, "
         "measured in the same run). *sim* rows use the simulated framework (`bench/simulated.py`): loads and "
         "forward passes sleep (1-3 s per load), as a GPU's work leaves the CPU free. Simulated workers start "
         "without a warm start (it would only sleep) but with what one worker's warm start measured, in the learned "
         "store, as workers of a deployment that ran before do; loads are counted from the first job sent."),
        "",
    ]
    one = {w: _median([r.jobs_per_s for r in results.get((w, 1, "placement"), [])] or [float("nan")])
           for w in REPORTED}
    for workload in (w for w in REPORTED if any(key[0] == w for key in results)):
        skewed = workload in ("sim-skewed", "sim-hot")
        distinct = len(MODEL_IDS) if workload == "real" else len(SIM_MODELS)
        cache = 2 if workload == "real" else 3
        lines += [
            (
                f"## {workload}: "
                f"{'600 mixed jobs, 6 real tiny models' if workload == 'real' else '1,200 jobs, 12 simulated models'}"
                f"{f', 80 % for one model ({HOT_ITEM_S[workload] * 1000:g} ms per input)' if skewed else ''}, "
                f"cache of {cache} per worker"
            ),
            "",
            (
                "| workers | jobs/s placement | jobs/s shared | vs N x one worker | loads placement | loads shared "
                "| target loads | hot model on workers |"
            ),
            "|---|---|---|---|---|---|---|---|",
        ]
        for n in workers:
            placed = results.get((workload, n, "placement"), [])
            shared = results.get((workload, n, "shared"), [])
            if not placed:
                continue
            scale = (
                _median([r.jobs_per_s for r in placed]) / (n * one[workload])
                if one[workload] == one[workload]
                else float("nan")
            )
            fits = n * cache >= distinct
            target = f"<= {distinct + 1}" if fits and not skewed else "-"
            hot = summary([r.hot_workers for r in placed]) if skewed else "-"
            lines.append(
                f"| {n} | {summary([r.jobs_per_s for r in placed])} "
                f"| {summary([r.jobs_per_s for r in shared]) if shared else '-'} "
                f"| {scale:.2f} | {summary([r.loads for r in placed])} "
                f"| {summary([r.loads for r in shared]) if shared else '-'} "
                f"| {target} | {hot} |"
            )
        lines.append("")
    fail = [(routing, results.get(("failover", 3, routing), [])) for routing in ("placement", "shared")]
    if any(rs for _, rs in fail):
        lines += [
            "## failover: 3 workers, the simulated burst, one worker SIGKILLed at 40 % of the results",
            "",
            (
                "| routing | lost | recovery (s): dead worker's jobs and models free again | kill -> all done (s) "
                "| jobs/s |"
            ),
            "|---|---|---|---|---|",
        ]
        for routing, rs in fail:
            if rs:
                lines.append(
                    f"| {routing} | {summary([r.lost for r in rs])} "
                    f"| {summary([r.recovery_s or float('nan') for r in rs])} "
                    f"| {summary([r.done_after_kill_s or float('nan') for r in rs])} "
                    f"| {summary([r.jobs_per_s for r in rs])} |"
                )
        lines.append("")
    return "\n".join(lines) + "\n"


def _sections(text: str) -> tuple[list[str], dict[str, str]]:
    """A report's lines before its first section, and its sections by workload name."""
    head, *parts = text.split("\n## ")
    return head.splitlines(), {part.split(":", 1)[0]: "## " + part.rstrip("\n") for part in parts}


def merge(earlier: str, now: str, argv: str) -> str:
    """``now``'s sections, and ``earlier``'s for the workloads ``now`` did not run, in the usual order."""
    old_head, old = _sections(earlier)
    new_head, new = _sections(now)
    order = [*REPORTED, "failover"]
    merged = {**old, **new}
    when = next((line for line in old_head if line.startswith("`python -m bench.scaleout`")), "")
    head = [*new_head[:2], (f"Sections {', '.join(sorted(new))}: `python -m bench.scaleout {argv}`, "
             f"{time.strftime('%Y-%m-%d %H:%M')}; the others from the earlier run: {when}"), *new_head[3:]]
    body = [merged[name] for name in sorted(merged, key=lambda n: order.index(n) if n in order else len(order))]
    return "\n".join(head).rstrip("\n") + "\n\n" + "\n\n".join(body) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="1,2,3,4", help="worker counts, comma-separated")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--routings", default="placement,shared")
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "SCALEOUT.md")
    parser.add_argument("--update", action="store_true",
                        help="keep the output's sections of the workloads not run now (from its earlier run)")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    workloads = args.workloads.split(",")
    routings = args.routings.split(",")
    real_models = build_models() if "real" in workloads else Path()
    sim_models = {w: _sim_models_file(OUT / f"sim-models-{int(s * 1000)}ms", s) for w, s in HOT_ITEM_S.items()
                  if w in workloads}
    results: dict[tuple[str, int, str], list[Result]] = {}
    started = time.monotonic()
    learned = {path: learn(path) for path in set(sim_models.values())}
    for rep in range(args.repeats):
        for workload in workloads:
            for n in [3] if workload == "failover" else counts:
                for routing in routings:
                    models = sim_models.get(workload, Path())
                    result = run_config(workload, n, routing, seed=rep, real_models=real_models, sim_models=models,
                                        learned=learned.get(models))
                    results.setdefault((workload, n, routing), []).append(result)
                    extra = f", recovery {result.recovery_s:.1f} s" if result.recovery_s is not None else ""
                    print(f"rep {rep + 1} {workload} n={n} {routing}: {result.jobs_per_s:.1f} jobs/s, "
                          f"{result.loads} loads, lost {result.lost}{extra}", flush=True)
    text = report(results, counts, args.repeats, time.monotonic() - started)
    if args.update and args.output.exists():
        text = merge(args.output.read_text(), text, " ".join(sys.argv[1:]))
    args.output.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
