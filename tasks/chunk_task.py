"""The ``swapless.predict_chunk`` task: chunk messages (``[model_id, [input, ...]]``, see ``tasks.chunks``).

In a worker, chunk messages go to the same ``BatchScheduler`` as single jobs (the one built at worker start-up
for ``swapless.predict``): it expands each chunk into per-item jobs, so both kinds of message are grouped by model
together. ``predict_chunk.apply(args=[model_id, inputs])`` runs a chunk eagerly through the same model code.

Registered in the worker through the Celery app's ``include`` list (``tasks.app``).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

from manager import SwaplessError, run_group
from tasks.app import PREDICT_TASK, app
from tasks.batch import SwaplessBatches, build_runtime
from tasks.chunks import CHUNK_TASK, ChunkAssembler
from tasks.results import ResultStore

__all__ = ["predict_chunk"]


class _ChunkBatches(SwaplessBatches):
    """Hands chunk requests to the ``swapless.predict`` task's scheduler: one backlog, one cache per worker."""

    abstract = True

    def flush(self, requests: Collection[Any]) -> None:
        self.app.tasks[PREDICT_TASK].flush(requests)


def _run_chunks_now(requests: Sequence[Any]) -> None:
    """The eager path: expand, run and store each chunk in this thread."""
    runtime = build_runtime()
    results = ResultStore(app)
    try:
        for request in requests:
            chunks = ChunkAssembler()
            try:
                jobs = chunks.expand(request, runtime.store, time.monotonic())
            except SwaplessError as err:
                results.store([(request.id, None, err)])
                continue
            _, done = chunks.collect(run_group(runtime.manager, jobs[0].model_id, jobs))
            results.store([(request.id, value, None) for _, value, _ in done])
    finally:
        runtime.manager.close()


@app.task(base=_ChunkBatches, name=CHUNK_TASK, bind=False, acks_late=True)
def predict_chunk(requests: Sequence[Any]) -> None:
    """The chunk task. In a worker its flush feeds the scheduler and this body is not used."""
    _run_chunks_now(requests)
