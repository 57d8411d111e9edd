"""Does a worker serve a long tail of models? A real ``swapless worker --max-models 4`` on *simulated* models.

    python -m bench.longtail                     # 4 scenarios x 3 repetitions, 15-20 min on 2 cores; bench/LONGTAIL.md
    python -m bench.longtail --quick             # smoke test: smaller, 1 repetition; bench/out/LONGTAIL-quick.md
    python -m bench.longtail --scenarios burst,fleet --repeats 1 --write /tmp/LONGTAIL.md

Every model is ``bench/simulated.py``'s: models ``m000 .. m{N-1}``, each loading in 0.8 s, a forward pass of n
inputs taking 5 ms + 0.2 ms n (passes of up to 64), all of it *sleeping* (no CPU, as a GPU's work), so the figures
are the queue's and the cache's, on a simulated device; no GPU is involved. Popularity is Zipf with s = 1.1 over the
models in order (m000 the hottest), drawn with a fixed seed per repetition (the repetition's number). Each worker is
``python -m swapless worker --max-models 4`` with every other flag at its default (the warm start as shipped),
``SWAPLESS_PLUGINS=bench.simulated``, on a fresh queue and key prefix in Redis (database 13), started fresh for each
measurement. Loads are counted exactly: with ``SIMULATED_LOADS`` set, each load appends ``<model>\\t<pid>`` to a file.

1. **Start-up to first answer** (registries of 40, 200, 1,000 models): the worker is spawned and, at once, one
   interactive job for the model in the middle of the registry is submitted; seconds from the spawn to its result.
   The worker's log splits the time: spawn to its first log line (imports, the registry, Celery, the worker's
   context), from there to "ready.", and from "ready." to the answer; the models it warmed before the answer are
   counted from its "warmed m in T s" lines. Once per repetition, ``import swapless.tasks.cli.main`` and ``import
   torch`` are timed alone in a fresh interpreter: ``--device auto`` (the default) imports torch to resolve the
   device, even for a registry of simulated models.
2. **Burst** (40 models): 6,000 Zipf jobs sent by one ``Client.submit_jobs`` call (bulk priority) to a worker that is
   ready, then ``Client.gather``: seconds from the submit to the end of the gather; loads from the submit on
   (counted 1 s after the gather, so a load under way at the end counts too); models touched; and the device limit
   over that time: Σ over the touched models of one load (0.8 s) + Σ over their passes (ceil(n_m / 64) passes per
   model, each 5 ms + 0.2 ms per input), as a ratio limit / wall.
3. **Stream** (40 models): interactive jobs arriving as a Poisson process at 40 jobs/s for 30 s, each sent by
   ``Client.submit(model, input, priority="interactive")`` at its arrival time from one thread of the benchmark.
   A job's latency is its result's ``date_done`` (stamped by the worker as it stores the result; same host, same
   clock) minus the wall time just before its ``submit``: the error is the store's own round trip, a millisecond or
   two. A second thread reads the results (MGET every 20 ms) to know when all are in; the gap between its sightings
   and ``date_done`` is printed as a check. Reported: p50 and p95 of the 3 hottest models (m000-m002, "hot") and p95
   of the other 37 ("tail"), and the share of jobs answered within 2 s. On the same arrivals, two reference figures
   come from a discrete-event simulation in this process (no worker; device time only, no queue overhead):

   a. **FIFO + per-request LRU of 4**, the baseline: jobs one at a time in arrival order; a job whose model is not
      among the 4 most recently used pays a load (0.8 s) first; each job is one pass of 1 input.
   b. **The cycling bound**: an idealized worker that keeps the 3 hot models resident in 3 of its 4 slots and cycles
      the tail through the 4th: hot jobs are served between visits as soon as they arrive (each one pass of 1); a
      visit goes to the tail model whose oldest waiting job is the oldest and costs one load (none if that model is
      still in the 4th slot) + passes of up to 64 for all of its jobs waiting when the load ends. Its tail p95 is
      "the bound".
4. **Three workers** (40 models): the burst of 2 against 3 workers started together (``--hostname w{i}@bench``), all
   ready (and heartbeating) before the submit: loads across the fleet and models touched.

Targets: start-up ≤ 5 s; burst loads ≤ touched x 1.1 and limit / wall ≥ 0.9; stream hot p95 ≤ one load + two
passes of 64 (0.8356 s), tail p95 ≤ 1.2 x the bound; fleet loads ≤ touched + 3. Medians of the repetitions are judged.

Every worker is stopped at the end (SIGTERM, then SIGKILL after a timeout), on errors too, and every Redis key under
the run's prefixes is deleted. Worker logs and load files stay in ``bench/out/longtail/<time>-<pid>/``.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Self

import redis

from bench.common import OUT, REPO, Process, cleanup, fresh_prefix, percentile, summary
from bench.simulated import simulated_entry

__all__ = ["cycling_bound", "device_limit_s", "fifo_lru", "main"]

REDIS_URL = os.environ.get("SWAPLESS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
#: This run's folder (worker logs, load files, models files): a run of its own per process, so that runs at the same
#: time never share a file.
LOGS = OUT / "longtail" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"

#: The simulated device: a load, a pass's fixed and per-input costs (seconds), the largest pass.
LOAD_S, BATCH_S, ITEM_S, MAX_BATCH = 0.8, 0.005, 0.0002, 64
ZIPF_S = 1.1
MAX_MODELS = 4
#: The hottest models (m000-m002): the stream's "hot" group; the rest is the tail.
HOT_COUNT = 3
#: Stream: Poisson arrivals per second.
STREAM_RATE = 40.0
#: The stream's share answered within this many seconds.
WITHIN_S = 2.0
#: Start-up target, seconds from spawn to the first answer.
STARTUP_TARGET_S = 5.0
#: Stream hot p95 target: one load + two passes of 64.
HOT_P95_TARGET_S = LOAD_S + 2 * (BATCH_S + ITEM_S * MAX_BATCH)
TAIL_VS_BOUND_TARGET = 1.2
BURST_LOADS_VS_TOUCHED_TARGET = 1.1
BURST_LIMIT_RATIO_TARGET = 0.9
FLEET_EXTRA_LOADS_TARGET = 3
FLEET_WORKERS = 3
#: Seconds any wait may take at most: a worker's readiness, a result, a stop.
READY_TIMEOUT_S, RESULT_TIMEOUT_S, STOP_TIMEOUT_S = 180.0, 600.0, 20.0
SCENARIOS = ("startup", "burst", "stream", "fleet")


@dataclass(frozen=True)
class Sizes:
    registries: tuple[int, ...]
    models: int
    burst_jobs: int
    stream_s: float


FULL = Sizes(registries=(40, 200, 1000), models=40, burst_jobs=6000, stream_s=30.0)
QUICK = Sizes(registries=(40, 200), models=40, burst_jobs=1500, stream_s=10.0)


def say(message: str) -> None:
    print(f"[longtail {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the workload --------------------------------------------------------------------------------------------------


def model_ids(n: int) -> list[str]:
    return [f"m{i:03d}" for i in range(n)]


def registry(n: int) -> Path:
    """The models file of ``n`` simulated models ``m000 ..``, each loading in 0.8 s (written once)."""
    from swapless.manager.demo.tiny import write_models_file

    directory = LOGS / f"models-{n}"
    if (directory / "models.json").exists():
        return directory / "models.json"
    directory.mkdir(parents=True, exist_ok=True)
    entries = [simulated_entry(m, LOAD_S, BATCH_S, ITEM_S) for m in model_ids(n)]
    for entry in entries:
        entry["max_batch_size"] = MAX_BATCH
    return write_models_file(directory, entries)


def zipf_picker(models: Sequence[str], rng: random.Random) -> Callable[[], str]:
    """Draws a model with Zipf popularity (s = ``ZIPF_S``) over ``models`` in order."""
    cumulative = list(itertools.accumulate(1 / (k + 1) ** ZIPF_S for k in range(len(models))))
    return lambda: models[bisect.bisect_left(cumulative, rng.random() * cumulative[-1])]


def burst_jobs(seed: int, models: Sequence[str], n: int) -> list[tuple[str, str]]:
    pick = zipf_picker(models, random.Random(seed))
    return [(pick(), f"burst {i}") for i in range(n)]


def arrivals(seed: int, models: Sequence[str], rate: float, duration_s: float) -> list[tuple[float, str]]:
    """(seconds from the start, model) of a Poisson process of ``rate`` jobs/s over ``duration_s``."""
    rng = random.Random(seed)
    pick = zipf_picker(models, rng)
    out: list[tuple[float, str]] = []
    at = rng.expovariate(rate)
    while at < duration_s:
        out.append((at, pick()))
        at += rng.expovariate(rate)
    return out


def pass_s(n: int) -> float:
    return BATCH_S + ITEM_S * n


def device_limit_s(jobs: Sequence[tuple[str, Any]]) -> float:
    """One load per touched model + its passes of up to 64 (ceil(n_m / 64) passes, each 5 ms + 0.2 ms per input)."""
    counts: dict[str, int] = {}
    for model_id, _ in jobs:
        counts[model_id] = counts.get(model_id, 0) + 1
    return sum(LOAD_S + math.ceil(n / MAX_BATCH) * BATCH_S + ITEM_S * n for n in counts.values())


# -- the reference figures: discrete-event simulations on the stream's arrivals -------------------------------------


def fifo_lru(jobs: Sequence[tuple[float, str]], slots: int = MAX_MODELS) -> tuple[list[float], int]:
    """(latencies, loads) of the FIFO + per-request LRU baseline: one job at a time in arrival order, a load first
    when its model is not among the ``slots`` most recently used, one pass of 1 input per job."""
    lru: OrderedDict[str, None] = OrderedDict()
    now = 0.0
    latencies = []
    loads = 0
    for at, model_id in jobs:
        now = max(now, at)
        if model_id in lru:
            lru.move_to_end(model_id)
        else:
            now += LOAD_S
            loads += 1
            lru[model_id] = None
            if len(lru) > slots:
                lru.popitem(last=False)
        now += pass_s(1)
        latencies.append(now - at)
    return latencies, loads


def cycling_bound(jobs: Sequence[tuple[float, str]], hot: set[str]) -> tuple[list[float], int]:
    """(latencies, loads) of the idealized cycling worker (see the module docstring, 3b): the hot models resident,
    hot jobs one pass each between tail visits, the tail through one slot, oldest waiting job first."""
    latencies = [math.nan] * len(jobs)
    hot_waiting: deque[int] = deque()
    tail_waiting: dict[str, list[int]] = {}
    resident: str | None = None
    now, admitted, loads = 0.0, 0, 0

    def admit(until: float) -> None:
        nonlocal admitted
        while admitted < len(jobs) and jobs[admitted][0] <= until:
            model_id = jobs[admitted][1]
            if model_id in hot:
                hot_waiting.append(admitted)
            else:
                tail_waiting.setdefault(model_id, []).append(admitted)
            admitted += 1

    while True:
        admit(now)
        if hot_waiting:
            index = hot_waiting.popleft()
            now += pass_s(1)
            latencies[index] = now - jobs[index][0]
        elif tail_waiting:
            model_id = min(tail_waiting, key=lambda m: jobs[tail_waiting[m][0]][0])
            if model_id != resident:
                now += LOAD_S
                loads += 1
                resident = model_id
                admit(now)  # jobs of this model arriving during its load are served in this visit
            waiting = tail_waiting.pop(model_id)
            for start in range(0, len(waiting), MAX_BATCH):
                chunk = waiting[start : start + MAX_BATCH]
                now += pass_s(len(chunk))
                for index in chunk:
                    latencies[index] = now - jobs[index][0]
        elif admitted < len(jobs):
            now = jobs[admitted][0]
        else:
            return latencies, loads


# -- worker processes ------------------------------------------------------------------------------------------------


class _Interrupts:
    """An interrupt that comes during a clean-up (``uninterrupted``) is held until the clean-up is done."""

    depth = 0
    pending: int | None = None


def _interrupted(signum: int, frame: object) -> None:
    code = 128 + signum
    if _Interrupts.depth:
        _Interrupts.pending = code
        return
    sys.exit(code)


@contextmanager
def uninterrupted() -> Iterator[None]:
    _Interrupts.depth += 1
    try:
        yield
    finally:
        _Interrupts.depth -= 1
        if not _Interrupts.depth and _Interrupts.pending is not None:
            code, _Interrupts.pending = _Interrupts.pending, None
            sys.exit(code)


class Workers:
    """``n`` ``swapless worker --max-models 4`` processes on a fresh queue, their loads counted in one file.

    Use as a context manager: every process is stopped and every key under the prefix deleted on the way out."""

    def __init__(self, tag: str, models_file: Path, n: int = 1) -> None:
        self.tag = tag
        self.n = n
        self.models_file = models_file
        self.prefix = fresh_prefix("longtail")
        self.queue = self.prefix + "jobs"
        self.loads_file = LOGS / f"{tag}.loads"
        self.loads_file.parent.mkdir(parents=True, exist_ok=True)
        self.loads_file.write_text("")
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.processes: list[Process] = []
        self._client: Any = None

    def env(self) -> dict[str, str]:
        path = os.environ.get("PYTHONPATH")
        return {
            "SWAPLESS_REDIS_URL": REDIS_URL,
            "SWAPLESS_KEY_PREFIX": self.prefix,
            "SWAPLESS_QUEUE": self.queue,
            "SWAPLESS_MODELS_FILE": str(self.models_file),
            "SWAPLESS_PLUGINS": "bench.simulated",
            "SIMULATED_LOADS": str(self.loads_file),
            "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO),
        }

    def spawn(self) -> None:
        for i in range(self.n):
            argv = [sys.executable, "-m", "swapless", "worker", "--max-models", str(MAX_MODELS)]
            if self.n > 1:
                argv += ["--hostname", f"w{i}@bench"]
            self.processes.append(Process(argv, self.env(), LOGS / f"{self.tag}-w{i}.log"))

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Wait until every worker logged "ready." and heartbeats; returns the seconds waited."""
        from swapless.tasks.cluster.members import read_heartbeats
        from swapless.tasks.keyspace import Keyspace

        started = time.monotonic()
        deadline = started + timeout_s
        for process in self.processes:
            process.wait_for(" ready.", max(1.0, deadline - time.monotonic()))
        keyspace = Keyspace(self.queue, self.prefix)
        while len(read_heartbeats(self.redis, keyspace)) < self.n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.tag}: the workers' heartbeats did not all appear in {timeout_s:.0f} s")
            time.sleep(0.1)
        return time.monotonic() - started

    def client(self) -> Any:
        if self._client is None:
            from swapless.config.settings import Settings
            from swapless.tasks.client import Client

            settings = Settings(redis_url=REDIS_URL, key_prefix=self.prefix, queue=self.queue,
                                models_file=self.models_file)
            self._client = Client(settings=settings)
            _ = self._client.store  # the registry is read now, not in the first submit
        return self._client

    def loads(self) -> list[tuple[str, int]]:
        """Every load so far, in order: (model, worker pid)."""
        rows = [line.split("\t") for line in self.loads_file.read_text().splitlines() if line]
        return [(model_id, int(pid)) for model_id, pid in rows]

    def close(self) -> None:
        """SIGTERM to every worker, SIGKILL to those still running after ``STOP_TIMEOUT_S``; delete the keys. Each
        step runs whatever the one before did, and an interrupt waits until all are done."""
        with uninterrupted():
            try:
                if self._client is not None:
                    self._client.close()
            finally:
                try:
                    stop_all(self.processes)
                finally:
                    try:
                        cleanup(self.redis, self.prefix)
                    finally:
                        self.redis.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stop_all(processes: Sequence[Process], timeout_s: float = STOP_TIMEOUT_S) -> None:
    for process in processes:
        if process.proc.poll() is None:
            process.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            say(f"{process.log_path.name}: no exit {timeout_s:.0f} s after SIGTERM; SIGKILL")
            with suppress(ProcessLookupError):
                os.killpg(process.proc.pid, signal.SIGKILL)
            process.proc.wait(10)
        process.stop()  # exited: only closes its log


