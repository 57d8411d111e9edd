"""What tracing costs the worker: its CPU per job on the simulated device's stream, tracing off and on.

    python -m bench.tracing [--quick] [--repeats N] [--write PATH]

Each repetition runs, in a fresh process each, the same workload twice: tracing off (no ``OTEL_*`` variable
anywhere) and tracing on (the worker exporting OTLP/HTTP to a receiver in this process that takes and drops each
request; the producer tracing with the SDK, each ``submit_jobs`` call in a span of its own, so that every message
carries a ``traceparent``). The workload is ``bench.device``'s stream (its simulated device: passes that sleep,
using no CPU, so the worker's CPU is the queue's own) sent two ways: calls of 256 jobs (a trace per call, as a
script or a bulk producer sends) and calls of 8 jobs (many traces per forward pass, each linked from the pass's
``run`` span, nearer a gateway's one trace per request). The worker's CPU is read from ``/proc`` (all its
threads) around each way's jobs, results stored included. Writes ``bench/TRACING.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.common import OUT, REPO, collect, python
from bench.httpd import QuietHandler, serving

__all__ = ["main"]

#: Jobs per ``submit_jobs`` call of each way, by its name.
WAYS = {"calls of 256 jobs": 256, "calls of 8 jobs": 8}


@contextmanager
def sink() -> Iterator[str]:
    """An OTLP/HTTP receiver that answers every export 200 and keeps nothing; yields its endpoint."""

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

    with serving(Handler) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}"


def run_one(redis_url: str, jobs: int, traced: bool) -> dict[str, float]:
    """One worker, each way's jobs through it; its CPU ms per job per way (in the child process)."""
    from bench.device import DeviceSwapless, device_models
    from swapless.tasks import tracing

    provider = tracing.configure("bench-producer") if traced else None
    tracer = tracing.tracer() if traced else None
    system = DeviceSwapless(redis_url, device_models(OUT / "tracing-models"), "traced" if traced else "plain")
    system.start()
    found: dict[str, float] = {}
    try:
        warm = system.client.submit_jobs([("dev", f"warm {i}") for i in range(64)])
        system.client.gather(warm, timeout=120)
        for way, per_call in WAYS.items():
            inputs = [("dev", f"text {i}") for i in range(jobs)]
            cpu_before = system.cpu_s()
            sent: list[str] = []
            for start in range(0, jobs, per_call):
                call = inputs[start : start + per_call]
                if tracer is not None:
                    with tracer.start_as_current_span("producer call"):
                        sent += [job.id for job in system.client.submit_jobs(call)]
                else:
                    sent += [job.id for job in system.client.submit_jobs(call)]
            got = collect(system.redis, system.prefix, sent, 600)
            if any(state != "SUCCESS" for state in got.states.values()):
                raise RuntimeError(f"jobs failed; see {system.log}")
            found[way] = 1000 * (system.cpu_s() - cpu_before) / jobs
    finally:
        system.stop()
        tracing.shutdown(provider)
    return found


def _child(redis_url: str, jobs: int, traced: bool, endpoint: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if traced:
        env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "bench-worker"})
    argv = [python(), "-m", "bench.tracing", "--child", "on" if traced else "off", "--jobs", str(jobs),
            "--redis-url", redis_url]
    out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{out.stderr[-3000:]}")
    found: dict[str, float] = json.loads(out.stdout.splitlines()[-1])
    return found


_NOTE = (
    "Target: at most 10 % more worker CPU per job with tracing on, on the device's stream (`bench.device` sends it "
    "in calls of 256 jobs). The spans of a batch (`run`, `forward`, `store`, `load`) are shared by its jobs; each "
    "trace in a batch adds its own `process` and `wait` spans (made, and encoded for export, in the worker's "
    "process), so the cost per job grows with the traces per batch: calls of 8 jobs put 8 traces or more in each "
    "pass. Off, tracing adds no span and no export: a worker reads each message's `traceparent` header and checks "
    "one attribute per group."
)


def table(runs: dict[str, list[dict[str, float]]], command: str, jobs: int) -> str:
    lines = [
        "# Tracing's cost to the worker",
        "",
        (f"Command: `{command}` on this machine (2 cores, shared with other work). {len(runs['off'])} "
        f"repetition(s), each a fresh worker per mode, run one after the other; {jobs} jobs per way through "
        "`bench.device`'s simulated device (passes sleep: the worker's CPU is the queue's own). Tracing on: the "
        "worker exports OTLP/HTTP (`OTEL_EXPORTER_OTLP_ENDPOINT`, the SDK's batch processor at its defaults) to a "
        "receiver that drops each export, and every message carries a `traceparent` (the producer wraps each "
        "`submit_jobs` call in a span). Worker CPU per job from `/proc`, all its threads, median [min–max]."),
        "",
        "| way | tracing off (ms/job) | tracing on (ms/job) | on vs off | target (≤ +10 %) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for way in WAYS:
        off = [r[way] for r in runs["off"]]
        on = [r[way] for r in runs["on"]]
        ratio = statistics.median(on) / statistics.median(off) - 1
        lines.append(f"| {way} | {statistics.median(off):.3f} [{min(off):.3f}–{max(off):.3f}] | "
                     f"{statistics.median(on):.3f} [{min(on):.3f}–{max(on):.3f}] | {ratio:+.1%} | "
                     f"{'met' if ratio <= 0.10 else 'not met'} |")
    lines += ["", _NOTE, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1,500 jobs per way instead of 6,000")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--write", type=Path, default=REPO / "bench" / "TRACING.md")
    parser.add_argument("--child", choices=["on", "off"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    jobs = args.jobs or (1500 if args.quick else 6000)
    if args.child is not None:
        sys.stdout.write(json.dumps(run_one(args.redis_url, jobs, args.child == "on")) + "\n")
        return
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with sink() as endpoint:
        for repeat in range(args.repeats):
            for mode in ("off", "on"):
                runs[mode].append(_child(args.redis_url, jobs, mode == "on", endpoint))
                print(f"repetition {repeat + 1}, tracing {mode}: {runs[mode][-1]}", flush=True)
    command = "python -m bench.tracing" + (" --quick" if args.quick else "") + (
        f" --repeats {args.repeats}" if args.repeats != 3 else "")
    text = table(runs, command, jobs)
    args.write.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
