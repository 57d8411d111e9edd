"""Autoscaling on the queue's signals, simulated: a fleet that follows ``swapless_workers_desired`` against fixed
fleets of 1 and N workers and against an oracle that knows the day ahead, under a day-shaped load.

Every row is simulated: the workers serve models of the sleeping framework (``bench/simulated.py``: loads and
forward passes sleep, as a GPU's work leaves the CPU free), so a fleet of several GPU workers fits on two cores.

The day (compressed; ``Day``): interactive traffic on two small models (phase A), an idle stretch (B), a nightly
bulk burst over many models while interactive traffic goes on (C), and interactive traffic for a while after the
burst is done (D). Each fleet runs the same day on a fresh queue, starting warm (its first workers started before
the day does). A worker asked for starts ``startup_s`` later (a pod scheduled and its image pulled), then pays its
real process start; it is counted from the moment it is asked for to the moment it exits.

- **autoscaled**: a controller scrapes a real ``swapless exporter`` every ``poll_s`` and follows
  ``swapless_workers_desired``: up at once, down after ``cooldown_s`` below, one worker at a time, the cheapest by
  the status's removal cost (``RemovalCost.rank``), with ``swapless drain`` (KEDA's behaviour, with shorter timers
  to fit a short day); ``SWAPLESS_SCALE_MIN_WORKERS=1`` (interactive traffic must not wait for a cold start).
- **fixed 1** and **fixed N**: the same workers all day.
- **oracle**: one worker all day, and N - 1 more asked for exactly one start-up ahead of the burst (it knows when
  the burst comes and how long a worker takes to join: the median measured in the same repetition) and drained
  the moment the bulk work is done.

Measured per fleet: GPU-seconds (the workers' lives within the day), interactive p50/p95 (submit to result),
the bulk burst's completion time (first submit to last result), model loads.

    python -m bench.autoscale                # 3 repetitions, writes bench/AUTOSCALE.md
    python -m bench.autoscale --quick        # a short day, 1 repetition, for CI: never writes AUTOSCALE.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.common import OUT, REPO, Process, cleanup, fresh_prefix, percentile
from bench.simulated import simulated_entry

REDIS_URL = os.environ.get("SWAPLESS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")

INTERACTIVE = ["chat-a", "chat-b"]


@dataclass(frozen=True)
class Day:
    """The load, in seconds and jobs."""

    interactive_s: float = 20.0  # phase A
    idle_s: float = 15.0  # phase B
    tail_s: float = 15.0  # phase D, after the burst is done
    interactive_rate: float = 8.0  # jobs per second, phases A, C and D
    bulk_models: int = 8
    bulk_jobs: int = 3000  # per model
    startup_s: float = 3.0  # from asking for a worker to its process starting
    workers: int = 4  # N: the fixed fleet's size and the autoscaled fleet's maximum
    poll_s: float = 1.0
    cooldown_s: float = 5.0

    @property
    def burst_at(self) -> float:
        return self.interactive_s + self.idle_s


QUICK = Day(interactive_s=4.0, idle_s=3.0, tail_s=3.0, interactive_rate=5.0, bulk_models=3, bulk_jobs=1000,
            startup_s=0.5, workers=2, cooldown_s=2.0)

#: The bulk models' costs: a 2 s load, a pass of 64 in 20 ms + 2 ms per input (2.3 ms per job).
BULK_COSTS = (2.0, 0.02, 0.002)
#: The interactive models': a 1 s load, 5 ms + 0.2 ms per input.
INTERACTIVE_COSTS = (1.0, 0.005, 0.0002)


def bulk_models(day: Day) -> list[str]:
    return [f"bulk-{i}" for i in range(day.bulk_models)]


def models_file(day: Day, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    entries = [simulated_entry(m, *INTERACTIVE_COSTS) for m in INTERACTIVE]
    entries += [simulated_entry(m, *BULK_COSTS) for m in bulk_models(day)]
    path = directory / "models.json"
    path.write_text(json.dumps({"models": entries}, indent=2))
    return path


@dataclass
class Life:
    """One worker's life: when it was asked for, when its process became ready, when it exited."""

    name: str
    asked_at: float
    process: Process | None = None
    started_at: float | None = None
    ready_at: float | None = None
    ended_at: float | None = None
    draining: bool = False
    worker_id: str | None = None


