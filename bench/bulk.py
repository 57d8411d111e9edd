"""Benchmark of bulk jobs: `python -m bench.bulk --records 100000`.

On one tiny text model (random-weight BERT, ``manager.tiny``), in one run:

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
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import psutil
import redis

from bench.common import OUT, REPO, Process, cleanup, fresh_prefix

MODEL = "sentiment"


def build_model() -> Path:
    from manager.tiny import build_demo_models

    directory = OUT / "bulk-models"
    models_file = directory / "models.json"
    return models_file if models_file.exists() else build_demo_models(directory, image=False)


def write_input(path: Path, records: int, seed: int = 0) -> list[str]:
    """``records`` short reviews (5 to 30 words of the tiny vocabulary), one JSON object per line."""
    from manager.tiny import vocabulary

    rng = random.Random(seed)
    words = [w for w in vocabulary(3000) if w.isalpha()]
    sample = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) for _ in range(4096)]
    with path.open("w") as file:
        for i in range(records):
            file.write(json.dumps({"id": f"r{i}", "text": sample[(i * 7919) % len(sample)]}) + "\n")
    return sample


def in_process_rate(models_file: Path, texts: list[str], records: int, group: int = 256) -> float:
    """Records/s of the worker's compute path in this process: run_group over groups of ``group``."""
    from manager import Job, ModelEngine, ModelManager, ModelStore, WorkerLimits, run_group

    engine = ModelEngine(WorkerLimits(device="cpu"))
    manager = ModelManager(ModelStore.from_file(models_file, engine.frameworks), engine)
    try:
        jobs = [Job(id=str(i), model_id=MODEL, input=texts[i % len(texts)]) for i in range(records)]
        run_group(manager, MODEL, jobs[:group])  # load and warm up
        started = time.perf_counter()
        for start in range(0, len(jobs), group):
            run_group(manager, MODEL, jobs[start : start + group])
        return len(jobs) / (time.perf_counter() - started)
    finally:
        manager.close()


@dataclass
class Run:
    status: int
    seconds: float
    producer_peak_bytes: int
    worker_peak_bytes: int
    stderr: str


