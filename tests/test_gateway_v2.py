"""The Open Inference Protocol (KServe v2) on the gateway, called by the real ``tritonclient.http`` client against a
real `swapless serve` process, a real worker with the tiny models, and the real Redis.

One worker and one gateway serve the whole module; the predictions are checked against what the gateway's own
``POST /predict`` gives for the same inputs.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.stack import GatewayProcess, free_port, wait_for, worker_and_gateway
from tests.stack import Stack as GatewayStack
from tests.tinymodels import encode_image, write_models_file

pytestmark = [pytest.mark.slow, pytest.mark.images]

MAX_BODY_BYTES = 256 * 1024
TOP_K = 5  # the tiny models' top_k: the default
TEXT_MODELS = {"sentiment", "spam", "topic"}


@dataclass
class Stack(GatewayStack):
    triton: httpclient.InferenceServerClient


@pytest.fixture(scope="module")
def v2_models_file(models_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny models (``sentiment`` also as ``feelings``) and two routes: ``mood``, a split over two text models,
    and ``classify``, a branch by input type."""
    entries = json.loads(models_file.read_text())["models"]
    for entry in entries:
        entry["path"] = str(models_file.parent / entry["path"])
        if entry["id"] == "sentiment":
            entry["aliases"] = ["feelings"]
    entries += [
        {"id": "mood", "route": {"sentiment": 50, "spam": 50}},
        {"id": "classify", "by_type": {"text": "sentiment", "image": "vision"}},
    ]
    return write_models_file(tmp_path_factory.mktemp("v2-models"), entries)


