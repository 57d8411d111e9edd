"""API keys for the gateway: ``Authorization: Bearer <key>``, checked against ``SWAPLESS_API_KEYS`` and
``SWAPLESS_API_KEYS_FILE`` by an ASGI middleware, before any route runs.

Each key is one entry: separated by commas in the variable, one per line in the file (where ``#`` starts a
comment and blank lines are skipped)::

    KEY                      may call every model
    KEY:MODEL|MODEL|...      may call only these models (ids, aliases or routes of the models file)

A key is 16 to 512 characters of ``A-Z a-z 0-9 - . _ ~ + /``, optionally ending in ``=`` (RFC 6750's token
characters: ``secrets.token_urlsafe(32)`` makes one). Only the SHA-256 digest of each key is kept, and a
presented key is hashed and compared with every digest by ``hmac.compare_digest``.

What each request needs (``access``):

- nothing: ``/healthz``, ``/v2`` (server metadata), ``/v2/health/...``, ``/docs``, ``/openapi.json``, ``/``
  (a redirect to the status page);
- any valid key: ``GET|DELETE /jobs/{id}`` (job ids are random UUIDs, so holding one is the permission; the
  job's model is not checked), ``GET /models``, ``GET /status`` and ``/status.json``; these two also take the
  key as ``?key=`` (a browser cannot send the header when it opens a page), which is taken out of the query
  before anything downstream sees it, and redacted in uvicorn's access log (``RedactKeyFilter``);
- a key for the model: ``POST /jobs`` and ``POST /predict`` (the ``model_id`` of the JSON body, which is read
  here and handed on untouched), any ``/v2/models/{model}`` path (the path);
- a key for every model: anything else (``/v2/repository/...``: the index, loading and unloading, among them).

Missing or unknown key: 401 with ``WWW-Authenticate: Bearer``; a key limited to other models: 403; the body is
``{"detail": ...}``, or ``{"error": ...}`` under ``/v2/`` (the Open Inference Protocol's). With no key
configured there is no middleware at all (and ``swapless serve`` listens on loopback only, unless told
``--insecure-no-auth``). Nothing here logs a request's headers or a key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fastapi import FastAPI

# The router's own reading of the path (root_path removed), so the check sees the route the router will pick.
from starlette._utils import get_route_path

from config.settings import Settings
from manager.errors import ConfigError
from manager.store import ModelStore
from tasks.gateway.limits import replay

__all__ = [
    "ApiKeys", "KeyEntry", "KeyRule", "Need", "RedactKeyFilter", "access", "install_api_keys", "load_keys", "parse_keys",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MIN_KEY_CHARS = 16
MAX_KEY_CHARS = 512
_KEY_CHARS = re.compile(r"[A-Za-z0-9._~+/-]+=*")
_HOW_TO_MAKE = "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
#: Paths that take the key as ``?key=`` too: the status page and its data, which a browser opens.
STATUS_PATHS = frozenset({"/status", "/status.json"})
_OPEN = frozenset({"/", "/healthz", "/v2", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc"})
_REALM = 'Bearer realm="swapless"'


class Need(str, Enum):
    """What a request must present."""

    NOTHING = "nothing"
    KEY = "key"
    MODEL_IN_BODY = "model in body"
    MODEL_IN_PATH = "model in path"
    EVERY_MODEL = "every model"


def access(method: str, path: str) -> tuple[Need, str | None]:
    """What a request to ``path`` (as the router sees it) needs, and the model it addresses when that is in the path.

    Args:
        method: the HTTP method.
        path: the path, root path removed.
    """
    if path in _OPEN or re.fullmatch(r"/v2/health/[^/]+", path):
        return Need.NOTHING, None
    if path.startswith("/v2/models/"):
        model = path[len("/v2/models/") :].split("/", 1)[0]
        return (Need.MODEL_IN_PATH, model) if model else (Need.EVERY_MODEL, None)
    if method == "POST" and path in ("/jobs", "/predict"):
        return Need.MODEL_IN_BODY, None
    reads = method in ("GET", "HEAD")
    if (reads and (path in STATUS_PATHS or path == "/models")) or (
        method in ("GET", "HEAD", "DELETE") and re.fullmatch(r"/jobs/[^/]+", path)
    ):
        return Need.KEY, None
    return Need.EVERY_MODEL, None


@dataclass(frozen=True)
class KeyEntry:
    """One entry as written: its key's digest, the models it names (None: every model), and where it was written."""

    digest: bytes
    models: tuple[str, ...] | None
    where: str


@dataclass(frozen=True)
class KeyRule:
    """One accepted key: the SHA-256 digest of the key and the canonical ids it may call (None: every model)."""

    digest: bytes
    models: frozenset[str] | None
    #: the names as written, for messages
    names: tuple[str, ...] = ()

    def allows(self, store: ModelStore, model: str) -> bool:
        """Whether this key may call ``model`` (an id, alias or route; an unknown name is refused)."""
        if self.models is None:
            return True
        if store.is_route(model):
            return model in self.models
        return model in store and store.resolve(model) in self.models


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape") if isinstance(key, str) else key).digest()


