"""A private Redis Sentinel deployment for failover tests: a primary, its replicas and three sentinels, each a
``redis-server`` (``--sentinel`` for the sentinels) on a free 127.0.0.1 port with its own directory.

The sentinels declare a primary down after ``down_after_ms`` without an answer (1 s here, 30 s by default) and
retry a failover after ``failover_timeout_ms``; a quorum of two starts it. So a SIGKILLed primary's replica is
promoted about two seconds later. ``kill_primary`` kills it and returns when the sentinels name the new one;
``stall_primary`` stops it (SIGSTOP) until they name a new one and lets it go on, alive and still a primary until
the sentinels demote it (8 s or more later). A primary that stalls on its own for ``down_after_ms`` (a loaded
machine) is replaced too: ``failovers`` counts every promotion, ``describe`` says who is primary now and what the
sentinels logged, for failure messages.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import redis

from tests.redis_server import RedisServer, free_port, redis_server_binary

__all__ = ["MASTER", "SentinelCluster", "SentinelServer"]

#: The master name the sentinels know the primary by.
MASTER = "swapless"


class SentinelServer:
    """One sentinel (``redis-server --sentinel``) with its own config file, which it rewrites as it learns."""

    def __init__(self, directory: Path, primary_port: int, *, down_after_ms: int, failover_timeout_ms: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.primary_port = primary_port
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.proc: subprocess.Popen[bytes] | None = None

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, decode_responses=True)

    def start(self, timeout_s: float = 20.0) -> None:
        config = self.directory / "sentinel.conf"
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndaemonize no\ndir {self.directory}\n"
            f"logfile {self.directory / 'sentinel.log'}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {MASTER} 1\n"
        )
        self.proc = subprocess.Popen([redis_server_binary(), str(config), "--sentinel"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with self.client() as client:
                    if client.ping():
                        return
            except redis.ConnectionError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sentinel on port {self.port} did not start:\n{self.log()}")
            time.sleep(0.05)

    def master(self) -> dict[str, object]:
        """What this sentinel knows of the primary (``SENTINEL MASTER``)."""
        with self.client() as client:
            return dict(client.sentinel_master(MASTER))

    def primary_port_now(self) -> int | None:
        """The port this sentinel names as the primary's now."""
        with self.client() as client:
            found = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
        return int(found[1]) if found else None

    def log(self) -> str:
        return self.full_log()[-3000:]

    def full_log(self) -> str:
        path = self.directory / "sentinel.log"
        return path.read_text(errors="replace") if path.exists() else "(no log)"

    def events(self) -> list[str]:
        """The lines of its log that say what it saw and did: a server down or back, a failover, a demotion, its
        TILT mode (its own timer stalled: it acts on nothing for 30 s)."""
        marks = ("+sdown", "-sdown", "+odown", "-odown", "+switch-master", "+convert-to-slave", "+tilt", "-tilt",
                 "+failover-end", "failover-abort")
        return [line for line in self.full_log().splitlines() if any(mark in line for mark in marks)]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


