"""Benchmark of bulk jobs: `python -m bench.bulk --records 100000`.

On one tiny text model (random-weight BERT, ``swapless.manager.demo.tiny``), in one run:

1. in-process batched throughput: ``run_group`` over groups of 256 in this process (the worker's own compute path,
   no queue), measured just before and just after the full bulk run (the machine may be shared: both are shown);
2. a chunk-size sweep of ``swapless bulk`` on the first records (how the default chunk size was chosen);
3. ``swapless bulk`` over all records through Redis and one real worker process: records/s, peak RSS of the
   producer and of the worker, producer peak RSS on a tenth of the input too (flat memory), result keys left in
   Redis;
4. the same job interrupted twice (SIGINT, then SIGKILL) and resumed: lines, unique keys, duplicates and gaps.

Prints a table and writes it to bench/BULK_RESULTS.md. Needs Redis at SWAPLESS_TEST_REDIS_URL (default
redis://127.0.0.1:6379/11); uses its own key prefix and deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil
import redis

from bench.common import OUT, REPO, Process, cleanup, fresh_prefix

MODEL = "sentiment"


def build_model() -> Path:
    from swapless.manager.demo.models import build_demo_models

    directory = OUT / "bulk-models"
    models_file = directory / "models.json"
    return models_file if models_file.exists() else build_demo_models(directory, image=False)


def write_input(path: Path, records: int, seed: int = 0) -> list[str]:
    """``records`` short reviews (5 to 30 words of the tiny vocabulary), one JSON object per line."""
    from swapless.manager.demo.tiny import vocabulary

    rng = random.Random(seed)
    words = [w for w in vocabulary(3000) if w.isalpha()]
    sample = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) for _ in range(4096)]
    with path.open("w") as file:
        for i in range(records):
            file.write(json.dumps({"id": f"r{i}", "text": sample[(i * 7919) % len(sample)]}) + "\n")
    return sample


def in_process_rate(models_file: Path, texts: list[str], records: int, group: int = 256) -> tuple[float, float]:
    """Records/s of the worker's compute path in this process (run_group over groups of ``group``), and its CPU
    seconds per 1000 records."""
    from swapless.manager import ModelEngine, ModelManager, ModelStore, WorkerLimits, WorkItem, run_group

    engine = ModelEngine(WorkerLimits(device="cpu"))
    manager = ModelManager(ModelStore.from_file(models_file, engine.frameworks), engine)
    try:
        jobs = [WorkItem(id=str(i), model_id=MODEL, input=texts[i % len(texts)]) for i in range(records)]
        run_group(manager, MODEL, jobs[:group])  # load and warm up
        started, cpu = time.perf_counter(), time.process_time()
        for start in range(0, len(jobs), group):
            run_group(manager, MODEL, jobs[start : start + group])
        return len(jobs) / (time.perf_counter() - started), (time.process_time() - cpu) / len(jobs) * 1000
    finally:
        manager.close()


@dataclass
class Run:
    status: int
    seconds: float
    producer_peak_bytes: int
    worker_peak_bytes: int
    stderr: str
    producer_cpu_s: float = 0.0
    worker_cpu_s: float = 0.0

    @property
    def reported_rate(self) -> float:
        """The records/s the producer reports (from the start of sending to the end, its imports excluded)."""
        match = re.search(r"([0-9.]+) records/s", self.stderr)
        return float(match.group(1)) if match else float("nan")


def run_bulk(
    env: dict[str, str],
    source: Path,
    out: Path,
    worker: Process,
    *extra: str,
    stop_after: tuple[int, int] | None = None,
) -> Run:
    """Run ``swapless bulk`` as a subprocess, sampling the RSS of it and of the worker every 50 ms.

    ``stop_after=(lines, signal)`` sends the signal once the output has that many lines.
    """
    argv = [sys.executable, "-m", "swapless", "bulk", MODEL, str(source), "-o", str(out), "--id-field", "id",
            "--progress", "none", *extra]
    log = out.with_suffix(".log")
    worker_ps = psutil.Process(worker.proc.pid)
    worker_cpu = sum(worker_ps.cpu_times()[:2])
    children_cpu = _children_cpu()
    producer_peak = worker_peak = 0
    with log.open("wb") as stderr:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=stderr)
        producer_ps = psutil.Process(proc.pid)
        signalled = False
        while proc.poll() is None:
            try:
                producer_peak = max(producer_peak, producer_ps.memory_info().rss)
                worker_peak = max(worker_peak, worker_ps.memory_info().rss)
            except psutil.Error:
                pass
            if stop_after and not signalled and out.exists() and out.read_bytes().count(b"\n") >= stop_after[0]:
                proc.send_signal(stop_after[1])
                signalled = True
            time.sleep(0.05)
        seconds = time.perf_counter() - started
    return Run(
        proc.returncode, seconds, producer_peak, worker_peak, log.read_text(),
        producer_cpu_s=_children_cpu() - children_cpu, worker_cpu_s=sum(worker_ps.cpu_times()[:2]) - worker_cpu,
    )


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # children that have ended: the producers run here
    return usage.ru_utime + usage.ru_stime


def check_output(out: Path, records: int) -> dict[str, int]:
    keys = [json.loads(line)["key"] for line in out.read_text().splitlines()]
    expected = [f"r{i}" for i in range(records)]
    seen = set(keys)
    return {
        "lines": len(keys),
        "unique": len(seen),
        "duplicates": len(keys) - len(seen),
        "gaps": sum(1 for key in expected if key not in seen),
        "in_order": int(keys == expected),
    }


def mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


@dataclass
class Measured:
    """Everything one benchmark run measured, for its table."""

    sweep: dict[int, list[float]]
    small_run: Run
    full: Run
    full_check: dict[str, int]
    left: int
    rates_in_process: list[float]
    cpu_in_process: float
    pairs: list[tuple[float, float]]
    interrupted: tuple[Run, int, Run, int, Run]
    resumed: dict[str, int]


def _fresh(path: Path) -> Path:
    path.unlink(missing_ok=True)
    return path


def _measure(args: argparse.Namespace, env: dict[str, str], worker: Process, client: redis.Redis, prefix: str,
             models_file: Path, texts: list[str]) -> Measured:
    """The sweep, the small and full runs between two in-process runs, the pairs, then the interrupted run."""
    work = OUT / "bulk"
    source, small, sweep_source = work / "input.jsonl", work / "input-small.jsonl", work / "input-sweep.jsonl"
    sweep: dict[int, list[float]] = {int(size): [] for size in args.sweep.split(",") if size}
    for _ in range(2):  # two interleaved rounds: a burst of load elsewhere hits one size, not all of its runs
        for size, rates in sweep.items():
            out = _fresh(work / f"sweep-{size}.jsonl")
            rates.append(run_bulk(env, sweep_source, out, worker, "--chunk-size", str(size)).reported_rate)
    small_run = run_bulk(env, small, _fresh(work / "small.jsonl"), worker)
    out = _fresh(work / "full.jsonl")
    rates_in_process = [in_process_rate(models_file, texts, args.in_process_records)[0]]
    full = run_bulk(env, source, out, worker)
    full_check = check_output(out, args.records)
    left = sum(1 for _ in client.scan_iter(match=f"{prefix}celery-task-meta-*", count=5000))
    after, cpu_in_process = in_process_rate(models_file, texts, args.in_process_records)
    rates_in_process.append(after)
    # The machine may be shared: interleaved pairs cancel slow drifts in load; the median ratio is reported.
    pairs = []
    for index in range(args.pairs):
        alone = in_process_rate(models_file, texts, args.sweep_records)[0]
        out = _fresh(work / f"pair-{index}.jsonl")
        pairs.append((alone, run_bulk(env, sweep_source, out, worker).reported_rate))

    out = _fresh(work / "resumed.jsonl")
    first = run_bulk(env, source, out, worker, stop_after=(args.records * 3 // 10, signal.SIGINT))
    after_sigint = out.read_bytes().count(b"\n")
    second = run_bulk(env, source, out, worker, stop_after=(args.records * 6 // 10, signal.SIGKILL))
    after_sigkill = out.read_bytes().count(b"\n")
    third = run_bulk(env, source, out, worker)
    resumed = check_output(out, args.records)
    return Measured(sweep, small_run, full, full_check, left, rates_in_process, cpu_in_process, pairs,
                    (first, after_sigint, second, after_sigkill, third), resumed)


def _rows(args: argparse.Namespace, m: Measured, loads: tuple[float, float]) -> list[tuple[str, str]]:
    full, full_check, resumed, pairs = m.full, m.full_check, m.resumed, m.pairs
    first, after_sigint, second, after_sigkill, third = m.interrupted
    in_process = statistics.mean(m.rates_in_process)
    bulk_rate = args.records / full.seconds
    return [
        ("records", f"{args.records}"),
        (
            "in-process batched (run_group, groups of 256), records/s",
            (
                f"{in_process:.0f} (just before the bulk run {m.rates_in_process[0]:.0f}, "
                f"just after {m.rates_in_process[1]:.0f})"
            ),
        ),
        ("`swapless bulk`, records/s as it reports them (first send to last write)", f"{full.reported_rate:.0f}"),
        ("`swapless bulk` end to end (process start to exit, imports included), records/s", f"{bulk_rate:.0f}"),
        ("bulk (as reported) / in-process (mean of the two)", f"{full.reported_rate / in_process:.0%}"),
        (
            f"interleaved pairs on {args.sweep_records} records: in-process / bulk records/s (ratio)",
            "; ".join(f"{alone:.0f} / {bulk:.0f} ({bulk / alone:.0%})" for alone, bulk in pairs),
        ),
        ("bulk / in-process, median of the pairs", f"{statistics.median(bulk / alone for alone, bulk in pairs):.0%}"),
        (
            "CPU seconds per 1000 records: in-process / bulk worker + producer (Redis not counted)",
            (
                f"{m.cpu_in_process:.2f} / {full.worker_cpu_s / args.records * 1000:.2f} + "
                f"{full.producer_cpu_s / args.records * 1000:.2f}"
            ),
        ),
        (
            f"chunk-size sweep on {args.sweep_records} records, records/s (best of 2 interleaved rounds)",
            ", ".join(f"{size}: {max(rates):.0f}" for size, rates in m.sweep.items()),
        ),
        ("producer peak RSS, all records", mib(full.producer_peak_bytes)),
        (f"producer peak RSS, {max(1, args.records // 10)} records", mib(m.small_run.producer_peak_bytes)),
        ("worker peak RSS", mib(full.worker_peak_bytes)),
        (
            "output check (lines / duplicates / gaps / in order)",
            (
                f"{full_check['lines']} / {full_check['duplicates']} / {full_check['gaps']} / "
                f"{'yes' if full_check['in_order'] else 'NO'}"
            ),
        ),
        ("chunk results left in Redis after the run", f"{m.left}"),
        ("interrupted run: SIGINT at 30% (exit status, lines)", f"{first.status}, {after_sigint}"),
        ("then SIGKILL at 60% (exit status, lines)", f"{second.status}, {after_sigkill}"),
        (
            "then resumed to the end (exit status, lines, unique keys)",
            f"{third.status}, {resumed['lines']}, {resumed['unique']}",
        ),
        (
            "resumed output: duplicates / gaps / in order",
            f"{resumed['duplicates']} / {resumed['gaps']} / {'yes' if resumed['in_order'] else 'NO'}",
        ),
        ("load average before / after (1 min; other work on the machine)", f"{loads[0]:.2f} / {loads[1]:.2f}"),
    ]


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--sweep", default="16,64,256,1024", help="chunk sizes to compare (on --sweep-records)")
    parser.add_argument("--sweep-records", type=int, default=10_000)
    parser.add_argument("--in-process-records", type=int, default=20_000)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads, in-process and in the worker [default: torch's]"
    )
    parser.add_argument("--pairs", type=int, default=5, help="interleaved (in-process, bulk) pairs on --sweep-records")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` or a kill still stops the worker (finally)

    url = os.environ.get("SWAPLESS_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
    client = redis.Redis.from_url(url)
    prefix = fresh_prefix("bulk")
    work = OUT / "bulk"
    work.mkdir(parents=True, exist_ok=True)
    models_file = build_model()
    texts = write_input(work / "input.jsonl", args.records)
    write_input(work / "input-small.jsonl", max(1, args.records // 10))
    write_input(work / "input-sweep.jsonl", args.sweep_records)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    env = {
        **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}),
        "SWAPLESS_REDIS_URL": url,
        "SWAPLESS_KEY_PREFIX": prefix,
        "SWAPLESS_QUEUE": prefix + "jobs",
        "SWAPLESS_MODELS_FILE": str(models_file),
        "SWAPLESS_DEVICE": "cpu",
    }
    load_before = os.getloadavg()[0]
    worker = Process([sys.executable, "-m", "swapless", "worker", "--loglevel", "INFO"], env, work / "worker.log")
    try:
        worker.wait_for("ready", 120)
        measured = _measure(args, env, worker, client, prefix, models_file, texts)
    finally:
        worker.stop()
        cleanup(client, prefix)
    rows = _rows(args, measured, (load_before, os.getloadavg()[0]))
    command = f"python -m bench.bulk --records {args.records}" + (f" --threads {args.threads}" if args.threads else "")
    width = max(len(name) for name, _ in rows)
    table = "\n".join(f"| {name:<{width}} | {value} |" for name, value in rows)
    header = f"| {'measure':<{width}} | value |\n|{'-' * (width + 2)}|-------|"
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = (
        f"## `{command}`\n\n{when}, {os.cpu_count()} CPU cores, CPU only, torch threads: "
        f"{args.threads or 'default'}.\n\n{header}\n{table}\n"
    )
    print(section)
    _write_section(REPO / "bench" / "BULK_RESULTS.md", command, section)


_INTRO = """# Bulk jobs benchmark

`python -m bench.bulk` runs one tiny random-weight BERT (`sentiment` of `swapless.manager.demo.tiny`: 2 layers, hidden
128) on short reviews (5-30 words) through `swapless bulk` (one worker process, the real Redis, default chunk size 256
and 8 chunks in flight) and through the worker's own compute path in one process (`run_group`, groups of 256: no
queue), in the same run. Each command below replaces its own section.

The machine these ran on is shared (other test suites and benchmarks run beside them; see the load average), so
single measurements swing by 2x either way: the **interleaved pairs** (in-process, then bulk, five times) and their
median ratio are the figure to read; the full-run ratio compares the 100,000-record run with in-process runs just
before and just after it.
"""


def _write_section(path: Path, command: str, section: str) -> None:
    """Replace this command's section of the results file (keeping the others), or add it."""
    old = path.read_text() if path.exists() else ""
    sections = [part for part in old.split("\n## ")[1:] if not part.startswith(f"`{command}`\n")]
    path.write_text(_INTRO + "".join("\n## " + part.rstrip("\n") + "\n" for part in sections) + "\n" + section)


if __name__ == "__main__":
    main()
