"""Benchmark of a burst three times a worker's capacity, with deadlines and without.

    python -m bench.overload                 # 3 repetitions; writes bench/OVERLOAD.md
    python -m bench.overload --repeats 1 --burst-s 5

One worker, one simulated model (``bench/simulated.py``: its forward pass sleeps 100 ms + 10 ms per input, at most
10 inputs a pass: a GPU's work, off the CPU). Each repetition first measures the worker's capacity (jobs/s over a
backlog sent at once), then sends interactive jobs one ``Client.submit`` at a time, paced at 3x that capacity for
``--burst-s`` seconds, twice on fresh workers and queues: with no deadline (the baseline), and with
``expires=2.0`` on every job. Per job: its latency from send to stored result (``date_done``); the share served
within the 2 s, served late, and answered ``JobExpired``; and, from the model's own input log, how many expired jobs
reached the model (the promise: none).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.common import OUT, REPO, summary
from bench.scaleout import Cluster
from bench.simulated import simulated_entry

MODEL = "overload-sim"
DEADLINE_S = 2.0
RESULTS_MD = REPO / "bench" / "OVERLOAD.md"


@dataclass
class Run:
    sent: int
    rate: float
    within: float  # share of sent jobs served within the deadline
    late: float  # share served after it
    expired: float  # share answered JobExpired
    p50_s: float  # latency of served jobs
    p95_s: float
    expired_that_ran: int


def _models_file(directory: Path) -> Path:
    from swapless.manager.demo.tiny import write_models_file

    directory.mkdir(parents=True, exist_ok=True)
    entry = simulated_entry(MODEL, 0.2, 0.1, 0.01)
    entry["max_batch_size"] = 10
    return write_models_file(directory, [entry])


def _cluster(name: str, models_file: Path, log: Path) -> Cluster:
    log.unlink(missing_ok=True)
    os.environ["SIMULATED_LOG"] = str(log)  # the worker processes inherit it
    try:
        return Cluster(name, 1, "placement", models_file, 2, warm_start=True)
    finally:
        del os.environ["SIMULATED_LOG"]


def _done_at(cluster: Cluster, client: object, ids: Sequence[str]) -> dict[str, tuple[str, float]]:
    """``{id: (state, date_done epoch s)}`` for the jobs with a stored result."""
    found: dict[str, tuple[str, float]] = {}
    for start in range(0, len(ids), 1000):
        part = ids[start : start + 1000]
        raws = cluster.redis.mget([client.results.key(job_id) for job_id in part])  # type: ignore[attr-defined]
        for job_id, raw in zip(part, raws, strict=True):
            if raw is not None:
                meta = json.loads(raw)
                found[job_id] = (meta["status"], datetime.fromisoformat(meta["date_done"]).timestamp())
    return found


def capacity(models_file: Path, jobs: int = 400) -> float:
    """Jobs/s of one worker on the model, over a backlog sent at once (the model loaded first)."""
    cluster = _cluster("overload-cap", models_file, OUT / "overload" / "cap.log")
    try:
        client = cluster.client()
        client.submit(MODEL, "warm").get(timeout=60)  # type: ignore[attr-defined]
        started = time.perf_counter()
        sent = client.submit_jobs([(MODEL, f"cap {i}") for i in range(jobs)])  # type: ignore[attr-defined]
        client.gather(sent, timeout=300)  # type: ignore[attr-defined]
        return jobs / (time.perf_counter() - started)
    finally:
        cluster.close()


def burst(models_file: Path, rate: float, burst_s: float, expires: float | None, tag: str) -> Run:
    log = OUT / "overload" / f"{tag}.log"
    cluster = _cluster(f"overload-{tag}", models_file, log)
    try:
        client = cluster.client()
        client.submit(MODEL, "warm").get(timeout=60)  # type: ignore[attr-defined]
        sent_at: dict[str, float] = {}
        inputs: dict[str, str] = {}
        total = int(rate * burst_s)
        started = time.perf_counter()
        for i in range(total):
            pause = started + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            text = f"{tag} {i}"
            job = client.submit(MODEL, text, expires=expires)  # type: ignore[attr-defined]
            sent_at[job.id] = time.time()
            inputs[job.id] = text
        sent_s = time.perf_counter() - started
        ids = list(sent_at)
        deadline = time.monotonic() + burst_s * 4 + 120
        done: dict[str, tuple[str, float]] = {}
        while len(done) < len(ids) and time.monotonic() < deadline:
            done = _done_at(cluster, client, ids)
            time.sleep(0.2)
        reached = set(log.read_text().splitlines()) if log.exists() else set()
        served = [done[i][1] - sent_at[i] for i in ids if i in done and done[i][0] == "SUCCESS"]
        expired_ids = [i for i in ids if i in done and done[i][0] == "FAILURE"]
        latencies = sorted(served)
        return Run(
            sent=len(ids),
            rate=len(ids) / sent_s,
            within=sum(1 for s in served if s <= DEADLINE_S) / len(ids),
            late=sum(1 for s in served if s > DEADLINE_S) / len(ids),
            expired=len(expired_ids) / len(ids),
            p50_s=latencies[len(latencies) // 2] if latencies else float("nan"),
            p95_s=latencies[min(len(latencies) - 1, int(len(latencies) * 0.95))] if latencies else float("nan"),
            expired_that_ran=sum(1 for i in expired_ids if inputs[i] in reached),
        )
    finally:
        cluster.close()


def report(capacities: list[float], runs: dict[str, list[Run]], burst_s: float, argv: str) -> str:
    lines = [
        "# Overload: a burst at 3x capacity, with deadlines and without",
        "",
        f"`python -m bench.overload {argv}`".replace(" `", "`"),
        "",
        ("Simulated rows (every row): one worker, one simulated model whose forward pass sleeps 100 ms + 10 ms per "
         "input, at most 10 inputs a pass. Interactive jobs sent one `Client.submit` at a time at 3x the capacity "
         f"measured in the same run, for {burst_s:g} s; latency is send to stored result. Median [min–max] of "
         f"{len(capacities)} repetitions."),
        "",
        f"Capacity: {summary(capacities)} jobs/s.",
        "",
        ("| deadline | jobs sent | sent/s | served within 2 s | served late | expired | served p50 s | served p95 s "
         "| expired jobs that reached the model |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in runs.items():
        pct = lambda values: summary([100 * v for v in values]) + " %"  # noqa: E731
        lines.append(
            f"| {name} | {summary([r.sent for r in rows])} | {summary([r.rate for r in rows])} "
            f"| {pct([r.within for r in rows])} | {pct([r.late for r in rows])} | {pct([r.expired for r in rows])} "
            f"| {summary([r.p50_s for r in rows])} | {summary([r.p95_s for r in rows])} "
            f"| {sum(r.expired_that_ran for r in rows)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--burst-s", type=float, default=10.0, help="seconds of sending at 3x capacity")
    parser.add_argument("--no-write", action="store_true", help=f"print the table only, do not write {RESULTS_MD.name}")
    args = parser.parse_args(argv)
    models_file = _models_file(OUT / "overload" / "models")
    capacities: list[float] = []
    runs: dict[str, list[Run]] = {"none (baseline)": [], f"expires={DEADLINE_S:g} s": []}
    for repeat in range(args.repeats):
        cap = capacity(models_file)
        capacities.append(cap)
        for (name, rows), expires in zip(runs.items(), (None, DEADLINE_S), strict=True):
            run = burst(models_file, 3 * cap, args.burst_s, expires, f"r{repeat}-{'off' if expires is None else 'on'}")
            rows.append(run)
            print(f"repeat {repeat + 1}: capacity {cap:.1f} jobs/s, deadline {name}: {run}", file=sys.stderr)
    table = report(capacities, runs, args.burst_s, " ".join(sys.argv[1:] if argv is None else argv))
    print(table)
    if not args.no_write:
        RESULTS_MD.write_text(table)


if __name__ == "__main__":
    main()
