"""The live status page: ``GET /status`` (one static HTML page, its CSS and JavaScript inline), the data it draws
every 2 s at ``GET /status.json`` (what ``swapless status --json`` prints: ``swapless.tasks.observe.status``), and
``GET /`` redirecting to the page; and ``GET /metrics``, the cluster-wide autoscaling signals
(``swapless.tasks.observe.scaling``).

With API keys set, both need a key (``swapless.tasks.gateway.auth``); since a browser cannot send a header when it
opens a page, they also take it as ``?key=``. The page sends the key it was opened with as a Bearer header when it
fetches the data, so the key is in one request line, not in one every 2 s.
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
from swapless.tasks.gateway.http import GuardedRoute
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.queue import DEFAULT_SAMPLE
from swapless.tasks.observe.scaling import ScalingSignals, signals_registry
from swapless.tasks.observe.status import aread_status
from swapless.tasks.protocol import PRIORITY_BULK

__all__ = ["page_html", "status_router"]

_NO_STORE = {"Cache-Control": "no-store"}


def page_html() -> str:
    """The status page, its constants filled in."""
    text = (files("swapless.tasks.gateway") / "static" / "status.html").read_text(encoding="utf-8")
    return text.replace("{{PRIORITY_BULK}}", str(PRIORITY_BULK))


def _page_headers(html: str) -> dict[str, str]:
    """No caching, no referrer, no framing; scripts and styles only those inline in the page (by hash), fetches only
    to the gateway itself."""
    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.DOTALL)
        return " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'" for b in blocks)

    policy = (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; connect-src 'self'; "
              "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
    return {**_NO_STORE, "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": policy}


def status_router(settings: Settings, store: ModelStore, redis: Callable[[], aredis.Redis]) -> APIRouter:
    """The routes of the status page.

    Args:
        settings: the deployment's queue, key prefix and Redis URL.
        store: the models file (placement is read per model).
        redis: the gateway's asyncio Redis client (it exists while the app runs).
    """
    router = APIRouter(route_class=GuardedRoute)
    html = page_html()
    headers = _page_headers(html)
    model_ids = store.ids()
    sync = redis_client(settings.redis.broker_url, connect_timeout_s=settings.redis.connect_timeout_s,
                        sentinel=SentinelOptions.of(settings))  # connects when used

    @router.get("/", include_in_schema=False, **needs(Need.NOTHING))
    async def root(request: Request) -> RedirectResponse:
        query = request.url.query
        return RedirectResponse("status" + (f"?{query}" if query else ""), status_code=307)

    @router.get("/status", response_class=HTMLResponse, **needs(Need.KEY, query_key=True))
    async def status_page() -> HTMLResponse:
        """The live status page for a browser (with API keys: open ``/status?key=<key>``)."""
        return HTMLResponse(html, headers=headers)

    signals = ScalingSignals(sync, settings, model_ids)
    metrics = signals_registry(signals)

    @router.get("/metrics", response_class=PlainTextResponse, **needs(Need.EVERY_MODEL))
    async def scaling_metrics() -> Response:
        """The cluster-wide autoscaling signals in Prometheus's text format (docs/operations/autoscaling.md), read
        from Redis now: what ``swapless exporter`` serves. Needs a key for every model (they name every model)."""
        body = await asyncio.to_thread(generate_latest, metrics)
        return Response(body, media_type=CONTENT_TYPE_LATEST, headers=_NO_STORE)

    @router.get("/status.json", **needs(Need.KEY, query_key=True))
    async def status_json(
        request: Request,
        sample: int = Query(DEFAULT_SAMPLE, ge=1, le=10_000, description="queued messages read per priority level"),
    ) -> Any:
        """What ``swapless status --json`` prints: the queue per model and priority, each live worker's heartbeat
        (loaded models, cache counters, jobs, queue wait), which worker holds which model, Redis's memory. A key
        that is no operator's sees its own batches only and the webhooks' counts, not other callers' URLs."""
        caller = request.state.caller
        payload = await aread_status(redis(), sync, Keyspace.of(settings), model_ids, sample,
                                     owner=None if caller.admin else caller.owner)
        return JSONResponse(payload, headers=_NO_STORE)

    return router