# -- 1. start-up ----------------------------------------------------------------------------------------------------

LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): [A-Z]+/[^\]]+\] (.*)$", re.M)
WARMED_LINE = re.compile(r"^warmed \S+ in ([\d.]+) s")
#: Modules whose import a fresh worker pays, timed alone in a fresh interpreter: the CLI (Celery, the client, the
#: worker's code) and torch, which ``--device auto`` (the default) imports to resolve the device.
BOOT_IMPORTS = {"import swapless.tasks.cli.main, fresh process (s)": "swapless.tasks.cli.main",
                "import torch, fresh process (s)": "torch"}


def log_events(text: str) -> Iterator[tuple[float, str]]:
    """(wall time, message) of each line of a worker's log (its clock is this host's, local time)."""
    for stamp, message in LOG_LINE.findall(text):
        yield datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp(), message


def startup_phases(text: str, spawned_wall: float, answered_wall: float) -> dict[str, float]:
    """Where the time from spawn to answer went, from the worker's log lines: until its first line (imports, the
    registry, Celery, the worker's context), then until "ready.", then until the answer; and the warm start's models
    before the answer ("warmed m in T s" lines)."""
    first_at = ready_at = math.nan
    warmed, warm_s = 0, 0.0
    for at, message in log_events(text):
        if math.isnan(first_at):
            first_at = at
        found = WARMED_LINE.search(message)
        if found and at <= answered_wall:
            warmed, warm_s = warmed + 1, warm_s + float(found[1])
        elif message.endswith(" ready.") and math.isnan(ready_at):
            ready_at = at
    return {
        "spawn → first log line (s)": first_at - spawned_wall,
        "first log line → ready (s)": ready_at - first_at,
        "spawn → ready (s)": ready_at - spawned_wall,
        "ready → answer (s)": answered_wall - ready_at,
        "models warmed before the answer": warmed,
        "warming before the answer (s)": warm_s,
    }