class Fleet:
    """The worker processes of one run, each with its life."""

    def __init__(self, name: str, day: Day, env: dict[str, str]) -> None:
        self.name = name
        self.day = day
        self.env = env
        self.lives: list[Life] = []
        self.lock = threading.Lock()

    def ask(self, delay_s: float) -> Life:
        """Ask for one more worker: its process starts ``delay_s`` from now."""
        with self.lock:
            life = Life(f"w{len(self.lives)}", time.monotonic())
            self.lives.append(life)
        threading.Thread(target=self._start, args=(life, delay_s), daemon=True).start()
        return life

    def _start(self, life: Life, delay_s: float) -> None:
        time.sleep(delay_s)
        life.started_at = time.monotonic()
        log = OUT / "autoscale" / f"{self.name}-{life.name}.log"
        life.process = Process([sys.executable, "-m", "swapless", "worker", "--hostname", f"{life.name}@bench",
                                "--loglevel", "INFO"], self.env, log)
        while "ready." not in life.process.text():
            if life.process.proc.poll() is not None:
                life.ended_at = time.monotonic()
                return
            time.sleep(0.05)
        life.ready_at = time.monotonic()
        life.worker_id = f"{life.name}@bench:{life.process.proc.pid}"
        threading.Thread(target=self._reap, args=(life,), daemon=True).start()

    def _reap(self, life: Life) -> None:
        assert life.process is not None
        life.process.proc.wait()
        life.ended_at = time.monotonic()

    def alive(self) -> list[Life]:
        """Workers asked for and not draining (starting ones included)."""
        return [life for life in self.lives if not life.draining and life.ended_at is None]

    def drain(self, life: Life) -> None:
        """``swapless drain`` one worker (in the background)."""
        life.draining = True

        def run() -> None:
            if life.worker_id is None:
                return
            subprocess.run([sys.executable, "-m", "swapless", "drain", life.worker_id, "--timeout", "60"],
                           cwd=REPO, env={**os.environ, **self.env}, capture_output=True, check=False)

        threading.Thread(target=run, daemon=True).start()

    def wait_ready(self, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while sum(1 for life in self.lives if life.ready_at is not None) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {count} workers not ready after {timeout_s:.0f} s")
            time.sleep(0.1)

    def gpu_seconds(self, start: float, end: float) -> float:
        total = 0.0
        for life in self.lives:
            total += max(0.0, min(life.ended_at or end, end) - max(life.asked_at, start))
        return total

    def loads(self, since: dict[str, int]) -> int:
        found = 0
        for life in self.lives:
            if life.process is not None:
                found += len(re.findall(r"loaded \S+ \(", life.process.text()[since.get(life.name, 0):]))
        return found

    def marks(self) -> dict[str, int]:
        return {life.name: len(life.process.text()) for life in self.lives if life.process is not None}

    def join_s(self) -> list[float]:
        """Seconds from process start to ready of the workers that joined during the day."""
        return [life.ready_at - life.started_at for life in self.lives[1:]
                if life.ready_at is not None and life.started_at is not None]

    def stop(self) -> None:
        for life in self.lives:
            if life.process is not None:
                life.process.stop()


@dataclass
class Outcome:
    fleet: str
    gpu_s: float
    interactive_p50_ms: float
    interactive_p95_ms: float
    bulk_s: float
    loads: int
    max_workers: int
    join_s: list[float] = field(default_factory=list)
    lost: int = 0


class Autoscaler:
    """Follows ``swapless_workers_desired`` from a real exporter (see the module docstring)."""

    def __init__(self, fleet: Fleet, day: Day, metrics_url: str, client: redis.Redis, keyspace: Any) -> None:
        self.fleet = fleet
        self.day = day
        self.url = metrics_url
        self.client = client
        self.keyspace = keyspace
        self.stopping = threading.Event()
        #: (when, desired, demand, backlog seconds, workers alive) at each poll
        self.trace: list[tuple[float, int, float, float, int]] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> int | None:
        try:
            text = urllib.request.urlopen(self.url, timeout=5).read().decode()
        except OSError:
            return None
        found = re.search(r"^swapless_workers_desired (\S+)$", text, re.MULTILINE)
        if found is None:
            return None
        demand = re.search(r"^swapless_demand_workers (\S+)$", text, re.MULTILINE)
        backlog = sum(float(v) for v in re.findall(r"^swapless_backlog_seconds\{[^}]*\} (\S+)$", text, re.MULTILINE))
        self.trace.append((time.monotonic(), int(float(found.group(1))), float(demand.group(1)) if demand else 0.0,
                           backlog, len(self.fleet.alive())))
        return int(float(found.group(1)))

    def _cheapest(self, candidates: list[Life]) -> Life:
        from swapless.tasks.cluster.members import read_heartbeats
        from swapless.tasks.observe.scaling import removal_costs

        costs = removal_costs(read_heartbeats(self.client, self.keyspace))
        unknown = (0.0, False, 0.0)
        return min(candidates, key=lambda life: (costs[life.worker_id].rank if life.worker_id in costs else unknown,
                                                 -life.asked_at))

    def _loop(self) -> None:
        below_since: float | None = None
        while not self.stopping.wait(self.day.poll_s):
            desired = self._read()
            if desired is None:
                continue
            alive = self.fleet.alive()
            if desired > len(alive):
                below_since = None
                for _ in range(desired - len(alive)):
                    self.fleet.ask(self.day.startup_s)
            elif desired < len(alive):
                now = time.monotonic()
                below_since = below_since or now
                ready = [life for life in alive if life.ready_at is not None]
                if now - below_since >= self.day.cooldown_s and len(ready) > 1:
                    self.fleet.drain(self._cheapest(ready))
                    below_since = now  # one at a time, a cooldown apart
            else:
                below_since = None

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)