def parse_keys(text: str, source: str, *, per_line: bool) -> list[KeyEntry]:
    """The entries of ``SWAPLESS_API_KEYS`` (``per_line=False``: comma-separated) or of a keys file.

    Args:
        text: what the variable or the file holds.
        source: what to call it in messages (the variable's name, or the file's).
        per_line: one entry per line, ``#`` starting a comment (a file); else entries separated by commas.

    Raises:
        ConfigError: an entry is malformed; the message names the entry (never the key) and what to write.
    """
    if per_line:
        raw = [(f"{source} line {n}", line.split("#", 1)[0].strip()) for n, line in enumerate(text.splitlines(), 1)]
    else:
        raw = [(f"{source} entry {n}", part.strip()) for n, part in enumerate(text.split(","), 1)]
    entries = []
    for where, entry in raw:
        if not entry:
            continue
        key, colon, names = entry.partition(":")
        key = key.strip()
        if not _KEY_CHARS.fullmatch(key):
            raise ConfigError(where, "an API key holds only letters, digits and - . _ ~ + / (= at the end), with no "
                              f"spaces; write KEY or KEY:MODEL|MODEL; {_HOW_TO_MAKE}")
        if not MIN_KEY_CHARS <= len(key) <= MAX_KEY_CHARS:
            raise ConfigError(where, f"the key is {len(key)} characters; use {MIN_KEY_CHARS} to {MAX_KEY_CHARS}: "
                              f"{_HOW_TO_MAKE}")
        models = None
        if colon:
            models = tuple(name.strip() for name in names.split("|"))
            if not all(models):
                raise ConfigError(where, "after the ':' name the models the key may call, separated by |, like "
                                  "KEY:sentiment|spam (or drop the ':' for every model)")
        entries.append(KeyEntry(_digest(key), models, where))
    return entries


def load_keys(settings: Settings, store: ModelStore) -> list[KeyRule]:
    """The keys of ``SWAPLESS_API_KEYS`` and ``SWAPLESS_API_KEYS_FILE`` (both, when both are set), hashed; the
    models they name resolved through ``store``. Empty: no key is configured.

    Raises:
        ConfigError: an entry is malformed, names an unknown model, or repeats a key; the file cannot be read or
            lists no key.
    """
    entries: list[KeyEntry] = []
    if settings.api_keys is not None and settings.api_keys.get_secret_value().strip():
        entries += parse_keys(settings.api_keys.get_secret_value(), "SWAPLESS_API_KEYS", per_line=False)
        if not entries:
            raise ConfigError("SWAPLESS_API_KEYS", "it lists no key: write KEY or KEY:MODEL|MODEL, comma-separated, "
                              "or unset it")
    if settings.api_keys_file is not None:
        path = settings.api_keys_file
        try:
            text = path.read_text(encoding="utf-8-sig")  # a BOM (Windows editors) is not part of the first key
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
            raise ConfigError("SWAPLESS_API_KEYS_FILE", f"cannot read {path} ({reason}): point it at a readable "
                              "UTF-8 file of keys, one per line") from None
        from_file = parse_keys(text, str(path), per_line=True)
        if not from_file:
            raise ConfigError("SWAPLESS_API_KEYS_FILE", f"{path} lists no key: write one KEY or KEY:MODEL|MODEL per "
                              "line, or unset the variable")
        entries += from_file
    rules: list[KeyRule] = []
    first: dict[bytes, str] = {}
    for entry in entries:
        if entry.digest in first:
            raise ConfigError(entry.where, f"the same key as {first[entry.digest]}: list each key once")
        first[entry.digest] = entry.where
        models = None
        if entry.models is not None:
            resolved = set()
            for name in entry.models:
                try:
                    resolved.add(name if store.is_route(name) else store.resolve(name))
                except KeyError as err:  # UnknownModel: its message lists the known ids
                    raise ConfigError(entry.where, f"{err}; name models of the models file") from None
            models = frozenset(resolved)
        rules.append(KeyRule(entry.digest, models, entry.models or ()))
    return rules


class RedactKeyFilter(logging.Filter):
    """Rewrites a log record's string arguments so a ``key`` query parameter reads ``key=***`` (uvicorn's access
    log prints each request's path and query)."""

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


