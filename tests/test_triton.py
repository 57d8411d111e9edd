"""TritonWorker against a real tritonserver (the binary shipped in the nvidia-pytriton wheel).

The server serves ``tests/triton_repo``: ``densenet_like`` (FP32 [3, 32, 32] image in, 10 logits out,
max_batch_size 8, labels in ``labels.txt``) and ``adder`` (two INT32 [4] in, SUM and DIFF out, no batching).
Run with ``-s`` to see the measured load/unload round trip.
"""

from __future__ import annotations

import base64
import io
import json
import math
import socket
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from PIL import Image

from swapless.config.errors import BackendUnavailable, InputError, ModelLoadError
from swapless.manager.batching.runner import WorkItem, run_group
from swapless.manager.cache.lru import ModelManager
from swapless.manager.frameworks.engine import ModelEngine
from swapless.manager.frameworks.triton.worker import TritonWorker
from swapless.manager.frameworks.worker import ModelWorker, WorkerLimits
from swapless.manager.registry.specs import ModelSpec
from swapless.manager.registry.store import ModelStore

try:
    from tests.triton_server import REPOSITORY, TritonServer, fresh_triton, triton_server
except ImportError:  # pytest run without the repository root on sys.path: tests/ itself is on it
    from triton_server import (  # type: ignore[no-redef]
        REPOSITORY,
        TritonServer,
        fresh_triton,  # noqa: F401
        triton_server,  # noqa: F401
    )

pytestmark = pytest.mark.triton

LABELS_FILE = REPOSITORY / "densenet_like" / "labels.txt"
LABELS = LABELS_FILE.read_text().split()
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

#: Seconds measured per load/unload, printed by test_load_then_unload (visible with -s).
TIMINGS: dict[str, list[float]] = {"load_s": [], "unload_s": []}


def spec(model_id: str, url: str, **fields: Any) -> ModelSpec:
    """An image entry for the Triton model ``model_id`` (``name=`` names another Triton model)."""
    values: dict[str, Any] = {"id": model_id, "name": model_id, "type": "image", "framework": "triton"}
    return ModelSpec(**(values | {"triton_url": url} | fields))


def b64_image(seed: int, fmt: str = "PNG") -> str:
    rng = np.random.default_rng(seed)
    height, width = int(rng.integers(20, 80)), int(rng.integers(20, 80))
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode()


def reference_tensor(b64: str) -> np.ndarray:
    """The preprocessing the worker documents, written out again: resize 32x32 bilinear, ImageNet norm, CHW."""
    image = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
    image = image.resize((32, 32), Image.Resampling.BILINEAR)
    pixels = (np.asarray(image, dtype=np.float32) / 255.0 - MEAN) / STD
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def direct_infer(url: str, model: str, tensors: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
    """One plain tritonclient request, bypassing the worker."""
    client = httpclient.InferenceServerClient(url)
    try:
        inputs = []
        for name, array in tensors.items():
            datatype = "FP32" if array.dtype == np.float32 else "INT32"
            infer_input = httpclient.InferInput(name, list(array.shape), datatype)
            infer_input.set_data_from_numpy(array)
            inputs.append(infer_input)
        result = client.infer(model, inputs, outputs=[httpclient.InferRequestedOutput(n) for n in outputs])
        return {name: result.as_numpy(name) for name in outputs}
    finally:
        client.close()


def server_stats(url: str, model: str) -> dict[str, int]:
    """Requests, executions and inferences the server counted for ``model``.

    The server updates its statistics just after it answers, so this reads until two reads 50 ms apart agree.
    """
    client = httpclient.InferenceServerClient(url)
    try:
        previous: dict[str, int] | None = None
        for _ in range(40):
            stats = client.get_inference_statistics(model)["model_stats"][0]
            current = {
                "requests": int(stats["inference_stats"]["success"]["count"]),
                "executions": int(stats["execution_count"]),
                "inferences": int(stats["inference_count"]),
            }
            if current == previous:
                return current
            previous = current
            time.sleep(0.05)
        raise AssertionError(f"statistics of {model} did not settle: {previous}")
    finally:
        client.close()


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before[key] for key in before}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalEcho(ModelWorker):
    """An in-process model (not registered globally) to show Triton models do not count against max_models."""

    def load(self) -> None:
        self.memory_bytes = 1024

    def predict(self, batch: Any) -> list[Any]:
        return list(batch)

    def unload(self) -> None:
        self.memory_bytes = 0


