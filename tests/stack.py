"""Helpers for the gateway, status and metrics tests: a private Redis corner shared by a module, a real
`swapless serve` process, free ports, the listening sockets of a process (read from /proc), and the pub/sub
connections a process holds on Redis."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import redis

from swapless.config.settings import get_settings
from tests.conftest import REPO, CliProcess, WorkerProcess
from tests.redis_server import free_port

__all__ = ["GatewayProcess", "free_port", "listening_ports", "private_env", "pubsub_connections", "run_cli", "wait_for"]

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None], timeout_s: float = 10.0, interval_s: float = 0.05, what: str = "condition"
) -> T:
    """Poll ``predicate`` until it returns something truthy; return that, or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def pubsub_connections(admin: redis.Redis, pid: int) -> list[dict[str, Any]]:
    """The pub/sub connections (``CLIENT LIST TYPE pubsub``: subscribed to some channel) that process ``pid`` holds
    on ``admin``'s Redis: those whose address is one of the process's own sockets."""
    ours = {f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process(pid).net_connections(kind="inet") if c.raddr}
    return [c for c in admin.client_list(_type="pubsub") if c["addr"] in ours]


@contextmanager
def private_env(redis_url: str, models_file: Path, **extra: str) -> Iterator[dict[str, str]]:
    """Like conftest's ``swapless_env``, for a whole module: set the variables here, delete the keys afterwards."""
    prefix = f"swapless-test-{uuid.uuid4().hex[:10]}:"
    env = {
        "SWAPLESS_REDIS_URL": redis_url,
        "SWAPLESS_KEY_PREFIX": prefix,
        "SWAPLESS_QUEUE": prefix + "jobs",
        "SWAPLESS_MODELS_FILE": str(models_file),
        "SWAPLESS_DEVICE": "cpu",
        **extra,
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    get_settings.cache_clear()
    try:
        yield env
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        get_settings.cache_clear()
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m swapless ARGS`` with a wide terminal, so tables are not cut."""
    return subprocess.run(
        [sys.executable, "-m", "swapless", *args],
        check=False,
        cwd=REPO,
        env={**os.environ, **(env or {}), "COLUMNS": "200", "TERM": "dumb"},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


class GatewayProcess(CliProcess):
    """A real `swapless serve` process on a free port."""

    def __init__(self, env: dict[str, str], log_path: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(["serve", "--port", str(self.port), "--log-level", "warning", *args], env, log_path)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"gateway exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                httpx.get(self.url + "/openapi.json", timeout=1.0)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise AssertionError(f"gateway not ready after {timeout_s} s:\n{self.log()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        return super().stop(sig, timeout_s)


@dataclass
class Stack:
    """A real worker and a real gateway on one private environment, and an HTTP client of the gateway."""

    env: dict[str, str]
    worker: WorkerProcess
    gateway: GatewayProcess
    http: httpx.Client


@contextmanager
def worker_and_gateway(
    redis_url: str, models_file: Path, logs: Path, hostname: str, *gateway_args: str, **extra: str
) -> Iterator[tuple[dict[str, str], WorkerProcess, GatewayProcess]]:
    """A private environment (``extra`` on top), a real worker (``--hostname``, no warm start) and a real
    ``swapless serve`` on it, both ready; both stopped afterwards."""
    with private_env(redis_url, models_file, **extra) as env:
        worker = WorkerProcess(["--hostname", hostname, "--no-warm-start"], env, logs / "worker.log")
        gateway = GatewayProcess(env, logs / "gateway.log", *gateway_args)
        try:
            worker.wait_ready()
            gateway.wait_ready()
            yield env, worker, gateway
        finally:
            gateway.stop()
            worker.stop()


def listening_ports(pid: int) -> list[tuple[str, int]]:
    """The TCP ``(address, port)`` pairs process ``pid`` listens on (Linux: its socket inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table, size in (("tcp", 4), ("tcp6", 16)):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            address_hex, port_hex = local.split(":")
            raw = bytes.fromhex(address_hex)
            if size == 4:
                address = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                address = socket.inet_ntop(socket.AF_INET6, words)
            found.append((address, int(port_hex, 16)))
    return sorted(found)
