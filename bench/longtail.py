"""Does a worker serve a long tail of models? A real ``swapless worker --max-models 4`` on *simulated* models.

    python -m bench.longtail                     # 5 scenarios x 3 repetitions, 20-25 min on 2 cores; bench/LONGTAIL.md
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

5. **A registry of 1,000 models** (``registry``): one worker on 1,000 models, after a burst of 2,000 Zipf jobs over
   m000-m039 and 2,000 more over m000-m003 (bulk, gathered: heartbeats, learned costs, claims and results exist).
   Before each read, 10 bulk jobs each go to fresh models (m100 ..) until 20 models have jobs queued or held (the
   worker drains them meanwhile). Each read is timed over 20 calls (``--quick``: 10) after one untimed call, in this
   process, with the worker and a ``swapless serve`` (no API keys, loopback) running beside it:
   ``swapless models`` (tasks/cli/main.py's calls, its listing drawn 120 columns wide; and the whole process once, not
   judged), ``swapless status --json`` (``read_status`` + ``json.dumps``; the process once), the gateway's
   ``GET /models`` and ``GET /metrics`` (httpx), a heartbeat built by ``build_heartbeat`` and published by
   ``HeartbeatPublisher.beat`` under a keyspace of its own (with the worker's activity now, and with every model of
   the registry in it) and ``read_heartbeats``, ``read_placement`` of the 1,000 ids, a placer tick's reads and its
   pure part (``Placer._workers``, ``Placer._demand``, ``plan``, as the worker, never carried out), and
   ``read_cluster``. Redis: ``MEMORY USAGE .. SAMPLES 0`` of every key under the run's prefix, grouped per job (a
   job id in the name), per model (``{queue/model}`` in the name) and the rest; bounded? the keys but the per-job
   ones are read after the first burst and after the second (2,000 more jobs, no new model): their change.

Targets: start-up ≤ 5 s; burst loads ≤ touched x 1.1 and limit / wall ≥ 0.9; stream hot p95 ≤ one load + two passes
of 64 (0.8356 s) for the jobs sent after the cold start (``COLD_START_S``; the whole stream's reported), tail p95 ≤
1.2 x the bound; fleet loads ≤ touched + 3; each read of 5 ≤ 100 ms (median of every timed call). Medians of the
repetitions are judged.

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
#: The stream's cold start: a fresh worker has loaded nothing, so the hot jobs sent in its first seconds wait for the
#: first loads in turn (the first tail model asked for, then each hot model: ~3 loads, 2.4 s, that no schedule avoids
#: and that the cycling bound, with the hot models resident from the start, does not pay). The hot p95 target is
#: judged on the jobs sent after it; the whole stream's is reported beside it.
COLD_START_S = 5.0
HOT_STEADY_ROW = f"hot p95, jobs sent after the first {COLD_START_S:g} s (s)"
TAIL_VS_BOUND_TARGET = 1.2
BURST_LOADS_VS_TOUCHED_TARGET = 1.1
BURST_LIMIT_RATIO_TARGET = 0.9
FLEET_EXTRA_LOADS_TARGET = 3
FLEET_WORKERS = 3
#: Seconds any wait may take at most: a worker's readiness, a result, a stop.
READY_TIMEOUT_S, RESULT_TIMEOUT_S, STOP_TIMEOUT_S = 180.0, 600.0, 20.0
SCENARIOS = ("startup", "burst", "stream", "fleet", "registry")


@dataclass(frozen=True)
class Sizes:
    registries: tuple[int, ...]
    models: int
    burst_jobs: int
    stream_s: float
    #: The registry scenario: the jobs of its burst over ``models`` models, and the timed calls per read.
    registry_burst_jobs: int = 2000
    registry_calls: int = 20


FULL = Sizes(registries=(40, 200, 1000), models=40, burst_jobs=6000, stream_s=30.0, registry_burst_jobs=2000,
             registry_calls=20)
QUICK = Sizes(registries=(40, 200), models=40, burst_jobs=1500, stream_s=10.0, registry_burst_jobs=1000,
              registry_calls=10)


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


def latency_stats(latencies: Sequence[float], models: Sequence[str], hot: set[str],
                  arrived: Sequence[float]) -> dict[str, float]:
    hot_l = [x for x, m in zip(latencies, models, strict=True) if m in hot]
    tail_l = [x for x, m in zip(latencies, models, strict=True) if m not in hot]
    steady = [x for x, m, at in zip(latencies, models, arrived, strict=True) if m in hot and at >= COLD_START_S]
    return {
        "hot p50 (s)": percentile(hot_l, 50),
        "hot p95, whole stream (s)": percentile(hot_l, 95),
        f"hot p95, jobs sent after the first {COLD_START_S:g} s (s)": percentile(steady, 95),
        "tail p50 (s)": percentile(tail_l, 50),
        "tail p95 (s)": percentile(tail_l, 95),
        f"answered within {WITHIN_S:g} s": sum(1 for x in latencies if x <= WITHIN_S) / len(latencies),
    }


def stream(rep: int, duration_s: float, models: Sequence[str]) -> dict[str, dict[str, float]]:
    """The worker on a Poisson stream, and the two simulations on the same arrivals."""
    jobs = arrivals(rep, models, STREAM_RATE, duration_s)
    hot = set(models[:HOT_COUNT])
    names = [m for _, m in jobs]
    ats = [at for at, _ in jobs]
    fifo_latencies, fifo_loads = fifo_lru(jobs)
    bound_latencies, bound_loads = cycling_bound(jobs, hot)
    fifo = {**latency_stats(fifo_latencies, names, hot, ats), "loads": fifo_loads}
    bound = {**latency_stats(bound_latencies, names, hot, ats), "loads": bound_loads}
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
    worker = latency_stats(latencies, names, hot, ats)
    worker["loads"] = loads
    worker["jobs"] = len(jobs)
    worker["tail p95 / bound"] = worker["tail p95 (s)"] / bound["tail p95 (s)"]
    worker["submit lag, max (ms)"] = late * 1000
    return {"worker": worker, "fifo": fifo, "bound": bound}


# -- 5. a registry of 1,000 models -----------------------------------------------------------------------------------

#: The registry scenario: its models, the models of its burst (m000 ..), the models kept with jobs waiting and the
#: jobs sent to each, the models of the boundedness check's extra jobs (m000 ..), and the reads' target.
REGISTRY_MODELS = 1000
WAITING_MODELS, WAITING_JOBS = 20, 10
AGAIN_MODELS = 4
READ_TARGET_MS = 100.0
#: A key's part that names a model: ``swapless:{<queue>/<model>}:<part>``; and a job id (uuid4) in a key's name.
MODEL_KEY = re.compile(r"\{[^{}/]*/(m\d{3})\}")
JOB_KEY = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: The rows of section 5, by key: (name, what it runs on, judged against READ_TARGET_MS).
REGISTRY_ROWS: dict[str, tuple[str, str, bool]] = {
    "models": ("`swapless models`: settings, plugins, models file → ModelStore, listing drawn (ms)", "host CPU", True),
    "store": ("… of which the models file → ModelStore (ms)", "host CPU", False),
    "models process": ("`swapless models`, process incl. interpreter start (ms)", "host CPU", False),
    "status": ("`swapless status --json`: read_status + json.dumps (ms)", "host CPU", True),
    "status process": ("`swapless status --json`, process incl. interpreter start (ms)", "host CPU", False),
    "get models": ("gateway GET /models (ms)", "host CPU", True),
    "get models bytes": ("gateway GET /models, body (bytes)", "host CPU", False),
    "beat": ("heartbeat: build_heartbeat + publish (ms)", "simulated device", True),
    "read beats": ("heartbeat: read_heartbeats (ms)", "host CPU", True),
    "beat models": ("heartbeat: models in the worker's activity (`models`), at that read", "simulated device",
                    False),
    "beat bytes": ("heartbeat: the worker's JSON in Redis after the reads (bytes)", "simulated device", False),
    "beat all": ("heartbeat, all 1,000 models in its activity: build_heartbeat + publish (ms)", "simulated device",
                 True),
    "read beats all": ("heartbeat, all 1,000 models in its activity: read_heartbeats (ms)", "host CPU", True),
    "beat all bytes": ("heartbeat, all 1,000 models in its activity: JSON (bytes)", "simulated device", False),
    "placement": ("placement: read_placement, 1,000 ids (ms)", "host CPU", True),
    "tick reads": ("placement: a tick's reads, read_placement + live heartbeats (ms)", "simulated device", True),
    "tick plan": ("placement: a tick's pure part, views + demand + plan (ms)", "simulated device", True),
    "idle cpu": ("worker process CPU with nothing waiting, over 5 s (% of one core)", "simulated device", False),
    "cluster": ("autoscaling: read_cluster (ms)", "host CPU", True),
    "get metrics": ("gateway GET /metrics (ms)", "host CPU", True),
    "busy start": ("models with jobs waiting or held, at a read's start", "simulated device", False),
    "busy end": ("models with jobs waiting or held, at a read's end", "simulated device", False),
    "jobs start": ("jobs waiting or held, at a read's start", "simulated device", False),
    "keys": ("Redis: keys under the run's prefix", "simulated device", False),
    "bytes": ("Redis: bytes under the run's prefix", "simulated device", False),
    "job keys": ("Redis: per-job keys (results, attempts…): keys", "simulated device", False),
    "job bytes": ("Redis: per-job keys: bytes", "simulated device", False),
    "model keys": ("Redis: per-model keys: keys", "simulated device", False),
    "models with keys": ("Redis: models with keys", "simulated device", False),
    "model mean": ("Redis: bytes per model with keys, mean", "simulated device", False),
    "model max": ("Redis: bytes per model with keys, max", "simulated device", False),
    "shared keys": ("Redis: per-queue and per-deployment keys: keys", "simulated device", False),
    "shared bytes": ("Redis: per-queue and per-deployment keys: bytes", "simulated device", False),
    "job no ttl": ("Redis: per-job keys without a TTL", "simulated device", False),
    "model no ttl": ("Redis: per-model keys without a TTL", "simulated device", False),
    "shared no ttl": ("Redis: per-queue and per-deployment keys without a TTL", "simulated device", False),
    "per registry model": ("Redis: all but per-job bytes / registry model", "simulated device", False),
    "grown bytes": ("bounded? per-model + per-queue bytes, change after the extra jobs", "simulated device", False),
    "grown job keys": ("bounded? per-job keys, change after the extra jobs", "simulated device", False),
}


def timed_ms(call: Callable[[], Any], n: int) -> list[float]:
    """Milliseconds of ``n`` calls of ``call``, after one untimed call (imports, connections, caches)."""
    call()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def key_memory(client: redis.Redis, prefix: str) -> dict[str, Any]:
    """``MEMORY USAGE`` (every element: ``SAMPLES 0``) of every key under ``prefix``, grouped: per job (a job id in
    the name), per model (``{<queue>/<model>}`` in the name), the rest (per queue, per deployment)."""
    keys = [k.decode() for k in client.scan_iter(match=f"{prefix}*", count=5000)]
    sizes: list[int] = []
    ttls: list[int] = []
    for start in range(0, len(keys), 5000):
        pipe = client.pipeline(transaction=False)
        for key in keys[start : start + 5000]:
            pipe.memory_usage(key, samples=0)
            pipe.pttl(key)
        replies = pipe.execute()
        sizes += [int(n or 0) for n in replies[::2]]
        ttls += [int(n) for n in replies[1::2]]
    per_job: dict[str, int] = {}
    per_model: dict[str, int] = {}
    model_keys: dict[str, int] = {}
    shared: dict[str, int] = {}
    no_ttl: dict[str, int] = {"per_job": 0, "model_keys": 0, "shared": 0}
    for key, size, ttl in zip(keys, sizes, ttls, strict=True):
        name = key.removeprefix(prefix)
        model = MODEL_KEY.search(name)
        if JOB_KEY.search(name):
            per_job[name], group = size, "per_job"
        elif model:
            model_keys[name], group = size, "model_keys"
            per_model[model[1]] = per_model.get(model[1], 0) + size
        else:
            shared[name], group = size, "shared"
        no_ttl[group] += ttl == -1
    return {"keys": len(keys), "bytes": sum(sizes), "per_job": per_job, "per_model": per_model,
            "model_keys": model_keys, "shared": shared, "no_ttl": no_ttl}


def key_parts(memory: dict[str, Any]) -> str:
    """The per-model keys of a ``key_memory`` reading by their last part (``p9``, ``holders`` ...): keys, bytes."""
    parts: dict[str, list[int]] = {}
    for name, size in memory["model_keys"].items():
        part = parts.setdefault(name.rsplit(":", 1)[-1], [0, 0])
        part[0], part[1] = part[0] + 1, part[1] + size
    return ", ".join(f"{k} {n} keys {b} B" for k, (n, b) in sorted(parts.items()))


class WaitingWork:
    """Keeps ``WAITING_MODELS`` models with jobs waiting (queued in Redis or held by the worker): before each read,
    ``WAITING_JOBS`` bulk jobs each to as many fresh models (m100 .., never run before) as are missing."""

    def __init__(self, client: Any, redis_client: redis.Redis, keyspace: Any, ids: Sequence[str]) -> None:
        self.client = client
        self.redis = redis_client
        self.keyspace = keyspace
        self.ids = list(ids)
        self.fresh = iter(self.ids[100:])
        self.sent = 0

    def count(self) -> tuple[int, int]:
        """(models with jobs waiting or held, those jobs) now."""
        from swapless.tasks.cluster.view import read_placement

        busy = [p for p in read_placement(self.redis, self.keyspace, self.ids) if p.waiting_messages or p.held]
        return len(busy), sum(p.waiting_messages + p.held for p in busy)

    def top_up(self) -> tuple[int, int]:
        models, _ = self.count()
        if models < WAITING_MODELS:
            fresh = list(itertools.islice(self.fresh, WAITING_MODELS - models))
            jobs = [(m, f"waiting {self.sent + i}")
                    for i, m in enumerate(m for m in fresh for _ in range(WAITING_JOBS))]
            if jobs:
                self.client.submit_jobs(jobs, priority="bulk")
                self.sent += len(jobs)
        return self.count()


def process_cpu_share(pid: int, seconds: float) -> float:
    """CPU seconds per second of process ``pid`` and its children over the next ``seconds``."""
    import psutil

    def cpu() -> float:
        total = 0.0
        parent = psutil.Process(pid)
        for process in [parent, *parent.children(recursive=True)]:
            with suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    started, at = cpu(), time.monotonic()
    time.sleep(seconds)
    return (cpu() - started) / (time.monotonic() - at)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli_process_ms(workers: Workers, *args: str) -> float:
    """Milliseconds of one ``python -m swapless <args>`` process, interpreter start included."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "swapless", *args], env={**os.environ, **workers.env()}, cwd=REPO,
                   capture_output=True, check=True, timeout=120)
    return (time.perf_counter() - started) * 1000


