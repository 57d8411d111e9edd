"""Benchmark: what ``SWAPLESS_REDIS_MIN_REPLICAS=1`` costs per job, against 0 (the baseline) in the same run.

    python -m bench.durability                    # 3 repetitions, about a minute; writes bench/DURABILITY.md
    python -m bench.durability --jobs 500 --repeats 1

A private primary and one replica (``redis-server`` on free 127.0.0.1 ports, no persistence: the cost measured is
replication's). Per repetition and setting, in this process:

- ``submit``: ``Client.submit`` of one job at a time (the gateway's and most producers' case): per-job latency
  p50 / p99 and jobs/s; with 1, each submit's pipeline ends with ``WAIT 1``;
- ``submit_jobs x100``: 100 jobs per call (one round trip, one ``WAIT`` per call): jobs/s;
- ``store x256``: the worker's result store of a 256-job group (``ResultStore.store``; with 1, a ``PUBLISH`` and a
  ``WAIT`` at its end, before the group's ack): per-job cost.

Settings alternate within each repetition (0, 1, 0, 1, ...) so that drift hits both alike.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import redis

from bench.common import REPO
from swapless.config.settings import load_settings
from swapless.tasks.app import make_app
from swapless.tasks.broker.connection import ReplicaWait
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.client import Client


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server(directory: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    binary = shutil.which("redis-server") or "redis-server"
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
                             "--save", "", "--appendonly", "no", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    for _ in range(200):
        try:
            if redis.Redis(port=port).ping():
                return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError(f"redis-server on port {port} did not start")


def _models_file(directory: Path) -> Path:
    path = directory / "models.json"
    path.write_text('{"models": [{"id": "echo", "name": "echo", "type": "text", "framework": "crashy"}]}')
    return path


def run_once(url: str, models: Path, min_replicas: int, jobs: int) -> dict[str, float]:
    """One setting's measurements (see the module docstring)."""
    settings = load_settings(redis_url=url, redis_min_replicas=min_replicas, key_prefix=f"bench-{uuid.uuid4().hex[:8]}",
                             models_file=models, max_queued=10_000_000)
    client = Client(settings=settings)
    try:
        latencies = []
        started = time.perf_counter()
        for n in range(jobs):
            t = time.perf_counter()
            client.submit("echo", f"job {n}")
            latencies.append(time.perf_counter() - t)
        single_s = time.perf_counter() - started
        latencies.sort()
        started = time.perf_counter()
        for _ in range(max(1, jobs // 100)):
            client.submit_jobs([("echo", f"bulk {n}") for n in range(100)])
        bulk_s = time.perf_counter() - started
        store = ResultStore(make_app(settings), client=client.redis, replicas=ReplicaWait.of(settings.redis))
        groups = max(1, jobs // 256)
        started = time.perf_counter()
        for _ in range(groups):
            store.store([(str(uuid.uuid4()), {"label": "x", "score": 1.0}, None) for _ in range(256)])
        store_s = time.perf_counter() - started
    finally:
        client.close()
    return {
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
        "single_jobs_s": jobs / single_s,
        "bulk_jobs_s": max(1, jobs // 100) * 100 / bulk_s,
        "store_us_per_job": store_s / (groups * 256) * 1e6,
    }


def _row(name: str, runs: list[dict[str, float]]) -> str:
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    spread = {key: (min(r[key] for r in runs), max(r[key] for r in runs)) for key in runs[0]}
    return (f"| {name} | {med['p50_ms']:.3f} | {med['p99_ms']:.3f} | {med['single_jobs_s']:.0f} "
            f"({spread['single_jobs_s'][0]:.0f}-{spread['single_jobs_s'][1]:.0f}) | {med['bulk_jobs_s']:.0f} | "
            f"{med['store_us_per_job']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000, help="single submits per repetition and setting")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "DURABILITY.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        base = Path(root)
        (base / "a").mkdir()
        (base / "b").mkdir()
        primary, port = _server(base / "a")
        replica, _ = _server(base / "b", "--replicaof", "127.0.0.1", str(port))
        try:
            admin = redis.Redis(port=port)
            while not admin.info("replication").get("connected_slaves"):
                time.sleep(0.05)
            models = _models_file(base)
            url = f"redis://127.0.0.1:{port}/0"
            runs: dict[int, list[dict[str, float]]] = {0: [], 1: []}
            for repeat in range(args.repeats):
                for setting in (0, 1):
                    runs[setting].append(run_once(url, models, setting, args.jobs))
                print(f"repetition {repeat + 1}/{args.repeats} done")
        finally:
            for proc in (replica, primary):
                proc.kill()
                proc.wait()
    head = ("| SWAPLESS_REDIS_MIN_REPLICAS | submit p50 (ms) | submit p99 (ms) | submit jobs/s (min-max) | "
            "submit_jobs x100 jobs/s | store x256 (µs/job) |\n|---|---|---|---|---|---|")
    table = "\n".join([head, _row("0 (baseline)", runs[0]), _row("1", runs[1])])
    text = (f"# SWAPLESS_REDIS_MIN_REPLICAS: the cost per job\n\n`python -m bench.durability --jobs {args.jobs} "
            f"--repeats {args.repeats}`: a local primary and one replica (no persistence), medians of "
            f"{args.repeats} repetitions.\n\n{table}\n")
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
