"""The trace context's plumbing without a worker: reading a ``traceparent``, what a producer carries with no tracer
provider, the spans of one batch (a batch of one trace under it, a batch of many linking them), and a webhook's
span. Spans go to the SDK's in-memory exporter through a provider made here (the process's global provider is
never set: other tests' producers would carry traces)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import redis
from opentelemetry import context, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import SecretStr

from swapless.config.settings import Settings
from swapless.manager import Job, Outcome
from swapless.manager.cache.entries import CacheStats
from swapless.tasks import tracing
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.webhooks import WebhookDelivery, WebhookQueue
from swapless.tasks.worker.spans import BatchSpans, traces_note
from swapless.tasks.worker.webhooks import WebhookSender
from tests.webhook_receiver import SECRET

A = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
B = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def exported() -> Iterator[tuple[Any, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("test"), exporter
    provider.shutdown()


def test_a_traceparent_is_read_without_opentelemetry_and_the_environment_decides() -> None:
    assert tracing.trace_id_of(A) == "0af7651916cd43dd8448eb211c80319c"
    assert tracing.trace_id_of("00-" + "0" * 32 + "-b7ad6b7169203331-01") is None
    assert tracing.trace_id_of("garbage") is None and tracing.trace_id_of(None) is None
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not tracing.wanted({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})


def test_a_producer_with_no_provider_carries_only_its_callers_context() -> None:
    with tracing.sending("q", 1, lambda: pytest.fail("no span to name")) as carried:
        assert carried is None
    token = context.attach(tracing.remote_parent(A))  # a request's context, as the gateway's middleware sets it
    try:
        with tracing.sending("q", 3, "sentiment") as carried:
            assert carried is not None and carried["traceparent"] == A
        assert tracing.current_traceparent() == A
    finally:
        context.detach(token)
    assert context.get_value("x") is None and tracing.remote_parent("nonsense") == context.Context()


def _jobs(traces: list[str | None]) -> list[Job]:
    return [Job(id=f"j{i}", model_id="m", input="x", received_s=time.monotonic() - 0.05, trace=t)
            for i, t in enumerate(traces)]


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def test_a_batch_of_one_trace_runs_inside_it(exported: tuple[Any, InMemorySpanExporter]) -> None:
    tracer, exporter = exported
    stats = CacheStats()
    manager: Any = SimpleNamespace(stats=stats)
    jobs = _jobs([A, A, None])
    traced = BatchSpans(tracer, "q").start("m", jobs, manager)
    assert traced is not None and BatchSpans(tracer, "q").start("m", _jobs([None]), manager) is None
    traced.on_loaded(None)()
    stats.load_seconds["m"] = [0.5]  # the batch loaded its model from disk
    traced.ran([Outcome(jobs[0], result=1), Outcome(jobs[1], error=None), Outcome(jobs[2], result=3)])
    traced.stored(time.time_ns(), time.time_ns())
    spans = _by_name(exporter.get_finished_spans())
    assert sorted(spans) == ["forward m", "load m", "process m", "run m", "store m", "wait m"]
    process, run = spans["process m"][0], spans["run m"][0]
    assert process.parent is not None and f"{process.context.trace_id:032x}" == tracing.trace_id_of(A)
    assert process.parent.span_id == int(A[36:52], 16) and process.kind == trace.SpanKind.CONSUMER
    assert process.attributes is not None and process.attributes["messaging.batch.message_count"] == 2
    assert run.parent is not None and run.parent.span_id == process.context.span_id and not run.links
    assert run.attributes is not None and run.attributes["swapless.load"] == "disk"
    assert run.attributes["swapless.batch.size"] == 3
    assert {s.parent.span_id for n in ("load m", "forward m", "store m") for s in spans[n] if s.parent} == {
        run.context.span_id}
    assert traces_note(jobs) == " [trace 0af7651916cd43dd8448eb211c80319c]"


def test_a_batch_of_many_traces_links_them(exported: tuple[Any, InMemorySpanExporter]) -> None:
    tracer, exporter = exported
    jobs = _jobs([A, B, B])
    traced = BatchSpans(tracer, "q").start("m", jobs, SimpleNamespace(stats=CacheStats()))  # type: ignore[arg-type]
    assert traced is not None
    traced.on_loaded(None)()
    traced.ran([Outcome(job, result=1) for job in jobs])
    traced.stored(time.time_ns(), time.time_ns())
    spans = _by_name(exporter.get_finished_spans())
    run = spans["run m"][0]
    assert run.parent is None  # a trace of its own, linked to each producer's span
    assert {link.context.span_id for link in run.links} == {int(A[36:52], 16), int(B[36:52], 16)}
    assert run.attributes is not None and run.attributes["swapless.load"] == "none" and "load m" not in spans
    processes = spans["process m"]
    assert {f"{p.context.trace_id:032x}" for p in processes} == {tracing.trace_id_of(A), tracing.trace_id_of(B)}
    assert all([link.context.span_id for link in p.links] == [run.context.span_id] for p in processes)
    assert len(spans["wait m"]) == 2
    assert traces_note(jobs).startswith(" [traces ") and traces_note(_jobs([None])) == ""


def test_a_webhook_is_a_span_of_its_jobs_trace_and_carries_it(
    exported: tuple[Any, InMemorySpanExporter], redis_url: str, key_prefix: str, settings: Settings
) -> None:
    tracer, exporter = exported
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    client = redis.Redis.from_url(redis_url)
    queue = WebhookQueue(client, Keyspace("q", key_prefix), ttl_s=60, max_pending=3, max_failed=2)
    s = settings.model_copy(update={"webhook_secret": SecretStr(SECRET), "webhook_allowed_hosts": "hooks.test"})
    sender = WebhookSender(queue, s.webhooks, transport=httpx.MockTransport(answer), resolve=lambda host: ["10.0.0.7"],
                           tracer=tracer)
    queue.enqueue([WebhookDelivery("job-1", "http://hooks.test/h?token=secret", json.dumps({"x": 1}), traceparent=A)])
    sender.start()
    try:
        deadline = time.monotonic() + 10
        while not exporter.get_finished_spans() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        sender.stop()
        client.close()
    [span] = exporter.get_finished_spans()
    assert span.name == "webhook" and span.kind == trace.SpanKind.CLIENT and span.parent is not None
    assert span.parent.span_id == int(A[36:52], 16) and span.attributes is not None
    assert span.attributes["url.full"] == "http://hooks.test/h"  # no query: it may hold a token
    carried = seen[0].headers["traceparent"]
    assert tracing.trace_id_of(carried) == tracing.trace_id_of(A) and carried[36:52] == f"{span.context.span_id:016x}"