def _registry_growth(workers: Workers, rep: int, sizes: Sizes, ids: list[str], tag: str,
                     rows: dict[str, list[float]]) -> None:
    """Two bursts, the second over models that ran already: how the keys other than the per-job ones grew."""
    client, r = workers.client(), workers.redis

    def run_burst(jobs: list[tuple[str, str]]) -> None:
        got = client.gather(client.submit_jobs(jobs, priority="bulk"), timeout=RESULT_TIMEOUT_S)
        if any(s.state != "SUCCESS" for s in got):
            raise RuntimeError(f"{tag}: a job of the burst failed; see {LOGS}/{tag}-w0.log")
        time.sleep(2.5)  # a heartbeat after the last group (every 2 s by default)

    run_burst(burst_jobs(rep, ids[: sizes.models], sizes.registry_burst_jobs))
    before = key_memory(r, workers.prefix)
    # bounded? as many jobs again, over models that have run already: no key but the per-job ones may grow
    run_burst(burst_jobs(rep + 1000, ids[:AGAIN_MODELS], sizes.registry_burst_jobs))
    after = key_memory(r, workers.prefix)
    kept_before = before["model_keys"] | before["shared"]
    kept_after = after["model_keys"] | after["shared"]
    rows["grown bytes"] = [sum(kept_after.values()) - sum(kept_before.values())]
    rows["grown job keys"] = [len(after["per_job"]) - len(before["per_job"])]
    grown = sorted((v - kept_before.get(k, 0), k) for k, v in kept_after.items())
    say(f"  {tag}: per-job keys {len(before['per_job'])} → {len(after['per_job'])}, other keys "
        f"{len(kept_before)} ({sum(kept_before.values())} B) → {len(kept_after)} ({sum(kept_after.values())} B); "
        "most grown: " + ", ".join(f"{k} {d:+d} B" for d, k in grown[-3:] if d))
    say(f"  {tag}: per-model keys by part, before: {key_parts(before)}; after: {key_parts(after)}")


