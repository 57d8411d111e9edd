"""The result consumers against the real Redis: every wait of a client (``Job.get``, ``gather``) and of an event
loop on one pub/sub connection, no result missed between the subscribe and the first read, a dropped connection
replaced with every wait still woken, and a gather woken by publishes rather than a polling loop.

The pub/sub connections counted are this process's own (``tests.stack.pubsub_connections``), those opened during
the test; a connection is killed by its id alone, so other users of the shared Redis are left alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from swapless.config.settings import Settings
from swapless.tasks.broker.connection import async_redis_client
from swapless.tasks.broker.results import ResultStore, StoredResult
from swapless.tasks.client import Client
from swapless.tasks.client.aconsumer import AsyncResultConsumer
from swapless.tasks.client.consumer import POLL_S, ResultConsumer
from tests.stack import pubsub_connections, wait_for


def _new_ids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def _opened_since(admin: redis.Redis, before: set[str]) -> Callable[[int], list[dict[str, Any]] | None]:
    """A probe for ``wait_for``: this process's pub/sub connections opened since ``before``, once they hold
    ``subscribed`` subscriptions in all."""

    def probe(subscribed: int) -> list[dict[str, Any]] | None:
        found = [c for c in pubsub_connections(admin, os.getpid()) if c["id"] not in before]
        return found if sum(int(c["sub"]) for c in found) >= subscribed else None

    return probe


def _ours(admin: redis.Redis) -> set[str]:
    return {c["id"] for c in pubsub_connections(admin, os.getpid())}


def _store_quietly(admin: redis.Redis, results: ResultStore, job_id: str, value: Any) -> None:
    """A success stored as Celery's backend stores it, with no publish: only a read can find it."""
    meta = {"status": "SUCCESS", "result": value, "traceback": None, "children": [],
            "date_done": "2026-01-01T00:00:00+00:00", "task_id": job_id}
    admin.set(results.key(job_id), json.dumps(meta), ex=600)


def test_two_hundred_gets_from_threads_share_one_pub_sub_connection(settings: Settings) -> None:
    client = Client(settings=settings, validate=False)
    admin = redis.Redis.from_url(settings.redis.broker_url)
    worker = ResultStore(client.app)  # stores and publishes as a worker does
    before = _ours(admin)
    ids = _new_ids(200)
    got: dict[str, Any] = {}

    def get(job_id: str) -> None:
        got[job_id] = client.job(job_id).get(timeout=60)

    threads = [threading.Thread(target=get, args=(job_id,)) for job_id in ids]
    for thread in threads:
        thread.start()
    opened = wait_for(lambda: _opened_since(admin, before)(200), 30, what="200 subscriptions")
    assert len(opened) == 1 and int(opened[0]["sub"]) == 200, opened
    worker.store([(job_id, {"echo": job_id}, None) for job_id in ids])
    for thread in threads:
        thread.join(30)
    assert got == {job_id: {"echo": job_id} for job_id in ids}
    client.close()
    assert _opened_since(admin, before)(0) == [], "the connection goes back with the client"


