"""A real tritonserver for the tests: the binary that ships in the nvidia-pytriton wheel, on free ports.

Fixtures:
    triton_server: session-scoped; starts ``tritonserver`` on ``tests/triton_repo`` (explicit model control,
        127.0.0.1 only) and yields a ``TritonServer``. If the binary is missing or the server does not become
        ready, the fixture FAILS with the server's log tail: these tests must run in CI, never skip silently.
    fresh_triton: function-scoped; the same server with every model unloaded before the test starts.

How the server is started (what a manual run needs too):

- The Python backend's stub embeds a libpython of one Python version; the wheel ships one stub per version in
  ``pytriton/tritonserver/python_backend_stubs/X.Y``, so a backend directory is assembled in a temporary
  folder with the stub of the running interpreter (what PyTriton itself does, without writing into the venv).
- ``LD_LIBRARY_PATH``: the interpreter's ``LIBDIR`` (where ``libpython3.X.so.1.0`` lives) and the wheel's
  ``nvidia_pytriton.libs``.
- ``PATH`` starts with the interpreter's ``bin`` folder: the stub runs an *isolated* embedded Python, which
  ignores ``PYTHONPATH`` and finds its ``sys.prefix`` from the ``python3`` on ``PATH``; with the venv's, the
  models see the venv's site-packages (numpy).
- Models load without auto-complete (``--disable-auto-complete-config``; the configs are complete), which saves
  a stub start per load (about 1.2 s of each load).

Usage in a test module (or conftest.py)::

    from tests.triton_server import fresh_triton, triton_server  # noqa: F401
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = ["REPOSITORY", "TritonServer", "fresh_triton", "start_triton", "triton_server"]

#: The model repository the tests serve.
REPOSITORY = Path(__file__).resolve().parent / "triton_repo"
#: Seconds to wait for /v2/health/ready after the start.
READY_TIMEOUT_S = 60.0
#: Seconds to wait for a model to finish unloading.
UNLOAD_TIMEOUT_S = 30.0
#: Seconds between SIGTERM and SIGKILL at the end of the session.
STOP_TIMEOUT_S = 15.0


@dataclass
class TritonServer:
    """A running tritonserver. ``url`` is ``host:port`` of the HTTP endpoint (what ``tritonclient.http`` takes)."""

    url: str
    repository: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def request(self, method: str, path: str, body: Any = None, timeout_s: float = 30.0) -> Any:
        """One HTTP call to the server (plain urllib, independent of the code under test); the JSON answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://{self.url}{path}", data=data, method=method)
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            text = response.read().decode()
        return json.loads(text) if text else None

    def repository_index(self) -> list[dict[str, str]]:
        """Every model of the repository as ``{"name", "state"}``; one never loaded shows as UNAVAILABLE."""
        index = self.request("POST", "/v2/repository/index", {})
        return [{"name": e["name"], "state": e.get("state", "UNAVAILABLE")} for e in index]

    def state(self, name: str) -> str:
        """The repository state of one model (READY, LOADING, UNLOADING, UNAVAILABLE)."""
        return next((e["state"] for e in self.repository_index() if e["name"] == name), "UNAVAILABLE")

    def unload_all(self, timeout_s: float = UNLOAD_TIMEOUT_S) -> None:
        """Unload every model and wait until none is READY, LOADING or UNLOADING."""
        for entry in self.repository_index():
            if entry["state"] in ("READY", "LOADING"):
                self.request("POST", f"/v2/repository/models/{entry['name']}/unload", {})
        deadline = time.monotonic() + timeout_s
        while any(e["state"] in ("READY", "LOADING", "UNLOADING") for e in self.repository_index()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"models still loaded after {timeout_s:g} s: {self.repository_index()}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM (a background server ignores SIGINT), then SIGKILL after STOP_TIMEOUT_S."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _pytriton_dir() -> Path:
    spec = importlib.util.find_spec("pytriton")  # found without importing it (and its heavy imports)
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("nvidia-pytriton is not installed: it ships the tritonserver binary these tests need "
                    "(pip install -e '.[test]')", pytrace=False)
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def _backend_dir(dist: Path, workdir: Path) -> Path:
    """A backends folder with the Python backend and the stub for this interpreter's version."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        pytest.fail(f"no Python backend stub for Python {version} in {stub.parent.parent}", pytrace=False)
    python = workdir / "backends" / "python"
    python.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(dist / "backends" / "python" / name, python / name)
    shutil.copy2(stub, python / "triton_python_backend_stub")
    return python.parent


def server_env(dist: Path) -> dict[str, str]:
    """The environment tritonserver and its Python stubs need (see the module docstring)."""
    env = os.environ.copy()
    libs = [str(sysconfig.get_config_var("LIBDIR") or ""), str(dist.parent.parent / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = ":".join(p for p in [*libs, env.get("LD_LIBRARY_PATH", "")] if p)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


def start_triton(repository: Path, workdir: Path, attempts: int = 3) -> TritonServer:
    """Start tritonserver on free ports and wait until it is ready. Fails the test (not skip) if it cannot."""
    dist = _pytriton_dir()
    binary = dist / "bin" / "tritonserver"
    if not binary.exists():
        pytest.fail(f"tritonserver binary not found at {binary}", pytrace=False)
    backends = _backend_dir(dist, workdir)
    env = server_env(dist)
    server: TritonServer | None = None
    for attempt in range(1, attempts + 1):  # a free port can be taken between the probe and the bind
        http, grpc, metrics = _free_ports(3)
        command = [
            str(binary),
            f"--model-repository={repository}",
            "--model-control-mode=explicit",
            "--disable-auto-complete-config",
            "--strict-readiness=true",
            "--http-address=127.0.0.1", f"--http-port={http}",
            "--allow-grpc=true", "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
            "--allow-metrics=true", "--allow-gpu-metrics=false",
            "--metrics-address=127.0.0.1", f"--metrics-port={metrics}",
            f"--backend-directory={backends}",
            "--exit-timeout-secs=5",
            "--log-verbose=0",
        ]
        log_path = workdir / f"tritonserver-{attempt}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        server = TritonServer(f"127.0.0.1:{http}", repository, process, log_path, command, env)
        atexit.register(server.stop)  # in case the session dies before the fixture's teardown
        deadline = time.monotonic() + READY_TIMEOUT_S
        while process.poll() is None and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://{server.url}/v2/health/ready", timeout=2).close()
                return server
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        server.stop()
        if "already in use" not in server.log_tail().lower():
            break
    assert server is not None
    pytest.fail(
        f"tritonserver did not become ready (exit code {server.process.returncode}); command:\n"
        f"{' '.join(server.command)}\nlog tail ({server.log_path}):\n{server.log_tail()}",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A tritonserver serving ``tests/triton_repo`` for the whole session, stopped with SIGTERM at the end."""
    server = start_triton(REPOSITORY, tmp_path_factory.mktemp("tritonserver"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_triton(triton_server: TritonServer) -> TritonServer:
    """The session's server with every model unloaded, so each test starts from the same state."""
    if triton_server.process.poll() is not None:
        pytest.fail(f"tritonserver exited ({triton_server.process.returncode}):\n{triton_server.log_tail()}",
                    pytrace=False)
    triton_server.unload_all()
    return triton_server
