"""What ``bench/gpu.py`` runs (``Plan``), what it measured (``Results``), and its tables: throughput against the
limit, per-model loads and memory, the memory budget.

Every row names the device it was measured on; a figure a CPU run cannot give reads "n/a (no CUDA)".
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import OUT, build_models, summary
from bench.gpu_probe import UNLOAD_TOLERANCE_BYTES, DeviceInfo, LoadProbe, TierProbe
from bench.scheduler import BATCH_CANDIDATES
from bench.systems import Run

__all__ = ["Plan", "Results", "render"]

NO_CUDA = "n/a (no CUDA)"
MB = 1024 * 1024
GIB = 1024**3


@dataclass(frozen=True)
class Plan:
    """What one mode runs: its models, its jobs and its repetitions."""

    name: str
    text_models: tuple[tuple[str, str, str], ...]
    image_models: tuple[tuple[str, str], ...]
    mixed_jobs: int
    stream_model: str
    stream_jobs: int
    repeats: int
    #: torch threads of the benchmark's process and of the worker (None: torch's default, one per core)
    threads: int | None = None
    #: the batch sizes the in-process limit tries per model
    batch_candidates: tuple[int, ...] = BATCH_CANDIDATES

    @property
    def model_ids(self) -> list[str]:
        return [m[0] for m in self.text_models] + [m[0] for m in self.image_models]

    @property
    def image_ids(self) -> set[str]:
        return {m[0] for m in self.image_models}

    def architecture(self, model_id: str) -> str:
        found = {m[0]: f"{m[1]} ({m[2]})" for m in self.text_models} | {m[0]: m[1] for m in self.image_models}
        return found[model_id]

    def build(self) -> Path:
        """Build this plan's models once and return their models.json; the directory,
        ``bench/out/gpu-models-<name>-<hash of the model list>``, changes when the list does."""
        digest = hashlib.sha256(repr((self.text_models, self.image_models)).encode()).hexdigest()[:8]
        return build_models(OUT / f"gpu-models-{self.name}-{digest}", self.text_models, self.image_models)


@dataclass
class Results:
    """Every measurement of a run, per repetition."""

    plan: Plan
    info: DeviceInfo
    #: (workload, system) -> runs; systems ``swapless`` and ``limit``
    runs: dict[tuple[str, str], list[Run]] = field(default_factory=dict)
    probes: list[LoadProbe] = field(default_factory=list)
    tier_probes: list[TierProbe] = field(default_factory=list)
    #: model -> the worker's load times (its log), warm start included
    worker_loads: dict[str, list[float]] = field(default_factory=dict)
    compute_cpu_ms: list[float] = field(default_factory=list)
    worker_peak_bytes: list[int] = field(default_factory=list)
    limit_peak_bytes: list[int] = field(default_factory=list)
    worker_start_s: list[float] = field(default_factory=list)
    best_sizes: dict[str, list[int]] = field(default_factory=dict)
    budget_bytes: int | None = None
    wall_s: float = 0.0

    def add(self, workload: str, system: str, run: Run) -> None:
        self.runs.setdefault((workload, system), []).append(run)
        cpu = run.extra.get("cpu_ms_per_job")
        print(f"  {workload:>7} {system:>9} on {self.info.label}: {run.jobs_per_s:9.1f} jobs/s, {run.loads:3d} loads"
              + (f", worker CPU {cpu:.3f} ms/job" if cpu is not None else ""), flush=True)


def _gib(value: int | None) -> str:
    return NO_CUDA if value is None else f"{value / GIB:.2f} GiB"


def _mb(values: Sequence[int | None]) -> str:
    known = [v / MB for v in values if v is not None]
    return summary(known) if known else NO_CUDA


def _ratio(top: Sequence[float], bottom: Sequence[float]) -> str:
    if not top or not bottom:
        return ""
    return f"{statistics.median(top) / statistics.median(bottom):.2f}"


def _throughput(results: Results) -> list[str]:
    plan, dev = results.plan, results.info.label

    def jobs_per_s(workload: str, system: str) -> list[float]:
        return [r.jobs_per_s for r in results.runs.get((workload, system), [])]

    def worker(workload: str, key: str) -> list[float]:
        return [r.extra[key] for r in results.runs.get((workload, "swapless"), [])]

    mixed, mixed_limit = jobs_per_s("mixed", "swapless"), jobs_per_s("mixed", "limit")
    stream, stream_limit = jobs_per_s("stream", "swapless"), jobs_per_s("stream", "limit")
    loads = [float(r.loads) for r in results.runs.get(("mixed", "swapless"), [])]
    cpu_mixed, cpu_stream = worker("mixed", "cpu_ms_per_job"), worker("stream", "cpu_ms_per_job")
    n_models = len(plan.model_ids)
    rows = [
        ("mixed burst: jobs/s", f"{plan.mixed_jobs} jobs over {n_models} models at once, cache of 2",
         summary(mixed), f"limit {summary(mixed_limit)}", _ratio(mixed, mixed_limit)),
        ("mixed burst: model loads", "the worker's loads during the burst", summary(loads),
         f"limit {n_models} (one per model)", ""),
        ("single-model stream: jobs/s", f"{plan.stream_jobs} jobs of {plan.stream_model}, loaded and warm",
         summary(stream), f"limit {summary(stream_limit)}", _ratio(stream, stream_limit)),
        ("worker CPU per job, mixed burst (ms)", "all the worker's threads, /proc", summary(cpu_mixed), "", ""),
        ("worker CPU per job, single-model stream (ms)", "all the worker's threads, /proc", summary(cpu_stream),
         f"in-process passes {summary(results.compute_cpu_ms)}", _ratio(cpu_stream, results.compute_cpu_ms)),
    ]
    lines = ["| measurement | what | device | swapless worker | baseline (this run, this device) | ratio |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {name} | {what} | {dev} | {value} | {base} | {ratio} |" for name, what, value, base, ratio in rows]
    return lines


def _back(probes: Sequence[LoadProbe]) -> str:
    left = [p.left_bytes for p in probes if p.left_bytes is not None]
    if not left:
        return NO_CUDA
    worst = max(left)
    verdict = "yes" if worst <= UNLOAD_TOLERANCE_BYTES else "NO"
    return f"{verdict} (worst {worst / MB:+.1f} MB)"


def _per_model(results: Results) -> list[str]:
    dev = results.info.label
    lines = [("| model | architecture | device | size MB | load s (in-process) | load s (worker) | allocated before MB "
              "| after load MB | after unload MB | back within 64 MB |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for model_id in results.plan.model_ids:
        probes = [p for p in results.probes if p.model_id == model_id]
        worker = results.worker_loads.get(model_id, [])
        lines.append(
            f"| {model_id} | {results.plan.architecture(model_id)} | {dev} | "
            f"{summary([p.size_bytes / MB for p in probes])} | {summary([p.load_s for p in probes])} | "
            f"{summary(worker) if worker else ''} | {_mb([p.before for p in probes])} | "
            f"{_mb([p.after_load for p in probes])} | {_mb([p.after_unload for p in probes])} | {_back(probes)} |"
        )
    return lines


def _memory(results: Results) -> list[str]:
    info, dev = results.info, results.info.label
    budget = results.budget_bytes
    worker_peak = max(results.worker_peak_bytes) if results.worker_peak_bytes else None
    limit_peak = max(results.limit_peak_bytes) if results.limit_peak_bytes else None
    if budget is None:
        budget_text = (
            "none: `SWAPLESS_MEMORY_BUDGET_BYTES` unset is no byte limit; the cache is bounded by `--max-models` alone"
        )
        against, against_name = info.total_bytes, "no budget: total device memory − worker peak"
    else:
        budget_text = f"{budget / GIB:.2f} GiB (`SWAPLESS_MEMORY_BUDGET_BYTES`)"
        against, against_name = budget, "budget − worker peak"
    headroom = None if against is None or worker_peak is None else against - worker_peak
    rows = [
        ("total device memory", _gib(info.total_bytes)),
        ("memory budget in effect for a worker started with no `--memory-budget`", budget_text),
        ("peak device memory of the worker (above what was in use before it started; its CUDA context included)",
         _gib(worker_peak)),
        ("peak allocated in-process during the limit (`torch.cuda.max_memory_allocated`)", _gib(limit_peak)),
        (f"headroom ({against_name})", _gib(headroom)),
    ]
    return ["| figure | device | value |", "|---|---|---|"] + [f"| {name} | {dev} | {value} |" for name, value in rows]


def _tiers(results: Results) -> list[str]:
    """Per model: a swap-in from disk, from the host tier, and a hit, and the device memory after the moves."""
    dev = results.info.label
    lines = [("| model | device | from disk s | from host memory s | resident (hit) s | move to host s | allocated "
              "after load MB | after the move to host MB | after the swap-in MB | host tier gives the device back |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model_id in results.plan.model_ids:
        probes = [p for p in results.tier_probes if p.model_id == model_id]
        if not probes:
            continue
        back = [p.after_to_host - p.before for p in probes if p.after_to_host is not None and p.before is not None]
        verdict = NO_CUDA if not back else (
            f"{'yes' if max(back) <= UNLOAD_TOLERANCE_BYTES else 'NO'} (worst {max(back) / MB:+.1f} MB)")
        lines.append(
            f"| {model_id} | {dev} | {summary([p.disk_s for p in probes])} | {summary([p.host_s for p in probes])} | "
            f"{summary([p.resident_s for p in probes])} | {summary([p.to_host_s for p in probes])} | "
            f"{_mb([p.after_load for p in probes])} | {_mb([p.after_to_host for p in probes])} | "
            f"{_mb([p.after_swap_in for p in probes])} | {verdict} |"
        )
    return lines


def render(results: Results, command: str, max_batch: int, stream_sample: int) -> str:
    """The whole Markdown report of one run.

    Args:
        results: the run's measurements.
        command: the command line that made them.
        max_batch: the largest forward pass, of the worker and of the limit.
        stream_sample: jobs of the stream its limit was measured on.
    """
    plan, info = results.plan, results.info
    repeats = len(results.runs.get(("mixed", "limit"), []))
    sizes = ", ".join(
        f"{model_id} {summary([float(s) for s in found])}" for model_id, found in results.best_sizes.items()
    )
    models = ", ".join(f"{model_id} ({plan.architecture(model_id)})" for model_id in plan.model_ids)
    lines = [
        "# GPU benchmark",
        "",
        f"Measured on **{info.label}**"
        + (f", {info.total_bytes / GIB:.1f} GiB" if info.total_bytes else "")
        + f". Command: `{command}`; {repeats} repetition{'s' if repeats != 1 else ''}, median [min–max]; "
        f"{results.wall_s:.0f} s in all.",
        "",
        f"Models (real architectures, random weights, real sizes, built offline by `manager/demo/tiny.py`): {models}. "
        f"Swapless is a real `swapless worker --warm-start --max-models 2` process on the device, forward passes up "
        f"to {max_batch} inputs (start-up {summary(results.worker_start_s)} s, not counted)"
        + (f"; {plan.threads} torch thread(s) in the worker and in the benchmark's process" if plan.threads else "")
        + ". The limit is measured in "
        f"the benchmark's own process on the same device (`bench.scheduler.measure_limit`): one load per model plus "
        f"its jobs at its best batch size (best of two passes at each of the sizes "
        f"{', '.join(map(str, plan.batch_candidates))}, then the median of three "
        f"at that size); the stream's on its first {min(plan.stream_jobs, stream_sample)} jobs. "
        f"The in-process CPU per job is the stream model's forward passes over those jobs at its best size, inputs "
        f"prepared as a worker does.",
        "",
        *_throughput(results),
        "",
        (
            "Loads and memory per model, in the benchmark's process: its load from its saved files (already in the "
            "page cache: written by the build or read by an earlier repetition), one forward pass of 8 inputs, its "
            "unload; `torch.cuda.memory_allocated()` before the load, after it and after the unload. "
            "`load s (worker)`: the worker's own loads (warm start and burst), from its log."
        ),
        "",
        *_per_model(results),
        "",
        *_memory(results),
        "",
        (
            "The cache's tiers, per model, through a `ModelManager` of one model with a host tier "
            "(`swapless.manager.cache.host`): a `use` with the model only on disk (a load), a `use` while it is "
            "resident (a hit), its eviction into host memory (pinned on CUDA), and a `use` from there (a copy back); "
            "`torch.cuda.memory_allocated()` after each step."
        ),
        "",
        *_tiers(results),
        "",
        f"Best batch sizes in-process: {sizes}.",
    ]
    return "\n".join(lines) + "\n"