# -- load / unload -------------------------------------------------------------------------------------------


@pytest.mark.slow  # a live tritonserver
def test_load_then_unload(fresh_triton: TritonServer) -> None:
    worker = TritonWorker(spec("densenet_like", fresh_triton.url))
    assert worker.remote is True
    worker.unload()  # before any load: a no-op
    for _ in range(3):
        started = time.perf_counter()
        worker.load()
        loaded = time.perf_counter()
        assert fresh_triton.state("densenet_like") == "READY"
        assert worker.memory_bytes == 0
        worker.unload()
        TIMINGS["load_s"].append(loaded - started)
        TIMINGS["unload_s"].append(time.perf_counter() - loaded)
        assert {e["name"]: e["state"] for e in fresh_triton.repository_index()}["densenet_like"] == "UNAVAILABLE"
    worker.unload()  # twice: still fine
    assert fresh_triton.state("densenet_like") == "UNAVAILABLE"
    load_ms = statistics.median(TIMINGS["load_s"]) * 1000
    unload_ms = statistics.median(TIMINGS["unload_s"]) * 1000
    print(
        f"\nTriton load/unload round trip (densenet_like, Python backend, median of {len(TIMINGS['load_s'])}): "
        f"load {load_ms:.0f} ms + unload {unload_ms:.0f} ms = {load_ms + unload_ms:.0f} ms"
    )


@pytest.mark.slow  # a live tritonserver
def test_missing_model_fails_to_load_with_the_servers_message(fresh_triton: TritonServer) -> None:
    worker = TritonWorker(spec("ghost", fresh_triton.url, name="no_such_model"))
    with pytest.raises(ModelLoadError) as caught:
        worker.load()
    message = str(caught.value)
    assert message.startswith(f"could not load model 'ghost': Triton at {fresh_triton.url}: ")
    assert "failed to load 'no_such_model'" in message
    assert "failed to poll from model repository" in message
    worker.unload()


@pytest.mark.slow  # a live tritonserver
def test_predict_loads_again_a_model_the_server_lost(fresh_triton: TritonServer) -> None:
    worker = TritonWorker(spec("densenet_like", fresh_triton.url))
    worker.load()
    prepared = worker.prepare(b64_image(1))
    fresh_triton.unload_all()  # behind the worker's back (a server restart looks the same)
    [output] = worker.predict([prepared])
    assert list(output) == ["fc6_1"] and len(output["fc6_1"]) == 10
    assert fresh_triton.state("densenet_like") == "READY"
    worker.unload()


# -- predict ---------------------------------------------------------------------------------------------------


@pytest.mark.slow  # a live tritonserver
def test_images_match_a_direct_infer_and_use_few_requests(fresh_triton: TritonServer) -> None:
    worker = TritonWorker(spec("densenet_like", fresh_triton.url, labels_file=LABELS_FILE, top_k=10))
    worker.load()
    images = [b64_image(seed, "PNG" if seed % 2 else "JPEG") for seed in range(20)]
    prepared = [worker.prepare(image) for image in images]
    before = server_stats(fresh_triton.url, "densenet_like")
    outputs = worker.predict(prepared)
    used = delta(before, server_stats(fresh_triton.url, "densenet_like"))
    assert used == {"requests": math.ceil(20 / 8), "executions": math.ceil(20 / 8), "inferences": 20}

    for image, output in zip(images, outputs, strict=True):
        logits = direct_infer(fresh_triton.url, "densenet_like", {"data_0": reference_tensor(image)[None]}, ["fc6_1"])
        row = logits["fc6_1"][0].astype(np.float64)
        probabilities = np.exp(row - row.max()) / np.exp(row - row.max()).sum()  # logits -> softmax
        best = np.argsort(-probabilities)
        assert [entry["label"] for entry in output] == [LABELS[i] for i in best]
        assert [entry["score"] for entry in output] == pytest.approx(probabilities[best].tolist(), rel=1e-5, abs=1e-6)
        assert sum(entry["score"] for entry in output) == pytest.approx(1.0)
    worker.unload()


