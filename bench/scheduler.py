"""Benchmark of the swap-minimizing scheduler: naive Celery vs Swapless vs the in-process limit.

    python -m bench.scheduler            # 3 repetitions, a few minutes on 2 cores; writes bench/RESULTS.md

Workloads (six models: three bert-tiny-sized, one bert-mini-sized, one distilbert-sized, mobilenet_v2; random
weights; a cache of two):
  1. mixed burst: 600 jobs enqueued at once in random model order;
  2. single-model stream: jobs for one warm tiny model, enqueued as fast as the producer can;
  3. lone jobs: one job at a time on a warm model of an idle worker.
The limit is measured in this process: one load per model plus each model's compute at its best batch size (the
size chosen by the fastest of two passes at each of 1..64, its time then measured afresh: median of three passes).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.common import (
    MODEL_IDS,
    OUT,
    REPO,
    Process,
    cleanup,
    collect,
    fresh_prefix,
    inputs_for,
    mixed_jobs,
    percentile,
    python,
    summary,
)

STREAM_MODEL = "tiny-a"
BATCH_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class Run:
    jobs_per_s: float
    loads: int
    p50_s: float
    p99_s: float
    extra: dict[str, float] = field(default_factory=dict)


# -- the in-process limit ----------------------------------------------------------------------------------


def measure_limit(models_file: Path, jobs: list[tuple[str, str]]) -> tuple[Run, dict[str, int], dict[str, float]]:
    """One load per model + its jobs at its best batch size. Returns the run, best batch sizes, per-job seconds."""
    from manager import ModelEngine, ModelStore, WorkerLimits

    engine = ModelEngine(WorkerLimits(device="cpu", max_batch_size=1024))
    store = ModelStore.from_file(models_file, engine.frameworks)
    engine.warm_up(spec.framework for spec in store)  # as a worker does at start-up
    by_model: dict[str, list[str]] = {}
    for model_id, value in jobs:
        by_model.setdefault(model_id, []).append(value)
    total = 0.0
    best_sizes: dict[str, int] = {}
    per_job: dict[str, float] = {}
    for model_id, values in by_model.items():
        worker = engine.build(store.get(model_id))
        started = time.perf_counter()
        worker.load()
        load_s = time.perf_counter() - started
        worker.tuner = None  # fixed sizes here: the limit is the best of each, measured
        worker.predict([worker.prepare(v) for v in values[:8]])  # first-call costs (allocator, kernels) once
        fastest = float("inf")
        for size in BATCH_CANDIDATES:
            worker.limits.max_batch_size = size
            for _ in range(2):  # best of two: the machine is shared
                started = time.perf_counter()
                worker.predict([worker.prepare(v) for v in values])
                elapsed = time.perf_counter() - started
                if elapsed < fastest:
                    fastest, best_sizes[model_id] = elapsed, size
        # The fastest of 14 noisy draws is a lucky one (the winner's curse): the size is chosen by it, its time is
        # measured again, three fresh passes at that size, median.
        worker.limits.max_batch_size = best_sizes[model_id]
        again = []
        for _ in range(3):
            started = time.perf_counter()
            worker.predict([worker.prepare(v) for v in values])
            again.append(time.perf_counter() - started)
        best = statistics.median(again)
        per_job[model_id] = best / len(values)
        total += load_s + best
        worker.unload()
    return Run(len(jobs) / total, len(by_model), total, total), best_sizes, per_job


def lone_inference_s(models_file: Path, model_id: str, value: str, repeats: int = 30) -> float:
    from manager import ModelEngine, ModelStore, WorkerLimits

    engine = ModelEngine(WorkerLimits(device="cpu"))
    worker = engine.build(ModelStore.from_file(models_file, engine.frameworks).get(model_id))
    worker.load()
    worker.predict([worker.prepare(value)])  # first-call costs once
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        worker.predict([worker.prepare(value)])
        times.append(time.perf_counter() - started)
    worker.unload()
    return statistics.median(times)


# -- systems under test ------------------------------------------------------------------------------------


class System:
    name = ""

    def __init__(self, redis_url: str, models_file: Path, tag: str) -> None:
        self.redis_url = redis_url
        self.models_file = models_file
        self.prefix = fresh_prefix(self.name)
        self.queue = self.prefix + "jobs"
        self.redis = redis.Redis.from_url(redis_url)
        self.log = OUT / "logs" / f"{self.name}-{tag}.log"
        self.process: Process | None = None

    def loads(self) -> int:
        assert self.process is not None
        return self.process.text().count(self.load_marker)

    load_marker = ""

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        cleanup(self.redis, self.prefix)


class Naive(System):
    name = "naive"
    load_marker = "naive loaded "

    def start(self) -> None:
        env = {"BENCH_REDIS_URL": self.redis_url, "BENCH_QUEUE": self.queue, "BENCH_PREFIX": self.prefix,
               "SWAPLESS_MODELS_FILE": str(self.models_file)}
        argv = [python(), "-m", "celery", "-A", "bench.naive", "worker", "--pool", "solo", "--concurrency", "1",
                "--loglevel", "INFO", "--without-gossip", "--without-mingle", "-Q", self.queue]
        self.process = Process(argv, env, self.log)
        self.process.wait_for("ready.")
        from bench.naive import app

        app.conf.broker_url = self.redis_url
        self.app = app

    def submit(self, jobs: list[tuple[str, str]], priority: str = "interactive") -> list[tuple[float, str]]:
        sent = []
        with self.app.producer_or_acquire() as producer:
            for model_id, value in jobs:
                at = time.time()
                result = self.app.send_task("naive.predict", args=[model_id, value], queue=self.queue, producer=producer)
                sent.append((at, result.id))
        return sent

    def get_one(self, model_id: str, value: str) -> float:
        started = time.time()
        result = self.app.send_task("naive.predict", args=[model_id, value], queue=self.queue)
        collect(self.redis, self.prefix, [result.id], 60, poll_s=0.001)  # a tight poll: fair to naive's latency
        return time.time() - started


class Swapless(System):
    name = "swapless"
    load_marker = "loaded "
    #: ``swapless worker --warm-start``: each model warmed and its batch size measured before "ready" (the limit,
    #: too, leaves its warm-up pass out); ``ColdSwapless`` is the same worker without it.
    warm_start = True
    start_s = 0.0

    def start(self) -> None:
        env = {"SWAPLESS_REDIS_URL": self.redis_url, "SWAPLESS_QUEUE": self.queue, "SWAPLESS_KEY_PREFIX": self.prefix,
               "SWAPLESS_MODELS_FILE": str(self.models_file), "SWAPLESS_DEVICE": "cpu"}
        argv = [python(), "-m", "tasks.cli", "worker", "--max-models", "2", "--loglevel", "INFO"]
        argv += ["--warm-start"] if self.warm_start else []
        started = time.monotonic()
        self.process = Process(argv, env, self.log)
        self.process.wait_for("ready.")
        self.start_s = time.monotonic() - started
        from config.settings import Settings
        from tasks.client import Client

        self.client = Client(settings=Settings(redis_url=self.redis_url, queue=self.queue, key_prefix=self.prefix,
                                               models_file=self.models_file))

    #: How jobs are sent: ``Client.submit_jobs`` (one pipeline, messages built directly) or Celery's ``send_task``.
    producer = "submit_jobs"

    def submit(self, jobs: list[tuple[str, str]], priority: str = "interactive") -> list[tuple[float, str]]:
        from tasks.protocol import PREDICT_TASK, PRIORITY_BULK, PRIORITY_INTERACTIVE

        if self.producer == "submit_jobs":
            at = time.time()  # every job counts from before the first message was built
            return [(at, job.id) for job in self.client.submit_jobs(jobs, priority=priority)]
        level = PRIORITY_BULK if priority == "bulk" else PRIORITY_INTERACTIVE
        sent = []
        app = self.client.app
        with app.producer_or_acquire() as producer:
            for model_id, value in jobs:
                at = time.time()
                result = app.send_task(PREDICT_TASK, args=[model_id, value], queue=self.queue, priority=level, producer=producer)
                sent.append((at, result.id))
        return sent

    def get_one(self, model_id: str, value: str) -> float:
        started = time.time()
        self.client.submit(model_id, value).get(timeout=60)
        return time.time() - started

    def loads(self) -> int:
        assert self.process is not None
        return len(re.findall(r"loaded \S+ \((?:transformers|torchvision|triton)\) in", self.process.text()))


class ColdSwapless(Swapless):
    """A fresh worker process without the warm start: every model's one-off costs fall on its first jobs."""

    name = "swapless (cold start)"
    warm_start = False