def _wait_gateway(http: Any, gateway: Process) -> None:
    import httpx

    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        with suppress(httpx.HTTPError):
            if http.get("/healthz").status_code == 200:
                return
        if gateway.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the gateway did not start:\n{gateway.text()[-3000:]}")
        time.sleep(0.1)


def _beat_publisher(workers: Workers, aside: Any, manager: Any, beat: Any, activity: dict[str, Any]) -> Any:
    """A publisher of ``beat``'s heartbeat under ``aside``, its stats fed with ``activity`` per model."""
    from swapless.tasks.observe.accounting import GroupReport
    from swapless.tasks.observe.beats import HeartbeatPublisher, build_heartbeat
    from swapless.tasks.observe.stats import WorkerStats

    stats = WorkerStats()
    waits = 1000 // max(1, len(activity))
    for model_id, a in activity.items():
        stats(GroupReport(model_id=model_id, succeeded=a.jobs_done, errors={},
                          run_s=a.run_s_total + a.load_s_total,
                          queue_wait_s=(1.0,) * min(a.jobs_done, waits), hits=a.hits, misses=a.misses,
                          load_s=(LOAD_S,) * a.loads, load_failures=0, evicted=()))
    claimed = [m for m, a in beat.models.items() if a.claimed]
    return HeartbeatPublisher(
        workers.redis, aside, "bench@registry:0",
        lambda: build_heartbeat(hostname="bench@registry", worker_id="bench@registry:0",
                                queue=workers.queue, started_at=beat.started_at,
                                interval_s=beat.interval_s, manager=manager, stats=stats,
                                backlog={m: a.backlog for m, a in beat.models.items()},
                                jobs_done=beat.jobs_done, jobs_failed=beat.jobs_failed,
                                routing=beat.routing, claimed=claimed, device=beat.device),
        beat.interval_s)


