"""The gateway's requests in their callers' traces: ``TraceRequests``, an ASGI middleware."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI

from swapless.tasks.tracing import TRACE_HEADERS, context_of

__all__ = ["TraceRequests", "fastapi_traces_requests"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_NAMES = frozenset(name.encode() for name in TRACE_HEADERS)


def fastapi_traces_requests() -> bool:
    """Whether this FastAPI makes the requests' spans itself, through the global tracer provider (its
    ``telemetry`` option)."""
    return "telemetry" in inspect.signature(FastAPI).parameters


class TraceRequests:
    """ASGI middleware: HTTP requests in their callers' traces.

    Args:
        app: the ASGI app it wraps.
        tracer: makes a SERVER span of each request (None: only the caller's context is carried).
    """

    def __init__(self, app: ASGIApp, tracer: Any = None) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carried = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ()) if k in _NAMES}
        if self.tracer is None:
            if not carried:
                await self.app(scope, receive, send)
                return
            from opentelemetry import context

            token = context.attach(context_of(carried))
            try:
                await self.app(scope, receive, send)
            finally:
                context.detach(token)
            return
        await self._traced(scope, receive, send, carried)

    async def _traced(self, scope: Scope, receive: Receive, send: Send, carried: dict[str, str]) -> None:
        from opentelemetry import trace

        method = str(scope.get("method", "GET"))
        status: list[int] = []

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        attributes = {"http.request.method": method, "url.path": str(scope.get("path", "")),
                      "url.scheme": str(scope.get("scheme", "http"))}
        with self.tracer.start_as_current_span(method, context=context_of(carried), kind=trace.SpanKind.SERVER,
                                               attributes=attributes) as span:
            try:
                await self.app(scope, receive, sending)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if isinstance(route, str):
                    span.set_attribute("http.route", route)
                    span.update_name(f"{method} {route}")
                if status:
                    span.set_attribute("http.response.status_code", status[0])
                    if status[0] >= 500:
                        span.set_status(trace.StatusCode.ERROR, f"HTTP {status[0]}")
