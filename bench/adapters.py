"""Variants as adapters over one base, against the same variants as whole models: real models on this CPU.

    python -m bench.adapters                 # 3 repetitions, ~10 min on 2 cores; writes bench/ADAPTERS.md
    python -m bench.adapters --quick         # smaller streams, 1 repetition; bench/out/ADAPTERS-quick.md

The base is a BERT of bert-base size (12 layers, hidden 768, vocabulary 30,522: 110M parameters, random weights,
``swapless.manager.demo.tiny.build_text_classifier(preset="base")``); its variants are LoRA adapters of rank 8 on the
attention's query and value layers with their own classification head (``build_lora_adapters``: 1.2 MB each), built
once into ``bench/out/adapters/`` and kept. The same variants "as whole models": the base with the first adapter
merged into it (``merge_and_unload``), saved as a model of its own; the other whole variants are hard links to its
files (the same bytes to read per load; the page cache holds them either way after the first repetition).

1. **Swap-in against load** (in this process): ``TransformerWorker.load()`` of a whole variant (after one load to
   warm the page cache; the median of five), against bringing a variant into a loaded base's adapter slot (2 slots,
   filled first; twelve variants in turn, so each comes in after an eviction; the shapes as the start-up checks found
   them): from its file (first use; the page cache holds it, as it holds the whole variant's) and from host memory
   (the second round).
2. **Streams** (a real ``swapless worker --max-models 2 --no-warm-start`` per stream, ready and with its base loaded
   by one job first, of a variant for the variants' stream): one ``Client.submit_jobs`` of all the jobs, then waiting
   for every result; jobs/s from the call to the last result. Texts of 4-12 words. (a) every job on the base; (b) the
   same number of jobs spread evenly over 200 variants (shuffled); (c) one job each for 40 variants as whole models
   (every job a load, with 2 models cached): a short stream, since each of its jobs costs a full load.
3. **Registry** (the start-up checks read every adapter's header): a fresh ``swapless worker`` from spawn to
   "ready.", and ``swapless models``, with 10 and with 1,000 variants over the base, taken in turns (three starts and
   five listings of each per repetition, their medians); and, in this process, the registry's read with the start-up
   checks (``ModelStore.from_file`` and ``adapter_reserve``), the part of a start that grows with the variants.
4. **Simulated device** (``bench/simulated.py``: loads and passes *sleep*, as a GPU's work leaves the CPU free): a
   base loading in 0.8 s with passes of 5 ms + 0.2 ms per input (up to 64), its 200 variants (the adapters above; a
   swap-in sleeps 0.5 ms, in 256 slots: ``SWAPLESS_MAX_ADAPTERS``'s default), and 40 whole models of the same costs.
   Streams of 6,000 jobs on the base alone and spread over the 200 variants, and of 1,200 jobs spread over the 40
   whole models (2 cached).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from bench.common import OUT, REPO, cleanup, python, summary, target_lines, write_table
from bench.systems import Swapless, burst

ROOT = OUT / "adapters"
ADAPTERS = 1000
STREAM_VARIANTS = 200
WHOLE_VARIANTS = 40
LABELS = ["negative", "neutral", "positive"]
WORDS = ("the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "rug", "good", "bad", "film", "song", "very",
         "quite", "really", "not", "at", "all", "rather")


@dataclass(frozen=True)
class Sizes:
    stream_jobs: int
    whole_jobs: int
    sim_jobs: int
    sim_whole_jobs: int


FULL = Sizes(stream_jobs=960, whole_jobs=WHOLE_VARIANTS, sim_jobs=6000, sim_whole_jobs=1200)
QUICK = Sizes(stream_jobs=320, whole_jobs=8, sim_jobs=1500, sim_whole_jobs=300)
#: The simulated base's costs (``bench/simulated.py``), and its whole variants'.
SIM_COSTS = (0.8, 0.005, 0.0002)


def build(root: Path = ROOT) -> dict[str, Path]:
    """The base, its adapters and the whole variants under ``root`` (built once; kept between runs)."""
    from swapless.manager.demo.tiny import build_lora_adapters, build_text_classifier

    base = root / "base"
    if not (base / "model.safetensors").exists():
        build_text_classifier(base, preset="base", labels=LABELS, seed=0, vocab_size=30522)
    missing = [(root / "adapters" / f"a{k:04d}", 1000 + k) for k in range(ADAPTERS)
               if not (root / "adapters" / f"a{k:04d}" / "adapter_model.safetensors").exists()]
    if missing:
        print(f"building {len(missing)} adapters", flush=True)
        build_lora_adapters(base, missing, rank=8)
    whole = root / "whole" / "w0000"
    if not (whole / "model.safetensors").exists():
        merge(base, root / "adapters" / "a0000", whole)
    for k in range(1, WHOLE_VARIANTS):
        linked = root / "whole" / f"w{k:04d}"
        if not linked.exists():
            linked.mkdir(parents=True)
            for file in whole.iterdir():
                os.link(file, linked / file.name)
    return {"base": base, "adapters": root / "adapters", "whole": root / "whole"}


def merge(base: Path, adapter: Path, out: Path) -> None:
    """Save ``base`` with ``adapter`` merged into it, as a whole model with the base's tokenizer."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from swapless.manager.frameworks.adapter_checks import quiet_peft

    with quiet_peft():
        model = PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base), adapter)
    model.merge_and_unload().save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)