def import_s(module: str, timeout_s: float = 120) -> float:
    """Seconds ``import module`` takes in a fresh interpreter (this host, now)."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env,
                         check=True, cwd=REPO)
    return float(out.stdout.strip().splitlines()[-1])


def startup(n_models: int, rep: int) -> dict[str, float]:
    target = model_ids(n_models)[n_models // 2]
    with Workers(f"startup-{n_models}-rep{rep}", registry(n_models)) as workers:
        client = workers.client()  # built before the spawn: only the spawn and the job are timed
        spawned, spawned_wall = time.monotonic(), time.time()
        workers.spawn()
        job = client.submit(target, "first answer", priority="interactive")
        job.get(timeout=READY_TIMEOUT_S)
        answer_s = time.monotonic() - spawned
        answered_wall = time.time()
        workers.wait_ready()  # "ready." is logged before the answer; read the log once it is complete
        row = {"spawn → first answer (s)": answer_s,
               **startup_phases(workers.processes[0].text(), spawned_wall, answered_wall),
               f"loads of the job's model ({target})": sum(1 for m, _ in workers.loads() if m == target)}
    return row


# -- 2. and 4. the burst ---------------------------------------------------------------------------------------------


def burst(tag: str, jobs: list[tuple[str, str]], n_models: int, n_workers: int, priority: str) -> dict[str, float]:
    """``jobs`` by one ``submit_jobs`` call to ``n_workers`` ready workers of ``n_models`` models, then ``gather``."""
    with Workers(tag, registry(n_models), n_workers) as workers:
        workers.spawn()
        ready_s = workers.wait_ready()
        client = workers.client()
        before = len(workers.loads())
        say(f"  {tag}: {n_workers} worker(s) ready in {ready_s:.1f} s ({before} loads so far); sending {len(jobs)}")
        started = time.monotonic()
        sent = client.submit_jobs(jobs, priority=priority)
        submit_s = time.monotonic() - started
        got = client.gather(sent, timeout=RESULT_TIMEOUT_S)
        wall = time.monotonic() - started
        failed = sum(1 for s in got if s.state != "SUCCESS")
        if failed:
            raise RuntimeError(f"{tag}: {failed} of {len(jobs)} jobs failed; see {LOGS}/{tag}-w*.log")
        time.sleep(LOAD_S + 0.2)  # a load under way at the end is one the burst caused: let it be written
        loads = workers.loads()[before:]
    touched = len({m for m, _ in jobs})
    limit = device_limit_s(jobs)
    per_model: dict[str, int] = {}
    for model_id, _ in loads:
        per_model[model_id] = per_model.get(model_id, 0) + 1
    return {
        "wall (s)": wall,
        "submit_jobs call (s)": submit_s,
        "loads": len(loads),
        "models touched": touched,
        "loads / touched": len(loads) / touched,
        "loads − touched": len(loads) - touched,
        "most loads of one model": max(per_model.values(), default=0),
        "workers that loaded": len({pid for _, pid in loads}),
        "device limit (s)": limit,
        "limit / wall": limit / wall,
    }


# -- 3. the stream ---------------------------------------------------------------------------------------------------


class ResultWatcher(threading.Thread):
    """Reads the results of the jobs in ``submitted`` (appended by the submitting thread) every ``poll_s``: each one's
    ``date_done`` (the worker's store time) and when this thread saw it."""

    def __init__(self, prefix: str, poll_s: float = 0.02) -> None:
        super().__init__(name="longtail-watcher", daemon=True)
        self.prefix = prefix
        self.poll_s = poll_s
        self.submitted: list[str] = []
        self.done: dict[str, tuple[float, float, str]] = {}
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        client = redis.Redis.from_url(REDIS_URL)
        pending: list[str] = []
        taken = 0
        try:
            while not self._stop_event.is_set():
                count = len(self.submitted)
                pending += self.submitted[taken:count]
                taken = count
                if pending:
                    raws = client.mget([f"{self.prefix}celery-task-meta-{job_id}" for job_id in pending])
                    seen = time.time()
                    still = []
                    for job_id, raw in zip(pending, raws, strict=True):
                        if raw is None:
                            still.append(job_id)
                            continue
                        meta = json.loads(raw)
                        done_at = datetime.fromisoformat(meta["date_done"]).timestamp()
                        self.done[job_id] = (done_at, seen, meta["status"])
                    pending = still
                self._stop_event.wait(self.poll_s)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            self.error = err
        finally:
            client.close()

    def wait_all(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.done) < count:
            if self.error is not None:
                raise RuntimeError("the result watcher failed") from self.error
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count - len(self.done)} of {count} stream jobs had no result after {timeout_s} s")
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


