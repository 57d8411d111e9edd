"""Trace context through the queue: OpenTelemetry, set up by the standard ``OTEL_*`` variables alone.

``sending`` makes a producer's ``send`` span and the W3C headers each message carries; ``working`` a span of
Swapless's own work; ``configure`` sets the SDK up for a Swapless process; ``trace_id_of`` reads a trace id.
Off, tracing costs a producer one lookup per send and a worker nothing. See docs/guides/tracing.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = [
    "TRACEPARENT_HEADER",
    "TRACE_HEADERS",
    "configure",
    "context_of",
    "current_traceparent",
    "remote_parent",
    "sending",
    "shutdown",
    "trace_id_of",
    "tracer",
    "wanted",
    "working",
]

logger = logging.getLogger(__name__)

#: The W3C trace context header a message carries (Celery's instrumentation puts it in the message headers too).
TRACEPARENT_HEADER = "traceparent"
#: Every header of the trace context that travels with a job.
TRACE_HEADERS = (TRACEPARENT_HEADER, "tracestate", "baggage")
#: The instrumentation name of Swapless's spans.
TRACER_NAME = "swapless"
#: ``messaging.system`` of every span: the broker the messages go through.
MESSAGING_SYSTEM = "redis"

_ON_VALUES = frozenset({"otlp", "console"})


def trace_id_of(traceparent: object) -> str | None:
    """The trace id (32 hex digits) of a W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``); None when
    ``traceparent`` is not one."""
    if not isinstance(traceparent, str) or len(traceparent) < 55 or traceparent[2] != "-":
        return None
    trace_id = traceparent[3:35]
    if trace_id == "0" * 32 or traceparent[35] != "-":
        return None
    try:
        int(trace_id, 16)
    except ValueError:
        return None
    return trace_id


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables ask this process to export traces (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    if exporters:
        return bool(exporters & _ON_VALUES)
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(service_name: str) -> Any:
    """Set the SDK up for this process when the environment asks for traces (``wanted``).

    Args:
        service_name: the default of ``OTEL_SERVICE_NAME``.

    Returns:
        the tracer provider set up here (its caller shuts it down), or None: no traces asked for, the SDK missing,
        or the process has a provider of its own.
    """
    if not wanted():
        return None
    from opentelemetry import trace

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        logger.warning("OTEL_* variables ask for traces but opentelemetry-sdk is not installed: no spans are "
                       "exported (pip install 'swapless[tracing]')")
        return None
    exporters: list[SpanExporter] = []
    names = {e.strip().lower() for e in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if e.strip()}
    if "console" in names:
        exporters.append(ConsoleSpanExporter())
    if "otlp" in names:
        otlp = _otlp_exporter()
        if otlp is None:
            return None
        exporters.append(otlp)
    resource = Resource.create({} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name})
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    logger.info("tracing: spans of %s exported (%s)", resource.attributes.get(SERVICE_NAME), ", ".join(sorted(names)))
    return provider


def _otlp_exporter() -> Any:
    """The OTLP exporter of the protocol asked for (``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``, ``http/protobuf`` by
    default); None, said once, when its package is missing."""
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

            return Grpc()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

        return Http()
    except ImportError:
        package = "opentelemetry-exporter-otlp-proto-" + ("grpc" if protocol == "grpc" else "http")
        logger.warning("OTEL_* variables ask for OTLP traces but %s is not installed: no spans are exported", package)
        return None


def tracer() -> Any:
    """Swapless's tracer (through the global provider: ``configure`` may set it up later)."""
    from opentelemetry import trace

    return trace.get_tracer(TRACER_NAME)


def shutdown(provider: Any) -> None:
    """Export the spans ``provider`` (``configure``'s) still holds and stop its exporters; None: nothing to do."""
    if provider is None:
        return
    try:
        provider.shutdown()
    except Exception as err:  # noqa: BLE001 - an exporter that cannot flush must not fail the exit
        logger.warning("could not export the last spans (%s)", err)