def _env(prefix: str, models: Path, day: Day) -> dict[str, str]:
    return {
        "SWAPLESS_REDIS_URL": REDIS_URL,
        "SWAPLESS_KEY_PREFIX": prefix,
        "SWAPLESS_QUEUE": prefix + "jobs",
        "SWAPLESS_MODELS_FILE": str(models),
        "SWAPLESS_PLUGINS": "bench.simulated",
        "SWAPLESS_MAX_MODELS": "3",
        "SWAPLESS_DEVICE": "cpu",
        "SWAPLESS_WARM_START": "true",
        "SWAPLESS_HEARTBEAT_INTERVAL_S": "1",
        "SWAPLESS_SCALE_MIN_WORKERS": "1",
        "SWAPLESS_SCALE_MAX_WORKERS": str(day.workers),
        "SWAPLESS_SCALE_DRAIN_S": "10",
        "SWAPLESS_SCALE_WINDOW_S": "10",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }


def learn(models: Path, day: Day) -> dict[bytes, bytes]:
    """What one worker's warm start measures of the models (the learned store), to seed every run with, as a
    deployment that ran before starts."""
    prefix = fresh_prefix("autoscale-learn")
    client = redis.Redis.from_url(REDIS_URL)
    fleet = Fleet("learn", day, _env(prefix, models, day))
    try:
        fleet.ask(0)
        fleet.wait_ready(1)
        key = f"{prefix}swapless:learned:cpu"
        deadline = time.monotonic() + 60
        while client.hlen(key) < len(INTERACTIVE) + day.bulk_models:
            if time.monotonic() > deadline:
                raise RuntimeError("the warm start's measurements did not reach the learned store")
            time.sleep(0.2)
        return client.hgetall(key)  # type: ignore[return-value]
    finally:
        fleet.stop()
        cleanup(client, prefix)


class _Interactive:
    """The day's interactive traffic: ``day.interactive_rate`` jobs a second through a pool while not idle."""

    def __init__(self, producer: Any, day: Day) -> None:
        self.producer = producer
        self.day = day
        self.latencies: list[float] = []
        self.timeline: list[tuple[float, str, float]] = []  # (sent, model, seconds): where the slow answers fall
        self.lost = 0
        self.pool = ThreadPoolExecutor(16)
        self.stopping = threading.Event()
        self.idle = threading.Event()
        self.thread = threading.Thread(target=self._send, daemon=True)

    def _one(self, model_id: str) -> None:
        sent = time.monotonic()
        try:
            self.producer.submit(model_id, "hello there", priority="interactive").get(timeout=120)
            self.latencies.append(time.monotonic() - sent)
            self.timeline.append((sent, model_id, self.latencies[-1]))
        except Exception:  # noqa: BLE001 - counted
            self.lost += 1

    def _send(self) -> None:
        index = 0
        while not self.stopping.wait(1 / self.day.interactive_rate):
            if self.idle.is_set():
                continue
            self.pool.submit(self._one, INTERACTIVE[index % 2])
            index += 1

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.pool.shutdown(wait=True)