def latency_stats(latencies: Sequence[float], models: Sequence[str], hot: set[str]) -> dict[str, float]:
    hot_l = [x for x, m in zip(latencies, models, strict=True) if m in hot]
    tail_l = [x for x, m in zip(latencies, models, strict=True) if m not in hot]
    return {
        "hot p50 (s)": percentile(hot_l, 50),
        "hot p95 (s)": percentile(hot_l, 95),
        "tail p50 (s)": percentile(tail_l, 50),
        "tail p95 (s)": percentile(tail_l, 95),
        f"answered within {WITHIN_S:g} s": sum(1 for x in latencies if x <= WITHIN_S) / len(latencies),
    }


def stream(rep: int, duration_s: float, models: Sequence[str]) -> dict[str, dict[str, float]]:
    """The worker on a Poisson stream, and the two simulations on the same arrivals."""
    jobs = arrivals(rep, models, STREAM_RATE, duration_s)
    hot = set(models[:HOT_COUNT])
    names = [m for _, m in jobs]
    fifo_latencies, fifo_loads = fifo_lru(jobs)
    bound_latencies, bound_loads = cycling_bound(jobs, hot)
    fifo = {**latency_stats(fifo_latencies, names, hot), "loads": fifo_loads}
    bound = {**latency_stats(bound_latencies, names, hot), "loads": bound_loads}
    with Workers(f"stream-rep{rep}", registry(len(models))) as workers:
        workers.spawn()
        ready_s = workers.wait_ready()
        client = workers.client()
        before = len(workers.loads())
        say(f"  stream-rep{rep}: ready in {ready_s:.1f} s; {len(jobs)} jobs over {duration_s:g} s")
        watcher = ResultWatcher(workers.prefix)
        watcher.start()
        sent_wall: list[float] = []
        late = 0.0
        try:
            start = time.monotonic() + 0.2
            for i, (at, model_id) in enumerate(jobs):
                delay = start + at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                late = max(late, time.monotonic() - (start + at))
                sent_wall.append(time.time())
                job = client.submit(model_id, f"stream {i}", priority="interactive")
                watcher.submitted.append(job.id)
            watcher.wait_all(len(jobs), RESULT_TIMEOUT_S)
        finally:
            watcher.stop()
        loads = len(workers.loads()) - before
    ids = watcher.submitted
    failed = sum(1 for job_id in ids if watcher.done[job_id][2] != "SUCCESS")
    if failed:
        raise RuntimeError(f"stream-rep{rep}: {failed} of {len(ids)} jobs failed")
    latencies = [watcher.done[job_id][0] - at for job_id, at in zip(ids, sent_wall, strict=True)]
    gaps = [watcher.done[job_id][1] - watcher.done[job_id][0] for job_id in ids]
    say(f"  stream-rep{rep}: submits at most {late * 1000:.0f} ms behind schedule; watcher saw results "
        f"{statistics.median(gaps) * 1000:.0f} ms (median), {max(gaps) * 1000:.0f} ms (max) after date_done")
    worker = latency_stats(latencies, names, hot)
    worker["loads"] = loads
    worker["jobs"] = len(jobs)
    worker["tail p95 / bound"] = worker["tail p95 (s)"] / bound["tail p95 (s)"]
    worker["submit lag, max (ms)"] = late * 1000
    return {"worker": worker, "fifo": fifo, "bound": bound}