@pytest.fixture(scope="module")
def stack(redis_url: str, v2_models_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("gateway-v2-logs")
    extra = {"SWAPLESS_HEARTBEAT_INTERVAL_S": "0.5", "SWAPLESS_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY_BYTES)}
    with worker_and_gateway(redis_url, v2_models_file, logs, "v2@%h", **extra) as (env, worker, gateway):
        triton = httpclient.InferenceServerClient(f"127.0.0.1:{gateway.port}", network_timeout=120)
        try:
            with httpx.Client(base_url=gateway.url, timeout=60) as http:
                yield Stack(env, worker, gateway, http, triton)
        finally:
            triton.close()


def texts_input(texts: list[str], binary: bool = True) -> httpclient.InferInput:
    tensor = httpclient.InferInput("TEXT", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary_data=binary)
    return tensor


def predict_all(stack: Stack, model_id: str, inputs: list[str]) -> list[list[dict[str, Any]]]:
    """What ``POST /predict`` answers for each input, 16 at a time."""

    async def run() -> list[httpx.Response]:
        limit = asyncio.Semaphore(16)
        async with httpx.AsyncClient(base_url=stack.gateway.url, timeout=60) as client:

            async def predict(value: str) -> httpx.Response:
                async with limit:
                    return await client.post("/predict", json={"model_id": model_id, "input": value})

            return await asyncio.gather(*(predict(value) for value in inputs))

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * len(inputs), (
        [r.text for r in responses if r.status_code != 200][:2]
    )
    return [r.json()["result"] for r in responses]


def assert_same_predictions(labels: np.ndarray, scores: np.ndarray, expected: list[list[dict[str, Any]]]) -> None:
    """LABELS and SCORES rows hold the predictions best first, padded with "" and 0.0 to top_k."""
    assert labels.shape == scores.shape == (len(expected), TOP_K)
    assert scores.dtype == np.float32
    for row_labels, row_scores, predictions in zip(labels, scores, expected, strict=True):
        names = [value.decode() if isinstance(value, bytes) else value for value in row_labels]
        padding = TOP_K - len(predictions)
        assert names[TOP_K - padding :] == [""] * padding and list(row_scores[TOP_K - padding :]) == [0.0] * padding
        assert list(row_scores[: TOP_K - padding]) == sorted(row_scores[: TOP_K - padding], reverse=True)
        got = dict(zip(names[: TOP_K - padding], row_scores[: TOP_K - padding].tolist(), strict=True))
        assert got.keys() == {p["label"] for p in predictions}
        assert all(got[p["label"]] == pytest.approx(p["score"], abs=1e-4) for p in predictions), (got, predictions)


def test_server_and_model_metadata(stack: Stack) -> None:
    triton = stack.triton
    assert triton.is_server_live() and triton.is_server_ready()
    server = triton.get_server_metadata()
    assert server["name"] == "swapless" and server["version"] == "0.1.0"
    assert "binary_tensor_data" in server["extensions"]
    assert triton.is_model_ready("sentiment") and triton.is_model_ready("feelings", "1")
    assert triton.is_model_ready("vision"), "a model not loaded is ready: the worker loads it for its first job"
    assert not triton.is_model_ready("nope") and not triton.is_model_ready("sentiment", "2")
    outputs = [{"name": "LABELS", "datatype": "BYTES", "shape": [-1, TOP_K]},
               {"name": "SCORES", "datatype": "FP32", "shape": [-1, TOP_K]}]
    assert triton.get_model_metadata("feelings") == triton.get_model_metadata("sentiment", "1") == {
        "name": "sentiment", "versions": ["1"], "platform": "transformers",
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [-1]}], "outputs": outputs,
    }
    assert triton.get_model_metadata("vision")["inputs"] == [{"name": "IMAGE", "datatype": "BYTES", "shape": [-1]}]
    assert triton.get_model_metadata("mood")["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1]}]
    classify = triton.get_model_metadata("classify")
    assert [i["name"] for i in classify["inputs"]] == ["TEXT", "IMAGE"] and classify["versions"] == []
    with pytest.raises(InferenceServerException) as missing:
        triton.get_model_metadata("sentiment", "2")
    assert missing.value.status() == "404"
    assert missing.value.message() == (
        "model 'sentiment' has no version '2': address version '1', or leave the version out"
    )
    # the ready endpoints answer KServe clients too, which read the body
    assert stack.http.get("/v2/health/ready").json() == {"ready": True}
    assert stack.http.get("/v2/health/live").json() == {"live": True}
    assert stack.http.get("/v2/models/feelings/ready").json() == {"name": "sentiment", "ready": True}


def test_a_batch_of_64_texts_in_binary_is_what_predict_gives(stack: Stack) -> None:
    texts = [f"review number {i}: {'great' if i % 2 else 'awful'} stuff, {i * 7 % 13} stars" for i in range(64)]
    result = stack.triton.infer("sentiment", [texts_input(texts)], request_id="batch-64")
    response = result.get_response()
    assert {k: response[k] for k in ("model_name", "model_version", "id")} == {
        "model_name": "sentiment", "model_version": "1", "id": "batch-64"
    }
    assert all("binary_data_size" in o["parameters"] for o in response["outputs"]), "no outputs asked: all binary"
    labels, scores = result.as_numpy("LABELS"), result.as_numpy("SCORES")
    assert_same_predictions(labels, scores, predict_all(stack, "sentiment", texts))
    assert {label for row in labels for label in row[:2]} == {b"NEGATIVE", b"POSITIVE"}


def test_json_inputs_and_outputs_and_the_outputs_asked_for(stack: Stack) -> None:
    texts = ["win a free prize now", "lunch at noon?", "cheap meds online"]
    expected = predict_all(stack, "spam", texts)
    mixed = [httpclient.InferRequestedOutput("LABELS", binary_data=False),
             httpclient.InferRequestedOutput("SCORES", binary_data=True)]
    result = stack.triton.infer("spam", [texts_input(texts, binary=False)], outputs=mixed)
    by_name = {o["name"]: o for o in result.get_response()["outputs"]}
    assert (
        by_name["LABELS"]["data"][:2] in (["ham", "spam"], ["spam", "ham"])
        and by_name["LABELS"]["shape"] == [3, TOP_K]
    )
    assert by_name["SCORES"]["parameters"] == {"binary_data_size": 3 * TOP_K * 4} and "data" not in by_name["SCORES"]
    assert_same_predictions(result.as_numpy("LABELS"), result.as_numpy("SCORES"), expected)

    in_json = [httpclient.InferRequestedOutput("LABELS", binary_data=False),
               httpclient.InferRequestedOutput("SCORES", binary_data=False)]
    result = stack.triton.infer("spam", [texts_input(texts)], outputs=in_json, request_compression_algorithm="gzip")
    assert all("data" in o for o in result.get_response()["outputs"])
    assert_same_predictions(result.as_numpy("LABELS"), result.as_numpy("SCORES"), expected)

    only_scores = stack.triton.infer("spam", [texts_input(texts)], outputs=[httpclient.InferRequestedOutput("SCORES")])
    assert [o["name"] for o in only_scores.get_response()["outputs"]] == ["SCORES"]
    assert only_scores.as_numpy("LABELS") is None

    # an MLServer-style JSON request: strings of shape [n, 1], nested data, a JSON answer
    plain = stack.http.post("/v2/models/spam/versions/1/infer", json={
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [3, 1], "data": [[t] for t in texts]}],
    })
    assert plain.status_code == 200 and plain.headers["content-type"] == "application/json"
    outputs = {o["name"]: o for o in plain.json()["outputs"]}
    assert outputs["SCORES"]["shape"] == [3, TOP_K] and outputs["SCORES"]["datatype"] == "FP32"
    assert_same_predictions(np.array(outputs["LABELS"]["data"], dtype=np.object_).reshape(3, TOP_K),
                            np.array(outputs["SCORES"]["data"], dtype=np.float32).reshape(3, TOP_K), expected)


