"""The live status page (``/status``, its data at ``/status.json``, ``/`` redirecting to it) and ``/metrics``.

With API keys set they need a key, also taken as ``?key=`` (a browser cannot send a header opening a page).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from collections.abc import Callable
from importlib.resources import files
from typing import Any

import redis.asyncio as aredis
from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from swapless.config.settings import Settings
from swapless.manager.registry.store import ModelStore
from swapless.tasks.broker.connection import redis_client
from swapless.tasks.broker.sentinel import SentinelOptions
from swapless.tasks.gateway.auth import Need, needs
from swapless.tasks.gateway.http import Route, router_of
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.queue import DEFAULT_SAMPLE
from swapless.tasks.observe.scaling import ScalingSignals, signals_registry
from swapless.tasks.observe.status import aread_status
from swapless.tasks.protocol import PRIORITY_BULK

__all__ = ["STATUS_ROUTES", "StatusEndpoints", "page_html", "status_router"]

_NO_STORE = {"Cache-Control": "no-store"}


def page_html() -> str:
    """The status page, its constants filled in."""
    text = (files("swapless.tasks.gateway") / "static" / "status.html").read_text(encoding="utf-8")
    return text.replace("{{PRIORITY_BULK}}", str(PRIORITY_BULK))


def _page_headers(html: str) -> dict[str, str]:
    """No caching, referrer or framing; only the page's inline scripts and styles; fetches only to the gateway."""
    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.DOTALL)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks)

    policy = (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; connect-src 'self'; "
              "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
    return {**_NO_STORE, "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": policy}


class StatusEndpoints:
    """The status page's handlers.

    Args:
        settings: the deployment's settings.
        store: the models file.
        redis: the gateway's asyncio Redis client (it exists while the app runs).
    """

    def __init__(self, settings: Settings, store: ModelStore, redis: Callable[[], aredis.Redis]) -> None:
        self.settings = settings
        self.redis = redis
        self.html = page_html()
        self.headers = _page_headers(self.html)
        self.model_ids = store.ids()
        self.sync = redis_client(settings.redis.broker_url, connect_timeout_s=settings.redis.connect_timeout_s,
                                 sentinel=SentinelOptions.of(settings))  # connects when used
        self.metrics = signals_registry(ScalingSignals(self.sync, settings, self.model_ids))

    async def root(self, request: Request) -> RedirectResponse:
        query = request.url.query
        return RedirectResponse("status" + (f"?{query}" if query else ""), status_code=307)

    async def status_page(self) -> HTMLResponse:
        """The live status page for a browser (with API keys: open ``/status?key=<key>``)."""
        return HTMLResponse(self.html, headers=self.headers)

    async def scaling_metrics(self) -> Response:
        """The cluster-wide autoscaling signals in Prometheus's text format (docs/operations/autoscaling.md), read
        from Redis now: what ``swapless exporter`` serves. Needs a key for every model (they name every model)."""
        body = await asyncio.to_thread(generate_latest, self.metrics)
        return Response(body, media_type=CONTENT_TYPE_LATEST, headers=_NO_STORE)

    async def status_json(
        self,
        request: Request,
        sample: int = Query(DEFAULT_SAMPLE, ge=1, le=10_000, description="queued messages read per priority level"),
    ) -> Any:
        """What ``swapless status --json`` prints: the queue per model and priority, each live worker's heartbeat
        (loaded models, cache counters, jobs, queue wait), which worker holds which model, Redis's memory. A key
        that is no operator's sees its own batches only and the webhooks' counts, not other callers' URLs."""
        caller = request.state.caller
        payload = await aread_status(self.redis(), self.sync, Keyspace.of(self.settings), self.model_ids, sample,
                                     owner=None if caller.admin else caller.owner)
        return JSONResponse(payload, headers=_NO_STORE)


STATUS_ROUTES = [
    Route("/", "root", options={"include_in_schema": False, **needs(Need.NOTHING)}),
    Route("/status", "status_page", options={"response_class": HTMLResponse, **needs(Need.KEY, query_key=True)}),
    Route("/metrics", "scaling_metrics", options={"response_class": PlainTextResponse, **needs(Need.EVERY_MODEL)}),
    Route("/status.json", "status_json", options=needs(Need.KEY, query_key=True)),
]


def status_router(settings: Settings, store: ModelStore, redis: Callable[[], aredis.Redis]) -> APIRouter:
    """The routes of the status page (``StatusEndpoints``' arguments)."""
    return router_of(StatusEndpoints(settings, store, redis), STATUS_ROUTES)