# -- the report ------------------------------------------------------------------------------------------------------

Rows = dict[str, list[float]]
BURST_ROWS = ("wall (s)", "submit_jobs call (s)", "loads", "models touched", "loads / touched",
              "most loads of one model", "device limit (s)", "limit / wall")
FLEET_ROWS = ("wall (s)", "submit_jobs call (s)", "loads", "models touched", "loads − touched",
              "most loads of one model", "workers that loaded")
#: The heading of the hand-written notes under the tables (what the figures say); a new run keeps them.
NOTES = "## Notes"


def add(rows: Rows, values: dict[str, float]) -> None:
    for name, value in values.items():
        rows.setdefault(name, []).append(value)


def judged(rows: Rows, name: str, goal: float, at_most: bool) -> tuple[str, str]:
    """(the target, "met"/"NOT met") of a row's median."""
    target = f"{'≤' if at_most else '≥'} {goal:.4g}"
    values = [v for v in rows.get(name, []) if not math.isnan(v)]
    if not values:
        return target, "-"
    median = statistics.median(values)
    return target, ("met" if (median <= goal if at_most else median >= goal) else "**NOT met**")


def cell(rows: Rows, name: str) -> str:
    values = rows.get(name)
    if not values:
        return "-"
    if any(math.isnan(v) for v in values):
        return "n/a"
    return summary(values)