@pytest.mark.slow  # a live tritonserver
def test_raw_tensors_without_labels_return_raw_outputs(fresh_triton: TritonServer) -> None:
    worker = TritonWorker(spec("densenet_like", fresh_triton.url, max_batch_size=4))
    worker.load()
    rng = np.random.default_rng(7)
    tensors = [rng.standard_normal((3, 32, 32)).astype(np.float32) for _ in range(10)]
    prepared = [worker.prepare({"inputs": {"data_0": t.tolist()}}) for t in tensors]
    before = server_stats(fresh_triton.url, "densenet_like")
    outputs = worker.predict(prepared)
    assert delta(before, server_stats(fresh_triton.url, "densenet_like"))["requests"] == 3  # the entry's 4 < 8
    for tensor, output in zip(tensors, outputs, strict=True):
        expected = direct_infer(fresh_triton.url, "densenet_like", {"data_0": tensor[None]}, ["fc6_1"])["fc6_1"][0]
        assert output["fc6_1"] == pytest.approx(expected.tolist(), rel=1e-5, abs=1e-5)  # batched vs alone
    with pytest.raises(InputError) as caught:
        worker.prepare({"inputs": {"data_0": tensors[0][:, :16].tolist()}})
    assert str(caught.value) == (
        "bad input for model 'densenet_like': input 'data_0' (FP32): shape [3, 16, 32], "
        "the model expects [3, 32, 32] (-1: any size)"
    )
    worker.unload()


@pytest.mark.slow  # a live tritonserver
def test_bad_tensors_fail_their_job_alone(fresh_triton: TritonServer, tmp_path: Path) -> None:
    models = tmp_path / "models.json"
    models.write_text(json.dumps({"models": [
        {"id": "adder", "name": "adder", "type": "text", "framework": "triton"},
    ]}))
    manager = ModelManager(ModelStore.from_file(models), ModelEngine(WorkerLimits(triton_url=fresh_triton.url)))
    good = {"inputs": {"INPUT0": [1, 2, 3, 4], "INPUT1": [10, 20, 30, 40]}}
    jobs = [
        WorkItem("good-1", "adder", good),
        WorkItem("shape", "adder", {"inputs": {"INPUT0": [[1, 2], [3, 4]], "INPUT1": [1, 1, 1, 1]}}),
        WorkItem("dtype", "adder", {"inputs": {"INPUT0": [1, 2, 3, 4], "INPUT1": [1.5, 1, 1, 1]}}),
        WorkItem("missing", "adder", {"inputs": {"INPUT0": [1, 2, 3, 4]}}),
        WorkItem("unknown", "adder", {"inputs": {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 2, 3, 4], "X": [1]}}),
        WorkItem("text", "adder", "add these please"),
        WorkItem("good-2", "adder", {"inputs": {"INPUT0": [5, 5, 5, 5], "INPUT1": [1, 2, 3, 4]}}),
    ]
    try:
        outcomes = {outcome.job.id: outcome for outcome in run_group(manager, "adder", jobs)}
        before = server_stats(fresh_triton.url, "adder")
        run_group(manager, "adder", [WorkItem("again", "adder", good)])
        assert delta(before, server_stats(fresh_triton.url, "adder"))["requests"] == 1  # no batching: 1 per job
    finally:
        manager.close()
    assert outcomes["good-1"].result == {"SUM": [11, 22, 33, 44], "DIFF": [-9, -18, -27, -36]}
    assert outcomes["good-2"].result == {"SUM": [6, 7, 8, 9], "DIFF": [4, 3, 2, 1]}
    errors = {job_id: o.error for job_id, o in outcomes.items() if not o.ok}
    assert all(isinstance(err, InputError) for err in errors.values())
    prefix = "bad input for model 'adder': "
    assert {job_id: str(err).removeprefix(prefix) for job_id, err in errors.items()} == {
        "shape": "input 'INPUT0' (INT32): shape [2, 2], the model expects [4] (-1: any size)",
        "dtype": "input 'INPUT1' (INT32): expects integers, got floating-point numbers",
        "missing": "missing input 'INPUT1'; the model takes INPUT0, INPUT1",
        "unknown": "unknown input 'X'; the model takes INPUT0, INPUT1",
        "text": 'send tensors as {"inputs": {name: nested list}}; this Triton model takes INPUT0 INT32 [4], '
        "INPUT1 INT32 [4]",
    }
    assert fresh_triton.state("adder") == "UNAVAILABLE"


# -- server down -----------------------------------------------------------------------------------------------


def _retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "; retrying in " in r.getMessage()]


