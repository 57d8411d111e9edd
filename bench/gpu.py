"""Swapless on one GPU: a real ``swapless worker`` on the device against the in-process limit on the same device.

    python -m bench.gpu                  # on a machine with an NVIDIA GPU: 3 repetitions; writes bench/GPU.md
    python -m bench.gpu --quick          # any machine (CI): tiny models, 1 repetition; writes bench/out/GPU-quick.md
    python -m bench.gpu --allow-cpu      # the full run on a machine without CUDA; writes bench/out/GPU-cpu.md

Models (``swapless.manager.demo.tiny``: real architectures, random weights, real sizes, saved as checkpoints are):
bert-tiny ×2, bert-mini, distilbert-base, bert-base (hidden 768, 12 layers, 12 heads), mobilenet_v2, resnet18 and
resnet50; ``--quick``: two bert-tiny and mobilenet_v3_small, one torch thread per process, the limit tried at batch
sizes 8 and 64 only (a check that every row is produced, not a measurement). Every repetition measures, on the
device:

1. per model, in this process: its load from its saved files, then one forward pass, then its unload, with
   ``torch.cuda.memory_allocated()`` before the load, after it and after the unload (back within 64 MB, or the row
   says not);
2. the in-process limit (``bench.scheduler.measure_limit``): one load per model plus its jobs at its best batch
   size; and the stream model's CPU per job in this process at that size;
3. per model, through a cache of one with a host tier (``bench.gpu_probe.probe_tiers``): a swap-in from disk (a
   load), from host memory (a copy back, from pinned memory on CUDA) and while resident (a hit), the move to host
   memory, and ``torch.cuda.memory_allocated()`` after each move;
4. a fresh ``swapless worker --warm-start`` (``--max-models 2``, passes up to 64 inputs, as the limit's sizes) on
   the device: a mixed burst (jobs for every model at once, so it must swap), then a stream of jobs for one warm
   model; its jobs/s, model loads and CPU per job (all threads, from ``/proc``), and the device memory it took.

The memory budget row reads what a worker started here with no ``--memory-budget`` runs with: there is no
automatic CUDA budget (``SWAPLESS_MEMORY_BUDGET_BYTES`` unset is no byte limit, the cache is bounded by
``--max-models`` alone), so the headroom is the device's memory less the worker's peak.

Without CUDA the full run refuses (exit 2) unless ``--allow-cpu``: no GPU figure is ever written unmeasured, and
every row names the device it ran on.
"""

from __future__ import annotations

import argparse
import random
import re
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from bench.common import OUT, REPO, fresh_prefix, inputs_for, mixed_jobs
from bench.gpu_probe import (
    DeviceInfo,
    DeviceUse,
    budget_in_effect,
    compute_cpu_ms_per_job,
    device_info,
    probe_loads,
    probe_tiers,
)
from bench.gpu_table import Plan, Results, render
from bench.systems import Run, Swapless, burst

__all__ = ["FULL", "QUICK", "Plan", "Results", "main"]

#: Largest forward pass of the worker: the largest size the limit tries (``bench.scheduler.BATCH_CANDIDATES``).
MAX_BATCH = 64
#: Jobs of the stream the stream's limit is measured on (eight passes of ``MAX_BATCH``).
STREAM_SAMPLE = 8 * MAX_BATCH


FULL = Plan(
    name="full",
    text_models=(
        ("bert-tiny-a", "bert", "tiny"),
        ("bert-tiny-b", "bert", "tiny"),
        ("bert-mini", "bert", "mini"),
        ("distilbert", "distilbert", "distilbert"),
        ("bert-base", "bert", "base"),
    ),
    image_models=(("mobilenet-v2", "mobilenet_v2"), ("resnet18", "resnet18"), ("resnet50", "resnet50")),
    mixed_jobs=1600,
    stream_model="bert-base",
    stream_jobs=5000,
    repeats=3,
)
QUICK = Plan(
    name="quick",
    text_models=(("tiny-a", "bert", "tiny"), ("tiny-b", "bert", "tiny")),
    image_models=(("vision", "mobilenet_v3_small"),),
    mixed_jobs=48,
    stream_model="tiny-a",
    stream_jobs=300,
    repeats=1,
    # One thread each side: on a shared CI machine two OpenMP threads per process stall on each other's cores.
    threads=1,
    batch_candidates=(8, MAX_BATCH),
)


def swapless_on(info: DeviceInfo, threads: int | None) -> type[Swapless]:
    """``bench.systems.Swapless`` (``swapless worker --max-models 2 --warm-start``) on ``info``'s device, with
    forward passes of up to ``MAX_BATCH`` inputs (and ``threads`` torch threads, when given)."""

    class OnDevice(Swapless):
        env: ClassVar[Mapping[str, str]] = {
            "SWAPLESS_DEVICE": info.device,
            "SWAPLESS_MAX_BATCH_SIZE": str(MAX_BATCH),
            **({"OMP_NUM_THREADS": str(threads)} if threads else {}),
        }

    return OnDevice


_LOADED = re.compile(r"loaded (\S+) \((?:transformers|torchvision)\) in ([0-9.]+) s")


