"""The HTTP plumbing of ``TritonWorker``: ``TritonConnection``, one model's calls to one Triton server over
``tritonclient.http``, retried while the server does not answer (then ``BackendUnavailable``), and the repository
calls that wait for a model to become READY or to be gone. The gevent-based HTTP client cannot be shared between
threads, so the connection keeps one per thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.client import HTTPException
from typing import Protocol, TypeVar

import tritonclient.http as httpclient
from gevent import Timeout as GeventTimeout
from tritonclient.utils import InferenceServerException

from swapless.config.errors import BackendUnavailable

__all__ = ["TritonConnection", "TritonSettings"]

# The worker's logger, so that what is logged about a Triton model all comes from one place, as it always has.
logger = logging.getLogger("swapless.manager.frameworks.triton.worker")

T = TypeVar("T")

_UNAVAILABLE_STATUS = {"502", "503", "504"}


class TritonSettings(Protocol):
    """The knobs a connection reads at every call (``TritonWorker``'s attributes, so setting one on a worker
    changes its next call)."""

    retry_delays_s: tuple[float, ...]
    connection_timeout_s: float
    network_timeout_s: float


class TritonConnection:
    """Calls about the Triton model ``model_name`` to the server at ``url`` (``host:port``).

    Args:
        url: the server, without ``http://`` or ``https://``.
        ssl: talk HTTPS.
        model_name: the model's name on the server (in messages and repository calls).
        model_id: the entry's id, at the start of every log line.
        settings: where the retry delays and timeouts are read, at each call.
    """

    def __init__(self, url: str, ssl: bool, model_name: str, model_id: str, settings: TritonSettings) -> None:
        self.url = url
        self.ssl = ssl
        self.model_name = model_name
        self.model_id = model_id
        self._settings = settings
        self._local = threading.local()
        self._clients: list[httpclient.InferenceServerClient] = []
        self._clients_lock = threading.Lock()
        self._generation = 0

    def call(
        self, what: str, fn: Callable[[httpclient.InferenceServerClient], T], *, timeout_s: float | None = None
    ) -> T:
        """Run ``fn(client)``; retry with backoff while the server does not answer, then raise BackendUnavailable.

        Errors the server answers with (``InferenceServerException``, except 502/503/504) pass through.

        Args:
            timeout_s: the request's network timeout; given (the load request), a timeout is not retried.
        """
        started = time.monotonic()
        tries = len(self._settings.retry_delays_s) + 1
        for attempt in range(tries):
            client = self._client(timeout_s or self._settings.network_timeout_s)
            try:
                return fn(client)
            except InferenceServerException as err:
                if str(err.status()) not in _UNAVAILABLE_STATUS:
                    raise
                problem = f"HTTP {err.status()}: {err.message()}"
            except (OSError, HTTPException, GeventTimeout) as err:
                self._drop_client(client)  # its connection may be left half-open
                if timeout_s is not None and isinstance(err, TimeoutError | GeventTimeout):
                    problem = f"{what} of {self.model_name!r} got no answer within {timeout_s:g} s"
                    raise BackendUnavailable(self.url, problem) from None
                problem = f"{type(err).__name__}: {err}"
            if attempt < tries - 1:
                delay = self._settings.retry_delays_s[attempt]
                logger.warning("%s: Triton at %s: %s failed (%s); retrying in %g s", self.model_id, self.url, what,
                               problem, delay)
                time.sleep(delay)
        elapsed_s = time.monotonic() - started
        problem = f"{what} of {self.model_name!r} failed {tries} times in {elapsed_s:.1f} s ({problem})"
        raise BackendUnavailable(self.url, problem)

    # -- the model repository ------------------------------------------------------------------------------

    def wait_until_ready(self, timeout_s: float) -> bool:
        """Poll the model's readiness every 50 ms; False when it is still not ready after ``timeout_s``."""
        name = self.model_name
        deadline = time.monotonic() + timeout_s
        while not self.call("readiness check", lambda client: client.is_model_ready(name)):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def wait_until_unloaded(self, timeout_s: float) -> bool:
        """Poll the repository every 50 ms; False when the model is still READY or UNLOADING after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.server_state() in ("READY", "UNLOADING"):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def server_state(self) -> str:
        """The model's state in the server's repository index: READY when any version is, UNAVAILABLE if absent."""
        index = self.call("repository index", lambda client: client.get_model_repository_index())
        states = [entry.get("state", "UNAVAILABLE") for entry in index if entry.get("name") == self.model_name]
        return "READY" if "READY" in states else (states[0] if states else "UNAVAILABLE")

    # -- clients -------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every client; the next call, from any thread, makes a new one."""
        with self._clients_lock:
            clients, self._clients = self._clients, []
            self._generation += 1
        for client in clients:
            _close(client)

    def _client(self, network_timeout_s: float) -> httpclient.InferenceServerClient:
        """This thread's client for this timeout (made after the last ``close``, else a new one)."""
        if getattr(self._local, "generation", None) != self._generation:
            self._local.clients, self._local.generation = {}, self._generation
        clients: dict[float, httpclient.InferenceServerClient] = self._local.clients
        client = clients.get(network_timeout_s)
        if client is None:
            client = httpclient.InferenceServerClient(
                self.url,
                ssl=self.ssl,
                connection_timeout=self._settings.connection_timeout_s,
                network_timeout=network_timeout_s,
            )
            with self._clients_lock:
                self._clients.append(client)
            clients[network_timeout_s] = client
        return client

    def _drop_client(self, client: httpclient.InferenceServerClient) -> None:
        clients: dict[float, httpclient.InferenceServerClient] = getattr(self._local, "clients", {})
        for key in [key for key, value in clients.items() if value is client]:
            del clients[key]
        with self._clients_lock:
            if client in self._clients:
                self._clients.remove(client)
        _close(client)


def _close(client: httpclient.InferenceServerClient) -> None:
    try:
        client.close()
    except Exception:  # closing a broken connection must not fail an unload
        logger.debug("closing a Triton client failed", exc_info=True)
