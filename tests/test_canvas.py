"""Celery's canvas against a real ``swapless worker``: a plain Celery app (``tests.canvas_app``) composes
``swapless.predict`` (and chunk) signatures with its own tasks, run by a real second Celery worker, on both intake
paths (the lean default and ``--task-events``)."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, chord, group

from swapless.tasks.protocol import CHUNK_TASK, PREDICT_TASK
from tests.canvas_app import make_app
from tests.conftest import CliProcess, WorkerProcess

pytestmark = pytest.mark.slow

WAIT_S = 60


class CeleryWorker(CliProcess):
    """A real plain ``celery -A tests.canvas_app worker`` on one queue, its log in a file."""

    def __init__(self, env: dict[str, str], queue: str, log_path: Path) -> None:
        super().__init__(["-A", "tests.canvas_app", "worker", "-Q", queue, "--pool", "solo", "--loglevel=INFO",
                          "--without-gossip", "--without-mingle", "--without-heartbeat"], env, log_path,
                         module="celery")


@pytest.fixture
def canvas_env(swapless_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The test's environment with a queue of its own for the plain Celery worker's follow-ups."""
    queue = swapless_env["SWAPLESS_KEY_PREFIX"] + "post"
    monkeypatch.setenv("SWAPLESS_CANVAS_QUEUE", queue)
    return {**swapless_env, "SWAPLESS_CANVAS_QUEUE": queue}


@pytest.fixture
def post_worker(canvas_env: dict[str, str], tmp_path: Path) -> Iterator[CeleryWorker]:
    worker = CeleryWorker(canvas_env, canvas_env["SWAPLESS_CANVAS_QUEUE"], tmp_path / "post.log")
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()


def _sig(plain: Celery, name: str, *args: Any, **options: Any) -> Any:
    return plain.signature(name, args=list(args), **options)


def _next(plain: Celery, model_id: str) -> Any:
    """A ``swapless.predict`` step whose input is the result of the step before it."""
    return plain.signature(PREDICT_TASK, kwargs={"model_id": model_id})


@pytest.mark.parametrize("intake", ["lean", "task-events"])
def test_chain_chord_link_and_link_error_run_against_a_real_swapless_worker(
    intake: str, canvas_env: dict[str, str], start_worker: Callable[..., WorkerProcess], post_worker: CeleryWorker
) -> None:
    worker = start_worker(*(["--task-events"] if intake == "task-events" else []),
                          env={"SWAPLESS_CANVAS_QUEUE": canvas_env["SWAPLESS_CANVAS_QUEUE"]})
    plain = make_app(canvas_env)
    try:
        _run_every_shape(plain)
    finally:
        plain.backend.result_consumer.stop()
        plain.backend.client.connection_pool.disconnect()
        plain.close()
        # A plain Celery app may leave a connection of its result backend to the garbage collector (seen once in
        # a run of three test processes): collected here, where it is known to be this app's, rather than failing
        # whichever test the collector happens to run in next
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
    assert worker.proc.poll() is None


def _run_every_shape(plain: Celery) -> None:
    predict = lambda *args, **options: _sig(plain, PREDICT_TASK, *args, **options)  # noqa: E731

    # everything is sent first, then awaited: one worker start serves every shape
    chained = chain(predict("sentiment", "what a lovely day"), _sig(plain, "post.top")).apply_async()
    two_models = chain(predict("sentiment", "first model"),
                       predict("spam", "free money now", immutable=True), _sig(plain, "post.top")).apply_async()
    chorded = chord([predict("spam", f"header {i}") for i in range(4)], _sig(plain, "post.summarise")).apply_async()
    grouped = group(predict("spam", f"group {i}") for i in range(5)).apply_async()
    link = _sig(plain, "post.top").freeze()
    linked = predict("sentiment", "linked").apply_async(link=_sig(plain, "post.top", task_id=link.id))
    errback = _sig(plain, "post.failed").freeze()
    failing = predict("no-such-model", "x").apply_async(link_error=_sig(plain, "post.failed", task_id=errback.id))
    broken_chain = chain(predict("no-such-model", "y"), _sig(plain, "post.top")).apply_async()
    # a Swapless step fed by the step before it: the model id as a keyword, the previous result as the input
    fed = chain(predict("sentiment", "fed forward"), _sig(plain, "post.top"), _next(plain, "spam")).apply_async()
    misfed = chain(predict("sentiment", "a list is not a text"), _next(plain, "spam")).apply_async()
    chunk_link = _sig(plain, "post.chunk_top").freeze()
    _sig(plain, CHUNK_TASK, "spam", ["one", "two", "three"]).apply_async(
        link=_sig(plain, "post.chunk_top", task_id=chunk_link.id))

    assert chained.get(timeout=WAIT_S) in {"POSITIVE", "NEGATIVE"}
    assert two_models.get(timeout=WAIT_S) in {"ham", "spam"}
    assert two_models.parent.get(timeout=WAIT_S)[0]["label"] in {"ham", "spam"}  # the Swapless step's own result
    labels = chorded.get(timeout=WAIT_S)
    assert len(labels) == 4 and set(labels) <= {"ham", "spam"}
    assert len(grouped.get(timeout=WAIT_S)) == 5
    assert plain.AsyncResult(link.id).get(timeout=WAIT_S) == linked.get(timeout=WAIT_S)[0]["label"]
    report = plain.AsyncResult(errback.id).get(timeout=WAIT_S)
    assert report["job"] == failing.id and report["type"] == "UnknownModel"
    assert "no-such-model" in report["message"]
    broken_chain.get(timeout=WAIT_S, propagate=False)
    assert broken_chain.state == "FAILURE" and "no-such-model" in str(broken_chain.result)
    assert len(plain.AsyncResult(chunk_link.id).get(timeout=WAIT_S)) == 3
    assert fed.get(timeout=WAIT_S)[0]["label"] in {"ham", "spam"}
    assert fed.parent.get(timeout=WAIT_S) in {"POSITIVE", "NEGATIVE"}  # what the spam step classified
    misfed.get(timeout=WAIT_S, propagate=False)
    assert misfed.state == "FAILURE" and "this is a text model; send a string" in str(misfed.result), misfed.result