@dataclass
class _RegistryReads:
    """The timed reads of section 5 (``reads``), what to do before timing some of them (``prepare``), and the
    heartbeats built for them."""

    reads: dict[str, Callable[[], Any]]
    prepare: dict[str, Callable[[], Any]]
    publishers: dict[str, Any]
    beat: Any
    aside: Any


def _registry_reads(workers: Workers, http: Any, models_file: Path, ids: list[str], sizes: Sizes,
                    rows: dict[str, list[float]]) -> _RegistryReads:
    from swapless.config.settings import load_settings
    from swapless.manager import ModelEngine, ModelManager, ModelStore
    from swapless.tasks.broker.connection import RedisHealth
    from swapless.tasks.cli.main import models_text
    from swapless.tasks.cluster.members import read_heartbeats
    from swapless.tasks.cluster.placer import Placer
    from swapless.tasks.cluster.plan import plan
    from swapless.tasks.cluster.view import read_placement
    from swapless.tasks.keyspace import Keyspace
    from swapless.tasks.observe.backlog import read_cluster
    from swapless.tasks.observe.status import read_status
    from swapless.tasks.routing import Router
    from swapless.tasks.worker.runtime import load_plugins

    r = workers.redis
    keyspace = Keyspace(workers.queue, workers.prefix)
    settings = load_settings(redis_url=REDIS_URL, key_prefix=workers.prefix, queue=workers.queue,
                             models_file=models_file, plugins="bench.simulated")

    def cli_models() -> None:
        """``swapless models`` (tasks/cli/main.py): the registry read, its listing drawn 120 columns wide."""
        s = load_settings(models_file=models_file, plugins="bench.simulated")
        load_plugins(s.cache)
        models_text(ModelStore.from_file(s.cache.models_file, ModelEngine().frameworks), width=120)

    # The heartbeat: built by build_heartbeat from a cache of the worker's size (empty: what it has
    # loaded is at most 4 entries) and stats fed with the worker's activity per model as its last heartbeat
    # has it (read again just before the read), or with that of one of its models for every model of the
    # registry (the most a heartbeat holds: one entry per model run since the worker started); published
    # under a keyspace of its own (within the run's prefix), so that the worker never sees a second member.
    store = ModelStore.from_file(models_file, ModelEngine().frameworks)
    manager = ModelManager(store, ModelEngine().build, max_models=MAX_MODELS)
    aside = Keyspace(workers.queue, workers.prefix + "aside:")

    def worker_beat() -> Any:
        return next(b for b in read_heartbeats(r, keyspace) if b.queue == workers.queue)

    beat = worker_beat()
    typical = beat.models.get(ids[sizes.models - 1]) or next(iter(beat.models.values()))
    publishers = {"beat": _beat_publisher(workers, aside, manager, beat, beat.models),
                  "beat all": _beat_publisher(workers, aside, manager, beat, {m: typical.model_copy() for m in ids})}

    def beat_now() -> None:  # the publisher prepare_beat made
        publishers["beat"].beat()

    def prepare_beat() -> None:
        now = worker_beat()
        publishers["beat"] = _beat_publisher(workers, aside, manager, now, now.models)
        rows["beat models"] = [len(now.models)]

    # One placer tick of the worker's, read and planned as the worker (its id and activity; a cache of its
    # size, empty), never carried out: plan is pure, and nothing here claims.
    placer = Placer(settings, keyspace, store, manager, Router(store), r, RedisHealth(), beat.worker_id,
                    activity=lambda: beat.models)

    def tick_reads() -> Any:
        return read_placement(r, keyspace, ids), placer._live()

    tick: dict[str, Any] = {}

    def prepare_tick() -> None:  # the reading the plan works on: the backlog's, now
        tick["places"], (tick["beats"], tick["live"]) = tick_reads()

    def tick_plan() -> Any:
        return plan(beat.worker_id, placer._workers(tick["beats"]),
                    placer._demand(tick["places"], tick["beats"], tick["live"]),
                    copy_backlog_s=settings.placement.copy_backlog_s, max_copies=settings.placement.max_copies,
                    copy_idle_s=settings.placement.copy_idle_s)

    reads: dict[str, Callable[[], Any]] = {
        "models": cli_models,
        "store": lambda: ModelStore.from_file(models_file, ModelEngine().frameworks),
        "status": lambda: json.dumps(read_status(r, keyspace, ids)),
        "get models": lambda: http.get("/models").raise_for_status(),
        "beat": beat_now,
        "read beats": lambda: read_heartbeats(r, keyspace),
        "beat all": publishers["beat all"].beat,
        "read beats all": lambda: read_heartbeats(r, aside),
        "placement": lambda: read_placement(r, keyspace, ids),
        "tick reads": tick_reads,
        "tick plan": tick_plan,
        "cluster": lambda: read_cluster(r, keyspace, ids, unknown_job_s=settings.scaling.scale_unknown_job_s,
                                        unknown_load_s=settings.scaling.scale_unknown_load_s),
        "get metrics": lambda: http.get("/metrics").raise_for_status(),
    }
    prepare = {"beat": prepare_beat, "read beats all": publishers["beat all"].beat, "tick plan": prepare_tick}
    return _RegistryReads(reads, prepare, publishers, beat, aside)


