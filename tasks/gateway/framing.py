"""The gateway's outermost ASGI middleware: Host, Origin and framing checks, and the body bounded in bytes and time.

docs/operations/security.md lists the checks and their settings.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LOOPBACK_HOSTS", "ASGIApp", "BodyLimit", "Receive", "RequestGuard", "Scope", "Send", "openai_error", "reply",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The host names a loopback gateway answers to by default.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_DIGITS = re.compile(rb"[0-9]{1,19}")
_DISCONNECT: Message = {"type": "http.disconnect"}


#: OpenAI's error ``type`` by status (what its clients map to their exception classes).
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
                 422: "invalid_request_error", 429: "rate_limit_error"}


def openai_error(status: int, message: str, errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An error body in OpenAI's shape; ``param``: the first invalid field of a body, else None."""
    param = None
    if errors:
        loc = [str(part) for part in errors[0].get("loc", ()) if part not in ("body", "query", "path")]
        param = ".".join(loc) or None
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


async def reply(scope: Scope, send: Send, status: int, detail: str, headers: Iterable[tuple[bytes, bytes]] = (),
                *, close: bool = False) -> None:
    """Send a whole JSON error response in the path's protocol's shape; ``close``: close the connection after it."""
    path = scope.get("path", "")
    if path == "/v1" or path.startswith("/v1/"):
        payload = json.dumps(openai_error(status, detail)).encode()
    else:
        payload = json.dumps({"error" if path.startswith("/v2/") else "detail": detail}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *headers]
    if close:
        head.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": payload})


