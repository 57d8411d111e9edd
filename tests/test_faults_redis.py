"""Fault injection, Redis: a private redis-server killed and restarted under a worker and a producer, and
password / ACL-user URLs whose secrets never reach the logs.

Workers load the ``crashy`` test framework (tests/crashy.py; see test_faults_delivery.py). Each test starts its
own redis-server (tests/redis_server.py) through the ``private_redis`` fixture (tests/conftest.py).

Each scenario tallies its jobs (``tests.faultkit.Scenario``): submitted, succeeded, failed with the expected error,
lost (no final state in time), conflicting (a final state other than its own); one table of every scenario of the
run is printed at the end (``pytest_terminal_summary`` in tests/conftest.py). Run them with ``pytest -m faults``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import psutil
import pytest
import redis

from swapless.config.errors import QueueUnavailable
from swapless.tasks.client import Client
from tests.conftest import REPO
from tests.faultkit import FaultEnv, Scenario, echoes, gate, settle, wait_for
from tests.redis_server import RedisServer, free_port, protected_configs_allowed

pytestmark = [pytest.mark.faults, pytest.mark.slow]


# -- 6. Redis restarts ----------------------------------------------------------------------------------------------


def test_redis_restarts_and_worker_and_producer_reconnect_by_themselves(
    faults: FaultEnv, private_redis: Callable[..., RedisServer]
) -> None:
    scenario = Scenario("6. Redis killed and restarted")
    server = private_redis()
    faults.set(SWAPLESS_REDIS_URL=server.url(0))
    # A prefetch of 5: when Redis dies, 5 jobs are held by the worker and the rest wait in the queue, none is
    # between the two (a message in transit then is lost: see the burst tests in test_faults_delivery.py, same
    # kombu cause).
    worker = faults.worker(env={"SWAPLESS_PREFETCH": "5"})
    client = Client()
    warm = [client.submit("echo", f"warm-{i}") for i in range(10)]
    settle(client, warm, 20)
    held = gate(client, faults)  # a batch in flight when Redis dies
    before = [client.submit("echo", f"before-{i}") for i in range(30)]  # sent: the producer was told they are queued
    wait_for(lambda: (faults.unacked(), faults.queued()) == (5, 26), 10, "the worker to hold 5 jobs, 26 queued")

    server.restart(signal.SIGKILL, down_s=2)  # a crash: only the AOF (fsync always) survives
    back_at = time.monotonic()
    held.open()  # the batch in flight ends after the restart
    after = [client.submit("echo", f"after-{i}") for i in range(30)]  # the same Client, reconnecting by itself
    stored, done_at = settle(client, [*warm, held.job, *before, *after], 90)
    scenario.recovery_s = done_at - back_at
    # Still consuming a while later (Celery has had bugs where a worker silently stops after a reconnection).
    time.sleep(2)
    later = [client.submit("echo", f"later-{i}") for i in range(10)]
    stored_later, _ = settle(client, later, 30)

    texts = [f"before-{i}" for i in range(30)] + [f"after-{i}" for i in range(30)] + [f"later-{i}" for i in range(10)]
    scenario.count(
        stored + stored_later, [echoes(f"warm-{i}") for i in range(10)] + [held.expect] + [echoes(t) for t in texts]
    )
    scenario.assert_complete(faults.snapshot)
    assert worker.proc.poll() is None
    assert server.starts == 2
    faults.wait_broker_idle(30)


def test_a_result_write_during_a_redis_outage_is_retried_until_it_lands_and_the_job_is_not_rerun(
    faults: FaultEnv, private_redis: Callable[..., RedisServer]
) -> None:
    server = private_redis()
    faults.set(SWAPLESS_REDIS_URL=server.url(0))
    worker = faults.worker()
    client = Client()
    held = gate(client, faults)  # computing when Redis goes: its result is written while Redis is down
    server.stop(signal.SIGKILL)
    held.open()
    wait_for(lambda: "ran 1 job(s) on hold" in worker.log(), 20, "the held batch to finish while Redis is down")
    # its result write fails and is retried all the while (backoff up to 2 s)
    wait_for(lambda: "the worker keeps its jobs and retries" in worker.log(), 20, "the worker to retry the store")
    assert worker.proc.poll() is None
    server.start()
    stored, _ = settle(client, [held.job], 60)
    assert held.expect.matches(stored[0]), stored[0]
    assert faults.executions()[stored[0].value["echo"]] == 1, "stored once it could be, never run again"
    faults.wait_broker_idle(30)  # and acked after the store


ADVICE = {
    "READONLY": "this Redis is a read-only replica; point SWAPLESS_REDIS_URL at the primary",
    "MISCONF": "Redis cannot save its data to disk and refuses writes; fix its disk or its save settings",
}


def _refuse_writes(admin: redis.Redis, refusal: str) -> None:
    if refusal == "READONLY":  # a failover left it a replica (of a primary that is not there)
        admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
    else:  # a save point and a save that cannot be written: stop-writes-on-bgsave-error
        admin.config_set("save", "3600 1")
        admin.config_set("dir", "/proc")
        admin.bgsave()
        wait_for(lambda: admin.info("persistence")["rdb_last_bgsave_status"] == "err", 10, "the save to fail")


def _take_writes(admin: redis.Redis, refusal: str, directory: str) -> None:
    if refusal == "READONLY":
        admin.execute_command("REPLICAOF", "NO", "ONE")
    else:
        admin.config_set("dir", directory)
        admin.bgsave()
        wait_for(lambda: admin.info("persistence")["rdb_last_bgsave_status"] == "ok", 10, "the save to succeed")


@pytest.mark.parametrize("refusal", ["READONLY", "MISCONF"])
def test_producers_of_a_redis_that_refuses_writes_get_one_line_and_queue_nothing(
    faults: FaultEnv, private_redis: Callable[..., RedisServer], refusal: str
) -> None:
    server = private_redis(extra_args=["--appendonly", "no", *protected_configs_allowed()])
    faults.set(SWAPLESS_REDIS_URL=server.url(0))
    client = Client()
    with server.client() as admin:
        _refuse_writes(admin, refusal)
        with pytest.raises(QueueUnavailable) as caught:
            client.submit_jobs([("echo", f"{refusal}-refused"), ("echo2", f"{refusal}-refused-2")])
        assert str(caught.value) == f"cannot reach Redis at {server.url(0)}: {ADVICE[refusal]}"
        done = subprocess.run([sys.executable, "-m", "swapless", "submit", "echo", "refused-cli"], cwd=REPO,
                              check=False, capture_output=True, text=True, env={**os.environ, **faults.env}, timeout=60)
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [f"error: {caught.value}"], done.stderr
        _take_writes(admin, refusal, str(server.directory))
    assert faults.queued() == 0  # nothing of the refused jobs
    client.submit("echo", f"{refusal}-taken")  # and taken again at once
    assert faults.queued() == 1


@pytest.mark.parametrize("refusal", ["MISCONF", "READONLY"])
def test_a_worker_whose_redis_refuses_writes_keeps_its_jobs_and_resumes_by_itself(
    faults: FaultEnv, private_redis: Callable[..., RedisServer], refusal: str
) -> None:
    # READONLY: the Redis turns replica (a failover, a `REPLICAOF`) while the worker waits for jobs on it, which
    # cuts that wait short with "UNBLOCKED ... instance state changed": the worker takes that for a refusal too
    what = "cannot save (MISCONF)" if refusal == "MISCONF" else "turns replica (READONLY)"
    scenario = Scenario(f"6. Redis {what}, then takes writes again")
    server = private_redis(extra_args=["--appendonly", "no", *protected_configs_allowed()])
    faults.set(SWAPLESS_REDIS_URL=server.url(0))
    worker = faults.worker()
    client = Client()
    held = gate(client, faults)  # a batch in hand: its result is written while Redis refuses writes
    queued = [client.submit("echo", f"{refusal}-queued-{i}") for i in range(5)]
    admin = server.client()
    _refuse_writes(admin, refusal)
    held.open()  # the batch in hand ends; its result cannot be written yet
    wait_for(lambda: "ran 1 job(s) on hold" in worker.log(), 20, "the batch in hand to finish")
    wait_for(lambda: f"Redis refusing writes: {refusal}" in worker.log(), 20, "the worker to see the refusal")
    assert client.fetch([held.job.id])[0].state == "PENDING"
    _take_writes(admin, refusal, str(server.directory))
    back_at = time.monotonic()
    after = [client.submit("echo", f"{refusal}-after-{i}") for i in range(5)]
    stored, done_at = settle(client, [held.job, *queued, *after], 30)
    scenario.recovery_s = done_at - back_at
    scenario.count(stored, [held.expect] + [echoes(f"{refusal}-queued-{i}") for i in range(5)]
                   + [echoes(f"{refusal}-after-{i}") for i in range(5)])
    scenario.assert_complete(faults.snapshot)
    assert faults.executions()[held.text] == 1, "its result was stored once it could be, never run again"
    assert worker.proc.poll() is None and "Unrecoverable error" not in worker.log()
    admin.close()


# -- 10. security ----------------------------------------------------------------------------------------------------


def _listening_ports(pid: int) -> list[tuple[str, int]]:
    process = psutil.Process(pid)
    listening = []
    for proc in [process, *process.children(recursive=True)]:
        for conn in proc.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN or (conn.type == socket.SOCK_DGRAM and not conn.raddr):
                listening.append((conn.laddr.ip, conn.laddr.port))
    return listening


def _remote_ports(pid: int) -> set[int]:
    return {conn.raddr.port for conn in psutil.Process(pid).net_connections(kind="inet") if conn.raddr}


def test_password_and_acl_user_urls_work_and_secrets_never_reach_the_logs(
    faults: FaultEnv, private_redis: Callable[..., RedisServer]
) -> None:
    scenario = Scenario("10. password / ACL user URLs")
    password, user_password, wrong = "Pw-default-7f3a9c", "Pw-acl-user-2b8e41", "Pw-wrong-c0ffee"
    server = private_redis(password=password)
    with server.client() as admin:
        admin.acl_setuser(
            "swapless-app",
            enabled=True,
            passwords=[f"+{user_password}"],
            keys=["*"],
            channels=["*"],
            categories=["+@all"],
        )
    acl_url = server.url(1, username="swapless-app", password=user_password)
    for url, secret in [(server.url(0), password), (acl_url, user_password)]:
        faults.set(SWAPLESS_REDIS_URL=url)
        worker = faults.worker()
        client = Client()
        texts = [f"{secret[-6:]}-{i}" for i in range(5)]
        stored, _ = settle(client, [client.submit("echo", text) for text in texts], 30)
        scenario.count(stored, [echoes(text) for text in texts])
        assert _listening_ports(worker.proc.pid) == [], "the worker listens on no port of its own"
        assert _remote_ports(worker.proc.pid) == {server.port}, "the worker talks to Redis, and to Redis only"
        client.close()
        assert worker.stop() == 0
        log = worker.log()
        assert ":**@127.0.0.1" in log, "Celery shows the URL masked"
        assert secret not in log and password not in log and user_password not in log
    scenario.assert_complete()

    faults.set(SWAPLESS_REDIS_URL=server.url(0, password=wrong))
    refused = faults.worker(ready=False)
    wait_for(lambda: "invalid username-password pair" in refused.log().lower() or refused.proc.poll() is not None,
             30, "the worker to report the refused password")
    refused.stop()
    log = refused.log()
    assert "invalid username-password pair" in log.lower(), log[-3000:]  # it said why it stopped: not an empty log
    assert wrong not in log