def table(rows: Rows, names: Sequence[str], targets: dict[str, tuple[float, bool]],
          marker: str = "(simulated device)") -> list[str]:
    lines = [f"| measurement {marker} | target | median [min–max] | met? |", "|---|---|---|---|"]
    for name in names:
        if name in targets:
            target, verdict = judged(rows, name, *targets[name])
        else:
            target, verdict = "-", "-"
        lines.append(f"| {name} {marker} | {target} | {cell(rows, name)} | {verdict} |")
    return lines


def render(results: dict[str, Any], sizes: Sizes, repeats: int, command: str, took_s: float,
           priority: str) -> str:
    lines = [
        "# Long-tail benchmark (simulated device)",
        "",
        (f"Reproduce: `{command}` — {time.strftime('%Y-%m-%d %H:%M')}, this machine (2 cores, CPU only, shared "
         f"with other work), Redis 7; {repeats} repetition(s) per figure, median [min–max]; the run took "
         f"{took_s / 60:.1f} min."),
        "",
        ("**Every figure is on a simulated device** (`bench/simulated.py`): models `m000..m{N-1}` each load in "
         f"{LOAD_S:g} s and run a forward pass of n inputs in {BATCH_S * 1000:g} ms + {ITEM_S * 1000:g} ms n "
         f"(passes of up to {MAX_BATCH}), all sleeping; no GPU is involved. Popularity: Zipf, s = {ZIPF_S:g}, "
         "m000 the hottest; the seed of repetition r is r. Worker: `python -m swapless worker --max-models "
         f"{MAX_MODELS}` with every other flag at its default (the warm start as shipped), fresh for each "
         "measurement, on a fresh queue; loads counted exactly (`SIMULATED_LOADS`). Targets are judged on the "
         "median. See the module docstring of `bench/longtail.py` for the details of each measurement."),
        "",
    ]
    if "startup" in results:
        lines += [
            "## 1. Start-up to first answer",
            "",
            ("The worker is spawned and at once one interactive job is submitted for the model in the middle of the "
             "registry; seconds from the spawn to its result. The phases come from the worker's log lines (its first "
             "timestamped line, `… ready.`, `warmed m in T s`)."),
            "",
        ]
        for n, rows in results["startup"].items():
            lines += [f"### {n:,} models", "",
                      *table(rows, list(rows), {"spawn → first answer (s)": (STARTUP_TARGET_S, True)}), ""]
        if "boot" in results:
            lines += ["### What a fresh process imports (timed alone, once per repetition)", "",
                      *table(results["boot"], list(results["boot"]), {}, "(host CPU, no device)"), ""]
    if "burst" in results:
        rows = results["burst"]
        lines += [
            f"## 2. Burst: {sizes.burst_jobs:,} Zipf jobs over {sizes.models} models, one worker",
            "",
            (f"One `Client.submit_jobs` call ({priority} priority) to a ready worker, then `Client.gather`. Wall: "
             "submit start to gather end. Loads: from the submit on. Device limit: Σ over the touched models of one "
             f"load ({LOAD_S:g} s) + Σ over their passes (ceil(n_m / {MAX_BATCH}) per model, each "
             f"{BATCH_S * 1000:g} ms + {ITEM_S * 1000:g} ms per input)."),
            "",
            *table(rows, BURST_ROWS, {"loads / touched": (BURST_LOADS_VS_TOUCHED_TARGET, True),
                                      "limit / wall": (BURST_LIMIT_RATIO_TARGET, False)}),
            "",
        ]
    if "stream" in results:
        runs = results["stream"]
        lines += [
            (f"## 3. Stream: Poisson, {STREAM_RATE:g} interactive jobs/s for {sizes.stream_s:g} s, "
             f"{sizes.models} models"),
            "",
            ("Each job sent by `Client.submit(model, input, priority=\"interactive\")` at its arrival time. Latency: "
             "the result's `date_done` (the worker's store time, same host clock) minus the wall time just before "
             "the submit (error: a millisecond or two). Hot: m000-m002; tail: the other "
             f"{sizes.models - HOT_COUNT}. Baselines, simulated in the benchmark on the same arrivals (device time "
             f"only): **FIFO + LRU of {MAX_MODELS}**: jobs one at a time in arrival order, a load when the model is "
             f"not among the {MAX_MODELS} most recently used, one pass of 1 per job; **cycling bound**: the 3 hot "
             "models resident, hot jobs served between tail visits (a pass each), the tail cycled through the 4th "
             "slot, next the tail model whose oldest waiting job is oldest, each visit one load + passes for all "
             "its waiting jobs; its tail p95 is the bound."),
            "",
            "| measurement (simulated device) | target | swapless worker | FIFO + LRU of 4 | cycling bound | met? |",
            "|---|---|---|---|---|---|",
        ]
        targets = {"hot p95 (s)": (HOT_P95_TARGET_S, True), "tail p95 / bound": (TAIL_VS_BOUND_TARGET, True)}
        worker, fifo, bound = runs["worker"], runs["fifo"], runs["bound"]
        for name in worker:
            target, verdict = judged(worker, name, *targets[name]) if name in targets else ("-", "-")
            if name == "tail p95 (s)":  # judged by its ratio to the bound, per repetition (the next row)
                target = f"≤ {TAIL_VS_BOUND_TARGET:g} × bound"
                verdict = judged(worker, "tail p95 / bound", *targets["tail p95 / bound"])[1]
            lines.append(f"| {name} (simulated device) | {target} | {cell(worker, name)} | {cell(fifo, name)} "
                         f"| {cell(bound, name)} | {verdict} |")
        lines.append("")
    if "fleet" in results:
        rows = results["fleet"]
        lines += [
            f"## 4. Three workers: the burst of 2 ({sizes.burst_jobs:,} jobs, {sizes.models} models)",
            "",
            (f"{FLEET_WORKERS} workers started together (`--hostname w{{i}}@bench`, default flags, --max-models "
             f"{MAX_MODELS}), all ready and heartbeating before the one `submit_jobs` call ({priority} priority). "
             "Loads across the fleet from the submit on."),
            "",
            *table(rows, FLEET_ROWS, {"loads − touched": (FLEET_EXTRA_LOADS_TARGET, True)}),
            "",
        ]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------------------------------