def _autoscaler(kind: str, fleet: Fleet, day: Day, env: dict[str, str], client: redis.Redis,
                keyspace: Any) -> tuple[Process | None, Autoscaler | None]:
    """The exporter and the autoscaler following it, for the autoscaled fleet only."""
    if kind != "autoscaled":
        return None, None
    port = _free_port()
    exporter = Process([sys.executable, "-m", "swapless", "exporter", "--port", str(port)], env,
                       OUT / "autoscale" / f"{kind}-exporter.log")
    exporter.wait_for("Ctrl-C", 60)
    return exporter, Autoscaler(fleet, day, f"http://127.0.0.1:{port}/metrics", client, keyspace)


def _idle_until_burst(kind: str, fleet: Fleet, day: Day, start: float, join_s: float) -> None:
    """Wait for the burst; the oracle asks for its other workers ahead of it, by their start-up and join time."""
    oracle_asked = False
    while time.monotonic() - start < day.burst_at:
        ahead = day.burst_at - (day.startup_s + join_s)
        if kind == "oracle" and not oracle_asked and time.monotonic() - start >= ahead:
            for _ in range(day.workers - 1):
                fleet.ask(day.startup_s)
            oracle_asked = True
        time.sleep(0.05)
    if kind == "oracle" and not oracle_asked:
        for _ in range(day.workers - 1):
            fleet.ask(day.startup_s)


def _burst(producer: Any, day: Day) -> tuple[float, int]:
    """Every bulk model's jobs at once: (seconds until all are answered, jobs lost)."""
    burst_at = time.monotonic()
    jobs = []
    for model_id in bulk_models(day):
        jobs += producer.submit_many(model_id, [f"{model_id} record {i}" for i in range(day.bulk_jobs)])
    results = producer.gather(jobs, timeout=900)
    return time.monotonic() - burst_at, sum(1 for r in results if r.state != "SUCCESS")


def _write_traces(kind: str, autoscaler: Autoscaler | None, traffic: _Interactive, start: float) -> None:
    if autoscaler is not None:
        (OUT / "autoscale" / "trace.txt").write_text("".join(
            f"{when - start:7.1f} s  desired {desired}  demand {demand:.2f}  backlog {backlog:.1f} s  alive {alive}\n"
            for when, desired, demand, backlog, alive in autoscaler.trace))
    (OUT / "autoscale" / f"{kind}-latencies.txt").write_text("".join(
        f"{sent - start:7.2f} s  {model_id}  {seconds * 1000:7.0f} ms\n"
        for sent, model_id, seconds in sorted(traffic.timeline)))