def _time_reads(workers: Workers, http: Any, models_file: Path, ids: list[str], sizes: Sizes,
                rows: dict[str, list[float]], tag: str) -> dict[str, Any]:
    """Each read timed ``sizes.registry_calls`` times with the waiting work topped up; the keys' memory after."""
    from swapless.tasks.keyspace import Keyspace

    r = workers.redis
    keyspace = Keyspace(workers.queue, workers.prefix)
    calls = _registry_reads(workers, http, models_file, ids, sizes, rows)
    waiting = WaitingWork(workers.client(), r, keyspace, ids)
    for key, call in calls.reads.items():
        models_now, jobs_now = waiting.top_up()
        if key in calls.prepare:
            calls.prepare[key]()
        times = timed_ms(call, sizes.registry_calls)
        rows.setdefault(key, []).extend(times)
        add(rows, {"busy start": models_now, "jobs start": jobs_now, "busy end": waiting.count()[0]})
        say(f"    {key}: {statistics.median(times):.1f} ms [{min(times):.1f}–{max(times):.1f}], "
            f"{models_now} models ({jobs_now} jobs) waiting at the start")
    r.delete(calls.aside.heartbeat("bench@registry:0"), calls.aside.heartbeats)
    rows["get models bytes"] = [len(http.get("/models").content)]
    rows["beat bytes"] = [r.strlen(keyspace.heartbeat(calls.beat.worker_id))]
    rows["beat all bytes"] = [len(calls.publishers["beat all"].build().model_dump_json())]
    say(f"  {tag}: the worker's heartbeat now {rows['beat bytes'][0]} B; the one built for the read "
        f"{len(calls.publishers['beat'].build().model_dump_json())} B with {rows['beat models'][0]} models")
    waiting.top_up()
    return key_memory(r, workers.prefix)


