"""A throwaway HTTP server on 127.0.0.1, served from a daemon thread: the benchmarks' and the tests' receivers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["QuietHandler", "close", "serve", "serving"]


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler], port: int = 0) -> ThreadingHTTPServer:
    """Serve ``handler`` on 127.0.0.1:``port`` (0: a free port) until ``close``."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def close(server: ThreadingHTTPServer) -> None:
    """Stop serving and release the port."""
    server.shutdown()
    server.server_close()


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler], port: int = 0) -> Iterator[ThreadingHTTPServer]:
    """``serve`` for the length of a ``with`` block."""
    server = serve(handler, port)
    try:
        yield server
    finally:
        close(server)