@contextmanager
def interrupts_exit() -> Iterator[None]:
    """SIGTERM and SIGINT unwind the benchmark (``SystemExit``): every ``finally`` (the workers' stops) runs."""
    previous = {signum: signal.signal(signum, _interrupted) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run(scenarios: Sequence[str], sizes: Sizes, repeats: int, priority: str) -> dict[str, Any]:
    models = model_ids(sizes.models)
    results: dict[str, Any] = {}
    for rep in range(repeats):
        say(f"repetition {rep + 1}/{repeats}")
        if "startup" in scenarios:
            boot = {name: import_s(module) for name, module in BOOT_IMPORTS.items()}
            add(results.setdefault("boot", {}), boot)
            say("  " + ", ".join(f"{name}: {value:.2f}" for name, value in boot.items()))
            for n in sizes.registries:
                row = startup(n, rep)
                add(results.setdefault("startup", {}).setdefault(n, {}), row)
                say(f"  startup {n} models: first answer {row['spawn → first answer (s)']:.2f} s (first log line "
                    f"{row['spawn → first log line (s)']:.2f} s, ready {row['spawn → ready (s)']:.2f} s, "
                    f"{row['models warmed before the answer']:.0f} model(s) warmed before the answer)")
        if "burst" in scenarios:
            row = burst(f"burst-rep{rep}", burst_jobs(rep, models, sizes.burst_jobs), len(models), 1, priority)
            add(results.setdefault("burst", {}), row)
            say(f"  burst: {row['wall (s)']:.1f} s, {row['loads']:.0f} loads of {row['models touched']:.0f} "
                f"models, limit / wall {row['limit / wall']:.3f}")
        if "stream" in scenarios:
            got = stream(rep, sizes.stream_s, models)
            for kind, values in got.items():
                add(results.setdefault("stream", {}).setdefault(kind, {}), values)
            w, b = got["worker"], got["bound"]
            say(f"  stream: hot p95 {w['hot p95 (s)']:.3f} s, tail p95 {w['tail p95 (s)']:.2f} s "
                f"(bound {b['tail p95 (s)']:.2f} s, FIFO+LRU {got['fifo']['tail p95 (s)']:.1f} s), "
                f"{w['loads']:.0f} loads")
        if "fleet" in scenarios:
            row = burst(f"fleet-rep{rep}", burst_jobs(rep, models, sizes.burst_jobs), len(models),
                        FLEET_WORKERS, priority)
            add(results.setdefault("fleet", {}), row)
            say(f"  fleet: {row['wall (s)']:.1f} s, {row['loads']:.0f} loads of {row['models touched']:.0f} "
                f"models by {row['workers that loaded']:.0f} worker(s)")
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=None, help="default 3, --quick 1")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of " + ",".join(SCENARIOS))
    parser.add_argument("--write", type=Path, default=None,
                        help="default bench/LONGTAIL.md, --quick bench/out/LONGTAIL-quick.md")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: start-up at 40 and 200 models, a burst of 1,500, a 10 s stream, 1 repetition")
    parser.add_argument("--burst-priority", choices=("bulk", "interactive"), default="bulk",
                        help="the burst's and the fleet's submit_jobs priority (default bulk)")
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(sorted(unknown))}; choose from {', '.join(SCENARIOS)}")
    sizes = QUICK if args.quick else FULL
    repeats = args.repeats or (1 if args.quick else 3)
    write = args.write or (OUT / "LONGTAIL-quick.md" if args.quick else REPO / "bench" / "LONGTAIL.md")
    command = "python -m bench.longtail" + (f" {' '.join(argv if argv is not None else sys.argv[1:])}"
                                              if (argv if argv is not None else sys.argv[1:]) else "")
    started = time.monotonic()
    say(f"worker logs and load files in {LOGS}")
    with interrupts_exit():
        results = run(scenarios, sizes, repeats, args.burst_priority)
    text = render(results, sizes, repeats, command, time.monotonic() - started, args.burst_priority)
    write.parent.mkdir(parents=True, exist_ok=True)
    kept = write.read_text().partition(NOTES)[2] if write.exists() else ""
    write.write_text(text + (f"\n{NOTES}{kept}" if kept else ""))
    print(text)
    say(f"written to {write}")


if __name__ == "__main__":
    main()
