"""End to end: a real `swapless worker` process, the real Redis, jobs through the public client and CLI.

Every result is compared with what the model gives when called directly (transformers / torchvision code
written here, not Swapless' workers).
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from swapless.config.errors import InputError, UnknownModel
from swapless.manager.registry.store import ModelStore
from swapless.tasks.client import Client
from swapless.tasks.protocol import PREDICT_TASK
from tests.conftest import REPO, WorkerProcess, Workers
from tests.tinymodels import encode_image

pytestmark = [pytest.mark.slow, pytest.mark.images]

TEXTS = [
    "the movie was wonderful and the actors were great",
    "terrible service, never again",
    "win a free prize now, call this number",
    "meeting moved to thursday afternoon",
    "a",
    "stocks fell sharply as markets reacted to the news about the economy and the central bank " * 3,
]


def direct_text(path: Path, texts: list[str], top_k: int = 5) -> list[list[dict[str, Any]]]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            logits = model(**tokenizer(text, truncation=True, return_tensors="pt")).logits[0]
            probs = torch.softmax(logits, dim=-1)
            scores, idx = probs.topk(min(top_k, probs.numel()))
            out.append(
                [
                    {"label": model.config.id2label[i], "score": s}
                    for s, i in zip(scores.tolist(), idx.tolist(), strict=True)
                ]
            )
    return out


def direct_image(path: Path, images_b64: list[str], top_k: int = 5) -> list[list[dict[str, Any]]]:
    import torchvision
    from safetensors.torch import load_file

    weights = torchvision.models.MobileNet_V2_Weights.DEFAULT
    model = torchvision.models.mobilenet_v2(weights=None)
    model.load_state_dict(load_file(str(path)))
    model.eval()
    transform = weights.transforms()
    out = []
    with torch.inference_mode():
        for b64 in images_b64:
            image = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
            probs = torch.softmax(model(transform(image).unsqueeze(0))[0], dim=-1)
            scores, idx = probs.topk(top_k)
            out.append(
                [
                    {"label": weights.meta["categories"][i], "score": s}
                    for s, i in zip(scores.tolist(), idx.tolist(), strict=True)
                ]
            )
    return out


@pytest.fixture(scope="module")
def worker(module_env: dict[str, str], module_workers: Workers) -> WorkerProcess:
    """The module's one default worker (on its queue), for the tests that need nothing of their own."""
    return module_workers.start()