def models_file(paths: dict[str, Path], name: str, variants: int, whole: int = 0) -> Path:
    from swapless.manager.demo.tiny import write_models_file

    entries: list[dict[str, Any]] = [{"id": "base", "name": "bert-base-random", "type": "text",
                                      "framework": "transformers", "path": str(paths["base"]), "max_batch_size": 64}]
    entries += [{"id": f"v{k:04d}", "base": "base", "adapter": str(paths["adapters"] / f"a{k:04d}")}
                for k in range(variants)]
    entries += [{"id": f"w{k:04d}", "name": "bert-base-variant", "type": "text", "framework": "transformers",
                 "path": str(paths["whole"] / f"w{k:04d}"), "max_batch_size": 64} for k in range(whole)]
    directory = ROOT / "files" / name
    directory.mkdir(parents=True, exist_ok=True)
    return write_models_file(directory, entries)


def sim_models_file(paths: dict[str, Path]) -> Path:
    """The simulated device's models: ``sim``, its 200 variants (the real adapters' files: only their headers are
    read) and 40 whole models of the same costs."""
    from bench.simulated import simulated_entry
    from swapless.manager.demo.tiny import write_models_file

    entries = [simulated_entry("sim", *SIM_COSTS)]
    entries += [{"id": f"v{k:04d}", "base": "sim", "adapter": str(paths["adapters"] / f"a{k:04d}")}
                for k in range(STREAM_VARIANTS)]
    entries += [simulated_entry(f"w{k:04d}", *SIM_COSTS) for k in range(WHOLE_VARIANTS)]
    directory = ROOT / "files" / "simulated"
    directory.mkdir(parents=True, exist_ok=True)
    return write_models_file(directory, entries)


def texts(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) for _ in range(n)]


def swap_rows(paths: dict[str, Path]) -> dict[str, float]:
    """Seconds of a whole variant's load; of a variant's swap-in from its file and from host memory."""
    from swapless.manager import ModelStore, WorkerLimits
    from swapless.manager.frameworks.transformers_worker import TransformerWorker

    store = ModelStore.from_file(models_file(paths, "swap", variants=16, whole=3))
    loads = []
    for model_id in ("w0000", "w0001", "w0002", "w0000", "w0001", "w0002"):  # the first warms the page cache
        worker = TransformerWorker(store.get(model_id), WorkerLimits(device="cpu"))
        started = time.perf_counter()
        worker.load()
        loads.append(time.perf_counter() - started)
        worker.unload()
    from swapless.manager.frameworks.adapter_checks import adapter_reserve

    shapes = adapter_reserve(store, 2)[1]  # as a worker's start-up checks find them
    base = TransformerWorker(store.get("base"), WorkerLimits(device="cpu", max_adapters=2, adapter_shapes=shapes))
    base.load()
    pool = base.adapters
    assert pool is not None
    for k in (15, 0):  # fills the two slots first
        with pool.rows([store.get(f"v{k:04d}")]):
            pass
    from_file, from_host = [], []
    for round_ in range(2):
        for k in range(1, 13):  # two slots, twelve variants: each comes in after an eviction
            variant = store.get(f"v{k:04d}")
            started = time.perf_counter()
            with pool.rows([variant]):
                pass
            (from_file if round_ == 0 else from_host).append(time.perf_counter() - started)
    base.unload()
    return {"whole load": statistics.median(loads[1:]), "from file": statistics.median(from_file),
            "from host": statistics.median(from_host)}


class AdapterWorker(Swapless):
    name = "swapless adapters"
    flags: tuple[str, ...] = ("--no-warm-start",)
    env: ClassVar[dict[str, str]] = {}  # type: ignore[misc]


class SimulatedAdapterWorker(AdapterWorker):
    name = "swapless adapters (sim device)"
    env: ClassVar[dict[str, str]] = {"SWAPLESS_PLUGINS": "bench.simulated", "PYTHONPATH": str(REPO)}  # type: ignore[misc]


