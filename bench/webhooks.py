"""What a webhook costs per job: a real ``swapless worker`` runs the same stream of jobs without and with a
``callback_url`` to a local receiver that answers 200 at once, alternating, three repetitions each, in one run.

    python -m bench.webhooks [--jobs 2000] [--repeat 3] [--model zero|bert]

``zero`` (the default) is a simulated model whose load and forward pass cost nothing (``bench.simulated``): what is
left is the queue's own work per job, so the webhook's share (queueing the delivery, signing, the POST from the
sender thread) shows. ``bert`` is a tiny BERT on the CPU, whose cost swamps the webhook's. Prints per repetition the
jobs' throughput (submit to the last result), the worker's CPU per job (psutil, its sender thread included) and,
with webhooks, the time until the last webhook arrived; then the medians and the difference per job. Needs Redis
(``SWAPLESS_REDIS_URL``, default 127.0.0.1:6379/0; the run's keys live under a fresh prefix and are deleted after).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import psutil
import redis

from bench.common import OUT, Process, build_models, cleanup, fresh_prefix
from bench.httpd import QuietHandler, close, serve

SECRET = "whsec_" + "YmVuY2gtd2ViaG9va3Mtc2VjcmV0LTMyLWJ5dGVzISE="


class _Counter:
    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0
        self.lock = threading.Lock()


def _receiver(counter: _Counter) -> ThreadingHTTPServer:
    class Handler(QuietHandler):
        def do_POST(self) -> None:  # http.server's name
            self.rfile.read(int(self.headers.get("content-length", "0")))
            with counter.lock:
                counter.count += 1
                counter.last = time.perf_counter()
            self.send_response(200)
            self.end_headers()

    return serve(Handler)


Row = tuple[str, float, float, float | None]


def _models(model: str) -> tuple[Path, str]:
    """The models file of ``--model`` and how the table names it."""
    if model == "bert":
        models = build_models(OUT / "webhook-models", text_models=[("mini", "bert", "mini")], image_models=())
        return models, "tiny BERT on the CPU"
    from bench.simulated import simulated_entry
    from swapless.manager.demo.tiny import write_models_file

    (OUT / "webhook-zero").mkdir(parents=True, exist_ok=True)
    models = write_models_file(OUT / "webhook-zero", [simulated_entry("mini", 0.0, 0.0, 0.0)])
    return models, "simulated model that costs nothing"


def _measure(worker: Process, counter: _Counter, hook: str, jobs: int, repeat: int) -> list[Row]:
    """Each repetition's baseline and hooked runs: (name, jobs/s, worker CPU ms per job, last webhook after s)."""
    from swapless.tasks.client import Client

    rows: list[Row] = []
    proc = psutil.Process(worker.proc.pid)
    with Client() as client:
        client.gather(client.submit_jobs([("mini", f"warm {i}") for i in range(64)]), timeout=120)
        for rep in range(repeat):
            for hooked in (False, True):
                batch = [("mini", f"r{rep} {'h' if hooked else 'p'} {i}") for i in range(jobs)]
                before = counter.count
                cpu = sum(proc.cpu_times()[:2])
                started = time.perf_counter()
                sent = client.submit_jobs(batch, callback_url=hook if hooked else None)
                client.gather(sent, timeout=600)
                took = time.perf_counter() - started
                cpu_ms = (sum(proc.cpu_times()[:2]) - cpu) * 1000 / jobs
                delivered_s = None
                if hooked:
                    deadline = time.monotonic() + 600
                    while counter.count - before < jobs and time.monotonic() < deadline:
                        time.sleep(0.05)
                    delivered_s = counter.last - started
                rows.append(("with callback_url" if hooked else "baseline", jobs / took, cpu_ms, delivered_s))
    return rows


def _print(rows: list[Row], jobs: int, described: str) -> None:
    print(f"\n{jobs} jobs per run, {described}, one worker, receiver on this machine\n")
    print("| run | jobs/s | worker CPU ms/job | last webhook after (s) |")
    print("|---|---|---|---|")
    for name, rate, cpu_ms, delivered in rows:
        print(f"| {name} | {rate:.0f} | {cpu_ms:.3f} | {'' if delivered is None else f'{delivered:.2f}'} |")
    medians = {name: (statistics.median(r[1] for r in rows if r[0] == name),
                      statistics.median(r[2] for r in rows if r[0] == name))
               for name in ("baseline", "with callback_url")}
    (base_rate, base_cpu), (hook_rate, hook_cpu) = medians["baseline"], medians["with callback_url"]
    print(f"| median, baseline | {base_rate:.0f} | {base_cpu:.3f} | |")
    print(f"| median, with callback_url | {hook_rate:.0f} | {hook_cpu:.3f} | |")
    print(f"\na webhook costs {hook_cpu - base_cpu:+.3f} ms of worker CPU per job; "
          f"throughput {hook_rate / base_rate:.2f} of the baseline's")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", choices=("zero", "bert"), default="zero")
    args = parser.parse_args()
    url = os.environ.get("SWAPLESS_REDIS_URL", "redis://127.0.0.1:6379/0")
    models, described = _models(args.model)
    prefix = fresh_prefix("webhooks")
    env = {"SWAPLESS_REDIS_URL": url, "SWAPLESS_KEY_PREFIX": prefix, "SWAPLESS_QUEUE": prefix + "jobs",
           "SWAPLESS_MODELS_FILE": str(models), "SWAPLESS_DEVICE": "cpu", "SWAPLESS_WARM_START": "false",
           "SWAPLESS_WEBHOOK_SECRET": SECRET, "SWAPLESS_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
           "SWAPLESS_PLUGINS": "bench.simulated"}
    os.environ.update(env)
    counter = _Counter()
    server = _receiver(counter)
    hook = f"http://127.0.0.1:{server.server_address[1]}/hook"
    worker = Process([sys.executable, "-m", "swapless", "worker"], env, OUT / "webhooks-worker.log")
    try:
        worker.wait_for("ready.")
        rows = _measure(worker, counter, hook, args.jobs, args.repeat)
    finally:
        worker.stop()
        close(server)
        cleanup(redis.Redis.from_url(url), prefix)
    _print(rows, args.jobs, described)


if __name__ == "__main__":
    main()
