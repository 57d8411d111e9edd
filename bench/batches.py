"""Benchmark of the batch API against ``swapless bulk``: ``python -m bench.batches --records 100000``.

One simulated model (``bench.simulated``: a forward pass sleeps, 2 ms + 0.1 ms per input, so the queue, not this
machine's CPU, is what is measured), one real worker and one real ``swapless serve`` on a private key prefix. Each
repetition runs the same records through ``swapless bulk`` (a subprocess, to its output file) and through the batch
API with the ``openai`` client (upload, create, poll every 0.5 s until completed, download the output), and checks
both outputs hold every record once. The ratio is the batch's records/s (upload to download) over bulk's.
Prints a table and writes it to bench/BATCHES.md (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis

from bench.common import OUT, REPO, Process, cleanup, fresh_prefix
from bench.simulated import simulated_entry

MODEL = "sim"
KEY = "bench-batches-key-" + "k" * 16


def write_inputs(directory: Path, records: int) -> tuple[Path, Path]:
    """The same records as a bulk input (``id``, ``text``) and as a batch input (request lines)."""
    bulk, batch = directory / "bulk-input.jsonl", directory / "batch-input.jsonl"
    with bulk.open("w") as plain, batch.open("w") as lines:
        for i in range(records):
            text = f"review {i}: " + "word " * (5 + i % 25)
            plain.write(json.dumps({"id": f"r{i}", "text": text}) + "\n")
            lines.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/predict",
                                    "body": {"model_id": MODEL, "input": text}}) + "\n")
    return bulk, batch


def run_bulk(env: dict[str, str], source: Path, out: Path) -> float:
    out.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "swapless", "bulk", MODEL, str(source), "-o", str(out), "--id-field", "id",
            "--progress", "none"]
    started = time.perf_counter()
    subprocess.run(argv, cwd=REPO, env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    keys = [json.loads(line)["key"] for line in out.read_text().splitlines()]
    if len(keys) != len(set(keys)):
        raise RuntimeError("swapless bulk wrote a record twice")
    return seconds


def run_batch(url: str, source: Path, records: int) -> tuple[float, float, float]:
    """(upload s, create-to-completed s, total s with the download)."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=600)
    started = time.perf_counter()
    with source.open("rb") as file:
        uploaded = client.files.create(file=file, purpose="batch")
    uploaded_s = time.perf_counter() - started
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/predict", completion_window="24h")
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.5)
    ran_s = time.perf_counter() - started - uploaded_s
    if batch.status != "completed" or batch.request_counts.completed != records:
        raise RuntimeError(f"the batch ended {batch.status} with {batch.request_counts}")
    text = client.files.content(batch.output_file_id).text
    total_s = time.perf_counter() - started
    ids = [json.loads(line)["custom_id"] for line in text.splitlines()]
    if len(ids) != records or len(set(ids)) != records:
        raise RuntimeError("the batch's output does not hold every record once")
    return uploaded_s, ran_s, total_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "BATCHES.md")
    args = parser.parse_args()
    redis_url = os.environ.get("SWAPLESS_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")
    work = OUT / "batches"
    work.mkdir(parents=True, exist_ok=True)
    models_file = work / "models.json"
    models_file.write_text(json.dumps({"models": [simulated_entry(MODEL, 0.1, 0.002, 0.0001)]}))
    bulk_in, batch_in = write_inputs(work, args.records)
    prefix = fresh_prefix("batches")
    port = 18000 + os.getpid() % 1000
    env = {"SWAPLESS_REDIS_URL": redis_url, "SWAPLESS_KEY_PREFIX": prefix, "SWAPLESS_QUEUE": prefix + "jobs",
           "SWAPLESS_MODELS_FILE": str(models_file), "SWAPLESS_DEVICE": "cpu", "SWAPLESS_PLUGINS": "bench.simulated",
           "SWAPLESS_API_KEYS": KEY, "SWAPLESS_BATCH_FILES_URL": str(work / "files"),
           "SWAPLESS_BATCH_MAX_LINES": str(max(args.records, 100_000)), "SWAPLESS_WARM_START": "false"}
    worker = Process([sys.executable, "-m", "swapless", "worker", "--hostname", "bench-batches@%h"], env,
                     work / "worker.log")
    gateway = Process([sys.executable, "-m", "swapless", "serve", "--port", str(port), "--log-level", "warning"],
                      env, work / "gateway.log")
    rows = []
    try:
        worker.wait_for("ready.")
        import httpx

        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        for rep in range(args.reps):
            bulk_s = run_bulk(env, bulk_in, work / "bulk-output.jsonl")
            upload_s, ran_s, total_s = run_batch(f"http://127.0.0.1:{port}", batch_in, args.records)
            rows.append((rep + 1, bulk_s, upload_s, ran_s, total_s))
            print(f"rep {rep + 1}: bulk {bulk_s:.1f} s, batch {total_s:.1f} s (upload {upload_s:.1f} s, run "
                  f"{ran_s:.1f} s): ratio {bulk_s / total_s:.2f}", flush=True)
    finally:
        gateway.stop()
        worker.stop()
        cleanup(redis.Redis.from_url(redis_url), prefix)
    n = args.records
    lines = [
        (f"`python -m bench.batches --records {n} --reps {args.reps}` (simulated model: 2 ms + 0.1 ms per input per "
         "pass; one worker, one gateway, Redis on this machine; the machine's 2 cores are shared with other work)"),
        "",
        ("| rep | swapless bulk (s) | bulk records/s | batch upload (s) | batch create→completed (s) "
         "| batch upload→output downloaded (s) | batch records/s | batch / bulk |"),
        "|---|---|---|---|---|---|---|---|",
    ]
    for rep, bulk_s, upload_s, ran_s, total_s in rows:
        lines.append(f"| {rep} | {bulk_s:.1f} | {n / bulk_s:.0f} | {upload_s:.1f} | {ran_s:.1f} | {total_s:.1f} | "
                     f"{n / total_s:.0f} | {bulk_s / total_s:.2f} |")
    ratios = [bulk_s / total_s for _, bulk_s, _, _, total_s in rows]
    median = statistics.median(ratios)
    lines += ["", f"Median ratio {median:.2f} (target ≥ 0.90: {'met' if median >= 0.9 else 'not met'})."]
    table = "\n".join(lines)
    print(table)
    args.out.write_text("# Batch API against `swapless bulk`\n\n" + table + "\n")


if __name__ == "__main__":
    main()