def _memory_rows(memory: dict[str, Any], rows: dict[str, list[float]], tag: str) -> None:
    per_model = memory["per_model"]
    add(rows, {
        "keys": memory["keys"],
        "bytes": memory["bytes"],
        "job keys": len(memory["per_job"]),
        "job bytes": sum(memory["per_job"].values()),
        "model keys": len(memory["model_keys"]),
        "models with keys": len(per_model),
        "model mean": statistics.fmean(per_model.values()) if per_model else 0.0,
        "model max": max(per_model.values(), default=0),
        "shared keys": len(memory["shared"]),
        "shared bytes": sum(memory["shared"].values()),
        "job no ttl": memory["no_ttl"]["per_job"],
        "model no ttl": memory["no_ttl"]["model_keys"],
        "shared no ttl": memory["no_ttl"]["shared"],
        "per registry model": (sum(per_model.values()) + sum(memory["shared"].values())) / REGISTRY_MODELS,
    })
    largest = max(per_model, key=per_model.__getitem__, default="-")
    kinds: dict[str, int] = {}
    for name in memory["per_job"]:
        kinds[JOB_KEY.sub("<id>", name)] = kinds.get(JOB_KEY.sub("<id>", name), 0) + 1
    say(f"  {tag}: per-model keys by part: {key_parts(memory)}; per-job keys: {kinds}")
    say(f"  {tag}: largest model {largest} ({per_model.get(largest, 0)} B); largest shared keys: "
        + ", ".join(f"{k} {v} B" for k, v in sorted(memory["shared"].items(), key=lambda kv: -kv[1])[:6]))


