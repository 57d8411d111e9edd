"""Benchmark: does ``swapless serve`` stay responsive to a well-behaved key while hostile callers flood it?

    python -m bench.gateway              # 2 x 3 repetitions, about 5 minutes; writes bench/GATEWAY.md

Per repetition: a worker with one simulated model (``bench.simulated``: its passes sleep, so the gateway's own cost
is what is measured), a real ``swapless serve`` with API keys and its default limits, on the local Redis under a
fresh prefix. A well-behaved key sends ``/predict`` one at a time: first with the gateway idle (the baseline, in the
same run), then while ``bench.attacks`` runs every attack at once from another process (a smuggled body, gzip
bombs, a submit flood, deletes of random ids, slow bodies, unauthenticated bodies, nested JSON, oversized inputs),
once with each attack on an API key of its own, once with every attack on one key (which then takes turns with
itself at the gateway: the easier case); ``--keys own`` or ``--keys one`` runs one of them.
Afterwards every job the gateway accepted (the flood's and the good key's) must have its result: lost = accepted -
answered. The gateway's memory is read before and after the flood.

Target: the good key's ``/predict`` p50 under the flood within 2x of the idle p50; nothing accepted lost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, cast

import httpx
import psutil
import redis

from bench.attacks import ATTACKS
from bench.common import OUT, REPO, Process, cleanup, collect, fresh_prefix, percentile, python, summary

__all__ = ["main"]

GOOD = "good-key-" + "g" * 24
ATTACKER = "attacker-key-" + "a" * 20
#: ``bench.attacks --own-keys``: each attack with a key of its own
ATTACKER_KEYS = [f"{ATTACKER}-{name}" for name in ATTACKS]
MODEL = "sim"
#: The simulated model: a 2 ms pass plus 0.1 ms per input, a 50 ms load.
MODEL_NAME = "load=0.05,batch=0.002,item=0.0001"


@dataclass
class Rep:
    idle_s: list[float]
    flood_s: list[float]
    accepted: int
    answered: int
    rss_before: int
    rss_after: int
    seen: dict[str, dict[str, int]] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)


def _predicts(http: httpx.Client, seconds: float, limit: int, accepted: list[str]) -> list[float]:
    """The latencies of one-at-a-time ``/predict`` calls for ``seconds`` (at most ``limit`` calls)."""
    latencies: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and len(latencies) < limit:
        started = time.perf_counter()
        answer = http.post("/predict", json={"model_id": MODEL, "input": f"good {len(latencies)}"})
        latencies.append(time.perf_counter() - started)
        if answer.status_code != 200:
            raise RuntimeError(f"the good key's /predict answered {answer.status_code}: {answer.text[:300]}")
        accepted.append(answer.json()["job_id"])
    return latencies


@dataclass
class Stack:
    """A worker and a ``swapless serve`` with API keys on a fresh prefix, and the good key's HTTP client."""

    redis_url: str
    workdir: Path
    prefix: str = field(default_factory=lambda: fresh_prefix("gateway"))
    port: int = field(default_factory=lambda: 18000 + int(time.time() * 1000) % 1000)
    own_keys: bool = True  # each attack with its own key: none is held back by another's turns

    def __enter__(self) -> Self:
        from swapless.manager.demo.tiny import write_models_file

        self.workdir.mkdir(parents=True, exist_ok=True)
        models = write_models_file(self.workdir, [{"id": MODEL, "name": MODEL_NAME, "type": "text",
                                                   "framework": "simulated", "max_batch_size": 64}])
        env = {"SWAPLESS_REDIS_URL": self.redis_url, "SWAPLESS_KEY_PREFIX": self.prefix,
               "SWAPLESS_QUEUE": self.prefix + "jobs", "SWAPLESS_MODELS_FILE": str(models),
               "SWAPLESS_PLUGINS": "bench.simulated", "SWAPLESS_DEVICE": "cpu",
               "SWAPLESS_API_KEYS": ",".join(f"{key}:{MODEL}" for key in [GOOD, ATTACKER, *ATTACKER_KEYS])}
        self.client = redis.Redis.from_url(self.redis_url)
        self.worker = Process([python(), "-m", "swapless", "worker", "--hostname", f"gw-bench-{self.prefix}@%h"],
                              env, self.workdir / "worker.log")
        self.gateway = Process([python(), "-m", "swapless", "serve", "--port", str(self.port), "--log-level",
                                "warning"], env, self.workdir / "gateway.log")
        self.worker.wait_for("ready.")
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60,
                                 headers={"Authorization": f"Bearer {GOOD}"})
        self.gateway.wait_http(self.http)
        self.good_ids: list[str] = []
        _predicts(self.http, 5, 30, self.good_ids)  # warm: the model loaded, connections open
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()
        self.gateway.stop()
        self.worker.stop()
        cleanup(self.client, self.prefix)
        self.client.close()

    def _redis_cpu_s(self) -> float:
        info = cast(dict[str, Any], self.client.info("cpu"))
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def gateway_process(self) -> psutil.Process:
        return psutil.Process(self.gateway.proc.pid)

    def attack(self, duration_s: float, only: str | None = None) -> tuple[list[float], dict]:
        """The good key's latencies while ``bench.attacks`` runs (``only`` those attacks), and what it wrote."""
        out = self.workdir / f"attacks-{only or 'all'}.json"
        argv = [python(), "-m", "bench.attacks", "--port", str(self.port), "--key", ATTACKER, "--model", MODEL,
                "--duration", str(duration_s), "--out", str(out), *(["--own-keys"] if self.own_keys else [])]
        attackers = subprocess.Popen(argv + (["--only", only] if only else []), cwd=REPO)
        processes = {"gateway": self.gateway_process(), "worker": psutil.Process(self.worker.proc.pid),
                     "attackers": psutil.Process(attackers.pid)}
        time.sleep(2)  # the flood under way
        before = {name: process.cpu_times() for name, process in processes.items()}
        redis_before = self._redis_cpu_s()
        started = time.monotonic()
        flood = _predicts(self.http, duration_s - 4, 10_000, self.good_ids)
        elapsed = time.monotonic() - started
        after = {name: process.cpu_times() for name, process in processes.items()}
        self.cpu = {name: (after[name].user + after[name].system - before[name].user - before[name].system) / elapsed
                    for name in processes}
        self.cpu["redis (the whole server)"] = (self._redis_cpu_s() - redis_before) / elapsed
        attackers.wait(duration_s + 120)
        return flood, json.loads(out.read_text())