def test_an_image_model_takes_encoded_image_bytes(stack: Stack) -> None:
    images = [encode_image(seed) for seed in (7, 8)]
    tensor = httpclient.InferInput("IMAGE", [2], "BYTES")
    tensor.set_data_from_numpy(np.array([base64.b64decode(i) for i in images], dtype=np.object_))
    result = stack.triton.infer("vision", [tensor])
    assert result.get_response()["model_name"] == "vision"
    expected = predict_all(stack, "vision", images)
    assert all(len(p) == TOP_K for p in expected)
    assert_same_predictions(result.as_numpy("LABELS"), result.as_numpy("SCORES"), expected)
    # in JSON an image is a base64 string
    as_json = stack.http.post("/v2/models/vision/infer", json={
        "inputs": [
            {"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": ["data:image/png;base64," + images[0]]}
        ],
    })
    assert as_json.status_code == 200
    assert as_json.json()["outputs"][0]["data"] == [p["label"] for p in expected[0]]


def test_routes_are_models_of_their_targets_type(stack: Stack) -> None:
    texts = [f"route me {i}" for i in range(6)]
    mood = stack.triton.infer("mood", [texts_input(texts)])
    assert mood.get_response()["model_name"] == "mood" and "model_version" not in mood.get_response()
    rows = [{label for label in row if label} for row in mood.as_numpy("LABELS")]
    assert all(row in ({b"NEGATIVE", b"POSITIVE"}, {b"ham", b"spam"}) for row in rows), rows
    as_text = stack.triton.infer("classify", [texts_input(["a cat, maybe"])])
    assert {label for label in as_text.as_numpy("LABELS")[0] if label} == {b"NEGATIVE", b"POSITIVE"}
    image = httpclient.InferInput("IMAGE", [1], "BYTES")
    image.set_data_from_numpy(np.array([base64.b64decode(encode_image(3))], dtype=np.object_))
    as_image = stack.triton.infer("classify", [image])
    assert as_image.as_numpy("LABELS")[0].tolist() == [
        p["label"].encode() for p in predict_all(stack, "vision", [encode_image(3)])[0]
    ]


def test_bad_requests_are_400_and_unknown_models_404(stack: Stack) -> None:
    def refused(model: str, inputs: list[httpclient.InferInput], **options: Any) -> tuple[str, str]:
        with pytest.raises(InferenceServerException) as caught:
            stack.triton.infer(model, inputs, **options)
        return caught.value.status(), caught.value.message()

    numbers = httpclient.InferInput("TEXT", [2], "FP32")
    numbers.set_data_from_numpy(np.array([1.0, 2.0], dtype=np.float32))
    assert refused("sentiment", [numbers]) == (
        "400", "bad input for model 'sentiment': input 'TEXT' has datatype FP32: send BYTES, one UTF-8 string per text"
    )
    named = httpclient.InferInput("INPUT0", [1], "BYTES")
    named.set_data_from_numpy(np.array([b"hi"], dtype=np.object_))
    assert refused("sentiment", [named]) == (
        "400", "bad input for model 'sentiment': unknown input 'INPUT0': the model takes 'TEXT'"
    )
    assert refused("sentiment", [texts_input(["hello", "   "])]) == (
        "400",
        "bad input for model 'sentiment': input 'TEXT' element 1 is empty text: send at least one non-blank character",
    )
    assert refused("sentiment", [texts_input(["hi"])], outputs=[httpclient.InferRequestedOutput("PROBS")]) == (
        "400", "bad input for model 'sentiment': unknown output 'PROBS': the model gives 'LABELS' and 'SCORES'"
    )
    not_an_image = httpclient.InferInput("IMAGE", [2], "BYTES")
    not_an_image.set_data_from_numpy(
        np.array([base64.b64decode(encode_image(1)), b"GIF89a not really"], dtype=np.object_)
    )
    status, message = refused("vision", [not_an_image])
    assert (status, message) == (
        "400",
        (
            "bad input for model 'vision': input 'IMAGE' element 1: the bytes are not an "
            "image Pillow can read (PNG, JPEG, WEBP, GIF, BMP)"
        ),
    ), "refused before any is queued"
    assert refused("nope", [texts_input(["hi"])]) == (
        "404", "unknown model 'nope' (known: classify, mood, sentiment, spam, topic, vision)"
    )
    assert refused("sentiment", [texts_input(["hi"])], model_version="2")[0] == "404"

    http = stack.http
    broken = http.post("/v2/models/sentiment/infer", content=b'{"inputs": [')
    assert broken.status_code == 400 and broken.headers["content-type"] == "application/json"
    assert broken.json()["error"].startswith("bad input for model 'sentiment': the request is not valid JSON")
    bomb = gzip.compress(b"0" * (MAX_BODY_BYTES + 1))
    too_big = http.post("/v2/models/sentiment/infer", content=bomb, headers={"content-encoding": "gzip"})
    assert too_big.status_code == 413 and "once decompressed" in too_big.json()["error"]
    assert http.get("/v2/models/sentiment/config").json() == {
        "error": (
            "no endpoint GET /v2/models/sentiment/config: the Open Inference Protocol endpoints are listed at /docs"
        )
    }
    # the other endpoints keep their own error shape
    assert set(http.post("/jobs", json={"model_id": "nope", "input": "hi"}).json()) == {"detail", "known"}


