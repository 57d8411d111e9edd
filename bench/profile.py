"""Where a worker's CPU goes per job: a py-spy profile of a live worker fed a stream of jobs.

    python -m bench.profile                       # 20,000 jobs of a simulated model; prints the top frames
    python -m bench.profile --model real          # the stream benchmark's tiny BERT instead

The worker runs one model: by default a simulated one (``bench/simulated.py``: its forward pass sleeps, so every
CPU cycle the worker spends is the queue's), fed by ``Client.submit_jobs`` in batches of 500 from this process.
py-spy samples every thread of the worker (``--idle`` off: only samples on CPU count); the summary gives, per
function, its share of the samples on its own (self) and with what it calls (total), and the worker's CPU time per
job read from ``/proc`` (all its threads).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import OUT, REPO, Process, build_models, cleanup, fresh_prefix
from bench.simulated import simulated_entry

REDIS_URL = os.environ.get("SWAPLESS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summarize(raw: Path, top: int = 25) -> str:
    """Top frames of a py-spy ``--format raw`` file (collapsed stacks) by self and by total share."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0] + ")" if " (" in f else f
                  for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    lines = [f"{samples} samples on CPU", "", "| self % | total % | function (file) |", "|---|---|---|"]
    shown = set()
    for frame, n in own.most_common(top):
        lines.append(f"| {100 * n / samples:.1f} | {100 * total[frame] / samples:.1f} | `{frame}` |")
        shown.add(frame)
    lines += ["", "Largest by total share (what the time is spent under):", "",
              "| total % | function (file) |", "|---|---|"]
    for frame, n in total.most_common(top + 15):
        if "<module>" in frame or "_bootstrap" in frame or frame.startswith("run (threading"):
            continue
        lines.append(f"| {100 * n / samples:.1f} | `{frame}` |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--model", choices=["simulated", "real"], default="simulated")
    parser.add_argument("--output", type=Path, default=OUT / "profile")
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("py-spy is not installed: pip install py-spy")
    args.output.mkdir(parents=True, exist_ok=True)
    if args.model == "real":
        models_file, model_id = build_models(), "tiny-a"
    else:
        from swapless.manager.demo.tiny import write_models_file

        directory = OUT / "profile-models"
        directory.mkdir(parents=True, exist_ok=True)
        models_file = write_models_file(directory, [simulated_entry("sim", 0.0, 0.0, 0.0)])
        model_id = "sim"
    prefix = fresh_prefix("profile")
    env = {"SWAPLESS_REDIS_URL": REDIS_URL, "SWAPLESS_KEY_PREFIX": prefix, "SWAPLESS_QUEUE": prefix + "jobs",
           "SWAPLESS_MODELS_FILE": str(models_file), "SWAPLESS_PLUGINS": "bench.simulated", "SWAPLESS_DEVICE": "cpu",
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    worker = Process([sys.executable, "-m", "swapless", "worker", "--loglevel", "INFO"], env,
                     args.output / "worker.log")
    worker.wait_for("ready.")
    from swapless.config.settings import Settings
    from swapless.tasks.client import Client

    client = Client(settings=Settings(redis_url=REDIS_URL, key_prefix=prefix, queue=prefix + "jobs",
                                      models_file=models_file), forget=True)
    client.gather(client.submit_jobs([(model_id, "warm up")] * 200), timeout=60)
    raw = args.output / "profile.raw"
    spy = subprocess.Popen(["py-spy", "record", "--pid", str(worker.proc.pid), "--format", "raw", "--rate",
                            str(args.rate), "--output", str(raw), "--nonblocking"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    before = cpu_s(worker.proc.pid)
    started = time.perf_counter()
    pending = []
    for start in range(0, args.jobs, 500):
        pending += client.submit_jobs(
            [(model_id, f"text number {i}") for i in range(start, min(start + 500, args.jobs))]
        )
        if len(pending) >= 2000:
            client.gather(pending[:1000], timeout=120)
            pending = pending[1000:]
    client.gather(pending, timeout=300)
    seconds = time.perf_counter() - started
    used = cpu_s(worker.proc.pid) - before
    spy.send_signal(2)
    spy.wait(30)
    worker.stop()
    import redis

    cleanup(redis.Redis.from_url(REDIS_URL), prefix)
    print(f"{args.jobs} jobs of the {args.model} model in {seconds:.1f} s: {args.jobs / seconds:.0f} jobs/s; "
          f"worker CPU {used:.2f} s = {1000 * used / args.jobs:.3f} ms per job (all threads)\n")
    print(summarize(raw))


if __name__ == "__main__":
    main()
