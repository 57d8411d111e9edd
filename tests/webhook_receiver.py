"""A real HTTP webhook receiver for the tests: it verifies each request's Standard Webhooks signature with the
``standardwebhooks`` library and keeps what it received; it can answer slowly, or with an error status."""

from __future__ import annotations

import json
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook

from bench.httpd import QuietHandler, close, serve
from tests.redis_server import free_port

SECRET = "whsec_" + "c3dhcGxlc3MtdGVzdC1zZWNyZXQtMzItYnl0ZXMhIQ=="


class Receiver:
    """Listens on 127.0.0.1:``port`` once ``start``ed; ``received`` holds ``(headers, payload)`` of each verified
    request, ``rejected`` the count of requests whose signature did not verify."""

    def __init__(self, port: int | None = None, delay_s: float = 0.0, status: int = 200) -> None:
        self.port = port or free_port()
        self.delay_s = delay_s
        self.status = status
        self.received: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.rejected = 0
        self._lock = threading.Condition()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self
        verifier = Webhook(SECRET)

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    payload = verifier.verify(body, headers)
                except Exception:  # noqa: BLE001 - any verification failure
                    with receiver._lock:
                        receiver.rejected += 1
                    self.send_response(400)
                    self.end_headers()
                    return
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                if receiver.status < 300:
                    with receiver._lock:
                        receiver.received.append((headers, payload if isinstance(payload, dict) else json.loads(body)))
                        receiver._lock.notify_all()
                self.send_response(receiver.status)
                self.end_headers()

        self._server = serve(Handler, self.port)
        return self

    def wait_for(self, count: int, timeout_s: float) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """Wait until ``count`` requests were received (or raise AssertionError)."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.received) >= count, timeout_s):
                raise AssertionError(f"{len(self.received)} of {count} webhook(s) after {timeout_s} s")
            return list(self.received)

    def stop(self) -> None:
        if self._server is not None:
            close(self._server)