def burst(system: System, jobs: list[tuple[str, str]], timeout_s: float) -> Run:
    loads_before = system.loads()
    sent = system.submit(jobs)
    got = collect(system.redis, system.prefix, [job_id for _, job_id in sent], timeout_s)
    latencies = [got.done_wall[job_id] - at for at, job_id in sent]
    makespan = max(got.done_wall.values()) - sent[0][0]
    failed = sum(1 for state in got.states.values() if state != "SUCCESS")
    if failed:
        raise RuntimeError(f"{system.name}: {failed} jobs failed; see {system.log}")
    return Run(len(jobs) / makespan, system.loads() - loads_before, percentile(latencies, 50), percentile(latencies, 99),
               {"makespan_s": makespan})


def priority(system: System, bulk: list[tuple[str, str]], interactive: list[tuple[str, str]], every_s: float) -> Run:
    """Interactive jobs submitted one by one while a bulk backlog drains: their latency, and the bulk's rate."""
    started = time.time()
    sent_bulk = system.submit(bulk, priority="bulk")
    sent = []
    for job in interactive:
        time.sleep(every_s)
        sent.extend(system.submit([job], priority="interactive"))
    got = collect(system.redis, system.prefix, [job_id for _, job_id in sent], 600)
    latencies = [got.done_wall[job_id] - at for at, job_id in sent]
    bulk_done = collect(system.redis, system.prefix, [job_id for _, job_id in sent_bulk], 600)
    makespan = max(bulk_done.done_wall.values()) - started
    return Run(len(bulk) / makespan, 0, percentile(latencies, 50), percentile(latencies, 99), {"makespan_s": makespan})


