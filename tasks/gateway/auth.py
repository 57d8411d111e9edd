"""Who is calling: ``Callers`` turns each request's API key into a ``Caller`` before any route runs.

Each route declares what it needs (``needs``); docs/concepts/gateway.md lists the levels and answers.
Nothing here logs a request's headers or a key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fastapi import FastAPI, Security
from fastapi.security import HTTPBearer
from starlette.routing import BaseRoute, Match, Route

from swapless.config.settings import GatewaySettings
from swapless.manager.registry.store import ModelStore
from swapless.tasks.gateway.framing import ASGIApp, Receive, Scope, Send, reply
from swapless.tasks.gateway.keys import KeyRing, KeyRule, load_keys
from swapless.tasks.gateway.turns import NoTurn, Turns

__all__ = ["Caller", "Callers", "Need", "RedactKeyFilter", "install_api_keys", "needs"]

_REALM = 'Bearer realm="swapless"'
_NEEDS = "x-swapless-needs"
_QUERY_KEY = "x-swapless-query-key"
_bearer = HTTPBearer(auto_error=False, description="a key of SWAPLESS_API_KEYS or SWAPLESS_API_KEYS_FILE (when the "
                     "gateway has keys)")


class Need(str, Enum):  # noqa: UP042 - str() and format() give the member name; StrEnum would give the value
    """What a request must present."""

    NOTHING = "nothing"
    KEY = "key"
    EVERY_MODEL = "every model"


def needs(need: Need, *, query_key: bool = False) -> dict[str, Any]:
    """The route decorator's arguments that declare what the route needs (``query_key``: it also takes ``?key=``)."""
    extra: dict[str, Any] = {_NEEDS: need.value}
    if query_key:
        extra[_QUERY_KEY] = True
    return {"openapi_extra": extra, "dependencies": [Security(_bearer)] if need is not Need.NOTHING else []}


@dataclass(frozen=True)
class Caller:
    """Who made a request: ``owner`` as the ledger records it; ``admin`` callers read every job."""

    owner: str
    admin: bool
    rule: KeyRule | None = None

    def may_call(self, store: ModelStore, model: str) -> bool:
        """Whether this caller may send jobs to ``model`` (an id, alias or route)."""
        return self.rule is None or self.rule.allows(store, model)

    def refusal(self, model: str) -> str:
        """The 403 message for a model this caller may not call."""
        names = ", ".join(self.rule.names) if self.rule is not None else ""
        return f"this API key may call only the models {names}, not {model!r}: use a key for {model!r}"


