"""Warm start: pay each local model's one-off costs before the first job, and seed its batch-size tuner.

With ``SWAPLESS_WARM_START`` the worker, once ready and while no job has come, loads each local model in turn
through the cache, runs a synthetic input at each candidate batch size (the first pass pays the one-off costs of
kernels, allocators and lazy imports; the second is timed and seeds the tuner), and unloads it. A job waits for one
model's warm-up at most. Models kept loaded by their spec are loaded before the worker is ready (``load_kept``).
"""

from __future__ import annotations

import base64
import io
import logging
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from swapless.config.errors import SwaplessError
from swapless.manager.cache.lru import ModelManager
from swapless.manager.frameworks.engine import ModelEngine
from swapless.manager.registry.specs import InputType, ModelSpec

__all__ = ["load_kept", "warm_input", "warm_steps"]

logger = logging.getLogger(__name__)

#: A short sentence (about a dozen tokens): text shapes vary with the inputs anyway.
WARM_TEXT = "a short ordinary sentence that stands for the inputs sent later"


def warm_input(spec: ModelSpec) -> str:
    """A raw input of the kind ``spec`` takes: a sentence, or a base64 PNG of 224x224 noise."""
    if spec.type is InputType.TEXT:
        return WARM_TEXT
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 256, size=(224, 224, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


class _Fixed:
    """Stands in for the tuner during a warm-up pass: every forward pass has exactly ``size`` inputs."""

    def __init__(self, size: int) -> None:
        self.size = size

    def next_size(self) -> int:
        return self.size

    def record(self, size: int, items: int, seconds: float) -> None:
        pass


def warm_steps(
    manager: ModelManager,
    engine: ModelEngine,
    give_up_after: float = 1.5,
    budget_s: float = 3.0,
    *,
    total_budget_s: float | None = None,
    order: Sequence[str] = (),
    tuned: Collection[str] = (),
    skip: Collection[str] = (),
    keep: Callable[[str], bool] = lambda model_id: False,
) -> Iterator[tuple[str, float]]:
    """Warm the local models of ``manager``'s registry one at a time, yielding ``(model id, seconds)`` after each.

    Args:
        manager: the worker's cache.
        engine: the factory behind ``manager`` (its tuners are seeded).
        give_up_after: stop trying larger batch sizes once the cost per input is this many times the best so far.
        budget_s: stop trying larger batch sizes of a model after this long.
        total_budget_s: warm no more models after this long (None: no bound).
        order: models to warm first; then the rest, in registry order.
        tuned: models with earlier measurements: one pass at their best batch size.
        skip: models not to warm.
        keep: whether to leave a model loaded once warmed.
    """
    took = 0
    began = time.perf_counter()
    ids = [m for m in dict.fromkeys([*[m for m in order if m in manager.store.ids()], *manager.store.ids()])
           if m not in skip]
    ids.sort(key=lambda m: manager.store.get(m).keep_loaded)  # kept models last: they stay loaded after
    for model_id in ids:
        spec = manager.store.get(model_id)
        if total_budget_s is not None and time.perf_counter() - began >= total_budget_s:
            logger.info("warm start budget of %.0f s spent; %d model(s) left to warm on their first jobs",
                        total_budget_s, len(ids) - took)
            return
        probe = engine.build(spec)
        if probe.remote:
            continue
        started = time.perf_counter()
        try:
            with manager.use(spec.id) as worker:
                if spec.id in tuned and worker.tuner is not None and worker.tuner.cost_s:
                    _warm_at(worker, spec, worker.tuner.best())
                else:
                    _warm(worker, spec, give_up_after, started + budget_s)
        except SwaplessError as err:
            logger.warning("warm start of %s skipped: %s", spec.id, err)
            continue
        finally:
            if not spec.keep_loaded and not keep(spec.id):
                manager.evict(spec.id)
        seconds = time.perf_counter() - started
        took += 1
        tuner = engine.tuner(spec.id)
        costs = ", ".join(
            f"{size}: {cost * 1000:.1f} ms" for size, cost in sorted((tuner.cost_s if tuner else {}).items())
        )
        logger.info("warmed %s in %.2f s (per input at batch size %s)", spec.id, seconds, costs or "-")
        yield spec.id, seconds


def load_kept(manager: ModelManager, skip: Collection[str] = ()) -> list[str]:
    """Load the models kept loaded by their spec and not loaded yet, as many as the cache's limits hold; returns
    those loaded now. A failed load is logged and skipped.
    """
    limits = {False: manager.max_models, True: manager.remote_max_models}
    loaded: list[str] = []
    for spec in manager.store:
        if not spec.keep_loaded or spec.id in skip or manager.is_loaded(spec.id):
            continue
        remote = manager.factory(spec).remote
        kept = [e for e in manager.snapshot() if e.worker.spec.keep_loaded]
        if sum(1 for e in kept if e.remote == remote) >= limits[remote]:
            logger.warning("%s is kept loaded by its spec but the cache already holds %d kept model(s), its limit; it "
                           "loads on its first job (raise %s)", spec.id, limits[remote],
                           "SWAPLESS_TRITON_MAX_MODELS" if remote else "SWAPLESS_MAX_MODELS")
            continue
        others = [e.model_id for e in kept]
        try:
            with manager.use(spec.id, dict.fromkeys(others, 1)):
                pass
        except SwaplessError as err:
            logger.warning("could not load %s, kept loaded by its spec: %s", spec.id, err)
            continue
        loaded.append(spec.id)
        gone = [m for m in others if not manager.is_loaded(m)]
        if gone:  # a byte budget too small for them all: the kept models would only push one another out
            logger.warning("loading %s, kept loaded by its spec, evicted %s (the memory budget holds no more); the "
                           "rest load on their first jobs", spec.id, ", ".join(gone))
            break
    if loaded:
        logger.info("loaded %s: kept loaded by the models file", ", ".join(loaded))
    return loaded


def _warm_at(worker: Any, spec: ModelSpec, size: int) -> None:
    """One pass at ``size``: the one-off costs of the shape the tuner will pick first."""
    tuner = worker.tuner
    try:
        worker.tuner = _Fixed(size)
        worker.predict([worker.prepare(warm_input(spec))] * size)
    finally:
        worker.tuner = tuner


def _warm(worker: Any, spec: ModelSpec, give_up_after: float, deadline: float) -> None:
    prepared = worker.prepare(warm_input(spec))
    tuner = worker.tuner
    sizes = tuner.sizes if tuner is not None else [worker.batch_size]
    best = float("inf")
    try:
        for size in sizes:
            if best < float("inf") and time.perf_counter() + 2 * size * best > deadline:
                break  # this size's two passes would run past the budget
            batch = [prepared] * size
            worker.tuner = _Fixed(size)
            worker.predict(batch)  # pays this shape's one-off costs
            started = time.perf_counter()
            worker.predict(batch)
            per_input = (time.perf_counter() - started) / size
            if tuner is not None:
                tuner.record(size, size, per_input * size)
            best = min(best, per_input)
            if per_input > give_up_after * best or time.perf_counter() > deadline:
                break  # past the best size (larger batches only cost more here), or out of time
    finally:
        worker.tuner = tuner