def test_server_down_is_backend_unavailable_after_the_backoff(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING")
    url = f"127.0.0.1:{closed_port()}"
    worker = TritonWorker(spec("densenet_like", url))
    started = time.perf_counter()
    with pytest.raises(BackendUnavailable) as caught:
        worker.load()
    elapsed = time.perf_counter() - started
    # 0.2 + 0.4 + 0.8 s of backoff, then it gives up: the lower bound is the point; the upper one only says "not
    # forever" and is generous for a loaded machine
    assert 1.3 <= elapsed < 6.0
    message = str(caught.value)
    assert message.startswith(f"inference server at {url} is unavailable: load of 'densenet_like' failed 4 times in ")
    assert "ConnectionRefusedError" in message
    assert [m.rsplit("retrying in ", 1)[1] for m in _retries(caplog)] == ["0.2 s", "0.4 s", "0.8 s"]

    # Through the cache and the runner: the whole group fails with it, after a single backoff (not one per job,
    # nor a second one for the cleanup after the failed load).
    caplog.clear()
    store = ModelStore([spec("densenet_like", url)])
    manager = ModelManager(store, ModelEngine(WorkerLimits()))
    jobs = [WorkItem("a", "densenet_like", b64_image(1)), WorkItem("b", "densenet_like", b64_image(2))]
    outcomes = run_group(manager, "densenet_like", jobs)
    assert len(_retries(caplog)) == 3, _retries(caplog)
    assert [type(o.error) for o in outcomes] == [BackendUnavailable, BackendUnavailable]
    assert url in str(outcomes[0].error)


def test_a_load_without_answer_is_not_sent_again() -> None:
    with socket.socket() as listener:  # accepts connections (kernel backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"127.0.0.1:{listener.getsockname()[1]}"
        worker = TritonWorker(spec("densenet_like", url))
        worker.load_timeout_s = 0.3
        started = time.perf_counter()
        with pytest.raises(BackendUnavailable) as caught:
            worker.load()
        elapsed = time.perf_counter() - started
    assert 0.3 <= elapsed < 4.0  # it waited its 0.3 s, then gave up (the default would wait minutes)
    assert str(caught.value) == (
        f"inference server at {url} is unavailable: load of 'densenet_like' got no answer within 0.3 s"
    )


class _LoadsThenHangs(BaseHTTPRequestHandler):
    """Answers every POST (the load request) at once and every GET (readiness) only after a second."""

    def do_POST(self) -> None:  # http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def do_GET(self) -> None:
        time.sleep(1.0)
        self._answer()

    def _answer(self) -> None:
        try:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        except OSError:  # the client gave up already
            pass

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


def test_requests_that_time_out_are_retried_then_backend_unavailable() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _LoadsThenHangs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"127.0.0.1:{server.server_address[1]}"
        worker = TritonWorker(spec("densenet_like", url))
        worker.network_timeout_s = 0.2
        worker.retry_delays_s = (0.05, 0.1)
        started = time.perf_counter()
        with pytest.raises(BackendUnavailable) as caught:
            worker.load()
        elapsed = time.perf_counter() - started
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert 0.7 <= elapsed < 5.0  # 3 tries x 0.2 s + 0.15 s of backoff, then it gives up (generous: not forever)
    message = str(caught.value)
    assert message.startswith(
        f"inference server at {url} is unavailable: readiness check of 'densenet_like' failed 3 times in "
    )
    assert message.endswith("(TimeoutError: timed out)")


# -- the cache ------------------------------------------------------------------------------------------------


@pytest.mark.slow  # a live tritonserver
def test_cache_keeps_remote_max_models_on_the_server(fresh_triton: TritonServer, tmp_path: Path) -> None:
    models = tmp_path / "models.json"
    models.write_text(json.dumps({"models": [
        {"id": "local", "name": "echo", "type": "text", "framework": "local_echo"},
        {"id": "classifier", "name": "densenet_like", "type": "image", "framework": "triton",
         "labels_file": str(LABELS_FILE), "top_k": 3},
        {"id": "adder", "name": "adder", "type": "text", "framework": "triton"},
    ]}))
    engine = ModelEngine(WorkerLimits(triton_url=fresh_triton.url))

    def factory(model: ModelSpec) -> ModelWorker:
        return LocalEcho(model) if model.framework == "local_echo" else engine(model)

    manager = ModelManager(ModelStore.from_file(models), factory, max_models=1, remote_max_models=1)
    try:
        [echo] = run_group(manager, "local", [WorkItem("1", "local", "hello")])
        assert echo.result == "hello"

        [classified] = run_group(manager, "classifier", [WorkItem("2", "classifier", b64_image(3))])
        assert len(classified.result) == 3 and all(entry["label"] in LABELS for entry in classified.result)
        assert manager.loaded_ids() == ["local", "classifier"]  # Triton does not count against max_models=1
        assert fresh_triton.state("densenet_like") == "READY"

        item = WorkItem("3", "adder", {"inputs": {"INPUT0": [1] * 4, "INPUT1": [2] * 4}})
        [added] = run_group(manager, "adder", [item])
        assert added.result == {"SUM": [3] * 4, "DIFF": [-1] * 4}
        assert manager.loaded_ids() == ["local", "adder"]
        states = {e["name"]: e["state"] for e in fresh_triton.repository_index()}
        assert states == {"densenet_like": "UNAVAILABLE", "adder": "READY"}  # evicted = unloaded on the server
    finally:
        manager.close()
    assert fresh_triton.state("adder") == "UNAVAILABLE"


def test_module_imports_without_torch() -> None:
    code = "import sys, manager.frameworks.triton.worker; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "False"


@pytest.mark.slow  # a live tritonserver and a real worker process
def test_a_real_worker_serves_triton_models_beside_local_ones(
    fresh_triton: TritonServer, start_worker: Any, swapless_env: dict[str, str], tmp_path: Path
) -> None:
    """Through a real ``swapless worker``: Triton entries of the models file, ``SWAPLESS_TRITON_URL``,
    ``SWAPLESS_TRITON_MAX_MODELS``, the warm start leaving remote models alone, and local loads never evicting a
    Triton model (nor a Triton load a local one)."""
    from swapless.tasks.client import Client
    from tests.crashy import crashy_entry

    models = tmp_path / "models.json"
    models.write_text(json.dumps({"models": [
        crashy_entry("echo"), crashy_entry("echo2"),
        {"id": "classifier", "name": "densenet_like", "type": "image", "framework": "triton",
         "labels_file": str(LABELS_FILE), "top_k": 3},
        {"id": "adder", "name": "adder", "type": "text", "framework": "triton"},
    ]}))
    env = {"SWAPLESS_MODELS_FILE": str(models), "SWAPLESS_PLUGINS": "tests.crashy",
           "SWAPLESS_TRITON_URL": fresh_triton.url, "SWAPLESS_TRITON_MAX_MODELS": "1", "SWAPLESS_MAX_MODELS": "1",
           "SWAPLESS_WARM_START": "true"}
    worker = start_worker(env=env)
    from tests.faultkit import wait_for

    wait_for(lambda: "warm start on" in worker.log(), 30, "the idle warm start to end")
    states = {e["name"]: e.get("state", "UNAVAILABLE") for e in fresh_triton.repository_index()}
    assert states == {"densenet_like": "UNAVAILABLE", "adder": "UNAVAILABLE"}, "the warm start loads no remote model"
    assert "warmed echo " in worker.log() and "warmed classifier" not in worker.log()  # local ones only
    client = Client(settings=Client().settings.model_copy(update={"models_file": models}))
    image = b64_image(5)
    classified = client.submit("classifier", image).get(timeout=60)
    assert [entry["label"] for entry in classified] == [
        LABELS[i] for i in np.argsort(-direct_infer(fresh_triton.url, "densenet_like",
                                                    {"data_0": reference_tensor(image)[None]}, ["fc6_1"])
                                      ["fc6_1"][0])[:3]
    ]
    assert fresh_triton.state("densenet_like") == "READY"
    # local loads (one local slot: echo2 evicts echo) leave the Triton model loaded on its server
    assert client.submit("echo", "one").get(timeout=30)["echo"] == "one"
    assert client.submit("echo2", "two").get(timeout=30)["echo"] == "two"
    assert fresh_triton.state("densenet_like") == "READY"
    # a second Triton model takes the one remote slot: the first is unloaded on the server, the local one stays
    added = client.submit("adder", {"inputs": {"INPUT0": [1] * 4, "INPUT1": [2] * 4}}).get(timeout=60)
    assert added == {"SUM": [3] * 4, "DIFF": [-1] * 4}
    assert fresh_triton.state("densenet_like") == "UNAVAILABLE" and fresh_triton.state("adder") == "READY"
    assert client.submit("echo2", "still loaded").get(timeout=30)["echo"] == "still loaded"
    assert "loaded echo2" not in worker.log().split("loaded adder")[-1], "echo2 was not evicted by the Triton load"
