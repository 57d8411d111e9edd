"""The systems ``bench/scheduler.py`` measures: the naive one-task-per-job Celery worker and ``swapless worker`` in
several set-ups, each a real process on a queue of its own; and the ways jobs are fed to them (a burst, a bulk
drain with interactive jobs among it).

Every system reports, next to its jobs/s and latencies, the CPU its worker process used per job (all threads,
from ``/proc/<pid>/stat``): on a GPU, what the queue costs per job on the CPU is what limits a small model.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import redis

from bench.common import OUT, Process, cleanup, collect, fresh_prefix, percentile, python
from bench.profile import cpu_s

__all__ = [
    "OVERLAP",
    "DefaultSwapless",
    "Naive",
    "Run",
    "SimulatedSwapless",
    "Swapless",
    "System",
    "burst",
    "overlap_bound_s",
    "priority",
    "simulated_models",
]


@dataclass
class Run:
    jobs_per_s: float
    loads: int
    p50_s: float
    p99_s: float
    extra: dict[str, float] = field(default_factory=dict)


class System:
    name = ""
    load_marker = ""

    def __init__(self, redis_url: str, models_file: Path, tag: str, prefix: str | None = None) -> None:
        self.redis_url = redis_url
        self.models_file = models_file
        self.prefix = prefix or fresh_prefix(self.name.split()[0])
        self.queue = self.prefix + "jobs"
        self.redis = redis.Redis.from_url(redis_url)
        self.log = OUT / "logs" / f"{re.sub(r'[^a-z0-9-]+', '-', self.name)}-{tag}.log"
        self.process: Process | None = None
        self.start_s = 0.0

    def loads(self) -> int:
        assert self.process is not None
        return self.process.text().count(self.load_marker)

    def cpu_s(self) -> float:
        """CPU seconds the worker process has used so far (all its threads)."""
        assert self.process is not None
        return cpu_s(self.process.proc.pid)

    def submit(self, jobs: list[tuple[str, str]], priority: str = "interactive") -> list[tuple[float, str]]:
        raise NotImplementedError

    def stop(self, *, keep_keys: bool = False) -> None:
        if self.process is not None:
            self.process.stop()
        if not keep_keys:
            cleanup(self.redis, self.prefix)
        self.redis.close()


class Naive(System):
    name = "naive"
    load_marker = "naive loaded "

    def start(self) -> None:
        env = {"BENCH_REDIS_URL": self.redis_url, "BENCH_QUEUE": self.queue, "BENCH_PREFIX": self.prefix,
               "SWAPLESS_MODELS_FILE": str(self.models_file)}
        argv = [python(), "-m", "celery", "-A", "bench.naive", "worker", "--pool", "solo", "--concurrency", "1",
                "--loglevel", "INFO", "--without-gossip", "--without-mingle", "-Q", self.queue]
        self.process = Process(argv, env, self.log)
        self.process.wait_for("ready.")
        from bench.naive import app

        app.conf.broker_url = self.redis_url
        self.app = app

    def submit(self, jobs: list[tuple[str, str]], priority: str = "interactive") -> list[tuple[float, str]]:
        sent = []
        with self.app.producer_or_acquire() as producer:
            for model_id, value in jobs:
                at = time.time()
                result = self.app.send_task(
                    "naive.predict", args=[model_id, value], queue=self.queue, producer=producer
                )
                sent.append((at, result.id))
        return sent

    def get_one(self, model_id: str, value: str) -> float:
        started = time.time()
        result = self.app.send_task("naive.predict", args=[model_id, value], queue=self.queue)
        collect(self.redis, self.prefix, [result.id], 60, poll_s=0.001)  # a tight poll: fair to naive's latency
        return time.time() - started


class Swapless(System):
    """``swapless worker --warm-start`` with ``SWAPLESS_WARM_BEFORE_READY_S=60``: every model warmed and its batch
    sizes measured before "ready" (the limit, too, leaves its warm-up pass out)."""

    name = "swapless"
    #: command-line flags after ``swapless worker --max-models 2``
    flags: tuple[str, ...] = ("--warm-start",)
    #: environment on top of the queue's
    env: ClassVar[Mapping[str, str]] = {"SWAPLESS_WARM_BEFORE_READY_S": "60"}
    #: How jobs are sent: ``Client.submit_jobs`` (one pipeline, messages built directly) or Celery's ``send_task``.
    producer = "submit_jobs"

    def start(self) -> None:
        env = {"SWAPLESS_REDIS_URL": self.redis_url, "SWAPLESS_QUEUE": self.queue, "SWAPLESS_KEY_PREFIX": self.prefix,
               "SWAPLESS_MODELS_FILE": str(self.models_file), "SWAPLESS_DEVICE": "cpu", **self.env}
        argv = [python(), "-m", "swapless", "worker", "--max-models", "2", "--loglevel", "INFO", *self.flags]
        started = time.monotonic()
        self.process = Process(argv, env, self.log)
        self.process.wait_for("ready.")
        self.start_s = time.monotonic() - started
        from swapless.config.settings import Settings
        from swapless.tasks.client import Client

        self.client = Client(settings=Settings(redis_url=self.redis_url, queue=self.queue, key_prefix=self.prefix,
                                               models_file=self.models_file))

    def submit(self, jobs: list[tuple[str, str]], priority: str = "interactive") -> list[tuple[float, str]]:
        from swapless.tasks.protocol import PREDICT_TASK, PRIORITY_BULK, PRIORITY_INTERACTIVE

        if self.producer == "submit_jobs":
            at = time.time()  # every job counts from before the first message was built
            return [(at, job.id) for job in self.client.submit_jobs(jobs, priority=priority)]
        level = PRIORITY_BULK if priority == "bulk" else PRIORITY_INTERACTIVE
        sent = []
        app = self.client.app
        with app.producer_or_acquire() as producer:
            for model_id, value in jobs:
                at = time.time()
                result = app.send_task(
                    PREDICT_TASK, args=[model_id, value], queue=self.queue, priority=level, producer=producer
                )
                sent.append((at, result.id))
        return sent

    def get_one(self, model_id: str, value: str) -> float:
        started = time.time()
        self.client.submit(model_id, value).get(timeout=60)
        return time.time() - started

    def loads(self) -> int:
        assert self.process is not None
        frameworks = "transformers|torchvision|triton|simulated"
        return len(re.findall(rf"loaded \S+ \((?:{frameworks})\) in", self.process.text()))


class DefaultSwapless(Swapless):
    """``swapless worker`` with no flags, restarted on the Redis an earlier worker used: its batch tuners seeded
    with what that worker learned; its default warm start runs while idle, so a burst sent at once ends it."""

    name = "swapless (default flags, restart)"
    flags = ()
    env: ClassVar[Mapping[str, str]] = {}


class SimulatedSwapless(Swapless):
    """``swapless worker`` serving simulated models (``bench/simulated.py``: loads and passes sleep, using no CPU),
    without a warm start; ``env`` turns load ahead on or off."""

    name = "swapless (sim)"
    flags = ("--no-warm-start",)
    env: ClassVar[Mapping[str, str]] = {"SWAPLESS_PLUGINS": "bench.simulated", "OMP_NUM_THREADS": "1"}


#: The overlap workload: models whose load takes as long as their group's compute (simulated).
OVERLAP = {"models": 24, "jobs_per_model": 25, "load_s": 0.25, "item_s": 0.01}


def simulated_models(directory: Path) -> dict[str, Path]:
    """Models files of simulated models: ``stream`` (one model that costs nothing: every CPU cycle is the queue's)
    and ``overlap`` (``OVERLAP``'s models)."""
    from bench.simulated import simulated_entry
    from swapless.manager.demo.tiny import write_models_file

    files = {}
    for kind, entries in {
        "stream": [simulated_entry("sim", 0.0, 0.0, 0.0)],
        "overlap": [
            simulated_entry(f"o{i:02d}", OVERLAP["load_s"], 0.0, OVERLAP["item_s"]) for i in range(OVERLAP["models"])
        ],
    }.items():
        (directory / kind).mkdir(parents=True, exist_ok=True)
        files[kind] = write_models_file(directory / kind, entries)
    return files


def overlap_bound_s() -> float:
    """max(Σ loads, Σ compute) of the overlap workload: its makespan if every load hid behind compute or the
    reverse."""
    loads = OVERLAP["models"] * OVERLAP["load_s"]
    compute = OVERLAP["models"] * OVERLAP["jobs_per_model"] * OVERLAP["item_s"]
    return max(loads, compute)


def burst(system: System, jobs: list[tuple[str, str]], timeout_s: float) -> Run:
    loads_before = system.loads()
    cpu_before = system.cpu_s()
    sent = system.submit(jobs)
    got = collect(system.redis, system.prefix, [job_id for _, job_id in sent], timeout_s)
    cpu = system.cpu_s() - cpu_before
    latencies = [got.done_wall[job_id] - at for at, job_id in sent]
    makespan = max(got.done_wall.values()) - sent[0][0]
    failed = sum(1 for state in got.states.values() if state != "SUCCESS")
    if failed:
        raise RuntimeError(f"{system.name}: {failed} jobs failed; see {system.log}")
    return Run(
        len(jobs) / makespan,
        system.loads() - loads_before,
        percentile(latencies, 50),
        percentile(latencies, 99),
        {"makespan_s": makespan, "cpu_ms_per_job": 1000 * cpu / len(jobs)},
    )


def priority(system: System, bulk: list[tuple[str, str]], interactive: list[tuple[str, str]], every_s: float) -> Run:
    """Interactive jobs submitted one by one while a bulk backlog drains: their latency, and the bulk's rate."""
    started = time.time()
    sent_bulk = system.submit(bulk, priority="bulk")
    sent = []
    for job in interactive:
        time.sleep(every_s)
        sent.extend(system.submit([job], priority="interactive"))
    got = collect(system.redis, system.prefix, [job_id for _, job_id in sent], 600)
    latencies = [got.done_wall[job_id] - at for at, job_id in sent]
    bulk_done = collect(system.redis, system.prefix, [job_id for _, job_id in sent_bulk], 600)
    makespan = max(bulk_done.done_wall.values()) - started
    return Run(len(bulk) / makespan, 0, percentile(latencies, 50), percentile(latencies, 99), {"makespan_s": makespan})