def stream(models: Path, jobs: list[tuple[str, str]], warm: list[str], tag: str,
           kind: type[AdapterWorker] = AdapterWorker) -> float:
    """Jobs/s of ``jobs`` sent by one ``submit_jobs`` to a fresh worker that ran one job of each of ``warm`` first
    (its base loaded, and for variants its adapter slots built)."""
    system = kind("redis://127.0.0.1:6379/13", models, tag)
    try:
        system.start()
        system.client.gather(system.client.submit_jobs([(m, "warm up") for m in warm]), timeout=600)
        run = burst(system, jobs, 900)
        return run.jobs_per_s
    finally:
        system.stop()
        cleanup(system.redis, system.prefix)


def start_s(models: Path, tag: str) -> float:
    """Seconds from spawn to "ready." of a fresh worker on ``models``."""
    system = AdapterWorker("redis://127.0.0.1:6379/13", models, tag)
    try:
        system.start()
        return system.start_s
    finally:
        system.stop()
        cleanup(system.redis, system.prefix)


def listing_s(models: Path, variants: int) -> float:
    """Seconds of ``swapless models`` on ``models``."""
    env = {**os.environ, "SWAPLESS_MODELS_FILE": str(models), "SWAPLESS_REDIS_URL": "redis://127.0.0.1:6379/13"}
    started = time.perf_counter()
    listed = subprocess.run([python(), "-m", "swapless", "models"], env=env, cwd=REPO, capture_output=True,
                            text=True, check=True, timeout=120)
    elapsed = time.perf_counter() - started
    assert f"v{variants - 1:04d}" in listed.stdout, listed.stdout[-500:]
    return elapsed


def registry_s(models: Path) -> float:
    """Seconds of the registry's read and the start-up checks of its variants, in this process."""
    from swapless.manager import ModelStore
    from swapless.manager.frameworks.adapter_checks import adapter_reserve

    started = time.perf_counter()
    adapter_reserve(ModelStore.from_file(models), 256)
    return time.perf_counter() - started


def registry_rows(paths: dict[str, Path], sizes: tuple[int, int] = (10, ADAPTERS)) -> dict[str, float]:
    """Medians of the start-up, the listing and the registry's read with each number of variants, in turns."""
    files = {n: models_file(paths, f"registry-{n}", variants=n) for n in sizes}
    starts: dict[int, list[float]] = {n: [] for n in sizes}
    listings: dict[int, list[float]] = {n: [] for n in sizes}
    reads: dict[int, list[float]] = {n: [] for n in sizes}
    for turn in range(5):
        for n in sizes:
            if turn < 3:
                starts[n].append(start_s(files[n], f"registry-{n}"))
            listings[n].append(listing_s(files[n], n))
            reads[n].append(registry_s(files[n]))
    found = {}
    for n in sizes:
        found[f"start {n}"] = statistics.median(starts[n])
        found[f"models {n}"] = statistics.median(listings[n])
        found[f"read {n}"] = statistics.median(reads[n])
    return found


TARGETS = [
    ("swap-in from file vs whole load (× faster)", 50.0, False),
    ("200 adapters vs base alone (jobs/s ratio)", 0.8, False),
    ("sim: 200 adapters vs base alone (jobs/s ratio)", 0.8, False),
    ("start-up, 1,000 vs 10 variants (ratio)", 1.1, True),
    ("swapless models, 1,000 vs 10 variants (ratio)", 1.1, True),
]


Add = Callable[[str, float], None]


def _swap_rows(add: Add, paths: dict[str, Path]) -> None:
    swap = swap_rows(paths)
    add("whole variant: load (ms)", swap["whole load"] * 1000)
    add("adapter swap-in from its file (ms)", swap["from file"] * 1000)
    add("adapter swap-in from host memory (ms)", swap["from host"] * 1000)
    add("swap-in from file vs whole load (× faster)", swap["whole load"] / swap["from file"])


def _stream_rows(add: Add, stream_models: Path, sizes: Sizes, rng: random.Random, rep: int) -> None:
    inputs = texts(rng, sizes.stream_jobs)
    alone = stream(stream_models, [("base", t) for t in inputs], ["base"], f"base-{rep}")
    owners = [f"v{k % STREAM_VARIANTS:04d}" for k in range(sizes.stream_jobs)]
    rng.shuffle(owners)
    spread = stream(stream_models, list(zip(owners, inputs, strict=True)), ["v0000"], f"spread-{rep}")
    whole = stream(stream_models, [(f"w{k:04d}", inputs[k]) for k in range(sizes.whole_jobs)], ["base"],
                   f"whole-{rep}")
    add("stream, base alone (jobs/s)", alone)
    add(f"stream over {STREAM_VARIANTS} adapters (jobs/s)", spread)
    add("200 adapters vs base alone (jobs/s ratio)", spread / alone)
    add(f"stream over {sizes.whole_jobs} whole variants, one job each (jobs/s)", whole)