def run_once(redis_url: str, tag: str, duration_s: float, own_keys: bool = True) -> Rep:
    with Stack(redis_url, OUT / "gateway" / tag, own_keys=own_keys) as stack:
        idle = _predicts(stack.http, 10, 300, stack.good_ids)
        rss_before = stack.gateway_process().memory_info().rss
        flood, attacked = stack.attack(duration_s)
        rss_after = stack.gateway_process().memory_info().rss
        accepted = attacked["accepted"] + stack.good_ids
        done = collect(stack.client, stack.prefix, accepted, timeout_s=120)
        return Rep(idle, flood, len(accepted), len(done.states), rss_before, rss_after, attacked["seen"], stack.cpu)


def per_attack(redis_url: str, duration_s: float) -> str:
    """Each attack alone: the gateway's CPU (seconds per second) and the good key's p50 beside it."""
    rows = ["| attack alone | gateway CPU (s/s) | good key p50 (ms) | answers |", "|---|---|---|---|"]
    with Stack(redis_url, OUT / "gateway" / "per-attack") as stack:
        gateway = stack.gateway_process()
        for name in ("idle", *ATTACKS):
            before, started = gateway.cpu_times(), time.monotonic()
            if name == "idle":
                latencies, seen = _predicts(stack.http, duration_s - 4, 10_000, stack.good_ids), {}
            else:
                latencies, attacked = stack.attack(duration_s, name)
                seen = attacked["seen"][name]
            after, elapsed = gateway.cpu_times(), time.monotonic() - started
            cpu = (after.user + after.system - before.user - before.system) / elapsed
            answers = ", ".join(f"{status}: {n}" for status, n in sorted(seen.items()))
            rows.append(f"| {name} | {cpu:.2f} | {statistics.median(latencies) * 1000:.1f} | {answers} |")
            print(rows[-1], flush=True)
    return "\n".join(rows)