def repeat(fn: Callable[[int], Any], times: int) -> list[Any]:
    return [fn(i) for i in range(times)]


# -- the benchmark -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mixed-jobs", type=int, default=600)
    parser.add_argument("--stream-jobs", type=int, default=3000)
    parser.add_argument("--naive-stream-jobs", type=int, default=600)
    parser.add_argument("--lone-jobs", type=int, default=30)
    parser.add_argument("--bulk-jobs", type=int, default=1000)
    parser.add_argument("--write", type=Path, default=REPO / "bench" / "RESULTS.md")
    parser.add_argument("--systems", default="naive,swapless", help="comma-separated: naive, swapless")
    parser.add_argument("--workloads", default="mixed,stream,lone,priority",
                        help="comma-separated: mixed, stream, lone, priority (the limit is always measured)")
    args = parser.parse_args(argv)
    systems = [{"naive": Naive, "swapless": Swapless}[name.strip()] for name in args.systems.split(",")]
    workloads = {name.strip() for name in args.workloads.split(",")}

    from bench.common import build_models

    models_file = build_models()
    rng = random.Random(0)
    stream_inputs = inputs_for(STREAM_MODEL, rng, max(args.stream_jobs, args.naive_stream_jobs))
    lone_value = inputs_for(STREAM_MODEL, rng, 1)[0]
    rows: dict[tuple[str, str], list[Run]] = {}
    warm_starts: list[float] = []

    def add(workload: str, system: str, run: Run) -> None:
        rows.setdefault((workload, system), []).append(run)
        print(f"  {workload:>8} {system:>9}: {run.jobs_per_s:8.1f} jobs/s, {run.loads:4d} loads, "
              f"p50 {run.p50_s * 1000:8.1f} ms, p99 {run.p99_s * 1000:8.1f} ms", flush=True)

    for rep in range(args.repeats):
        print(f"repetition {rep + 1}/{args.repeats}", flush=True)
        jobs = mixed_jobs(seed=rep, n=args.mixed_jobs)
        limit, best_sizes, per_job = measure_limit(models_file, jobs)
        add("mixed", "limit", limit)
        stream_limit = 1.0 / per_job[STREAM_MODEL]
        add("stream", "limit", Run(stream_limit, 0, 0.0, 0.0))
        batch_s = per_job["mini"] * best_sizes["mini"]  # one forward pass of the bulk model at its best size
        add("priority", "limit", Run(1.0 / per_job["mini"], 0, batch_s, batch_s))
        inference = lone_inference_s(models_file, STREAM_MODEL, lone_value)
        add("lone", "limit", Run(1.0 / inference, 0, inference, inference))

        if "mixed" in workloads and Swapless in systems:
            cold = ColdSwapless(args.redis_url, models_file, f"cold-rep{rep}")
            try:
                cold.start()
                add("mixed", cold.name, burst(cold, jobs, timeout_s=600))
            finally:
                cold.stop()
        for cls in systems:
            system = cls(args.redis_url, models_file, f"rep{rep}")
            try:
                system.start()
                if isinstance(system, Swapless):
                    print(f"  swapless worker start-up with --warm-start: {system.start_s:.1f} s", flush=True)
                    warm_starts.append(system.start_s)
                if "mixed" in workloads:
                    add("mixed", system.name, burst(system, jobs, timeout_s=600))
                # warm the stream model, then the stream
                system.get_one(STREAM_MODEL, lone_value)
                if "stream" in workloads:
                    count = args.naive_stream_jobs if cls is Naive else args.stream_jobs
                    add("stream", system.name, burst(system, [(STREAM_MODEL, v) for v in stream_inputs[:count]], 600))
                    if isinstance(system, Swapless):  # the same worker, fed by Celery's own per-message publish
                        system.producer = "send_task"
                        add("stream", "swapless (send_task)",
                            burst(system, [(STREAM_MODEL, v) for v in stream_inputs[:count]], 600))
                        system.producer = "submit_jobs"
                if "lone" in workloads:
                    times = sorted(system.get_one(STREAM_MODEL, lone_value) for _ in range(args.lone_jobs))
                    add("lone", system.name, Run(1.0 / statistics.median(times), 0, percentile(times, 50),
                                                 percentile(times, 99), {"overhead_s": percentile(times, 50) - inference}))
                if "priority" in workloads:
                    bulk = [("mini", v) for v in inputs_for("mini", rng, args.bulk_jobs)]
                    interactive = [("tiny-b", v) for v in inputs_for("tiny-b", rng, 15)]
                    system.get_one("tiny-b", lone_value)  # both models loaded: the test is about queueing, not loading
                    add("priority", system.name, priority(system, bulk, interactive, every_s=0.2))
            finally:
                system.stop()
        print(f"  best batch sizes (in-process): {best_sizes}", flush=True)

    table = render(rows, args, warm_starts)
    print(table)
    args.write.write_text(table)
    print(f"written to {args.write}")


