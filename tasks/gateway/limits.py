"""ASGI middleware of the gateway: a bound on request bodies, enforced before anything is parsed."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["BodyLimit", "replay"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: answer 413 to a request body over ``max_bytes`` (declared or streamed), before parsing."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._reject(send, int(declared))
                return
            await self.app(scope, receive, send)
            return
        # No declared length (chunked): read up to the limit, then hand the body on in one piece.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(send, None)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        await self.app(scope, replay(b"".join(chunks), receive), send)

    async def _reject(self, send: Send, size: int | None) -> None:
        what = f"request body of {size} bytes" if size is not None else "request body"
        payload = json.dumps(
            {"detail": f"{what} is over the limit of {self.max_bytes} bytes (SWAPLESS_GATEWAY_MAX_BODY_BYTES)"}
        ).encode()
        await send({
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        })
        await send({"type": "http.response.body", "body": payload})


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands on ``body`` in one piece, then whatever comes next (a disconnect): for middleware
    that read the body before the app does."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
