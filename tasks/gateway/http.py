"""How every gateway route answers (``GuardedRoute``: JSON off the loop, one error map) and route tables."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from swapless.tasks.gateway.errors import problem
from swapless.tasks.gateway.framing import openai_error

__all__ = ["GuardedRoute", "Route", "error_response", "loads", "router_of"]

#: Bodies of more bytes than this are parsed in a worker thread.
OFF_LOOP_BYTES = 64 * 1024


def _loads(body: bytes) -> Any:
    try:
        return json.loads(body)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", body.decode("utf-8", "replace")[:64], 0) from None


async def loads(body: bytes) -> Any:
    """``json.loads``, in a worker thread for a large body.

    Raises:
        json.JSONDecodeError, UnicodeDecodeError: not JSON (nested too deeply included).
    """
    return await asyncio.to_thread(_loads, body) if len(body) > OFF_LOOP_BYTES else _loads(body)


class _OffLoopJson(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = await loads(await self.body())
        return self._json


def error_response(request: Request, err: BaseException) -> JSONResponse:
    """The response for ``err`` raised while answering ``request`` (its protocol by its path)."""
    path = request.url.path
    v2 = path.startswith("/v2")
    state = request.app.state
    found = problem(err, "v2" if v2 else "rest", state.redis_url, state.log)
    if path == "/v1" or path.startswith("/v1/"):
        status = 400 if found.status == 422 else found.status  # OpenAI answers a malformed request 400
        content: dict[str, Any] = openai_error(status, found.message, found.errors)
        return JSONResponse(status_code=status, content=content, headers=found.headers or None)
    if v2:
        content = {"error": found.message}
    elif found.errors is not None:
        content = {"detail": found.errors}
    else:
        content = {"detail": found.message, **found.extra}
    return JSONResponse(status_code=found.status, content=content, headers=found.headers or None)


class GuardedRoute(APIRoute):
    """An ``APIRoute`` whose handler parses JSON off the loop and answers every error through the one error map."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(_OffLoopJson(request.scope, request.receive))
            except Exception as err:  # noqa: BLE001 - every error answers through the map; bugs are logged there
                return error_response(request, err)

        return guarded


@dataclass(frozen=True)
class Route:
    """One row of a route table: a path, its HTTP methods, the handler's method name, FastAPI's route options."""

    path: str
    handler: str
    methods: tuple[str, ...] = ("GET",)
    options: Mapping[str, Any] = field(default_factory=dict)


def router_of(endpoints: object, table: Sequence[Route], **router_options: Any) -> APIRouter:
    """An ``APIRouter`` of ``GuardedRoute``s: each row of ``table`` served by that method of ``endpoints``."""
    router = APIRouter(route_class=GuardedRoute, **router_options)
    for route in table:
        router.add_api_route(route.path, getattr(endpoints, route.handler), methods=list(route.methods),
                             **route.options)
    return router
