"""Failover: a primary, replicas and three sentinels (tests/sentinel_cluster.py), the primary SIGKILLed, or stalled
(SIGSTOP) until the sentinels replace it and then back, while jobs stream in from a producer, with
``SWAPLESS_REDIS_MIN_REPLICAS=1``; and a managed Redis whose address moves to a promoted replica. Nothing a producer
was told is accepted is lost, every accepted job is answered, and results flow again within seconds of the
promotion. A wait for the stream that times out says what the stream was refused and what the sentinels did.

Workers load the ``crashy`` test framework (tests/crashy.py). Each scenario is tallied (``tests.faultkit.Scenario``)
and printed in the fault table at the end of the run. ``SWAPLESS_TEST_FAILOVER_JOBS`` sets how many jobs the
stream sends at least (300 by default; the run in docs/operations/high-availability.md sent a few thousand).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from swapless.config.errors import QueueUnavailable
from swapless.tasks.broker.sentinel import RECHECK_S
from swapless.tasks.client import Client, Job
from tests.faultkit import FaultEnv, Scenario, echoes, gate, settle, wait_for
from tests.redis_server import RedisServer
from tests.sentinel_cluster import MASTER, SentinelCluster

pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: Jobs the stream sends at least.
JOBS = int(os.environ.get("SWAPLESS_TEST_FAILOVER_JOBS", "300"))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    """A primary with two replicas (so that one is left to confirm writes after a failover) and three sentinels."""
    found = SentinelCluster(tmp_path / "sentinel", replicas=2)
    try:
        found.start()
        yield found
    finally:
        found.stop()


@dataclass
class Stream:
    """A producer thread submitting echo jobs one by one until stopped: what it was told is accepted, and when; what
    it was refused, and why; the error that ended it, if one did."""

    prefix: str
    accepted: list[tuple[Job, str, float]] = field(default_factory=list)
    #: When the submit of each accepted job began (monotonic): one sent to a stalled primary returns much later.
    began: list[float] = field(default_factory=list)
    refused: int = 0
    #: How many refusals said each thing.
    refusals: Counter[str] = field(default_factory=Counter)
    #: The last refusals, with when they came (monotonic).
    last_refusals: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=5))
    #: What ended the stream other than ``stop``.
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        client = Client()
        try:
            n = 0
            while not self.stop.is_set():
                text = f"{self.prefix}-{n}"
                n += 1
                began = time.monotonic()
                try:
                    job = client.submit("echo", text)
                except QueueUnavailable as err:  # the failover window: retryable, and not accepted
                    self.refused += 1
                    self.refusals[err.problem] += 1
                    self.last_refusals.append((time.monotonic(), err.problem))
                    time.sleep(0.05)
                    continue
                self.began.append(began)
                self.accepted.append((job, text, time.monotonic()))
        except BaseException as err:
            self.error = err
            raise
        finally:
            client.close()

    def accepted_after(self, when: float) -> list[Job]:
        return [job for job, _, at in self.accepted if at > when]

    def sent_after(self, when: float) -> list[Job]:
        """The accepted jobs whose submit began after ``when``."""
        # ``began`` is appended first: while a submit returns it may be one longer, and zip leaves that one out
        return [job for (job, _, _), began in zip(self.accepted, self.began, strict=False) if began > when]

    def has_accepted(self, count: int) -> bool:
        """Whether ``count`` jobs are accepted so far; raises at once if the stream has died."""
        if self.error is not None:
            raise AssertionError(f"the stream died: {self.error!r}\n{self.describe()}")
        return len(self.accepted) >= count

    def describe(self) -> str:
        """Where the stream stands, for failure messages: accepted, refused and why, last accepted."""
        now = time.monotonic()
        last = f"{now - self.accepted[-1][2]:.1f} s ago" if self.accepted else "never"
        lines = [f"stream {self.prefix!r}: {len(self.accepted)} accepted (the last {last}), {self.refused} refused"
                 + (f", died of {self.error!r}" if self.error is not None else "")]
        lines += [f"  {n} x {reason}" for reason, n in self.refusals.most_common(5)]
        lines += [f"  {now - at:.1f} s ago: {reason[:80]}..." for at, reason in self.last_refusals]
        return "\n".join(lines)


def _stream(prefix: str) -> tuple[Stream, threading.Thread]:
    stream = Stream(prefix)
    thread = threading.Thread(target=stream.run, name=f"stream-{prefix}", daemon=True)
    thread.start()
    return stream, thread


def _wait_accepted(stream: Stream, count: int, timeout_s: float, what: str,
                   cluster: SentinelCluster | None = None) -> float:
    """Wait until ``stream`` has ``count`` jobs accepted; a timeout says what the stream was told meanwhile and,
    with ``cluster``, whom the sentinels name and what they did (an unrequested failover shows there)."""

    def explain() -> str:
        return stream.describe() + ("\n" + cluster.describe() if cluster is not None else "")

    return wait_for(lambda: stream.has_accepted(count), timeout_s, what, on_timeout=explain)


def _first_result_after(client: Client, stream: Stream, since: float, timeout_s: float) -> float:
    """The monotonic time the first job ``stream`` had accepted after ``since`` has a final state."""

    def answered() -> bool:
        ids = [job.id for job in stream.accepted_after(since)]
        return any(s.ready for s in client.fetch(ids))

    return wait_for(answered, timeout_s, "a result of a job sent after the kill")


def _kill_during_stream(
    cluster: SentinelCluster, client: Client, prefix: str, scenario: Scenario,
    promoted: Callable[[], None] = lambda: None,
) -> tuple[RedisServer, dict[str, float]]:
    """Stream jobs, SIGKILL the primary once JOBS/2 are accepted, call ``promoted`` once the sentinels name the new
    one, go on to JOBS/2 more accepted, and tally every accepted job; returns the killed server and the timeline
    (seconds after the kill)."""
    stream, thread = _stream(prefix)
    _wait_accepted(stream, JOBS // 2, 60, f"{JOBS // 2} jobs accepted before the kill", cluster)
    killed_at = time.monotonic()
    old, promoted_s = cluster.kill_primary()
    promoted()
    first_accept = wait_for(lambda: bool(stream.accepted_after(killed_at + promoted_s)), 30,
                            "a job accepted after the promotion",
                            on_timeout=lambda: stream.describe() + "\n" + cluster.describe())
    first_result = _first_result_after(client, stream, killed_at, 30)
    _wait_accepted(stream, len(stream.accepted) + JOBS // 2, 60, f"{JOBS // 2} more jobs accepted", cluster)
    stream.stop.set()
    thread.join(30)
    stored, done_at = settle(client, [job for job, _, _ in stream.accepted], 90)
    scenario.count(stored, [echoes(text) for _, text, _ in stream.accepted])
    scenario.recovery_s = first_result - killed_at
    timeline = {"promotion": promoted_s, "first accepted": first_accept - killed_at,
                "first new result": first_result - killed_at, "all answered": done_at - killed_at}
    print(f"\n{scenario.name}: {timeline} ({len(stream.accepted)} accepted, {stream.refused} refused, old primary "
          f"{old.port})")
    return old, timeline


def test_the_primary_killed_while_jobs_stream_in_loses_nothing_accepted_and_comes_back_as_a_replica(
    cluster: SentinelCluster, faults: FaultEnv
) -> None:  # the cluster first: it outlives the workers, whose warm shutdown needs Redis
    faults.set(SWAPLESS_REDIS_URL=cluster.url(0), SWAPLESS_REDIS_SENTINEL_MASTER=MASTER,
               SWAPLESS_REDIS_MIN_REPLICAS="1", SWAPLESS_REDIS_REPLICA_TIMEOUT_S="0.5")
    worker = faults.worker(env={"SWAPLESS_PREFETCH": "64"})
    client = Client()
    # A job in flight through the failover, its worker holding (fetched, unacked) the jobs streamed meanwhile, and
    # a Job.get waiting on it: its result is stored on the new primary, after the promotion.
    waiting = gate(client, faults)
    got: list[object] = []

    def wait() -> None:
        try:
            got.append(waiting.job.get(timeout=60))
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            got.append(err)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()

    scenario = Scenario("S1. primary SIGKILLed under a job stream (Sentinel)")
    first, timeline = _kill_during_stream(cluster, client, "s1", scenario, waiting.open)
    scenario.assert_complete(faults.snapshot)
    # The worker reconnects as the sentinels name the new primary, not on Celery's reconnect backoff (its attempts
    # at 0, 2 and 6 s after the kill put the first new result 4 s or more after a 2 s promotion).
    assert timeline["first new result"] < timeline["promotion"] + 3.5, timeline
    waiter.join(10)
    assert got and waiting.expect.check(got[0]), f"the waiter hung or failed: {got}"
    # One line per process per failover: the kill's, and any a primary stalled on a loaded machine brought on.
    moved, failovers = worker.log().count("moved from"), cluster.failovers()
    assert moved == failovers, (f"one line per process saying where it reconnected per failover, got {moved} for "
                                f"{failovers}:\n{worker.log()[-3000:]}\n{cluster.describe()}")

    # The old primary comes back, as a replica of the new one, and the new one is killed in turn.
    first.start()
    cluster.wait_replica(first)
    again = Scenario("S2. the new primary SIGKILLed, the old one back as a replica")
    _kill_during_stream(cluster, client, "s2", again)
    again.assert_complete(faults.snapshot)
    assert worker.proc.poll() is None
    faults.wait_broker_idle(30)


def test_a_primary_stalled_past_its_failover_is_left_at_once_and_loses_nothing_accepted(
    cluster: SentinelCluster, faults: FaultEnv
) -> None:
    """The primary stops answering (SIGSTOP: a stalled machine) until the sentinels promote a replica, then goes on,
    a primary still until they demote it (8 s or more later: Sentinel waits that long before it reconfigures a
    server that says it is a primary). The producer's and the worker's connections to it are open and answered
    again; both leave it for the primary the sentinels name within ``RECHECK_S`` (``swapless.tasks.broker.sentinel``),
    not when it is demoted: jobs are accepted and answered again within seconds, and none accepted is lost (writes to
    the old primary are refused there, its replicas gone)."""
    faults.set(SWAPLESS_REDIS_URL=cluster.url(0), SWAPLESS_REDIS_SENTINEL_MASTER=MASTER,
               SWAPLESS_REDIS_MIN_REPLICAS="1", SWAPLESS_REDIS_REPLICA_TIMEOUT_S="0.5")
    worker = faults.worker(env={"SWAPLESS_PREFETCH": "64"})
    client = Client()
    scenario = Scenario("S4. primary stalled (SIGSTOP) past its failover, then back (Sentinel)")
    stream, thread = _stream("s4")
    try:
        _wait_accepted(stream, JOBS // 2, 60, f"{JOBS // 2} jobs accepted before the stall", cluster)
        old, promoted_s = cluster.stall_primary()
        resumed_at = time.monotonic()
        # The ask, a write in flight to the old primary refused (its WAIT), and slack: under the 8 s the sentinels
        # wait before they demote the old primary (which would send the clients away from it without the ask).
        bound_s = RECHECK_S + 4.0

        def explain() -> str:
            return f"the old primary ({old.port}) is now: {old.role()}\n{stream.describe()}\n{cluster.describe()}"

        # Jobs sent after the old primary went on: one sent before, to it, returns then, and is no sign.
        def answered() -> bool:
            ids = [job.id for job in stream.sent_after(resumed_at)]
            return any(s.ready for s in client.fetch(ids))

        first_accept = wait_for(lambda: stream.has_accepted(1) and bool(stream.sent_after(resumed_at)), bound_s,
                                "a job sent since the old primary went on accepted", on_timeout=explain)
        first_result = wait_for(answered, bound_s, "a result of a job sent since the old primary went on",
                                on_timeout=explain)
        old_role = old.role()
        _wait_accepted(stream, len(stream.accepted) + JOBS // 2, 60, f"{JOBS // 2} more jobs accepted", cluster)
    finally:
        stream.stop.set()
        thread.join(30)
    stored, done_at = settle(client, [job for job, _, _ in stream.accepted], 90)
    scenario.count(stored, [echoes(text) for _, text, _ in stream.accepted])
    scenario.recovery_s = promoted_s + first_result - resumed_at
    print(f"\n{scenario.name}: promotion {promoted_s:.2f} s after the stop; after it went on (then a {old_role}): "
          f"first accepted {first_accept - resumed_at:.2f} s, first new result {first_result - resumed_at:.2f} s, all "
          f"answered {done_at - resumed_at:.2f} s ({len(stream.accepted)} accepted, {stream.refused} refused)")
    scenario.assert_complete(faults.snapshot)
    moved, failovers = worker.log().count("moved from"), cluster.failovers()
    assert moved == failovers, (f"one line per process saying where it reconnected per failover, got {moved} for "
                                f"{failovers}:\n{worker.log()[-3000:]}\n{cluster.describe()}")
    assert worker.proc.poll() is None


def test_a_worker_acks_only_once_a_replica_holds_the_result(
    private_redis: Callable[..., RedisServer], faults: FaultEnv
) -> None:
    primary = private_redis()
    replica = private_redis(extra_args=["--replicaof", "127.0.0.1", str(primary.port)])
    wait_for(lambda: replica.client().info("replication")["master_link_status"] == "up", 20, "the replica to sync")
    primary.wait_confirmed()
    faults.set(SWAPLESS_REDIS_URL=primary.url(0), SWAPLESS_REDIS_MIN_REPLICAS="1",
               SWAPLESS_REDIS_REPLICA_TIMEOUT_S="0.2")
    worker = faults.worker()
    client = Client()
    settle(client, [client.submit("echo", "warm")], 30)
    faults.wait_broker_idle(30)  # acked: the replica confirmed the result (killed sooner, it never could)

    replica.stop(signal.SIGKILL)
    with pytest.raises(QueueUnavailable) as refused:
        client.submit("echo", "unconfirmed")
    assert "only 0 of the 1 replica(s) SWAPLESS_REDIS_MIN_REPLICAS asks for confirmed the write within 0.2 s" in str(
        refused.value)
    faults.wait_executed("unconfirmed")  # it is on the primary: the worker runs it, and stores its result there...
    wait_for(lambda: "the worker keeps its jobs and retries" in worker.log(), 20, "the worker to wait for a replica")
    time.sleep(1)
    assert faults.unacked() == 1, "...but does not ack it while no replica holds the result"

    replica.start()
    faults.wait_broker_idle(30)  # acked once the replica is back and holds it
    assert faults.executions()["unconfirmed"] == 1
    settle(client, [client.submit("echo", "after")], 30)


def test_a_managed_redis_whose_address_moves_to_the_promoted_replica(
    private_redis: Callable[..., RedisServer], faults: FaultEnv, tmp_path: Path
) -> None:
    """A managed service's failover: the primary dies and its address comes back serving the replica's data (here a
    new server on the same port, synced from the replica and promoted); plain ``redis://`` clients reconnect."""
    primary = private_redis()
    replica = private_redis(extra_args=["--replicaof", "127.0.0.1", str(primary.port)])
    wait_for(lambda: replica.client().info("replication")["master_link_status"] == "up", 20, "the replica to sync")
    primary.wait_confirmed()
    faults.set(SWAPLESS_REDIS_URL=primary.url(0), SWAPLESS_REDIS_MIN_REPLICAS="1",
               SWAPLESS_REDIS_REPLICA_TIMEOUT_S="0.5")
    worker = faults.worker(env={"SWAPLESS_PREFETCH": "64"})
    client = Client()
    scenario = Scenario("S3. managed Redis: the address moves to the promoted replica")
    stream, thread = _stream("s3")
    _wait_accepted(stream, JOBS // 2, 60, f"{JOBS // 2} jobs accepted before the kill")

    primary.stop(signal.SIGKILL)
    killed_at = time.monotonic()
    # The replica is promoted, and a new server at the old address takes its data (synced from it, then promoted).
    replica.client().execute_command("REPLICAOF", "NO", "ONE")
    moved = RedisServer(tmp_path / "redis-moved", extra_args=["--replicaof", "127.0.0.1", str(replica.port)])
    moved.port = primary.port
    try:
        moved.start()
        wait_for(lambda: moved.client().info("replication")["master_link_status"] == "up", 20, "the new server to sync")
        moved.client().execute_command("REPLICAOF", "NO", "ONE")
        replica.client().execute_command("REPLICAOF", "127.0.0.1", str(moved.port))  # the old replica follows it
        _answered_across(client, stream, thread, killed_at, scenario)
    finally:
        moved.stop(signal.SIGKILL)
    scenario.assert_complete(faults.snapshot)
    assert worker.proc.poll() is None


def _answered_across(client: Client, stream: Stream, thread: threading.Thread, killed_at: float,
                     scenario: Scenario) -> None:
    """Go on to JOBS/2 more jobs accepted after the move, and tally every accepted job."""
    first_result = _first_result_after(client, stream, killed_at, 30)
    _wait_accepted(stream, len(stream.accepted) + JOBS // 2, 60, f"{JOBS // 2} more jobs accepted")
    stream.stop.set()
    thread.join(30)
    stored, _ = settle(client, [job for job, _, _ in stream.accepted], 90)
    scenario.count(stored, [echoes(text) for _, text, _ in stream.accepted])
    scenario.recovery_s = first_result - killed_at
    print(f"\n{scenario.name}: first new result {scenario.recovery_s:.2f} s after the kill ({len(stream.accepted)} "
          f"accepted, {stream.refused} refused)")
