"""Benchmark of routes: a 90/10 split over 10,000 jobs, and what a shadow costs the served jobs.

    python -m bench.routing                  # 3 repetitions; writes bench/ROUTING.md
    python -m bench.routing --repeats 1 --jobs 2000

Simulated rows (every row): one worker, simulated models (``bench/simulated.py``, sleeping like a GPU). Each
repetition, on a fresh worker and queue:

1. **split**: 10,000 jobs (``--jobs``) sent with ``Client.submit_jobs`` to ``split`` = ``{"v1": 90, "v2": 10}``
   (zero-cost models); the share each version served, read from each result's ``model``;
2. **shadow**: 200 interactive jobs sent one ``Client.submit`` at a time, 20 ms apart, to ``plain`` (v1 only) and to
   ``shadowed`` (v1, with a 100 % shadow on v3: every job is also run on v3 at bulk priority), alternating; latency
   from send to stored result (``date_done``) of the served jobs, p50 and p95; and the shadow agreement counted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from bench.common import OUT, REPO, percentile, summary
from bench.scaleout import Cluster
from bench.simulated import simulated_entry

RESULTS_MD = REPO / "bench" / "ROUTING.md"
SPLIT = {"v1": 90, "v2": 10}


def _models_file(directory: Path) -> Path:
    from swapless.manager.demo.tiny import write_models_file

    directory.mkdir(parents=True, exist_ok=True)
    entries = [
        simulated_entry("v1", 0.2, 0.0, 0.0), simulated_entry("v2", 0.2, 0.0, 0.0),
        simulated_entry("p1", 0.2, 0.02, 0.001), simulated_entry("p3", 0.2, 0.02, 0.001),
        {"id": "split", "route": SPLIT},
        {"id": "plain", "route": {"p1": 1}},
        {"id": "shadowed", "route": {"p1": 1}, "shadow": {"p3": 100}},
    ]
    return write_models_file(directory, entries)


def split(cluster: Cluster, jobs: int) -> dict[str, float]:
    client = cluster.client()
    sent = client.submit_jobs([("split", f"split {i}") for i in range(jobs)])  # type: ignore[attr-defined]
    served = Counter(s.model for s in client.gather(sent, timeout=600))  # type: ignore[attr-defined]
    return {version: 100 * served[version] / jobs for version in SPLIT}


def shadow(cluster: Cluster, jobs: int = 200) -> tuple[dict[str, list[float]], tuple[int, int]]:
    from swapless.tasks.keyspace import Keyspace
    from swapless.tasks.routing import read_shadow

    client = cluster.client()
    for route in ("plain", "shadowed"):  # both models loaded, the first passes done
        client.submit(route, "warm").get(timeout=60)  # type: ignore[attr-defined]
    sent_at: dict[str, tuple[str, float]] = {}
    started = time.perf_counter()
    for i in range(jobs):
        pause = started + i * 0.02 - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        route = "plain" if i % 2 else "shadowed"
        job = client.submit(route, f"{route} {i}")  # type: ignore[attr-defined]
        sent_at[job.id] = (route, time.time())
    client.gather([client.job(job_id) for job_id in sent_at], timeout=120, forget=False)  # type: ignore[attr-defined]
    latency: dict[str, list[float]] = {"plain": [], "shadowed": []}
    ids = list(sent_at)
    raws = cluster.redis.mget([client.results.key(job_id) for job_id in ids])  # type: ignore[attr-defined]
    for job_id, raw in zip(ids, raws, strict=True):
        route, at = sent_at[job_id]
        latency[route].append(datetime.fromisoformat(json.loads(raw)["date_done"]).timestamp() - at)
    deadline = time.monotonic() + 60
    agreed = total = 0
    while time.monotonic() < deadline:
        counts = read_shadow(cluster.redis, Keyspace(cluster.env["SWAPLESS_QUEUE"], cluster.prefix))
        agreed = sum(a for (route, _, _), (a, _) in counts.items() if route == "shadowed")
        total = sum(n for (route, _, _), (_, n) in counts.items() if route == "shadowed")
        if total >= jobs // 2:
            break
        time.sleep(0.2)
    return latency, (agreed, total)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs of the split")
    parser.add_argument(
        "--no-write", action="store_true", help=f"print the tables only, do not write {RESULTS_MD.name}"
    )
    args = parser.parse_args(argv)
    models_file = _models_file(OUT / "routing" / "models")
    splits: list[dict[str, float]] = []
    p50: dict[str, list[float]] = {"plain": [], "shadowed": []}
    p95: dict[str, list[float]] = {"plain": [], "shadowed": []}
    agreement: list[tuple[int, int]] = []
    for repeat in range(args.repeats):
        cluster = Cluster(f"routing-{repeat}", 1, "placement", models_file, 4, warm_start=True)
        try:
            splits.append(split(cluster, args.jobs))
            latency, agreed = shadow(cluster)
            agreement.append(agreed)
            for route, values in latency.items():
                p50[route].append(statistics.median(values))
                p95[route].append(percentile(values, 95))
            print(f"repeat {repeat + 1}: split {splits[-1]}, p50 { {r: v[-1] for r, v in p50.items()} }, "
                  f"shadow agreement {agreed}", file=sys.stderr)
        finally:
            cluster.close()
    lines = [
        "# Routes: a split over versions, and what a shadow costs",
        "",
        f"`python -m bench.routing {' '.join(sys.argv[1:] if argv is None else argv)}`".replace(" `", "`"),
        "",
        f"Simulated rows (every row): one worker, simulated models. Median [min–max] of {args.repeats} repetitions.",
        "",
        f"Split of {args.jobs:,} jobs sent with `submit_jobs` to `{{\"v1\": 90, \"v2\": 10}}` (each result's `model`):",
        "",
        "| version | expected % | observed % |",
        "|---|---|---|",
        *[f"| {v} | {w} | {summary([s[v] for s in splits])} |" for v, w in SPLIT.items()],
        "",
        ("Interactive jobs 20 ms apart to a route without a shadow and to one with a 100 % shadow (every job also run "
         "on another model at bulk priority), alternating; seconds from send to stored result of the served job:"),
        "",
        "| route | p50 s | p95 s |",
        "|---|---|---|",
        *[f"| {route} | {summary(p50[route])} | {summary(p95[route])} |" for route in ("plain", "shadowed")],
        "",
        "Shadow copies compared (agreeing top label / compared): "
        + ", ".join(f"{a}/{n}" for a, n in agreement) + " (the simulated models give every input the same label).",
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    if not args.no_write:
        RESULTS_MD.write_text(table)


if __name__ == "__main__":
    main()