class ApiKeys:
    """ASGI middleware: let a request through only with a key that may make it (the module docstring says which).

    Args:
        app: the application it guards.
        rules: the accepted keys (``load_keys``); at least one.
        store: resolves the model names requests address.

    Register it inside ``BodyLimit`` (added before it): the bodies it reads for their ``model_id`` are then
    bounded already.
    """

    def __init__(self, app: ASGIApp, rules: Iterable[KeyRule], store: ModelStore) -> None:
        self.app = app
        self.rules = tuple(rules)
        self.store = store
        if not self.rules:
            raise ValueError("ApiKeys needs at least one key; with none, do not add the middleware")

    def match(self, key: str | bytes) -> KeyRule | None:
        """The rule of ``key``, comparing its digest with every rule's in constant time; None when none matches."""
        digest = _digest(key)
        found = None
        for rule in self.rules:  # no early exit: the time does not depend on which rule matches
            if hmac.compare_digest(digest, rule.digest):
                found = rule
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = get_route_path(scope)
        need, model = access(scope.get("method", "GET"), path)
        if need is Need.NOTHING:
            await self.app(scope, receive, send)
            return
        key = self._presented(scope, path)
        browser = f", or open {path}?key=<key>" if path in STATUS_PATHS else ""
        if key is None:
            await _reply(scope, send, 401, f"this gateway needs an API key: send the header "
                         f"'Authorization: Bearer <key>'{browser}", _REALM)
            return
        rule = self.match(key)
        if rule is None:
            await _reply(scope, send, 401, "this API key is not one the gateway accepts: send a key from its "
                         f"SWAPLESS_API_KEYS or SWAPLESS_API_KEYS_FILE as 'Authorization: Bearer <key>'{browser}",
                         f'{_REALM}, error="invalid_token"')
            return
        if rule.models is None or need is Need.KEY:
            await self.app(scope, receive, send)
            return
        may = f"this API key may call only the models {', '.join(rule.names)}"
        if need is Need.EVERY_MODEL:
            await _forbid(scope, send, f"{may}; {scope.get('method', '')} {path} needs a key for every model")
            return
        if model is not None:  # Need.MODEL_IN_PATH
            if rule.allows(self.store, model):
                await self.app(scope, receive, send)
            else:
                await _forbid(scope, send, f"{may}, not {model!r}: use a key for {model!r}")
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client went away
        named = _body_model(body)
        if named is None:
            await _forbid(scope, send, f"{may}: send a JSON body whose model_id is one of them")
        elif not rule.allows(self.store, named):
            await _forbid(scope, send, f"{may}, not {named!r}: use a key for {named!r}")
        else:
            await self.app(scope, replay(body, receive), send)

    def _presented(self, scope: Scope, path: str) -> str | bytes | None:
        """The key of a request: its ``Authorization: Bearer`` header, else (status paths only) ``?key=``. On those
        paths ``key`` is taken out of the query string either way, so nothing downstream sees it."""
        from_query = _take_query_key(scope) if path in STATUS_PATHS else None
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


async def _read_body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _body_model(body: bytes) -> str | None:
    """The ``model_id`` of a JSON body, read as FastAPI reads it (``json.loads``); None when there is none."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    named = parsed.get("model_id") if isinstance(parsed, dict) else None
    return named if isinstance(named, str) else None


async def _forbid(scope: Scope, send: Send, detail: str) -> None:
    await _reply(scope, send, 403, detail, f'{_REALM}, error="insufficient_scope"')


async def _reply(scope: Scope, send: Send, status: int, detail: str, challenge: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})
        return
    # The Open Inference Protocol's error body is {"error": ...}; the gateway's own is {"detail": ...}.
    field = "error" if get_route_path(scope).startswith("/v2/") else "detail"
    payload = json.dumps({field: detail}).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"www-authenticate", challenge.encode()),
        ],
    })
    await send({"type": "http.response.body", "body": payload})


def install_api_keys(app: FastAPI, settings: Settings, store: ModelStore) -> bool:
    """Guard ``app`` with the configured keys, declare them in its OpenAPI schema (the docs' "Authorize" button),
    and redact ``?key=`` in uvicorn's access log. Nothing when no key is configured. ``app.state.api_keys_required``
    says which.

    Returns:
        Whether keys are configured (and the middleware added).

    Raises:
        ConfigError: as ``load_keys``.
    """
    rules = load_keys(settings, store)
    app.state.api_keys_required = bool(rules)
    if not rules:
        return False
    app.add_middleware(ApiKeys, rules=rules, store=store)
    access_log = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactKeyFilter) for f in access_log.filters):
        access_log.addFilter(RedactKeyFilter())
    plain_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = plain_openapi()
        schema.setdefault("components", {}).setdefault("securitySchemes", {})["apiKey"] = {
            "type": "http", "scheme": "bearer", "description": "a key of SWAPLESS_API_KEYS or SWAPLESS_API_KEYS_FILE",
        }
        schema["security"] = [{"apiKey": []}]
        for path, operations in schema.get("paths", {}).items():
            if access("GET", path)[0] is Need.NOTHING:
                for operation in operations.values():
                    operation["security"] = []
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    return True