def current_traceparent() -> str | None:
    """The ``traceparent`` of the current span (a request's, with the gateway's ``TraceRequests``), if any."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None or not api.get_current_span().get_span_context().is_valid:
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get(TRACEPARENT_HEADER)


def working(name: str, attributes: Mapping[str, Any] | None = None, parent: str | None = None
            ) -> contextlib.AbstractContextManager[str | None]:
    """A span of Swapless's own work (a bulk run, a batch), current while it runs; yields its ``traceparent``.

    Without a tracer provider, ``parent`` is made current without a span, so that the sends still carry it.

    Args:
        name: the span's name.
        attributes: its attributes.
        parent: a ``traceparent`` to continue; else the current span's, else a new trace.
    """
    api = sys.modules.get("opentelemetry.trace")
    if parent is None and (api is None or isinstance(api.get_tracer_provider(), api.ProxyTracerProvider)):
        return _NOTHING
    return _work_span(name, attributes or {}, parent)


@contextlib.contextmanager
def _work_span(name: str, attributes: Mapping[str, Any], parent: str | None) -> Iterator[str | None]:
    from opentelemetry import context, trace

    outer = context_of({TRACEPARENT_HEADER: parent}) if parent is not None else None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        token = context.attach(outer if outer is not None else context.get_current())
        try:
            yield parent
        finally:
            context.detach(token)
        return
    with tracer().start_as_current_span(name, context=outer, attributes=attributes):
        yield current_traceparent()


def remote_parent(traceparent: str) -> Any:
    """The context of a W3C ``traceparent`` alone, read directly (a worker reads one per trace of each batch; the
    global propagator's extract costs five times as much); an empty context when it is not one."""
    from opentelemetry import context, trace

    trace_id = trace_id_of(traceparent)
    try:
        span_id, flags = int(traceparent[36:52], 16), int(traceparent[53:55], 16)
    except ValueError:
        span_id = 0
    if trace_id is None or not span_id or traceparent[52] != "-":
        return context.Context()
    parent = trace.SpanContext(int(trace_id, 16), span_id, is_remote=True, trace_flags=trace.TraceFlags(flags & 1))
    return trace.set_span_in_context(trace.NonRecordingSpan(parent), context.Context())


def context_of(headers: Mapping[str, Any]) -> Any:
    """The OpenTelemetry context a message's (or a request's) trace headers carry."""
    from opentelemetry import propagate

    return propagate.extract({k: v for k in TRACE_HEADERS if isinstance(v := headers.get(k), str)})


#: What ``sending`` gives when there is no trace to carry (reusable).
_NOTHING: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


def sending(destination: str, jobs: int, model: str | Callable[[], str | None] | None = None,
            attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[dict[str, str] | None]:
    """The ``send`` span of one publish and the trace headers its messages carry (None: no trace to carry).

    Args:
        destination: the queue.
        jobs: the messages sent.
        model: the model they address, if one; a callable is called only when there is a span to name.
        attributes: more attributes of the span.
    """
    api = sys.modules.get("opentelemetry.trace")
    if api is None:  # nothing imported OpenTelemetry: no span can be current, no provider set
        return _NOTHING
    current = api.get_current_span().get_span_context().is_valid
    if not current and isinstance(api.get_tracer_provider(), api.ProxyTracerProvider):
        return _NOTHING
    return _send_span(api, destination, jobs, model() if callable(model) else model, attributes or {})


@contextlib.contextmanager
def _send_span(api: Any, destination: str, jobs: int, model: str | None, extra: Mapping[str, Any]
               ) -> Iterator[dict[str, str] | None]:
    from opentelemetry import propagate

    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": destination,
        "messaging.batch.message_count": jobs,
        **extra,
    }
    if model is not None:
        attributes["swapless.model.id"] = model
    name = f"send {model if model is not None else destination}"
    with api.get_tracer(TRACER_NAME).start_as_current_span(name, kind=api.SpanKind.PRODUCER,
                                                           attributes=attributes):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield carrier if TRACEPARENT_HEADER in carrier else None
