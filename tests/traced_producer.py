"""A producer process that traces its requests with the OpenTelemetry SDK, as a user's app would, and sends jobs
three ways, each inside a span of its own: ``Client.submit``; a plain Celery ``send_task`` with
``opentelemetry-instrumentation-celery`` active; ``POST /predict`` to a gateway with the span's ``traceparent``.

    python -m tests.traced_producer GATEWAY_URL MODEL

It exports to ``OTEL_EXPORTER_OTLP_ENDPOINT`` and prints one JSON line: per way, the trace id of its span and the
id of the job it sent. The ``SWAPLESS_*`` variables name the queue and the models.
"""

from __future__ import annotations

import json
import sys

import httpx
from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from swapless import Client
from swapless.tasks.protocol import PREDICT_TASK


def main(gateway_url: str, model: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "user-app"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()
    tracer = trace.get_tracer("user-app")
    sent: dict[str, dict[str, str]] = {}
    client = Client()
    try:
        with tracer.start_as_current_span("checkout") as span:
            job = client.submit(model, "a lovely traced day")
            job.get(timeout=60)
            sent["client"] = {"trace_id": f"{span.get_span_context().trace_id:032x}", "job_id": job.id}
        with tracer.start_as_current_span("celery-producer") as span:
            result = client.app.send_task(PREDICT_TASK, args=[model, "sent by plain celery"], queue=client.queue)
            client.job(result.id).get(timeout=60)
            sent["celery"] = {"trace_id": f"{span.get_span_context().trace_id:032x}", "job_id": result.id}
        with tracer.start_as_current_span("http-caller") as span:
            headers: dict[str, str] = {}
            propagate.inject(headers)
            reply = httpx.post(f"{gateway_url}/predict", json={"model_id": model, "input": "over http"},
                               headers=headers, timeout=60)
            reply.raise_for_status()
            sent["gateway"] = {"trace_id": f"{span.get_span_context().trace_id:032x}", "job_id": reply.json()["job_id"]}
    finally:
        client.close()
        provider.shutdown()
    sys.stdout.write(json.dumps(sent) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