def registry_scenario(rep: int, sizes: Sizes) -> dict[str, list[float]]:
    """Section 5: the reads of a registry of ``REGISTRY_MODELS`` models with one worker (the module docstring, 5);
    rows by ``REGISTRY_ROWS``'s keys, every timed call of a read in its row."""
    import httpx

    ids = model_ids(REGISTRY_MODELS)
    models_file = registry(REGISTRY_MODELS)
    tag = f"registry-rep{rep}"
    rows: dict[str, list[float]] = {}
    with Workers(tag, models_file) as workers:
        workers.spawn()
        ready_s = workers.wait_ready()
        say(f"  {tag}: ready in {ready_s:.1f} s; a burst of {sizes.registry_burst_jobs} jobs over {sizes.models} "
            f"models, then as many over {AGAIN_MODELS}")
        _registry_growth(workers, rep, sizes, ids, tag, rows)
        rows["idle cpu"] = [process_cpu_share(workers.processes[0].proc.pid, 5.0) * 100]

        port = free_port()
        gateway = Process([sys.executable, "-m", "swapless", "serve", "--port", str(port), "--log-level", "warning"],
                          workers.env(), LOGS / f"{tag}-gateway.log")
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        try:
            _wait_gateway(http, gateway)
            memory = _time_reads(workers, http, models_file, ids, sizes, rows, tag)
        finally:
            http.close()
            stop_all([gateway])
        rows["models process"] = [cli_process_ms(workers, "models")]
        rows["status process"] = [cli_process_ms(workers, "status", "--json")]
    _memory_rows(memory, rows, tag)
    return rows


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
             "the submit (error: a millisecond or two). The hot p95 target is judged on the jobs sent after the "
             f"first {COLD_START_S:g} s (the cold start: a fresh worker loads the hot models in turn as their first "
             "jobs come; the cycling bound has them resident from the start). Hot: m000-m002; tail: the other "
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
        targets = {HOT_STEADY_ROW: (HOT_P95_TARGET_S, True), "tail p95 / bound": (TAIL_VS_BOUND_TARGET, True)}
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
    if "registry" in results:
        rows = results["registry"]
        lines += [
            f"## 5. A registry of {REGISTRY_MODELS:,} models",
            "",
            (f"One worker (`swapless worker --max-models {MAX_MODELS}`, default flags) on a registry of "
             f"{REGISTRY_MODELS:,} simulated models, after a burst of {sizes.registry_burst_jobs:,} Zipf jobs over "
             f"m000-m{sizes.models - 1:03d} and as many again over m000-m{AGAIN_MODELS - 1:03d} (bulk, gathered: "
             "heartbeats, learned costs, claims and results exist). Before each read, jobs waiting: "
             f"{WAITING_JOBS} bulk jobs each to fresh models (m100 ..) until {WAITING_MODELS} models have jobs "
             "queued or held, so the reads find a backlog, which the worker drains meanwhile. Each read: "
             f"{sizes.registry_calls} timed calls after one untimed, in this process (the gateway: HTTP over "
             "loopback to `swapless serve`, no API keys, with httpx, one connection), the worker and the gateway "
             "running beside it on the same 2 cores; median [min–max] over every timed call of every repetition. "
             "`swapless models` draws its listing (one line per model) for 120 columns. The heartbeat is built by "
             "`build_heartbeat` (an empty cache of the worker's size, stats fed with the worker's activity per model "
             "as its heartbeat has it just before the read, or with one model's for each of the 1,000) and "
             "published with `HeartbeatPublisher.beat` under a keyspace of its own. The placer's tick is the "
             "worker's own (its id, its heartbeat), planned on a reading taken just before, never carried out. "
             "Redis: `MEMORY USAGE … SAMPLES 0` of every key under the "
             "run's prefix, taken after the reads with the backlog topped up: per job (a job id in the name), per "
             "model (`{queue/model}` in the name), the rest per queue or deployment. Bounded? The keys but the "
             "per-job ones, after the first burst and again after the second: what grows with the jobs run."),
            "",
            "| measurement | target | median [min–max] | met? |",
            "|---|---|---|---|",
        ]
        for key, (name, marker, judge) in REGISTRY_ROWS.items():
            values = rows.get(key)
            if not values:
                continue
            target, verdict = judged(rows, key, READ_TARGET_MS, True) if judge else ("-", "-")
            lines.append(f"| {name} ({marker}) | {target} | {registry_cell(values, '(ms)' in name)} | {verdict} |")
        lines.append("")
    return "\n".join(lines)