def render(rows: dict[tuple[str, str], list[Run]], args: argparse.Namespace, warm_starts: list[float]) -> str:
    def med(runs: list[Run], attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in runs)

    lines = [
        "# Scheduler benchmark",
        "",
        f"Command: `python -m bench.scheduler --repeats {args.repeats}` on this machine (CPU only, 2 cores); "
        f"{args.repeats} repetitions, median [min–max]. Six models (3× bert-tiny size, bert-mini size, distilbert size, "
        f"mobilenet_v2; random weights), a cache of two. Mixed: {args.mixed_jobs} jobs at once, random order. "
        f"Stream: {args.stream_jobs} jobs for one warm tiny model ({args.naive_stream_jobs} for naive). "
        f"Lone: {args.lone_jobs} jobs one at a time on a warm model. Producers: naive sends each job with Celery's "
        f"`send_task`; Swapless rows use `Client.submit_jobs` (one message per job, built directly, pushed in one "
        f"pipeline); `swapless (send_task)` is the same worker fed one `send_task` per job. Latency counts from before "
        f"the first message is built. The Swapless worker runs with `--warm-start` (each model loaded, warmed and its "
        f"batch sizes measured before it reports ready: {summary(warm_starts) if warm_starts else '-'} s of start-up, "
        f"not counted, as the limit leaves out its own warm-up pass); `swapless (cold start)` is a fresh worker "
        f"without it. Limit: in this process, one load per model plus its compute at its best batch "
        f"size (chosen by the fastest of two passes at each size 1..64, then timed afresh: median of three passes).",
        "",
        "| workload | system | jobs/s | model loads | p50 latency ms | p99 latency ms | vs limit | vs naive |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for workload in ("mixed", "stream", "lone", "priority"):
        limit = rows.get((workload, "limit"), [])
        naive = rows.get((workload, "naive"), [])
        for system in ("naive", "swapless", "swapless (cold start)", "swapless (send_task)", "limit"):
            runs = rows.get((workload, system))
            if not runs:
                continue
            rate = [r.jobs_per_s for r in runs]
            vs_limit = f"{med(runs, 'jobs_per_s') / med(limit, 'jobs_per_s'):.2f}" if limit else ""
            vs_naive = f"{med(runs, 'jobs_per_s') / med(naive, 'jobs_per_s'):.2f}" if naive else ""
            loads = summary([float(r.loads) for r in runs]) if workload == "mixed" else ""
            lines.append(
                f"| {workload} | {system} | {summary(rate)} | {loads} | {summary([r.p50_s * 1000 for r in runs])} | "
                f"{summary([r.p99_s * 1000 for r in runs])} | {vs_limit} | {vs_naive} |"
            )
    mixed_limit = rows.get(("mixed", "limit"))
    mixed_swapless = rows.get(("mixed", "swapless"))
    lone = rows.get(("lone", "swapless"))
    lines += ["", "Targets:"]
    if mixed_limit and mixed_swapless:
        ratio = med(mixed_swapless, "jobs_per_s") / med(mixed_limit, "jobs_per_s")
        p99_ratio = med(mixed_swapless, "p99_s") / med(mixed_limit, "p50_s")
        loads = statistics.median(r.loads for r in mixed_swapless)
        lines.append(f"- mixed at ≥ 90% of the limit: {ratio:.0%}")
        lines.append(f"- model loads ≤ distinct models + 2 = {len(MODEL_IDS) + 2}: {loads:g}")
        lines.append(f"- p99 within 1.3× the limit's makespan: {p99_ratio:.2f}×")
        cold = rows.get(("mixed", "swapless (cold start)"))
        if cold:
            lines.append(f"  (a fresh worker without `--warm-start`: {med(cold, 'jobs_per_s') / med(mixed_limit, 'jobs_per_s'):.0%} "
                         f"of the limit, p99 {med(cold, 'p99_s') / med(mixed_limit, 'p50_s'):.2f}×)")
    stream = rows.get(("stream", "swapless"))
    if stream:
        lines.append(f"- single-model stream ≥ 1,500 jobs/s: {med(stream, 'jobs_per_s'):.0f} jobs/s")
    if lone:
        overhead = statistics.median(r.extra["overhead_s"] for r in lone)
        lines.append(f"- lone job p50 within 5 ms of in-process inference: +{overhead * 1000:.1f} ms")
    prio = rows.get(("priority", "swapless"))
    if prio:
        lines.append(
            f"- interactive jobs while {args.bulk_jobs} bulk jobs drain (priority rows; jobs/s is the bulk's rate): "
            f"p50 {med(prio, 'p50_s') * 1000:.0f} ms, p99 {med(prio, 'p99_s') * 1000:.0f} ms "
            f"(one batch of the bulk model: {med(rows[('priority', 'limit')], 'p50_s') * 1000:.0f} ms)"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