def table(reps: list[Rep]) -> str:
    idle = [statistics.median(r.idle_s) * 1000 for r in reps]
    flood = [statistics.median(r.flood_s) * 1000 for r in reps]
    ratio = [f / i for f, i in zip(flood, idle, strict=True)]
    rows = [
        f"| measurement (simulated model: its passes sleep) | value, median [min–max] of {len(reps)} |",
        "|---|---|",
        f"| good key /predict p50, gateway idle (baseline, ms) | {summary(idle)} |",
        f"| good key /predict p50, under the flood (ms) | {summary(flood)} |",
        f"| ratio flood / idle (target ≤ 2) | {summary(ratio)} |",
        (f"| good key /predict p95, idle / flood (ms) | {summary([percentile(r.idle_s, 95) * 1000 for r in reps])} / "
         f"{summary([percentile(r.flood_s, 95) * 1000 for r in reps])} |"),
        f"| good key requests under the flood | {summary([len(r.flood_s) for r in reps])} |",
        f"| jobs accepted (flood + good key) | {summary([r.accepted for r in reps])} |",
        f"| of them lost (accepted − answered) | {summary([r.accepted - r.answered for r in reps])} |",
        (f"| gateway memory growth during the flood (MiB) | "
         f"{summary([(r.rss_after - r.rss_before) / 2**20 for r in reps])} |"),
    ]
    rows += [f"| CPU during the flood, {name} (cores) | {summary([r.cpu[name] for r in reps])} |"
             for name in reps[0].cpu]
    rows += ["", "Answers the attackers got (last repetition):", "", "| attack | answers |", "|---|---|"]
    for name, counts in reps[-1].seen.items():
        rows.append(f"| {name} | {', '.join(f'{status}: {n}' for status, n in sorted(counts.items()))} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description="the gateway under hostile callers")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of flood per repetition")
    parser.add_argument("--write", type=Path, default=REPO / "bench" / "GATEWAY.md")
    parser.add_argument("--keys", default="own,one",
                        help="own: each attack with a key of its own; one: every attack with one key (which then "
                             "takes turns with itself at the gateway); both by default")
    parser.add_argument("--per-attack", action="store_true",
                        help="also run each attack alone: the gateway's CPU and the good key's p50 beside it")
    args = parser.parse_args()
    modes = [mode.strip() for mode in args.keys.split(",") if mode.strip()]
    if set(modes) - {"own", "one"}:
        parser.error(f"--keys takes own and/or one, not {args.keys!r}")
    text = (f"# The gateway under hostile callers\n\n`python -m bench.gateway` ({time.strftime('%Y-%m-%d')}, "
            f"{args.repeats} repetitions per table, {args.duration:g} s of flood each, 2-core machine; the worker's "
            "model is simulated; the attackers and the worker share the gateway's two cores)\n")
    for mode in modes:
        reps = []
        for n in range(args.repeats):
            rep = run_once(args.redis_url, f"{mode}-rep{n}", args.duration, mode == "own")
            print(f"{mode} keys, rep {n}: idle p50 {statistics.median(rep.idle_s) * 1000:.1f} ms, flood p50 "
                  f"{statistics.median(rep.flood_s) * 1000:.1f} ms, lost {rep.accepted - rep.answered}, CPU "
                  + ", ".join(f"{name} {cores:.2f}" for name, cores in rep.cpu.items()), flush=True)
            reps.append(rep)
        title = ("Each attack with an API key of its own" if mode == "own"
                 else "Every attack with one API key (it takes turns with itself)")
        text += f"\n## {title}\n\n{table(reps) if reps else ''}\n"
    if args.per_attack:
        text += (f"\n## Each attack alone, with its own key (one run, {args.duration:g} s each)\n\n"
                 f"{per_attack(args.redis_url, args.duration)}\n")
    args.write.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
