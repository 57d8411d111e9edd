"""Webhooks from the worker: ``WebhookIntake`` queues a finished job's delivery in Redis between its store and its
ack; ``WebhookSender``'s thread posts each, signed per the Standard Webhooks spec, retrying with backoff.

The body and headers: docs/guides/web-apps.md.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx
from standardwebhooks import Webhook

from swapless.config.errors import SwaplessError, WebhookRefused
from swapless.config.settings import WebhookSettings
from swapless.tasks.protocol import CALLBACK_OWNER_HEADER, CALLBACK_URL_HEADER, SENT_AT_HEADER, encode_outcome
from swapless.tasks.tracing import TRACEPARENT_HEADER, context_of, trace_id_of
from swapless.tasks.webhooks import WebhookDelivery, WebhookQueue, allowed_hosts, connect_address, pinned, resolve_host

__all__ = ["WebhookIntake", "WebhookSender", "backoff_s", "job_payload"]

logger = logging.getLogger(__name__)

#: The first retry's delay and the longest, in seconds.
FIRST_RETRY_S = 1.0
MAX_RETRY_S = 600.0


def backoff_s(attempts: int) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: 1, 2, 4, ... up to 10 minutes."""
    return min(MAX_RETRY_S, FIRST_RETRY_S * 2 ** max(0, attempts - 1))


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds")


def job_payload(job_id: str, result: Any, error: BaseException | None, model: str | None, sent_at: float | None,
                done_at: float) -> str:
    """The webhook body of one finished job."""
    data = {
        "job_id": job_id,
        "state": "SUCCESS" if error is None else "FAILURE",
        "model": model,
        "result": result if error is None else None,
        "error": None if error is None else encode_outcome(None, error),
        "timings": {"sent_at": None if sent_at is None else _iso(sent_at), "done_at": _iso(done_at),
                    "total_s": None if sent_at is None else round(max(0.0, done_at - sent_at), 6)},
    }
    body = {"type": "job.succeeded" if error is None else "job.failed", "timestamp": _iso(done_at), "data": data}
    try:
        return json.dumps(body)
    except (TypeError, ValueError):  # stored by the backend's own encoder (a datetime, a UUID): sent as text
        return json.dumps(body, default=str)


class WebhookIntake:
    """Queues the webhooks of finished jobs whose messages name a ``callback_url`` (one round trip per group).

    Args:
        queue: the delivery queue.
        wake: told that deliveries were queued (the sender in this process starts on them at once).
    """

    def __init__(self, queue: WebhookQueue, wake: Callable[[], None] = lambda: None) -> None:
        self.queue = queue
        self.wake = wake

    def enqueue(self, items: Sequence[tuple[Any, Any, SwaplessError | BaseException | None]],
                models: Mapping[str, str]) -> int:
        """Queue a delivery for each ``(request, result, error)`` with a ``callback_url``; returns how many."""
        deliveries = []
        now = time.time()
        for request, result, error in items:
            headers = getattr(request, "request_dict", None) or {}
            url = headers.get(CALLBACK_URL_HEADER)
            if not isinstance(url, str) or not url:
                continue
            sent_at = headers.get(SENT_AT_HEADER)
            sent = float(sent_at) if isinstance(sent_at, (int, float)) and not isinstance(sent_at, bool) else None
            payload = job_payload(request.id, result, error, models.get(request.id), sent, now)
            owner = headers.get(CALLBACK_OWNER_HEADER)
            traceparent = headers.get(TRACEPARENT_HEADER)
            deliveries.append(WebhookDelivery(request.id, url, payload, created_s=now,
                                       owner=owner if isinstance(owner, str) and owner else None,
                                       traceparent=traceparent if isinstance(traceparent, str) else None))
        if not deliveries:
            return 0
        _, full = self.queue.enqueue(deliveries, now)
        if full:
            logger.warning("%d webhook(s) kept as failed: the delivery queue is full (SWAPLESS_WEBHOOK_MAX_PENDING)",
                           full)
        self.wake()
        return len(deliveries)


