"""Shared pieces of the benchmarks: the six benchmark models, workloads, worker processes, result timing."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"

#: (id, arch, preset) of the text models; plus mobilenet_v2. Random weights, real architectures and sizes.
TEXT_MODELS = [
    ("tiny-a", "bert", "tiny"),
    ("tiny-b", "bert", "tiny"),
    ("tiny-c", "bert", "tiny"),
    ("mini", "bert", "mini"),
    ("distil", "distilbert", "distilbert"),
]
IMAGE_MODEL = "vision"
MODEL_IDS = [m[0] for m in TEXT_MODELS] + [IMAGE_MODEL]


def build_models(
    directory: Path = OUT / "models",
    text_models: Sequence[tuple[str, str, str]] = TEXT_MODELS,
    image_models: Sequence[tuple[str, str]] = ((IMAGE_MODEL, "mobilenet_v2"),),
) -> Path:
    """Build benchmark models once (offline, random weights) and return their models.json.

    Args:
        directory: where the models and their ``models.json`` go; a directory that has a ``models.json`` already is
            taken as built.
        text_models: ``(id, arch, preset)`` of the text classifiers
        (``swapless.manager.demo.tiny.build_text_classifier``). image_models: ``(id, torchvision builder)`` of the image
        classifiers (``build_image_classifier``).

    Returns:
        The path of ``directory/models.json``. The defaults are the six models of ``bench.scheduler``.
    """
    from swapless.manager.demo.tiny import (
        build_image_classifier,
        build_text_classifier,
        write_models_file,
    )

    models_file = directory / "models.json"
    if models_file.exists():
        return models_file
    entries = []
    for seed, (model_id, arch, preset) in enumerate(text_models):
        vocab = 30522  # the real bert/distilbert vocabulary size, so the sizes are the real ones
        build_text_classifier(
            directory / model_id, arch=arch, preset=preset, labels=["neg", "pos"], seed=seed, vocab_size=vocab
        )
        entries.append(
            {"id": model_id, "name": model_id, "type": "text", "framework": "transformers", "path": model_id}
        )
    for model_id, builder in image_models:
        weights = build_image_classifier(directory / model_id, arch=builder)
        entries.append(
            {
                "id": model_id,
                "name": builder,
                "type": "image",
                "framework": "torchvision",
                "path": str(weights.relative_to(directory)),
            }
        )
    return write_models_file(directory, entries)


def text_inputs(rng: random.Random, n: int) -> list[str]:
    from swapless.manager.demo.tiny import vocabulary

    words = [w for w in vocabulary(3000) if w.isalpha()]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) for _ in range(n)]


def image_inputs(n: int) -> list[str]:
    from swapless.manager.demo.tiny import encode_image

    pool = [encode_image(seed, size=(96, 72)) for seed in range(16)]
    return [pool[i % len(pool)] for i in range(n)]


def inputs_for(model_id: str, rng: random.Random, n: int, image_models: Collection[str] = (IMAGE_MODEL,)) -> list[str]:
    """``n`` inputs for ``model_id``: base64 images for the ids in ``image_models``, else sentences."""
    return image_inputs(n) if model_id in image_models else text_inputs(rng, n)


def mixed_jobs(
    seed: int, n: int = 600, models: Sequence[str] = MODEL_IDS, image_models: Collection[str] = (IMAGE_MODEL,)
) -> list[tuple[str, str]]:
    """``n`` jobs spread evenly over ``models`` (by default the six of ``bench.scheduler``), in random order."""
    rng = random.Random(seed)
    per_model = n // len(models)
    jobs = [(model_id, value) for model_id in models for value in inputs_for(model_id, rng, per_model, image_models)]
    rng.shuffle(jobs)
    return jobs


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: Sequence[float]) -> str:
    """``median [min–max]`` of repeated measurements."""
    if len(values) == 1:
        return f"{values[0]:.4g}"
    return f"{statistics.median(values):.4g} [{min(values):.4g}–{max(values):.4g}]"


def write_table(path: Path, table: str, notes: str) -> None:
    """Print ``table`` and write it to ``path``, keeping what ``path`` held under the heading ``notes`` (the
    hand-written notes a new run must not lose)."""
    print(table)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = path.read_text().partition(notes)[2] if path.exists() else ""
    path.write_text(table + (f"\n{notes}{kept}" if kept else ""))
    print(f"written to {path}")


def target_lines(rows: dict[str, list[float]], targets: Sequence[tuple[str, float, bool]]) -> list[str]:
    """"Targets (medians):" and one line per ``(row, goal, at most?)`` measured: its median, met or not."""
    lines = ["Targets (medians):", ""]
    for name, goal, at_most in targets:
        measured = rows.get(name)
        if not measured:
            continue
        value = statistics.median(measured)
        verdict = "met" if (value <= goal if at_most else value >= goal) else "NOT met"
        lines.append(f"- {name}: {value:.3g} ({verdict}; target {'≤' if at_most else '≥'} {goal:g})")
    return lines


@dataclass
class Collected:
    done_wall: dict[str, float]
    states: dict[str, str]


def collect(
    client: redis.Redis, key_prefix: str, job_ids: Sequence[str], timeout_s: float, poll_s: float = 0.1
) -> Collected:
    """Wait for Celery results (any Celery app) and read each one's ``date_done`` as a wall-clock time."""
    deadline = time.monotonic() + timeout_s
    done: dict[str, float] = {}
    states: dict[str, str] = {}
    pending = list(job_ids)
    while pending and time.monotonic() < deadline:
        keys = [f"{key_prefix}celery-task-meta-{job_id}" for job_id in pending]
        still = []
        for start in range(0, len(keys), 2000):
            for job_id, raw in zip(pending[start : start + 2000], client.mget(keys[start : start + 2000]), strict=True):
                if raw is None:
                    still.append(job_id)
                    continue
                meta = json.loads(raw)
                states[job_id] = meta["status"]
                done[job_id] = datetime.fromisoformat(meta["date_done"]).timestamp()
        pending = still
        if pending:
            time.sleep(poll_s)  # slow by default: date_done is stamped by the worker; polling must not steal CPU
    if pending:
        raise TimeoutError(f"{len(pending)} of {len(job_ids)} jobs had no result after {timeout_s} s")
    return Collected(done, states)


class Process:
    """A worker process with its log in a file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, marker: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while marker not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.proc.args} did not start:\n{self.text()[-3000:]}")
            time.sleep(0.05)

    def wait_http(self, http: Any, timeout_s: float = 60) -> None:
        """Wait until the process (a gateway) answers ``GET /healthz`` 200 through ``http`` (an ``httpx.Client``)."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if http.get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start:\n{self.text()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


def fresh_prefix(name: str) -> str:
    return f"bench-{name}-{uuid.uuid4().hex[:8]}:"


def cleanup(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}*", count=5000))
    for start in range(0, len(keys), 5000):
        client.delete(*keys[start : start + 5000])


def python() -> str:
    return sys.executable


def to_json(value: Any) -> str:
    return json.dumps(value)