class SentinelCluster:
    """A primary, ``replicas`` replicas of it and three sentinels watching them (see the module docstring).

    Args:
        root: where each server gets its own directory.
        replicas: how many replicas the primary has.
        down_after_ms: how long a primary goes unanswered before a sentinel calls it down.
        failover_timeout_ms: the sentinels' failover timeout.
    """

    def __init__(self, root: Path, *, replicas: int = 1, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 3000) -> None:
        self.root = Path(root)
        self.primary = RedisServer(self.root / "redis-0")
        self.replicas = [RedisServer(self.root / f"redis-{n + 1}",
                                     extra_args=["--replicaof", "127.0.0.1", str(self.primary.port)])
                         for n in range(replicas)]
        self.sentinels = [
            SentinelServer(self.root / f"sentinel-{n}", self.primary.port, down_after_ms=down_after_ms,
                           failover_timeout_ms=failover_timeout_ms)
            for n in range(3)
        ]
        self.servers = [self.primary, *self.replicas]

    def url(self, db: int = 0) -> str:
        """The ``sentinel://...;sentinel://...`` URL of the three sentinels (Celery's form)."""
        return ";".join(f"sentinel://127.0.0.1:{s.port}/{db}" for s in self.sentinels)

    def start(self, timeout_s: float = 30.0) -> None:
        """Start everything and wait until the replicas are in sync and every sentinel knows them and the others."""
        for server in self.servers:
            server.start()
        for sentinel in self.sentinels:
            sentinel.start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                states = [s.master() for s in self.sentinels]
                linked = all(_linked(replica) for replica in self.replicas)
                wanted = len(self.replicas)
                if linked and all(int(str(m["num-other-sentinels"])) >= 2 and int(str(m["num-slaves"])) >= wanted
                                 for m in states):
                    self.primary.wait_confirmed(wanted, max(1.0, deadline - time.monotonic()))
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels did not come together:\n" + self.sentinels[0].log())
            time.sleep(0.1)

    def primary_port(self) -> int | None:
        """The primary's port as the first sentinel names it."""
        return self.sentinels[0].primary_port_now()

    def current_primary(self) -> RedisServer:
        """The server the sentinels name the primary now."""
        port = self.primary_port()
        return next(server for server in self.servers if server.port == port)

    def kill_primary(self, timeout_s: float = 30.0) -> tuple[RedisServer, float]:
        """SIGKILL the primary and wait until every sentinel names another one.

        Returns:
            the killed server, and the seconds from the kill to the promotion.
        """
        old = self.current_primary()
        killed_at = time.monotonic()
        old.stop(signal.SIGKILL)
        return old, self._promoted(old, killed_at, timeout_s, "the kill")

    def stall_primary(self, timeout_s: float = 30.0) -> tuple[RedisServer, float]:
        """Stop the primary (SIGSTOP) until every sentinel names another one, then let it go on (SIGCONT): it comes
        back a primary, with its clients' connections open, until the sentinels demote it.

        Returns:
            the stalled server, and the seconds from the stop to the promotion.
        """
        old = self.current_primary()
        stopped_at = time.monotonic()
        old.pause()
        try:
            return old, self._promoted(old, stopped_at, timeout_s, "the stop")
        finally:
            old.resume()

    def _promoted(self, old: RedisServer, since: float, timeout_s: float, what: str) -> float:
        """Wait until every sentinel names a primary other than ``old`` that says it is one; the seconds since
        ``since``."""
        deadline = since + timeout_s
        while True:
            try:
                ports = {s.primary_port_now() for s in self.sentinels}
                if len(ports) == 1 and old.port not in ports and None not in ports:
                    new = self.current_primary()
                    with new.client() as client:
                        if client.info("replication")["role"] == "master":
                            return time.monotonic() - since
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no failover {timeout_s} s after {what}:\n" + self.describe())
            time.sleep(0.05)

    def failovers(self) -> int:
        """How many times the sentinels have promoted a replica so far: the most ``+switch-master`` lines of one
        sentinel's log (each logs every switch once: the others as soon as they name the new primary, the one that
        led it once it has reconfigured the replicas, a second or more later)."""
        return max(sum("+switch-master" in line for line in sentinel.events()) for sentinel in self.sentinels)

    def describe(self) -> str:
        """Who the sentinels name, what each server says it is, and the first sentinel's events: for failure
        messages (an unrequested failover shows here)."""
        named = []
        for sentinel in self.sentinels:
            try:
                named.append(str(sentinel.primary_port_now()))
            except redis.RedisError as err:
                named.append(f"? ({type(err).__name__})")
        lines = [f"sentinels name the primary at port(s) {', '.join(named)}",
                 "servers: " + ", ".join(f"{server.directory.name}:{server.port} {server.role()}"
                                         for server in self.servers),
                 f"sentinel-0 events ({self.failovers()} failover(s)):"]
        lines += self.sentinels[0].events()[-30:] or ["(none)"]
        return "\n".join(lines)

    def wait_replica(self, server: RedisServer, timeout_s: float = 30.0) -> None:
        """Wait until ``server`` (an old primary back) is a replica of the primary, in sync."""
        deadline = time.monotonic() + timeout_s
        while True:
            if _linked(server):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis on port {server.port} did not become a replica:\n" + self.describe())
            time.sleep(0.1)

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop(signal.SIGKILL)


def _linked(server: RedisServer) -> bool:
    """Whether ``server`` is a replica in sync with its primary."""
    try:
        with server.client() as client:
            info = client.info("replication")
    except redis.RedisError:
        return False
    return info.get("role") == "slave" and info.get("master_link_status") == "up"