def assert_same(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert [g["label"] for g in got] == [e["label"] for e in expected]
    for g, e in zip(got, expected, strict=True):
        assert g["score"] == pytest.approx(e["score"], abs=1e-4)


def test_mixed_workload_over_four_models_with_a_cache_of_two(
    start_worker: Callable[..., WorkerProcess], models_file: Path
) -> None:
    client = Client()
    store = ModelStore.from_file(models_file)
    images = [encode_image(seed) for seed in range(6)]
    expected: dict[str, list[Any]] = {
        "sentiment": direct_text(store.get("sentiment").path, TEXTS),  # type: ignore[arg-type]
        "spam": direct_text(store.get("spam").path, TEXTS),  # type: ignore[arg-type]
        "topic": direct_text(store.get("topic").path, TEXTS),  # type: ignore[arg-type]
        "vision": direct_image(store.get("vision").path, images),  # type: ignore[arg-type]
    }
    inputs = {"sentiment": TEXTS, "spam": TEXTS, "topic": TEXTS, "vision": images}
    submitted = []
    for _round in range(5):  # interleaved: the naive design would reload on most jobs
        for model_id in ["sentiment", "spam", "vision", "topic"]:
            for i, value in enumerate(inputs[model_id]):
                submitted.append((model_id, i, client.submit(model_id, value)))
    worker = start_worker("--max-models", "2")  # every job waits first: the count below does not race the producer
    results = client.gather([job for _, _, job in submitted], timeout=120)
    assert [r.state for r in results] == ["SUCCESS"] * len(submitted)
    for (model_id, i, _), stored in zip(submitted, results, strict=True):
        assert_same(stored.value, expected[model_id][i])
    # grouping: each model is loaded about once (twice at most, where one fetch splits its jobs), not once per job
    loads = worker.count("loaded ")
    assert 4 <= loads <= 8, worker.log()[-3000:]
    # job.get and job lookup by id
    again = client.job(submitted[0][2].id)
    assert_same(again.get(timeout=5), expected["sentiment"][0])


def test_bad_jobs_fail_alone_and_the_worker_keeps_running(worker: WorkerProcess) -> None:
    client = Client()
    raw = Client(validate=False)
    good = [client.submit("sentiment", text) for text in TEXTS]
    bad = {
        "empty": client.submit("sentiment", "  "),
        "not a string": client.submit("sentiment", {"text": "hi"}),
        "image to text model": client.submit("sentiment", None),
        "text to image model": client.submit("vision", "hello there"),
        "not an image": client.submit("vision", base64.b64encode(b"GIF89a not really").decode()),
        "unknown model": raw.submit("sentimnt", "hello"),
        "malformed payload": Client(validate=False),
    }
    malformed = bad.pop("malformed payload")
    malformed_result = malformed.app.send_task(PREDICT_TASK, args=["sentiment"], queue=malformed.settings.jobs.queue)
    more_good = [client.submit("spam", text) for text in TEXTS]

    assert all(isinstance(job.get(timeout=60), list) for job in good + more_good)
    messages = {}
    for name, job in bad.items():
        with pytest.raises(Exception) as caught:
            job.get(timeout=30)
        messages[name] = (type(caught.value), str(caught.value))
    assert messages["empty"] == (
        InputError,
        "bad input for model 'sentiment': empty text; send at least one non-blank character",
    )
    assert messages["not a string"] == (
        InputError,
        "bad input for model 'sentiment': this is a text model; send a string, not an object",
    )
    assert messages["image to text model"][1].endswith("send a string, not null")
    assert "image is not valid base64" in messages["text to image model"][1]
    assert "not an image Pillow can read" in messages["not an image"][1]
    assert messages["unknown model"][0] is UnknownModel
    assert messages["unknown model"][1] == "unknown model 'sentimnt' (known: sentiment, spam, topic, vision)"
    with pytest.raises(InputError, match="malformed job payload: expected args \\[model_id, input\\]"):
        malformed.job(malformed_result.id).get(timeout=30)
    assert worker.proc.poll() is None, "the worker is still running"
    assert isinstance(client.submit("topic", "still alive?").get(timeout=30), list)


def test_client_rejects_unknown_model_before_sending(swapless_env: dict[str, str]) -> None:
    with pytest.raises(UnknownModel, match="unknown model 'nope' \\(known: sentiment, spam, topic, vision\\)"):
        Client().submit("nope", "hello")


def test_async_get(worker: WorkerProcess) -> None:
    import asyncio

    client = Client()

    async def main() -> list[Any]:
        jobs = [client.submit("spam", text) for text in TEXTS[:3]]
        return await asyncio.gather(*(job.aget(timeout=60) for job in jobs))

    results = asyncio.run(main())
    assert len(results) == 3 and all(r[0]["label"] in {"ham", "spam"} for r in results)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "swapless", *args], cwd=REPO, check=False, capture_output=True, text=True, timeout=120
    )


def test_cli_submit_wait_and_result(worker: WorkerProcess, tmp_path: Path) -> None:
    done = run_cli("submit", "sentiment", "what a great day", "--wait")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["result"][0]["label"] in {"POSITIVE", "NEGATIVE"}
    looked_up = run_cli("result", payload["job_id"])
    assert json.loads(looked_up.stdout) == {
        "job_id": payload["job_id"],
        "state": "SUCCESS",
        "result": payload["result"],
    }

    image = tmp_path / "cat.png"
    image.write_bytes(base64.b64decode(encode_image(3)))
    queued = run_cli("submit", "vision", "--file", str(image))
    assert queued.returncode == 0, queued.stderr
    job_id = queued.stdout.strip()
    shown = json.loads(run_cli("result", job_id, "--wait", "60").stdout)
    assert shown["state"] == "SUCCESS" and len(shown["result"]) == 5

    failed = run_cli("submit", "sentiment", "", "--wait")
    assert failed.returncode == 2
    assert "empty text" in failed.stderr
    unknown = run_cli("submit", "sentimnt", "hi")
    assert unknown.returncode == 2 and "unknown model 'sentimnt'" in unknown.stderr


def test_worker_refuses_a_bad_models_file_at_start_up(
    start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"models": [{"id": "x", "name": "y", "type": "text", "framework": "onnx"}]}))
    worker = start_worker("--models", str(bad), ready=False)
    assert worker.proc.wait(60) != 0
    assert "models[0] (id 'x'), field 'framework': unknown framework 'onnx'" in worker.log()


def test_celery_dash_a_swapless_worker_works(swapless_env: dict[str, str], tmp_path: Path) -> None:
    import os
    import signal

    log = tmp_path / "celery.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "swapless",
                "worker",
                "-Q",
                swapless_env["SWAPLESS_QUEUE"],
                "--loglevel=INFO",
            ],
            cwd=REPO,
            env={**os.environ, **swapless_env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            result = Client().submit("spam", "free money now").get(timeout=90)
            assert result[0]["label"] in {"ham", "spam"}
            assert "solo" in log.read_text(), "the app's defaults pick the solo pool"
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