def run_day(kind: str, day: Day, models: Path, learned: dict[bytes, bytes], join_s: float) -> Outcome:
    """One fleet through one day (``kind``: autoscaled, fixed-1, fixed-N, oracle)."""
    from swapless.config.settings import Settings
    from swapless.tasks.client import Client
    from swapless.tasks.keyspace import Keyspace

    prefix = fresh_prefix(f"autoscale-{kind}")
    client = redis.Redis.from_url(REDIS_URL)
    env = _env(prefix, models, day)
    settings = Settings(redis_url=REDIS_URL, key_prefix=prefix, queue=prefix + "jobs", models_file=models)
    keyspace = Keyspace.of(settings)
    client.hset(keyspace.learned("cpu"), mapping=learned)  # type: ignore[arg-type]
    client.sadd(keyspace.learned_devices, "cpu")
    fleet = Fleet(kind, day, env)
    first = day.workers if kind == "fixed-N" else 1
    for _ in range(first):
        fleet.ask(0)
    fleet.wait_ready(first)
    exporter, autoscaler = _autoscaler(kind, fleet, day, env, client, keyspace)
    marks = fleet.marks()
    producer = Client(settings=settings, forget=True)
    traffic = _Interactive(producer, day)

    start = time.monotonic()
    if autoscaler is not None:
        autoscaler.start()
    traffic.thread.start()
    time.sleep(day.interactive_s)
    traffic.idle.set()
    _idle_until_burst(kind, fleet, day, start, join_s)
    traffic.idle.clear()
    bulk_s, bulk_lost = _burst(producer, day)
    if kind == "oracle":
        for life in fleet.lives[1:]:
            fleet.drain(life)
    time.sleep(day.tail_s)
    end = time.monotonic()
    traffic.stop()
    if autoscaler is not None:
        autoscaler.stop()
    _write_traces(kind, autoscaler, traffic, start)
    latencies = traffic.latencies
    outcome = Outcome(
        fleet=kind,
        gpu_s=fleet.gpu_seconds(start, end),
        interactive_p50_ms=statistics.median(latencies) * 1000 if latencies else float("nan"),
        interactive_p95_ms=percentile(latencies, 95) * 1000 if latencies else float("nan"),
        bulk_s=bulk_s,
        loads=fleet.loads(marks),
        max_workers=_most_at_once(fleet.lives, start, end),
        join_s=fleet.join_s(),
        lost=traffic.lost + bulk_lost,
    )
    producer.close()
    fleet.stop()
    if exporter is not None:
        exporter.stop()
    cleanup(client, prefix)
    client.close()
    return outcome


def _most_at_once(lives: Sequence[Life], start: float, end: float) -> int:
    edges = []
    for life in lives:
        edges += [(max(life.asked_at, start), 1), (min(life.ended_at or end, end), -1)]
    most = now = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        now += step
        most = max(most, now)
    return most


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _cell(values: Sequence[float], digits: int = 1) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{_median(values):.{digits}f} [{min(values):.{digits}f}–{max(values):.{digits}f}]"


FLEETS = ["autoscaled", "fixed-1", "fixed-N", "oracle"]