class Callers:
    """ASGI middleware: a ``Caller`` in ``scope["state"]["caller"]`` for every request, or 401/403.

    Args:
        app: the application it guards.
        keys: the accepted keys; empty: no key is asked for.
        routes: the app's routes, whose declarations (``needs``) say what each request needs.
        open_paths: paths that need nothing (the framework's own docs).
        turns: each caller's turns at the gateway's work.
    """

    def __init__(self, app: ASGIApp, keys: KeyRing, routes: list[BaseRoute], open_paths: frozenset[str],
                 turns: Turns) -> None:
        self.app = app
        self.keys = keys
        self.routes = routes
        self.open_paths = open_paths
        self.turns = turns

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        need, query_key = self._need(scope)
        state = scope.setdefault("state", {})
        if not self.keys:
            client = scope.get("client")
            state["caller"] = Caller(f"addr:{client[0] if client else 'unknown'}", admin=True)
            await self._in_turn(state["caller"], scope, receive, send)
            return
        if need is Need.NOTHING:
            await self.app(scope, receive, send)
            return
        key = self._presented(scope, query_key)
        browser = f", or open {scope.get('path', '')}?key=<key>" if query_key else ""
        if key is None:
            await _refuse(scope, send, 401, "this gateway needs an API key: send the header 'Authorization: Bearer "
                          f"<key>'{browser}", _REALM)
            return
        rule = self.keys.match(key)
        if rule is None:
            await _refuse(scope, send, 401, "this API key is not one the gateway accepts: send a key from its "
                          f"SWAPLESS_API_KEYS or SWAPLESS_API_KEYS_FILE as 'Authorization: Bearer <key>'{browser}",
                          f'{_REALM}, error="invalid_token"')
            return
        if need is Need.EVERY_MODEL and rule.models is not None:
            await _refuse(scope, send, 403, f"this API key may call only the models {', '.join(rule.names)}; "
                          f"{scope.get('method', '')} {scope.get('path', '')} needs a key for every model",
                          f'{_REALM}, error="insufficient_scope"')
            return
        state["caller"] = Caller(rule.owner, admin=rule.models is None, rule=rule)
        await self._in_turn(state["caller"], scope, receive, send)

    async def _in_turn(self, caller: Caller, scope: Scope, receive: Receive, send: Send) -> None:
        """The request, in one of its caller's turns; 429 when none comes in time (nothing of it read)."""
        try:
            async with self.turns.turn(caller.owner):
                await self.app(scope, receive, send)
        except NoTurn as refused:
            await reply(scope, send, 429, refused.message, [(b"retry-after", str(refused.retry_after_s).encode())],
                        close=True)

    def _need(self, scope: Scope) -> tuple[Need, bool]:
        """What the route this request reaches declares (any valid key where no route matches: its 404 or 405)."""
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                extra = getattr(route, "openapi_extra", None) or {}
                if _NEEDS in extra:
                    return Need(extra[_NEEDS]), bool(extra.get(_QUERY_KEY))
                path = getattr(route, "path", None)
                return (Need.NOTHING if path in self.open_paths else Need.EVERY_MODEL), False
        return Need.KEY, False

    @staticmethod
    def _presented(scope: Scope, query_key: bool) -> str | bytes | None:
        """The request's Bearer key, else ``?key=`` where the route takes it (taken out of the query either way)."""
        from_query = _take_query_key(scope) if query_key else None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.strip().partition(b" ")
                return token.strip() if scheme.lower() == b"bearer" and token.strip() else None
        return from_query


def _take_query_key(scope: Scope) -> str | None:
    """The first ``key`` of the query string, removed from ``scope``; None when there is none."""
    if not scope.get("query_string"):
        return None
    pairs = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
    keys = [value for name, value in pairs if name == "key"]
    if not keys:
        return None
    scope["query_string"] = urlencode([(n, v) for n, v in pairs if n != "key"]).encode("latin-1")
    return keys[0] or None


async def _refuse(scope: Scope, send: Send, status: int, detail: str, challenge: str) -> None:
    await reply(scope, send, status, detail, [(b"www-authenticate", challenge.encode())], close=True)


class RedactKeyFilter(logging.Filter):
    """Shows a ``key`` query parameter as ``key=***`` in uvicorn's access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, str) and "?" in a for a in record.args):
            record.args = tuple(_redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def _redact(text: str) -> str:
    path, mark, query = text.partition("?")
    if not mark:
        return text
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(name == "key" for name, _ in pairs):
        return text
    return path + "?" + urlencode([(n, "***" if n == "key" else v) for n, v in pairs], safe="*")


def install_api_keys(app: FastAPI, settings: GatewaySettings, store: ModelStore, routes: list[BaseRoute]) -> KeyRing:
    """Put ``Callers`` in front of ``app``'s ``routes`` and redact ``?key=`` in the access log.

    Raises:
        ConfigError: as ``load_keys``.
    """
    keys = KeyRing(load_keys(settings, store))
    app.state.api_keys_required = bool(keys)
    docs = frozenset(p for p in (app.docs_url, app.openapi_url, app.swagger_ui_oauth2_redirect_url, app.redoc_url) if p)
    own = [route for route in app.router.routes if isinstance(route, Route)]  # the docs' (included routers nest)
    turns = Turns(settings.gateway_active_per_key, settings.gateway_turn_wait_s)
    app.add_middleware(Callers, keys=keys, routes=[*own, *routes], open_paths=docs, turns=turns)
    access_log = logging.getLogger("uvicorn.access")
    if keys and not any(isinstance(f, RedactKeyFilter) for f in access_log.filters):
        access_log.addFilter(RedactKeyFilter())
    return keys