def test_a_result_stored_before_the_subscription_took_effect_is_not_missed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait reads at once, and once more when Redis confirms its subscription: a result stored (and published to
    nobody) in between is found. The consumer's pool lends its one connection only once the result is stored, and
    no poll comes within the test."""
    client = Client(settings=settings, validate=False)
    pool = redis.BlockingConnectionPool.from_url(settings.redis.broker_url, max_connections=1, timeout=20)
    held = pool.get_connection()  # the consumer cannot subscribe yet
    consumer = ResultConsumer(redis.Redis(connection_pool=pool), client.results, poll_s=60)
    worker = ResultStore(client.app)
    job_id = _new_ids(1)[0]
    reads: list[list[StoredResult]] = []
    fetch = client.results.fetch

    def fetch_then_store(job_ids: list[str]) -> list[StoredResult]:
        found = fetch(job_ids)
        reads.append(found)
        if len(reads) == 1:
            worker.store([(job_id, "stored in between", None)])  # its publish reaches nobody
        return found

    monkeypatch.setattr(client.results, "fetch", fetch_then_store)
    got: list[StoredResult] = []
    waiting = threading.Thread(target=lambda: got.append(consumer.wait(job_id, timeout_s=20)))
    started = time.monotonic()
    waiting.start()
    wait_for(lambda: reads, 10, what="the first read")
    time.sleep(0.2)
    pool.release(held)
    waiting.join(20)
    assert reads[0][0].state == "PENDING"
    assert [(s.state, s.value) for s in got] == [("SUCCESS", "stored in between")]
    assert time.monotonic() - started < 10, "found by the read after the subscription, not at the deadline"
    consumer.close()
    pool.disconnect()
    client.close()


def test_a_killed_pub_sub_connection_is_replaced_and_every_wait_still_wakes(settings: Settings) -> None:
    """Results stored with no publish before the kill are found by the read each wait makes once its keys are
    subscribed again; results published after it reach the new connection. No poll within the test."""
    client = Client(settings=settings, validate=False)
    consumer = ResultConsumer(client.redis, client.results, poll_s=60)
    admin = redis.Redis.from_url(settings.redis.broker_url)
    worker = ResultStore(client.app)
    before = _ours(admin)
    quiet, published = _new_ids(5), _new_ids(5)
    got: dict[str, StoredResult] = {}

    def wait(job_id: str) -> None:
        got[job_id] = consumer.wait(job_id, timeout_s=30)

    threads = [threading.Thread(target=wait, args=(job_id,)) for job_id in quiet + published]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    first = wait_for(lambda: _opened_since(admin, before)(10), 20, what="10 subscriptions")
    time.sleep(0.3)  # the first reads are done: they saw nothing
    for job_id in quiet:
        _store_quietly(admin, client.results, job_id, f"quiet {job_id}")
    assert admin.client_kill_filter(_id=first[0]["id"]) == 1
    # the keys subscribed again on a new connection (the quiet ones leave it as soon as their reads find them)
    second = wait_for(lambda: _opened_since(admin, before | {first[0]["id"]})(len(published)), 20,
                      what="the keys subscribed again on a new connection")
    assert len(second) == 1
    worker.store([(job_id, f"published {job_id}", None) for job_id in published])
    for thread in threads:
        thread.join(30)
    assert time.monotonic() - started < 15, "woken by the reconnection, not at their deadline (30 s)"
    assert {job_id: (s.state, s.value) for job_id, s in got.items()} == {
        **{job_id: ("SUCCESS", f"quiet {job_id}") for job_id in quiet},
        **{job_id: ("SUCCESS", f"published {job_id}") for job_id in published},
    }
    consumer.close()
    client.close()


def test_a_gather_of_a_thousand_jobs_is_woken_by_their_publishes_not_by_a_polling_loop(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Client(settings=settings, validate=False)
    worker = ResultStore(client.app)  # its own Redis client: its writes are not counted
    jobs = [client.job(job_id) for job_id in _new_ids(1000)]
    mgets: list[int] = []
    mget = client.redis.mget

    def counted(keys: list[str], *args: Any) -> Any:
        mgets.append(len(keys))
        return mget(keys, *args)

    monkeypatch.setattr(client.redis, "mget", counted)

    def finish() -> None:  # 20 batches over about 2 s, as a worker would finish them
        for start in range(0, len(jobs), 50):
            time.sleep(0.1)
            worker.store([(job.id, job.id, None) for job in jobs[start : start + 50]])

    finisher = threading.Thread(target=finish)
    started = time.monotonic()
    finisher.start()
    stored = client.gather(jobs, timeout=60)
    elapsed_s = time.monotonic() - started
    finisher.join()
    assert [s.value for s in stored] == [job.id for job in jobs]
    # one read first, then one per POLL_S at most (the safety net): the publishes carry the results themselves
    assert len(mgets) <= 2 + elapsed_s / POLL_S, (mgets, elapsed_s)
    assert max(mgets) <= 1000
    client.close()


def test_asyncio_waits_share_one_pub_sub_connection_that_is_replaced_when_killed(settings: Settings) -> None:
    client = Client(settings=settings, validate=False)
    admin = redis.Redis.from_url(settings.redis.broker_url)
    worker = ResultStore(client.app)
    before = _ours(admin)
    quiet, published = _new_ids(50), _new_ids(50)

    async def scenario() -> tuple[list[dict[str, Any]], list[StoredResult]]:
        aclient = async_redis_client(settings.redis.broker_url)
        consumer = AsyncResultConsumer(aclient, client.results, poll_s=60)
        started = time.monotonic()
        waits = [asyncio.create_task(consumer.wait(job_id, 30)) for job_id in quiet + published]
        first = await asyncio.to_thread(wait_for, lambda: _opened_since(admin, before)(100), 20)
        await asyncio.sleep(0.3)  # the first reads are done: they saw nothing
        for job_id in quiet:
            _store_quietly(admin, client.results, job_id, f"quiet {job_id}")
        assert admin.client_kill_filter(_id=first[0]["id"]) == 1
        second = await asyncio.to_thread(
            wait_for, lambda: _opened_since(admin, before | {first[0]["id"]})(len(published)), 20)
        worker.store([(job_id, f"published {job_id}", None) for job_id in published])
        stored = await asyncio.gather(*waits)
        assert time.monotonic() - started < 15, "woken by the reconnection, not at their deadline (30 s)"
        await consumer.aclose()
        await aclient.aclose()
        return [*first, *second], stored

    connections, stored = asyncio.run(scenario())
    assert len(connections) == 2 and int(connections[0]["sub"]) == 100, "one connection at a time for every wait"
    assert [(s.state, s.value) for s in stored] == [("SUCCESS", f"quiet {i}") for i in quiet] + [
        ("SUCCESS", f"published {i}") for i in published]
    assert _opened_since(admin, before)(0) == [], "the connection goes back with the consumer"
    client.close()