def registry_cell(values: Sequence[float], ms: bool) -> str:
    """``median [min–max]``: milliseconds to 4 significant digits, the rest (counts, bytes) as whole numbers."""
    show = (lambda v: f"{v:.4g}") if ms else (lambda v: f"{v:,.0f}")
    if len(values) == 1:
        return show(values[0])
    return f"{show(statistics.median(values))} [{show(min(values))}–{show(max(values))}]"


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
            say(f"  stream: hot p95 {w['hot p95, whole stream (s)']:.3f} s, after the cold start "
                f"{w[HOT_STEADY_ROW]:.3f} s, tail p95 {w['tail p95 (s)']:.2f} s "
                f"(bound {b['tail p95 (s)']:.2f} s, FIFO+LRU {got['fifo']['tail p95 (s)']:.1f} s), "
                f"{w['loads']:.0f} loads")
        if "fleet" in scenarios:
            row = burst(f"fleet-rep{rep}", burst_jobs(rep, models, sizes.burst_jobs), len(models),
                        FLEET_WORKERS, priority)
            add(results.setdefault("fleet", {}), row)
            say(f"  fleet: {row['wall (s)']:.1f} s, {row['loads']:.0f} loads of {row['models touched']:.0f} "
                f"models by {row['workers that loaded']:.0f} worker(s)")
        if "registry" in scenarios:
            for key, values in registry_scenario(rep, sizes).items():
                results.setdefault("registry", {}).setdefault(key, []).extend(values)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=None, help="default 3, --quick 1")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of " + ",".join(SCENARIOS))
    parser.add_argument("--write", type=Path, default=None,
                        help="default bench/LONGTAIL.md, --quick bench/out/LONGTAIL-quick.md")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: start-up at 40 and 200 models, a burst of 1,500, a 10 s stream, registry "
                             "reads of 10 calls after bursts of 1,000, 1 repetition")
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
