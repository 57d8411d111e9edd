"""A real OTLP/HTTP trace receiver for the tests: it takes the protobuf ``ExportTraceServiceRequest`` POSTs the
OpenTelemetry SDK's exporter sends to ``/v1/traces``, decodes them with ``opentelemetry-proto`` and keeps each span
as a plain ``Span``; ``tree`` draws the spans of one trace as text."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bench.httpd import QuietHandler, close, serve
from tests.redis_server import free_port

_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class Span:
    """One received span: ids in hex, times in epoch nanoseconds, its service (``service.name``)."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...] = ()
    status: int = 0
    events: tuple[str, ...] = field(default=())

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind is not None else None


def _spans(request: ExportTraceServiceRequest) -> list[Span]:
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                found.append(Span(
                    service=str(resource.get("service.name", "")), name=s.name, kind=_KINDS.get(s.kind, "?"),
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_id=s.parent_span_id.hex(),
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    attributes={a.key: _value(a.value) for a in s.attributes},
                    links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                    status=s.status.code, events=tuple(e.name for e in s.events),
                ))
    return found


class OtlpReceiver:
    """Listens on 127.0.0.1:``port`` once ``start``ed; ``spans`` holds every span received."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.spans: list[Span] = []
        self._lock = threading.Condition()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        """What ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set to (the exporter adds ``/v1/traces``)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver._lock:
                    receiver.spans.extend(_spans(request))
                    receiver._lock.notify_all()
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self._server = serve(Handler, self.port)
        return self

    def wait_for(self, found: Callable[[list[Span]], bool], timeout_s: float, what: str) -> list[Span]:
        """Wait until ``found(spans)`` holds (or raise AssertionError naming ``what`` and the spans so far)."""
        with self._lock:
            if not self._lock.wait_for(lambda: found(list(self.spans)), timeout_s):
                names = sorted({f"{s.service}: {s.name}" for s in self.spans})
                raise AssertionError(f"no {what} after {timeout_s} s; received: {names}")
            return list(self.spans)

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def stop(self) -> None:
        if self._server is not None:
            close(self._server)


def tree(spans: Sequence[Span], shown: Sequence[str] = ("swapless.model.id", "swapless.batch.size", "swapless.load",
                                                        "http.response.status_code")) -> str:
    """The spans of one trace as an indented tree: each span's service, name, kind, start (ms after the trace's
    first) and duration, and the ``shown`` attributes it has; children in start order; links noted."""
    by_id = {s.span_id: s for s in spans}
    children: dict[str, list[Span]] = {}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in by_id else "", []).append(s)
    origin = min((s.start_ns for s in spans), default=0)
    lines: list[str] = []

    def draw(span: Span, prefix: str, last: bool, top: bool) -> None:
        extra = [f"{k}={span.attributes[k]}" for k in shown if k in span.attributes]
        if span.links:
            extra.append(f"links={len(span.links)}")
        branch = "" if top else ("└─ " if last else "├─ ")
        head = f"{span.name} ({span.kind}, {span.service})"
        timing = f"+{(span.start_ns - origin) / 1e6:7.1f} ms {span.duration_ms:7.1f} ms"
        lines.append(f"{timing}  {prefix}{branch}{head}" + (f"  {' '.join(extra)}" if extra else ""))
        kids = sorted(children.get(span.span_id, []), key=lambda s: s.start_ns)
        inner = prefix if top else prefix + ("   " if last else "│  ")
        for i, kid in enumerate(kids):
            draw(kid, inner, i == len(kids) - 1, False)

    for root in sorted(children.get("", []), key=lambda s: s.start_ns):
        draw(root, "", True, True)
    return "\n".join(lines)