class WebhookSender:
    """The worker's webhook sender thread. Nothing starts until ``start``.

    Args:
        queue: the delivery queue.
        settings: the secret, allow-list, timeout, concurrency and retry window.
        transport: an httpx transport (tests); None: the network.
        resolve: host -> addresses, for the target check (None: the system's resolver).
        tracer: makes a span of each attempt of a traced job's delivery (None: tracing is off).
    """

    def __init__(self, queue: WebhookQueue, settings: WebhookSettings, transport: httpx.BaseTransport | None = None,
                 resolve: Callable[[str], Sequence[str]] | None = None, tracer: Any = None) -> None:
        self.queue = queue
        self.tracer = tracer
        self.settings = settings
        secret = settings.webhook_secret.get_secret_value() if settings.webhook_secret is not None else None
        self._signer = Webhook(secret) if secret else None
        self._allowed = allowed_hosts(settings.webhook_allowed_hosts)
        self._resolve = resolve or resolve_host
        self._transport = transport
        self._slots = threading.Semaphore(settings.webhook_concurrency)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._http: httpx.Client | None = None
        self.delivered = 0
        self.failed = 0

    def wake(self) -> None:
        """Look for due deliveries now (deliveries were just queued)."""
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._http = httpx.Client(timeout=self.settings.webhook_timeout_s, follow_redirects=False,
                                      transport=self._transport,
                                      headers={"user-agent": "swapless-webhooks", "content-type": "application/json"})
            self._pool = ThreadPoolExecutor(self.settings.webhook_concurrency, thread_name_prefix="swapless-webhook")
            self._thread = threading.Thread(target=self._loop, name="swapless-webhooks", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop taking deliveries; attempts in flight get ``timeout_s`` to finish (an unsettled one is due again
        when its lease ends)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._http is not None:
            self._http.close()

    # -- sender thread -------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        lease_s = self.settings.webhook_timeout_s + 30.0
        while not self._stop.is_set():
            free = 0
            while self._slots.acquire(blocking=False):
                free += 1
            try:
                taken = self.queue.claim(free, lease_s) if free else []
            except Exception as err:  # noqa: BLE001 - Redis away: try again shortly
                logger.warning("could not read the webhook queue (%s); trying again in 1 s", err)
                taken = []
                self._stop.wait(1.0)
            for _ in range(free - len(taken)):
                self._slots.release()
            assert self._pool is not None
            for delivery in taken:
                self._pool.submit(self._attempt, delivery)
            if taken and len(taken) == free:
                self._slots.acquire()  # every slot busy: wait for one
                self._slots.release()
                continue
            self._wake.wait(self._idle_s())
            self._wake.clear()

    def _idle_s(self) -> float:
        """How long to wait before looking again: until the next delivery is due, at most 1 s."""
        try:
            due = self.queue.next_due_s()
        except Exception:  # noqa: BLE001 - the loop retries
            return 1.0
        return 1.0 if due is None else min(1.0, max(0.01, due - time.time()))

    def _attempt(self, delivery: WebhookDelivery) -> None:
        try:
            if self.tracer is not None and delivery.traceparent is not None:
                outcome = self._traced_post(delivery, delivery.traceparent)
            else:
                outcome = self._post(delivery)
            self._settle(delivery, outcome)
        except Exception:  # a delivery whose settling failed is due again when its lease ends
            logger.exception("could not settle webhook %s", delivery.id)
        finally:
            self._slots.release()
            self._wake.set()

    def _traced_post(self, delivery: WebhookDelivery, traceparent: str) -> tuple[bool, str | None]:
        """``_post`` in a ``webhook`` span of the job's trace, its request carrying the span's context."""
        from opentelemetry import propagate, trace

        target = httpx.URL(delivery.url)
        port = f":{target.port}" if target.port is not None else ""
        attributes = {"http.request.method": "POST", "server.address": target.host,
                      "url.full": f"{target.scheme}://{target.host}{port}{target.path}",  # no credentials, no query
                      "swapless.job.id": delivery.id, "swapless.webhook.attempt": delivery.attempts + 1}
        with self.tracer.start_as_current_span("webhook", context=context_of({TRACEPARENT_HEADER: traceparent}),
                                               kind=trace.SpanKind.CLIENT, attributes=attributes) as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            ok, why = self._post(delivery, carrier)
            if not ok:
                span.set_status(trace.StatusCode.ERROR, (why or "").lstrip("!"))
            return ok, why

    def _post(
        self, delivery: WebhookDelivery, trace_headers: Mapping[str, str] | None = None
    ) -> tuple[bool, str | None]:
        """(delivered, why not). ``why not`` with ``delivered`` False and a ``!`` first: never retry.
        ``trace_headers``: the attempt's trace context, sent with it."""
        if self._signer is None:
            return False, "!SWAPLESS_WEBHOOK_SECRET is not set: the webhook cannot be signed (set it, then replay)"
        try:
            address = connect_address(delivery.url, self._allowed, self._resolve)
        except WebhookRefused as err:
            return False, f"!{err}"
        except OSError as err:
            return False, f"the host does not resolve ({err})"
        target, host_header, extensions = pinned(delivery.url, address)
        now = datetime.now(UTC)
        headers = {
            "webhook-id": delivery.id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": self._signer.sign(delivery.id, now, delivery.payload),
            **host_header,
            **(trace_headers or {}),
        }
        assert self._http is not None
        try:
            response = self._http.post(target, content=delivery.payload.encode(), headers=headers,
                                       extensions=extensions)
        except httpx.HTTPError as err:
            return False, f"{type(err).__name__}: {err}"
        if 200 <= response.status_code < 300:
            return True, None
        return False, f"the receiver answered {response.status_code}"

    def _settle(self, delivery: WebhookDelivery, outcome: tuple[bool, str | None]) -> None:
        ok, why = outcome
        if ok:
            self.queue.delivered(delivery)
            self.delivered += 1
            return
        delivery.attempts += 1
        final = why is not None and why.startswith("!")
        delivery.last_error = (why or "")[1:] if final else why
        now = time.time()
        retry_at = now + backoff_s(delivery.attempts)
        if final or retry_at > delivery.created_s + self.settings.webhook_retry_s:
            self.queue.fail(delivery, now)
            self.failed += 1
            logger.warning("webhook %s to %s failed after %d attempt(s): %s; kept (swapless webhooks replay)%s",
                           delivery.id, delivery.url, delivery.attempts, delivery.last_error, _trace_note(delivery))
            return
        logger.info("webhook %s to %s: %s; retrying in %.0f s%s", delivery.id, delivery.url, why,
                    retry_at - now, _trace_note(delivery))
        self.queue.retry(delivery, retry_at)


def _trace_note(delivery: WebhookDelivery) -> str:
    """What a log line about ``delivery`` says of its job's trace (``" [trace <id>]"``, or nothing)."""
    trace_id = trace_id_of(delivery.traceparent)
    return f" [trace {trace_id}]" if trace_id is not None else ""
