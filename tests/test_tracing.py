"""Traces through the queue: a real worker and a real gateway exporting OTLP to a real receiver in this process
(``tests.otlp_receiver``), and producers that trace their requests with the OpenTelemetry SDK: ``Client``, a plain
Celery producer instrumented by ``opentelemetry-instrumentation-celery``, ``POST /predict`` with a ``traceparent``
(``tests.traced_producer``), ``swapless bulk``, and the batch API. Each job's worker spans are in its producer's
trace and name the model; its status and the worker's log line name the trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from swapless import Client
from tests.conftest import REPO, WorkerProcess
from tests.otlp_receiver import OtlpReceiver, Span, tree
from tests.stack import GatewayProcess, run_cli, wait_for, worker_and_gateway

pytestmark = [pytest.mark.slow]

MODEL = "sentiment"
WORKER = "swapless-worker"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def traced(
    redis_url: str, text_models_file: Path, tmp_path_factory: pytest.TempPathFactory, receiver: OtlpReceiver
) -> Iterator[tuple[dict[str, str], WorkerProcess, GatewayProcess]]:
    """A worker and a gateway exporting their spans to ``receiver`` within a tenth of a second."""
    root = tmp_path_factory.mktemp("traced")
    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
            "SWAPLESS_BATCH_FILES_URL": str(root / "files")}
    with worker_and_gateway(redis_url, text_models_file, root, "traced@%h", "--log-level", "info", **otel) as stack:
        yield stack


def _worker_span(name: str, trace_id: str) -> Any:
    def found(spans: list[Span]) -> bool:
        return any(s.trace_id == trace_id and s.service == WORKER and s.name == name
                   and s.attributes.get("swapless.model.id") == MODEL for s in spans)
    return found


def _one(spans: list[Span], name: str, service: str | None = None) -> Span:
    matching = [s for s in spans if s.name == name and (service is None or s.service == service)]
    assert len(matching) == 1, (name, [(s.service, s.name) for s in spans])
    return matching[0]


def test_worker_spans_join_the_trace_of_each_producer(
    traced: tuple[dict[str, str], WorkerProcess, GatewayProcess], receiver: OtlpReceiver
) -> None:
    env, worker, gateway = traced
    produced = subprocess.run([sys.executable, "-m", "tests.traced_producer", gateway.url, MODEL], cwd=REPO,
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False)
    assert produced.returncode == 0, produced.stderr[-3000:]
    sent = json.loads(produced.stdout.splitlines()[-1])
    for way, info in sent.items():
        receiver.wait_for(_worker_span(f"store {MODEL}", info["trace_id"]), 20, f"the worker's spans of {way}")

    # Client: user span -> send (producer) -> process (worker) -> wait, run -> load, forward, store
    spans = receiver.trace(sent["client"]["trace_id"])
    checkout, send = _one(spans, "checkout"), _one(spans, f"send {MODEL}")
    process, wait, run = (_one(spans, f"{n} {MODEL}", WORKER) for n in ("process", "wait", "run"))
    assert send.parent_id == checkout.span_id and send.kind == "producer"
    assert process.parent_id == send.span_id and process.kind == "consumer"
    assert process.attributes["messaging.message.id"] == sent["client"]["job_id"]
    assert wait.parent_id == run.parent_id == process.span_id
    assert run.attributes["swapless.load"] == "disk" and run.attributes["swapless.batch.size"] == 1
    children = {s.name for s in spans if s.parent_id == run.span_id}
    assert children == {f"load {MODEL}", f"forward {MODEL}", f"store {MODEL}"}
    assert wait.end_ns <= run.start_ns + 1_000_000 and process.end_ns >= run.end_ns
    if os.environ.get("SWAPLESS_TRACE_TREE"):  # where to draw this trace (docs/guides/tracing.md shows one)
        Path(os.environ["SWAPLESS_TRACE_TREE"]).write_text(tree(spans) + "\n")

    # plain Celery: the worker's spans are children of the instrumentation's apply_async span
    spans = receiver.trace(sent["celery"]["trace_id"])
    process = _one(spans, f"process {MODEL}", WORKER)
    assert _one(spans, "celery-producer").span_id != process.parent_id  # the span send_task made, not the user's
    assert _one(spans, f"run {MODEL}", WORKER).attributes["swapless.load"] == "none"

    # the gateway: the caller's span -> POST /predict (server) ... send -> the worker's process
    receiver.wait_for(lambda s: any(x.name == "POST /predict" for x in s), 10, "the gateway's span")
    spans = receiver.trace(sent["gateway"]["trace_id"])
    caller, request = _one(spans, "http-caller"), _one(spans, "POST /predict", "swapless-gateway")
    assert request.parent_id == caller.span_id and request.attributes["http.response.status_code"] == 200
    gateway_send = _one(spans, f"send {MODEL}", "swapless-gateway")
    assert _ancestors(spans, gateway_send)[-2:] == [request.span_id, caller.span_id]  # under the request's span
    assert _one(spans, f"process {MODEL}", WORKER).parent_id == gateway_send.span_id

    # each job's status and the worker's log line name its trace
    client = Client(validate=False)
    try:
        for info in sent.values():
            assert client.job(info["job_id"]).status().trace_id == info["trace_id"]
    finally:
        client.close()
    job = sent["gateway"]["job_id"]
    assert httpx.get(f"{gateway.url}/jobs/{job}", timeout=10).json()["trace_id"] == sent["gateway"]["trace_id"]
    shown = run_cli("result", sent["client"]["job_id"], env=env)
    assert json.loads(shown.stdout)["trace_id"] == sent["client"]["trace_id"], shown.stderr
    log = worker.log()
    assert all(f"[trace {info['trace_id']}]" in log for info in sent.values()), log[-3000:]


def test_a_bulk_run_is_one_trace_with_a_span_per_chunk(
    traced: tuple[dict[str, str], WorkerProcess, GatewayProcess], receiver: OtlpReceiver, tmp_path: Path
) -> None:
    env, _, _ = traced
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps({"text": f"review {i}"}) + "\n" for i in range(40)))
    done = run_cli("bulk", MODEL, str(source), "-o", str(out), "--chunk-size", "10",
                   env={**env, "OTEL_SERVICE_NAME": "bulk-cli"})
    assert done.returncode == 0, done.stderr[-3000:]
    spans = receiver.wait_for(lambda s: any(x.service == "bulk-cli" and x.name == f"bulk {MODEL}" for x in s), 10,
                              "the bulk run's span")
    run = _one([s for s in spans if s.service == "bulk-cli"], f"bulk {MODEL}")
    spans = receiver.wait_for(
        lambda s: sum(1 for x in s if x.trace_id == run.trace_id and x.name == f"process {MODEL}") >= 4, 20,
        "the worker's spans of each chunk")
    sends = [s for s in spans if s.trace_id == run.trace_id and s.name == f"send {MODEL}"]
    assert len(sends) == 4 and all(s.parent_id == run.span_id for s in sends)
    assert all(s.attributes["swapless.chunk.inputs"] == 10 for s in sends)
    processes = [s for s in spans if s.trace_id == run.trace_id and s.name == f"process {MODEL}"]
    assert {p.parent_id for p in processes} <= {s.span_id for s in sends}


def test_a_batch_is_one_trace(
    traced: tuple[dict[str, str], WorkerProcess, GatewayProcess], receiver: OtlpReceiver
) -> None:
    _, _, gateway = traced
    lines = "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/predict",
                                "body": {"model_id": MODEL, "input": f"line {i}"}}) + "\n" for i in range(6))
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        uploaded = http.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", lines.encode())})
        assert uploaded.status_code == 200, uploaded.text
        created = http.post("/v1/batches", json={"input_file_id": uploaded.json()["id"], "endpoint": "/predict",
                                                 "completion_window": "24h"})
        assert created.status_code == 200, created.text
        batch_id = created.json()["id"]
        wait_for(lambda: http.get(f"/v1/batches/{batch_id}").json()["status"] == "completed", 60, 0.2,
                 what=f"batch {batch_id}")
    spans = receiver.wait_for(lambda s: any(x.name == f"batch {batch_id}" for x in s), 10, "the batch's span")
    batch = _one(spans, f"batch {batch_id}")
    _one(receiver.trace(batch.trace_id), "POST /v1/batches")  # it goes on in the trace of the request that made it
    receiver.wait_for(_worker_span(f"process {MODEL}", batch.trace_id), 20, "the worker's spans of the batch")


def _ancestors(spans: list[Any], span: Any) -> list[str]:
    """The ids of ``span``'s ancestors among ``spans``, nearest first; a parent missing from them ends the list with
    its id (a chain broken there)."""
    by_id = {s.span_id: s for s in spans}
    found = []
    parent = span.parent_id
    while parent:
        found.append(parent)
        if parent not in by_id:
            break
        parent = by_id[parent].parent_id
    return found
