"""The naive reference design, for the benchmark: one Celery task per job, an OrderedDict LRU of two models,
default Celery settings. It uses Swapless' own model workers so that only the queueing/scheduling differs.

Run by the benchmark as ``celery -A bench.naive worker --pool solo`` with BENCH_REDIS_URL, BENCH_QUEUE and
SWAPLESS_MODELS_FILE set.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import OrderedDict
from typing import Any

from celery import Celery

from swapless.manager import ModelEngine, ModelStore, ModelWorker, WorkerLimits

logger = logging.getLogger("bench.naive")

_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
app = Celery("naive", broker=_url, backend=_url)
app.conf.update(
    task_default_queue=os.environ.get("BENCH_QUEUE", "naive"),
    result_backend_transport_options={"global_keyprefix": os.environ.get("BENCH_PREFIX", "naive:")},
    worker_hijack_root_logger=False,
)

_cache: OrderedDict[str, ModelWorker] = OrderedDict()


@functools.cache
def _runtime() -> tuple[ModelEngine, ModelStore]:
    engine = ModelEngine(WorkerLimits(device="cpu"))
    return engine, ModelStore.from_file(os.environ["SWAPLESS_MODELS_FILE"], engine.frameworks)


def _worker(model_id: str) -> ModelWorker:
    engine, store = _runtime()
    if model_id in _cache:
        _cache.move_to_end(model_id)
        return _cache[model_id]
    if len(_cache) >= 2:
        _, old = _cache.popitem(last=False)
        old.unload()
    worker = engine.build(store.get(model_id))
    started = time.perf_counter()
    worker.load()
    print(f"naive loaded {model_id} in {time.perf_counter() - started:.3f} s", flush=True)
    _cache[model_id] = worker
    return worker


@app.task(name="naive.predict")
def predict(model_id: str, value: Any) -> Any:
    worker = _worker(model_id)
    return worker.predict([worker.prepare(value)])[0]