def host_name(value: str) -> str:
    """The host of a ``Host`` header or an origin's authority, lower-cased, without its port or IPv6 brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


@dataclass(frozen=True)
class BodyLimit:
    """A bound on a request body: its bytes and time, the settings that set them, and what the body carries."""

    bytes: int
    setting: str
    what: str
    timeout_s: float | None = None
    timeout_setting: str = ""

    def over(self) -> str:
        """The end of the 413 message, after "request body [of N bytes]"."""
        if not self.what:
            return f"is over the limit of {self.bytes} bytes ({self.setting})"
        return f"is over the {self.bytes} bytes {self.what} ({self.setting}): send a smaller input"


class RequestGuard:
    """ASGI middleware: Host, Origin and framing checks, then a body bounded in bytes and time.

    Args:
        app: the application it guards.
        max_body_bytes: the most bytes a request body may have, unless its path has a bound of its own.
        body_timeout_s: the most seconds a body may take to arrive, from the app's first read.
        allowed_hosts: host names answered to (lower case, no port); None: any.
        allowed_origins: origins whose cross-origin requests are let through.
        body_limits: per path of a ``POST``, a bound for its body.
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, body_timeout_s: float,
                 allowed_hosts: frozenset[str] | None, allowed_origins: frozenset[str],
                 body_limits: Mapping[str, BodyLimit] | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_limits = dict(body_limits or {})
        self.body_timeout_s = body_timeout_s
        self.allowed_hosts = allowed_hosts
        self.allowed_origins = allowed_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":  # the gateway has no websocket route
                await send({"type": "websocket.close", "code": 1008, "reason": "no websocket endpoints here"})
                return
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            status, detail = refusal
            await reply(scope, send, status, detail, close=True)
            return
        limit = self._limit(scope)
        timeout_s, setting = ((limit.timeout_s, limit.timeout_setting) if limit.timeout_s is not None
                              else (self.body_timeout_s, "SWAPLESS_GATEWAY_BODY_TIMEOUT_S"))
        body = _BoundedBody(scope, receive, send, limit, timeout_s, setting)
        await self.app(scope, body.receive, body.send)

    def _limit(self, scope: Scope) -> BodyLimit:
        """The bound of this request's body: its route's, else ``SWAPLESS_GATEWAY_MAX_BODY_BYTES``."""
        own = self.body_limits.get(scope.get("path", "")) if scope.get("method") == "POST" else None
        if own is not None:
            return own
        return BodyLimit(self.max_body_bytes, "SWAPLESS_GATEWAY_MAX_BODY_BYTES", "")

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        """The status and message of a request whose headers alone refuse it; None when they do not."""
        seen: dict[bytes, list[bytes]] = {b"host": [], b"content-length": [], b"transfer-encoding": [], b"origin": []}
        for name, value in scope.get("headers", ()):
            if name in seen:
                seen[name].append(value)
        return (self._origin_refusal(seen[b"host"], seen[b"origin"])
                or self._length_refusal(scope, seen[b"content-length"], seen[b"transfer-encoding"]))

    def _origin_refusal(self, hosts: list[bytes], origins: list[bytes]) -> tuple[int, str] | None:
        """Refuses a request without exactly one allowed Host, or from a web page of an origin not allowed."""
        if len(hosts) != 1:
            return 400, "send exactly one Host header"
        host_header = hosts[0].decode("latin-1")
        host = host_name(host_header)
        if self.allowed_hosts is not None and host not in self.allowed_hosts:
            allowed = ", ".join(sorted(self.allowed_hosts))
            return 400, (f"this gateway answers to the hosts {allowed}, not {host!r}: address it by one of them, or "
                         "add the name to SWAPLESS_GATEWAY_ALLOWED_HOSTS")
        if origins:
            origin = origins[0].decode("latin-1").strip().lower()
            same = origin.partition("://")[2] == host_header.strip().lower()
            if not same and origin not in self.allowed_origins:
                return 403, (f"requests from web pages of {origin} are refused: call the gateway from a server, or "
                             "add the origin to SWAPLESS_GATEWAY_ALLOWED_ORIGINS")
        return None

    def _length_refusal(self, scope: Scope, lengths: list[bytes], encodings: list[bytes]) -> tuple[int, str] | None:
        """Refuses ambiguous framing, and a declared length over the route's bound."""
        if encodings and lengths:
            return 400, "the request has both Content-Length and Transfer-Encoding: send one of them"
        if encodings and any(e.strip().lower() != b"chunked" for e in encodings):
            return 400, "the only Transfer-Encoding taken is chunked: send the body chunked or with a Content-Length"
        if len(lengths) > 1:
            return 400, "the request has several Content-Length headers: send one"
        if lengths:
            if not _DIGITS.fullmatch(lengths[0].strip()):
                return 400, "Content-Length is not a number of bytes: send the body's length in ASCII digits"
            declared = int(lengths[0])
            limit = self._limit(scope)
            if declared > limit.bytes:
                return 413, f"request body of {declared} bytes {limit.over()}"
        return None


class _BoundedBody:
    """One request's ``receive`` and ``send``, the body counted and timed; past a bound, refused here."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, limit: BodyLimit, timeout_s: float,
                 timeout_setting: str) -> None:
        self.scope, self._receive, self._send = scope, receive, send
        self.limit, self.timeout_s, self.timeout_setting = limit, timeout_s, timeout_setting
        self.deadline: float | None = None  # set by the first read
        self.seen = 0
        self.complete = False
        self.started = False
        self.refused = False

    async def receive(self) -> Message:
        if self.refused:
            return _DISCONNECT
        if self.complete:  # the body is in: what comes now is a disconnect, whenever it comes
            return await self._receive()
        if self.deadline is None:
            self.deadline = time.monotonic() + self.timeout_s
        try:
            message = await asyncio.wait_for(self._receive(), max(0.0, self.deadline - time.monotonic()))
        except TimeoutError:
            await self._refuse(408, f"the request body did not arrive within {self.timeout_s:g} s "
                               f"({self.timeout_setting}): send it at once")
            return _DISCONNECT
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.limit.bytes:
                await self._refuse(413, f"request body {self.limit.over()}")
                return _DISCONNECT
            self.complete = not message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def _refuse(self, status: int, detail: str) -> None:
        self.refused = True
        if not self.started:
            await reply(self.scope, self._send, status, detail, close=True)