def report(results: dict[str, list[Outcome]], day: Day, repeats: int, took_s: float, quick: bool) -> str:
    n = day.workers
    names = {"autoscaled": f"autoscaled (1 to {n})", "fixed-1": "fixed, 1 worker", "fixed-N": f"fixed, {n} workers",
             "oracle": f"oracle (1, and {n - 1} more for the burst)"}
    lines = [
        "# Autoscaling benchmark (simulated)",
        "",
        (f"Command: `python -m bench.autoscale{' --quick' if quick else ''}` on this machine (CPU only, 2 cores, "
        f"shared); {repeats} repetition(s), median [min–max]; {took_s / 60:.0f} min. **Every row is simulated** "
        "(`bench/simulated.py`: loads and forward passes sleep, as a GPU's work leaves the CPU free)."),
        "",
        (f"The day: {day.interactive_s:g} s of interactive traffic ({day.interactive_rate:g} jobs/s on two small "
        f"models), {day.idle_s:g} s idle, then a bulk burst of {day.bulk_models} models x {day.bulk_jobs} jobs "
        f"(2 s loads, 2.3 ms of device per job at batches of 64: {day.bulk_models * (day.bulk_jobs * 0.0023 + 2):.0f} "
        f"worker-seconds) with the interactive traffic going on, and {day.tail_s:g} s of interactive traffic once the "
        f"burst is done. Each worker holds 3 models. A worker asked for starts {day.startup_s:g} s later, then pays "
        "its real process start (joining a fleet, it warms nothing already measured). GPU-seconds count each "
        "worker from the moment it is asked for to its exit, within the day. The autoscaled fleet follows "
        f"`swapless_workers_desired` from a real `swapless exporter`, polled every {day.poll_s:g} s; down after "
        f"{day.cooldown_s:g} s below, one at a time, the cheapest by removal cost, with `swapless drain`; "
        "`SWAPLESS_SCALE_DRAIN_S=10`, `SWAPLESS_SCALE_WINDOW_S=10`, `SWAPLESS_SCALE_MIN_WORKERS=1`."),
        "",
        ("| fleet (simulated) | GPU-seconds | vs oracle | interactive p50 (ms) | interactive p95 (ms) "
         "| bulk burst done in (s) | loads | most workers | lost |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    oracle = results.get("oracle", [])
    for kind in FLEETS:
        runs = results.get(kind, [])
        if not runs:
            continue
        ratios = [r.gpu_s / o.gpu_s for r, o in zip(runs, oracle, strict=False)] if oracle else []
        lines.append(
            f"| {names[kind]} | {_cell([r.gpu_s for r in runs], 0)} | {_cell(ratios, 2) if ratios else '-'} | "
            f"{_cell([r.interactive_p50_ms for r in runs], 0)} | {_cell([r.interactive_p95_ms for r in runs], 0)} | "
            f"{_cell([r.bulk_s for r in runs])} | {_cell([float(r.loads) for r in runs], 0)} | "
            f"{_cell([float(r.max_workers) for r in runs], 0)} | {sum(r.lost for r in runs)} |"
        )
    joins = [s for r in results.get("autoscaled", []) for s in r.join_s]
    if joins:
        lines += ["", (f"A worker joining the autoscaled fleet: process start to ready {_cell(joins)} s "
                      f"({len(joins)} joins).")]
    if oracle and results.get("autoscaled") and results.get("fixed-N"):
        auto = results["autoscaled"]
        ratio = _median([a.gpu_s / o.gpu_s for a, o in zip(auto, oracle, strict=False)])
        fixed_p95 = _median([r.interactive_p95_ms for r in results["fixed-N"]])
        auto_p95 = _median([r.interactive_p95_ms for r in auto])
        fixed_bulk = _median([r.bulk_s for r in results["fixed-N"]])
        auto_bulk = _median([r.bulk_s for r in auto])
        lines += [
            "",
            "Targets (medians):",
            "",
            (f"- autoscaled GPU-seconds vs the oracle's: {ratio:.2f} ({'met' if ratio <= 1.2 else 'NOT met'}; "
            "target ≤ 1.2)"),
            (f"- interactive p95, autoscaled vs fixed {n}: {auto_p95:.0f} ms vs {fixed_p95:.0f} ms "
             f"({'met' if auto_p95 <= fixed_p95 * 1.2 else 'NOT met'}; target: the fixed fleet's, within 20 %)"),
            (f"- bulk burst done in, autoscaled vs fixed {n}: {auto_bulk:.1f} s vs {fixed_bulk:.1f} s "
             f"({auto_bulk / fixed_bulk:.2f}x; the autoscaled fleet's extra workers are asked for when the burst "
             f"lands and serve {day.startup_s:g} s + a process start later)"),
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="a short day, one repetition; never writes the table")
    parser.add_argument("--fleets", default=",".join(FLEETS))
    parser.add_argument("--write", type=Path, default=None, help="where to write the table "
                        "[default: bench/AUTOSCALE.md; with --quick, nowhere]")
    args = parser.parse_args(argv)
    day = QUICK if args.quick else Day()
    repeats = args.repeats or (1 if args.quick else 3)
    target = args.write or (None if args.quick else REPO / "bench" / "AUTOSCALE.md")
    models = models_file(day, OUT / ("autoscale-models-quick" if args.quick else "autoscale-models"))
    started = time.monotonic()
    learned = learn(models, day)
    results: dict[str, list[Outcome]] = {}
    fleets = [f for f in FLEETS if f in args.fleets.split(",")]
    for rep in range(repeats):
        joined: list[float] = []
        for kind in fleets:
            join_s = _median(joined) if joined else 6.0
            outcome = run_day(kind, day, models, learned, join_s)
            joined += outcome.join_s
            results.setdefault(kind, []).append(outcome)
            print(f"rep {rep + 1} {kind}: {outcome.gpu_s:.0f} GPU-s, interactive p50 {outcome.interactive_p50_ms:.0f} "
                  f"ms p95 {outcome.interactive_p95_ms:.0f} ms, bulk {outcome.bulk_s:.1f} s, {outcome.loads} loads, "
                  f"most {outcome.max_workers} workers, joins {[round(s, 1) for s in outcome.join_s]}, "
                  f"lost {outcome.lost}", flush=True)
    text = report(results, day, repeats, time.monotonic() - started, args.quick)
    if target is not None:
        target.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