def run_bulk(env: dict[str, str], source: Path, out: Path, worker: Process, *extra: str, stop_after: tuple[int, int] | None = None) -> Run:
    """Run ``swapless bulk`` as a subprocess, sampling the RSS of it and of the worker every 50 ms.

    ``stop_after=(lines, signal)`` sends the signal once the output has that many lines.
    """
    argv = [sys.executable, "-m", "tasks.cli", "bulk", MODEL, str(source), "-o", str(out), "--id-field", "id",
            "--progress", "none", *extra]
    log = out.with_suffix(".log")
    worker_ps = psutil.Process(worker.proc.pid)
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
    return Run(proc.returncode, seconds, producer_peak, worker_peak, log.read_text())


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--sweep", default="16,64,256,1024", help="chunk sizes to compare (on --sweep-records)")
    parser.add_argument("--sweep-records", type=int, default=10_000)
    parser.add_argument("--in-process-records", type=int, default=20_000)
    args = parser.parse_args()

    url = os.environ.get("SWAPLESS_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
    client = redis.Redis.from_url(url)
    prefix = fresh_prefix("bulk")
    work = OUT / "bulk"
    work.mkdir(parents=True, exist_ok=True)
    models_file = build_model()
    source = work / "input.jsonl"
    texts = write_input(source, args.records)
    small = work / "input-small.jsonl"
    write_input(small, max(1, args.records // 10))
    sweep_source = work / "input-sweep.jsonl"
    write_input(sweep_source, args.sweep_records)
    env = {"SWAPLESS_REDIS_URL": url, "SWAPLESS_KEY_PREFIX": prefix, "SWAPLESS_QUEUE": prefix + "jobs",
           "SWAPLESS_MODELS_FILE": str(models_file), "SWAPLESS_DEVICE": "cpu"}
    load_before = os.getloadavg()[0]
    rates_in_process: list[float] = []
    worker = Process([sys.executable, "-m", "tasks.cli", "worker", "--loglevel", "INFO"], env, work / "worker.log")
    rows: list[tuple[str, str]] = []
    try:
        worker.wait_for("ready", 120)
        sweep: dict[int, float] = {}
        for size in [int(s) for s in args.sweep.split(",") if s]:
            out = work / f"sweep-{size}.jsonl"
            out.unlink(missing_ok=True)
            run = run_bulk(env, sweep_source, out, worker, "--chunk-size", str(size))
            sweep[size] = args.sweep_records / run.seconds
        out = work / "small.jsonl"
        out.unlink(missing_ok=True)
        small_run = run_bulk(env, small, out, worker)
        out = work / "full.jsonl"
        out.unlink(missing_ok=True)
        rates_in_process.append(in_process_rate(models_file, texts, args.in_process_records))
        full = run_bulk(env, source, out, worker)
        full_check = check_output(out, args.records)
        left = sum(1 for _ in client.scan_iter(match=f"{prefix}celery-task-meta-*", count=5000))
        rates_in_process.append(in_process_rate(models_file, texts, args.in_process_records))

        out = work / "resumed.jsonl"
        out.unlink(missing_ok=True)
        first = run_bulk(env, source, out, worker, stop_after=(args.records * 3 // 10, signal.SIGINT))
        after_sigint = out.read_bytes().count(b"\n")
        second = run_bulk(env, source, out, worker, stop_after=(args.records * 6 // 10, signal.SIGKILL))
        after_sigkill = out.read_bytes().count(b"\n")
        third = run_bulk(env, source, out, worker)
        resumed = check_output(out, args.records)
    finally:
        worker.stop()
        cleanup(client, prefix)
    load_after = os.getloadavg()[0]

    in_process = statistics.mean(rates_in_process)
    bulk_rate = args.records / full.seconds
    rows += [
        ("records", f"{args.records}"),
        ("in-process batched (run_group, groups of 256), records/s",
         f"{in_process:.0f} (just before the bulk run {rates_in_process[0]:.0f}, just after {rates_in_process[1]:.0f})"),
        ("`swapless bulk` end to end (producer start to exit), records/s", f"{bulk_rate:.0f}"),
        ("bulk / in-process", f"{bulk_rate / in_process:.0%}"),
        ("chunk-size sweep on " + f"{args.sweep_records} records, records/s",
         ", ".join(f"{size}: {rate:.0f}" for size, rate in sweep.items())),
        ("producer peak RSS, all records", mib(full.producer_peak_bytes)),
        (f"producer peak RSS, {max(1, args.records // 10)} records", mib(small_run.producer_peak_bytes)),
        ("worker peak RSS", mib(full.worker_peak_bytes)),
        ("output check (lines / duplicates / gaps / in order)",
         f"{full_check['lines']} / {full_check['duplicates']} / {full_check['gaps']} / {'yes' if full_check['in_order'] else 'NO'}"),
        ("chunk results left in Redis after the run", f"{left}"),
        ("interrupted run: SIGINT at 30% (exit status, lines)", f"{first.status}, {after_sigint}"),
        ("then SIGKILL at 60% (exit status, lines)", f"{second.status}, {after_sigkill}"),
        ("then resumed to the end (exit status, lines, unique keys)",
         f"{third.status}, {resumed['lines']}, {resumed['unique']}"),
        ("resumed output: duplicates / gaps / in order",
         f"{resumed['duplicates']} / {resumed['gaps']} / {'yes' if resumed['in_order'] else 'NO'}"),
        ("load average before / after (1 min; other work on the machine)", f"{load_before:.2f} / {load_after:.2f}"),
    ]
    command = f"python -m bench.bulk --records {args.records}"
    width = max(len(name) for name, _ in rows)
    table = "\n".join(f"| {name:<{width}} | {value} |" for name, value in rows)
    header = f"| {'measure':<{width}} | value |\n|{'-' * (width + 2)}|-------|"
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        f"# Bulk jobs benchmark\n\n`{command}` ({when}, {os.cpu_count()} CPU cores, CPU only; model: tiny random-weight "
        f"BERT `{MODEL}`, 2 layers, hidden 128; inputs 5-30 words; one worker; default chunk size 256, 8 chunks in "
        f"flight)\n\n{header}\n{table}\n"
    )
    print(text)
    (REPO / "bench" / "BULK_RESULTS.md").write_text(text)


if __name__ == "__main__":
    main()