def test_repository_index_says_what_is_loaded_and_every_model_takes_requests(stack: Stack) -> None:
    # two models fit the worker: topic, called last, and one more (residency by interactive demand decides which:
    # this module's earlier tests called some models many times); the others are evicted
    for model in ("vision", "spam", "topic"):
        tensor = texts_input(["hello"]) if model != "vision" else httpclient.InferInput("IMAGE", [1], "BYTES")
        if model == "vision":
            tensor.set_data_from_numpy(np.array([base64.b64decode(encode_image(5))], dtype=np.object_))
        stack.triton.infer(model, [tensor])

    called = {"vision", "spam", "topic"}

    def settled() -> list[dict[str, Any]] | None:
        index = stack.triton.get_model_repository_index()
        ready = {entry["name"] for entry in index if entry["state"] == "READY"}
        return index if len(ready) == 2 and "topic" in ready else None

    index = {
        entry["name"]: entry for entry in wait_for(settled, 15, what="the heartbeat to show two of them loaded")
    }
    ready = {name for name, entry in index.items() if entry["state"] == "READY"}
    evicted = sorted(called - ready)
    assert evicted
    assert list(index) == ["sentiment", "spam", "topic", "vision", "mood", "classify"]
    assert index["topic"]["version"] == "1" and index["topic"]["reason"].startswith("loaded on v2@")
    for name in evicted:
        assert index[name] == {"name": name, "version": "1", "state": "UNAVAILABLE",
                               "reason": "not loaded on any live worker: its first request loads it"}
    if "sentiment" not in ready:  # mood routes to sentiment: it reads as its target does
        assert index["mood"]["state"] == "UNAVAILABLE" and "sentiment not loaded" in index["mood"]["reason"]
    assert all(stack.triton.is_model_ready(name) for name in evicted), "not loaded, and ready all the same"
    only_ready = stack.http.post("/v2/repository/index", json={"ready": True}).json()
    assert [entry["name"] for entry in only_ready] == [name for name in index if name in ready]


def test_no_result_in_time_is_504_naming_the_jobs(stack: Stack) -> None:
    os.kill(stack.worker.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(InferenceServerException) as caught:
            stack.triton.infer("topic", [texts_input(["late one", "late two"])], timeout=1_000_000)  # microseconds
        late = stack.http.post("/v2/models/topic/infer", json={
            "parameters": {"timeout": 500_000},
            "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["late three"]}],
        })
    finally:
        os.kill(stack.worker.proc.pid, signal.SIGCONT)
    assert caught.value.status() == "504"
    assert caught.value.message().startswith(
        "no result after 1 s for 2 of 2 jobs, still queued or running: poll GET /jobs/"
    )
    assert late.status_code == 504
    [job_id] = late.json()["job_ids"]
    assert late.json()["error"] == (
        f"no result after 0.5 s for 1 of 1 jobs, still queued or running: poll GET /jobs/{{job_id}} for {job_id}"
    )
    done = wait_for(
        lambda: (s := stack.http.get(f"/jobs/{job_id}").json())["state"] != "PENDING" and s, 60, what="the job"
    )
    assert done["state"] == "SUCCESS" and len(done["result"]) == 4


def test_redis_down_is_503_and_not_ready(stack: Stack, tmp_path: Path) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    gateway = GatewayProcess({**stack.env, "SWAPLESS_REDIS_URL": dead}, tmp_path / "gw.log")
    try:
        gateway.wait_ready()
        triton = httpclient.InferenceServerClient(f"127.0.0.1:{gateway.port}")
        try:
            assert triton.is_server_live() and not triton.is_server_ready() and not triton.is_model_ready("spam")
            assert triton.get_model_metadata("spam")["name"] == "spam", "metadata needs no Redis"
            with pytest.raises(InferenceServerException) as caught:
                triton.infer("spam", [texts_input(["hi"])])
        finally:
            triton.close()
        assert caught.value.status() == "503"
        assert caught.value.message() == "the queue (Redis) is unavailable: try again in 5 s"
        ready = httpx.get(gateway.url + "/v2/health/ready", timeout=30)
        assert ready.status_code == 503 and ready.headers["retry-after"] == "5"
        assert ready.json() == {"error": "the queue (Redis) is unavailable: try again in 5 s"}
    finally:
        gateway.stop()