def run_limit(results: Results, models_file: Path, jobs: list[tuple[str, str]], stream: list[tuple[str, str]]) -> None:
    """The in-process baselines: the limit on the mixed ``jobs``, the limit on (the first ``STREAM_SAMPLE`` jobs of)
    the ``stream``, and the stream model's CPU per job at its best size."""
    from bench.scheduler import measure_limit

    cuda, device = results.info.cuda, results.info.device
    if cuda:
        import torch

        torch.cuda.reset_peak_memory_stats()
    candidates = results.plan.batch_candidates
    limit, best_sizes, _ = measure_limit(models_file, jobs, device=device, candidates=candidates)
    if cuda:
        results.limit_peak_bytes.append(int(torch.cuda.max_memory_allocated()))
    results.add("mixed", "limit", limit)
    for model_id, size in best_sizes.items():
        results.best_sizes.setdefault(model_id, []).append(size)
    model_id = stream[0][0]
    sample = stream[:STREAM_SAMPLE]
    _, stream_sizes, per_job = measure_limit(models_file, sample, device=device, candidates=candidates)
    results.add("stream", "limit", Run(1.0 / per_job[model_id], 0, 0.0, 0.0))
    results.compute_cpu_ms.append(
        compute_cpu_ms_per_job(models_file, results.info, model_id, [v for _, v in sample], stream_sizes[model_id])
    )


def run_worker(results: Results, models_file: Path, jobs: list[tuple[str, str]], stream: list[tuple[str, str]],
               rep: int, args: argparse.Namespace) -> None:
    """A fresh worker on the device: the mixed burst, then the stream on its warm model."""
    plan = results.plan
    system = swapless_on(results.info, plan.threads)(args.redis_url, models_file, f"gpu-{plan.name}-rep{rep}",
                                                     prefix=args.key_prefix + fresh_prefix("gpu"))
    with DeviceUse(results.info) as use:
        try:
            system.start()
            results.worker_start_s.append(system.start_s)
            results.add("mixed", "swapless", burst(system, jobs, timeout_s=args.timeout_s))
            system.get_one(*stream[0])  # loaded and warm: the stream is about the queue
            results.add("stream", "swapless", burst(system, stream, timeout_s=args.timeout_s))
        finally:
            system.stop()
    if use.peak_bytes is not None:
        results.worker_peak_bytes.append(use.peak_bytes)
    assert system.process is not None
    for model_id, seconds in _LOADED.findall(system.process.text()):
        results.worker_loads.setdefault(model_id, []).append(float(seconds))


def run(plan: Plan, info: DeviceInfo, args: argparse.Namespace) -> Results:
    """Every repetition of ``plan`` on ``info``'s device."""
    started = time.monotonic()
    results = Results(plan, info, budget_bytes=budget_in_effect())
    models_file = plan.build()
    print(f"models built in {time.monotonic() - started:.1f} s: {models_file}", flush=True)
    for rep in range(args.repeats or plan.repeats):
        print(f"repetition {rep + 1}/{args.repeats or plan.repeats} on {info.label}", flush=True)
        jobs = mixed_jobs(rep, plan.mixed_jobs, plan.model_ids, plan.image_ids)
        values = inputs_for(plan.stream_model, random.Random(rep), plan.stream_jobs, plan.image_ids)
        stream = [(plan.stream_model, value) for value in values]
        phase = time.monotonic()
        results.probes += probe_loads(models_file, info, seed=rep)
        results.tier_probes += probe_tiers(models_file, info)
        run_limit(results, models_file, jobs, stream)
        print(f"  in-process probes and limits: {time.monotonic() - phase:.1f} s", flush=True)
        phase = time.monotonic()
        run_worker(results, models_file, jobs, stream, rep, args)
        print(f"  worker: {time.monotonic() - phase:.1f} s (start-up {results.worker_start_s[-1]:.1f} s)", flush=True)
    results.wall_s = time.monotonic() - started
    return results


def default_output(quick: bool, info: DeviceInfo) -> Path:
    """``bench/GPU.md`` for a full run on CUDA only; a quick or CPU run writes under ``bench/out/`` (ignored by git),
    so that neither ever replaces the committed table."""
    if quick:
        return OUT / "GPU-quick.md"
    return REPO / "bench" / "GPU.md" if info.cuda else OUT / "GPU-cpu.md"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny models, one repetition, any device (CI)")
    parser.add_argument("--allow-cpu", action="store_true", help="run the full benchmark without CUDA")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--repeats", type=int, default=0, help="repetitions [default: 3, --quick 1]")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--key-prefix", default="", help="put every Redis key of the run under this prefix")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="most seconds one workload may take")
    parser.add_argument("--write", type=Path, default=None,
                        help="the table's file [default: bench/GPU.md on CUDA, else under bench/out/]")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns the exit status (2: a full run asked for without CUDA)."""
    args = parse_args(argv)
    try:
        info = device_info(args.device)
    except RuntimeError as err:
        print(f"bench.gpu: {err}", file=sys.stderr)
        return 2
    if not (info.cuda or args.quick or args.allow_cpu):
        why = "--device cpu" if args.device == "cpu" else "no CUDA device here: torch.cuda.is_available() is False"
        print(f"bench.gpu: the full run measures a GPU ({why}); run it on a GPU machine, or pass --quick (CI check) "
              "or --allow-cpu (the full run on this CPU)", file=sys.stderr)
        return 2
    plan = QUICK if args.quick else FULL
    if plan.threads:
        import torch

        torch.set_num_threads(plan.threads)
    results = run(plan, info, args)
    command = shlex.join(["python", "-m", "bench.gpu", *(sys.argv[1:] if argv is None else argv)])
    table = render(results, command, MAX_BATCH, STREAM_SAMPLE)
    print(table)
    output = args.write or default_output(args.quick, info)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(table)
    print(f"written to {output} ({results.wall_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