def _sim_rows(add: Add, paths: dict[str, Path], sizes: Sizes, rng: random.Random, rep: int) -> None:
    sim_models = sim_models_file(paths)
    sim_inputs = texts(rng, sizes.sim_jobs)
    sim_owners = [f"v{k % STREAM_VARIANTS:04d}" for k in range(sizes.sim_jobs)]
    rng.shuffle(sim_owners)
    sim_alone = stream(sim_models, [("sim", t) for t in sim_inputs], ["sim"], f"sim-base-{rep}",
                       SimulatedAdapterWorker)
    sim_spread = stream(sim_models, list(zip(sim_owners, sim_inputs, strict=True)), ["v0000"],
                        f"sim-spread-{rep}", SimulatedAdapterWorker)
    sim_whole = stream(sim_models, [(f"w{k % WHOLE_VARIANTS:04d}", sim_inputs[k])
                                    for k in range(sizes.sim_whole_jobs)], ["sim"], f"sim-whole-{rep}",
                       SimulatedAdapterWorker)
    add("sim: stream, base alone (jobs/s)", sim_alone)
    add(f"sim: stream over {STREAM_VARIANTS} adapters (jobs/s)", sim_spread)
    add("sim: 200 adapters vs base alone (jobs/s ratio)", sim_spread / sim_alone)
    add(f"sim: stream over {WHOLE_VARIANTS} whole variants (jobs/s)", sim_whole)


def _registry_rows(add: Add, paths: dict[str, Path]) -> None:
    registry = registry_rows(paths)
    add("registry read and start-up checks, 10 variants (ms)", registry["read 10"] * 1000)
    add("registry read and start-up checks, 1,000 variants (ms)", registry[f"read {ADAPTERS}"] * 1000)
    add("start-up to ready, 10 variants (s)", registry["start 10"])
    add("start-up to ready, 1,000 variants (s)", registry[f"start {ADAPTERS}"])
    add("start-up, 1,000 vs 10 variants (ratio)", registry[f"start {ADAPTERS}"] / registry["start 10"])
    add("swapless models, 10 variants (s)", registry["models 10"])
    add("swapless models, 1,000 variants (s)", registry[f"models {ADAPTERS}"])
    add("swapless models, 1,000 vs 10 variants (ratio)", registry[f"models {ADAPTERS}"] / registry["models 10"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=None, help="default 3, --quick 1")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    repeats = args.repeats or (1 if args.quick else 3)
    write = args.write or (OUT / "ADAPTERS-quick.md" if args.quick else REPO / "bench" / "ADAPTERS.md")
    paths = build()
    stream_models = models_file(paths, "stream", variants=STREAM_VARIANTS, whole=WHOLE_VARIANTS)
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)
        print(f"  {name}: {value:.4g}", flush=True)

    for rep in range(repeats):
        print(f"repetition {rep + 1}/{repeats}", flush=True)
        _swap_rows(add, paths)
        rng = random.Random(rep)
        _stream_rows(add, stream_models, sizes, rng, rep)
        _sim_rows(add, paths, sizes, rng, rep)
        _registry_rows(add, paths)

    write_table(write, render(rows, args, sizes, repeats), NOTES)


NOTES = "## Notes"


def render(rows: dict[str, list[float]], args: argparse.Namespace, sizes: Sizes, repeats: int) -> str:
    command = "python -m bench.adapters" + (" --quick" if args.quick else "")
    lines = [
        "# Adapters benchmark",
        "",
        (f"Command: `{command}` on this machine (CPU only, 2 cores, shared); {repeats} repetition(s), median "
         f"[min–max]. Real models on the CPU, none simulated: a bert-base-size base (110M parameters, random "
         f"weights) and rank-8 LoRA adapters with their own heads; streams of {sizes.stream_jobs} jobs through a "
         "real `swapless worker --max-models 2 --no-warm-start`, except the rows marked **sim**, on the simulated "
         "device (`bench/simulated.py`: loads and passes sleep); see `bench/adapters.py` for each row."),
        "",
        "| measurement | median [min–max] |",
        "|---|---|",
    ]
    lines += [f"| {name} | {summary(values)} |" for name, values in rows.items()]
    return "\n".join([*lines, "", *target_lines(rows, TARGETS)]) + "\n"


if __name__ == "__main__":
    main()
