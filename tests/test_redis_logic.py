"""Redis-side bookkeeping that needs neither Lua nor a worker, over ``fakeredis`` (no real Redis, no process).

The key layout of ``swapless.tasks.keyspace``; results as ``ResultStore`` encodes, reads and deletes them (its Lua
scripts, ``store``/``start``/``prior``/``cancel``, are left to tests/test_results.py on the real Redis); the worker
heartbeats and their index (``swapless.tasks.cluster.members``); and the reads behind ``swapless status``: each
model's placement (``swapless.tasks.cluster.view``) and the depth of the queue (``swapless.tasks.observe.queue``).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis
from celery import states
from redis.crc import key_slot

from swapless.config.errors import InputError, JobCancelled, JobFailed
from swapless.config.settings import Settings
from swapless.tasks.app import make_app
from swapless.tasks.broker.results import ResultStore
from swapless.tasks.cluster.members import CacheInfo, Heartbeat, WaitSummary, read_heartbeats
from swapless.tasks.cluster.view import read_placement
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.accounting import GroupReport
from swapless.tasks.observe.beats import HeartbeatPublisher
from swapless.tasks.observe.queue import read_queue_depth
from swapless.tasks.observe.stats import WorkerStats
from swapless.tasks.protocol import PRIORITY_STEPS, item_id, split_item_id, storage_id

PREFIX = "t:"
KEYS = Keyspace("jobs", PREFIX)
#: Nothing listens there: a command that reached past fakeredis would fail, not touch a real Redis.
NOWHERE = "redis://127.0.0.1:9/0"


@pytest.fixture
def r() -> Iterator[fakeredis.FakeRedis]:
    client = fakeredis.FakeRedis()
    yield client
    client.close()


@pytest.fixture
def settings() -> Settings:
    return Settings(redis_url=NOWHERE, queue="jobs", key_prefix=PREFIX, result_expires_s=120)


@pytest.fixture
def store(settings: Settings, r: fakeredis.FakeRedis) -> ResultStore:
    return ResultStore(make_app(settings), retry_s=0, client=r)


# -- key layout (tasks.keyspace) --------------------------------------------------------------------------------


def test_the_ingress_is_kombu_s_priority_lists_under_the_prefix_with_records_of_its_own() -> None:
    assert KEYS.ingress(0) == "t:jobs"  # priority 0 is the queue's own list
    assert [KEYS.ingress(p) for p in PRIORITY_STEPS[1:]] == ["t:jobs\x06\x163", "t:jobs\x06\x166", "t:jobs\x06\x169"]
    assert Keyspace("jobs").ingress(6) == "jobs\x06\x166"  # no prefix
    ingress = KEYS.ingress_lists
    assert ingress.lists == tuple(KEYS.ingress(p) for p in PRIORITY_STEPS)
    assert ingress.records == ["t:swapless:{jobs/*ingress}:held", "t:swapless:{jobs/*ingress}:owner",
                               "t:swapless:{jobs/*ingress}:seen"]


def test_every_key_of_one_model_shares_one_cluster_slot_and_the_bell_is_per_queue() -> None:
    model = KEYS.model("sentiment")
    keys = [*model.lists, *model.records, model.holders, model.bell]
    assert keys[0] == "t:swapless:{jobs/sentiment}:p0" and keys[-1] == "t:swapless:{jobs/sentiment}:bell"
    assert [model.list_for(p) for p in PRIORITY_STEPS] == keys[:4]
    assert len(set(keys)) == 9
    assert {key_slot(k.encode()) for k in keys} == {key_slot(b"{jobs/sentiment}")}  # one slot: scripts fit a cluster
    assert key_slot(KEYS.model("spam").lists[0].encode()) != key_slot(keys[0].encode())
    assert KEYS.placement_bell == "t:swapless:jobs:placement-bell"
    assert Keyspace("jobs").placement_bell == "swapless:jobs:placement-bell"
    assert (KEYS.routes, KEYS.shadow_counts) == ("t:swapless:jobs:routes", "t:swapless:jobs:shadow")
    assert (KEYS.heartbeat("w@h:1"), KEYS.heartbeats) == ("t:swapless:worker:w@h:1", "t:swapless:workers")


def test_an_item_of_a_chunk_is_stored_under_its_chunk_and_a_job_under_itself() -> None:
    chunk = str(uuid.uuid4())
    assert [item_id(chunk, i) for i in (0, 11)] == [f"{chunk}:0", f"{chunk}:11"]
    assert split_item_id(item_id(chunk, 11)) == (chunk, 11)
    assert storage_id(item_id(chunk, 11)) == chunk
    assert storage_id(chunk) == chunk  # a Celery id has no colon: a job of its own
    assert split_item_id("a:b:7") == ("a:b", 7) and storage_id("a:b:7") == "a:b"  # the last colon counts
    assert split_item_id("abc:-1") is None and storage_id("abc:") == "abc:"


# -- results (tasks.broker.results, the methods without a script) ----------------------------------------------


def test_results_are_read_back_in_order_and_a_missing_one_is_pending(store: ResultStore,
                                                                      r: fakeredis.FakeRedis) -> None:
    done, missing = str(uuid.uuid4()), str(uuid.uuid4())
    prediction = [{"label": "POSITIVE", "score": 0.75}, {"label": "NEGATIVE", "score": 0.25}]
    assert store.key(done) == f"{PREFIX}celery-task-meta-{done}"  # the key Celery's AsyncResult reads
    assert store.attempts_key(done) == f"{PREFIX}swapless-attempts-{done}"
    r.set(store.key(done), store._encode(done, prediction, None, "2026-01-01T00:00:00+00:00"))
    got = store.fetch([missing, done, missing])
    assert [(s.job_id, s.state, s.value) for s in got] == [
        (missing, states.PENDING, None), (done, states.SUCCESS, prediction), (missing, states.PENDING, None)
    ]
    assert [s.ready for s in got] == [False, True, False]
    raw = r.get(store.key(done))
    assert isinstance(raw, bytes)
    meta = json.loads(raw)
    assert meta == {"status": "SUCCESS", "result": prediction, "traceback": None, "children": None,
                    "date_done": "2026-01-01T00:00:00+00:00", "task_id": done}  # Celery's fields, nothing else
    assert store.fetch([]) == []


def test_a_failure_is_rebuilt_as_the_worker_s_own_error(store: ResultStore, r: fakeredis.FakeRedis) -> None:
    job = str(uuid.uuid4())
    r.set(store.key(job), store._encode(job, None, InputError("sentiment", "empty text"), "2026-01-01T00:00:00"))
    [failed] = store.fetch([job])
    assert failed.state == states.FAILURE and failed.ready
    assert type(failed.value) is InputError
    assert (failed.value.model_id, failed.value.problem) == ("sentiment", "empty text")
    assert str(failed.value) == "bad input for model 'sentiment': empty text"


def test_a_failure_is_stored_under_its_public_name(store: ResultStore) -> None:
    """Errors are stored as ``swapless.<Name>``, the name a program imports them by, not where they are defined."""
    job = str(uuid.uuid4())
    stored = json.loads(store._encode(job, None, InputError("sentiment", "empty text"), "2026-01-01T00:00:00"))
    assert (stored["result"]["exc_module"], stored["result"]["exc_type"]) == ("swapless", "InputError")


@pytest.mark.parametrize("module", ["config.errors", "swapless.config.errors", "swapless"])
def test_a_failure_stored_by_an_older_layout_decodes_as_the_same_error(
    store: ResultStore, r: fakeredis.FakeRedis, module: str
) -> None:
    """A worker from before the one import root stored ``config.errors``; a reader today rebuilds the same class.
    A module it does not know stays Celery's stand-in, never an import of whatever that name is here."""
    job, foreign = str(uuid.uuid4()), str(uuid.uuid4())
    meta = {"status": "FAILURE", "traceback": None, "children": None, "date_done": "2026-01-01T00:00:00",
            "result": {"exc_type": "InputError", "exc_module": module,
                       "exc_message": ["sentiment", "empty text; send at least one non-blank character"]}}
    r.set(store.key(job), json.dumps({**meta, "task_id": job}))
    r.set(store.key(foreign), json.dumps({**meta, "task_id": foreign,
                                          "result": {**meta["result"], "exc_module": "someone.elses"}}))
    old, other = store.fetch([job, foreign])
    assert type(old.value) is InputError and old.value.model_id == "sentiment"
    assert str(old.value) == "bad input for model 'sentiment': empty text; send at least one non-blank character"
    assert not isinstance(other.value, InputError) and type(other.value).__name__ == "InputError"


def test_an_output_json_cannot_hold_becomes_this_job_s_failure_and_kombu_types_survive(store: ResultStore) -> None:
    tagged, unstorable = str(uuid.uuid4()), str(uuid.uuid4())
    when = {"id": uuid.UUID(int=7)}  # not plain JSON: kombu's encoder tags it and reads it back
    assert store.decode(tagged, store._encode(tagged, when, None, "x")).value == when
    result = store.decode(unstorable, store._encode(unstorable, {1, 2}, None, "x"))
    assert result.state == states.FAILURE and isinstance(result.value, JobFailed)
    assert result.value.error_type == "ResultNotStorable" and "cannot be stored as JSON" in result.value.detail


def test_celery_s_own_revoke_reads_as_a_cancel(store: ResultStore) -> None:
    job = str(uuid.uuid4())
    raw = store.backend.encode({"status": states.REVOKED, "result": None, "traceback": None, "children": None,
                                "date_done": "2026-01-01T00:00:00", "task_id": job})
    revoked = store.decode(job, raw)
    assert revoked.state == states.FAILURE and isinstance(revoked.value, JobCancelled)
    assert revoked.value.job_id == job and store.decode(job, None).state == states.PENDING


def test_forget_and_clear_attempts_delete_only_the_keys_they_name(store: ResultStore, r: fakeredis.FakeRedis) -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    for job in (a, b):
        r.set(store.key(job), store._encode(job, "ok", None, "x"))
        r.set(store.attempts_key(job), 1)
    store.forget([a])
    store.clear_attempts([b])
    assert [s.state for s in store.fetch([a, b])] == [states.PENDING, states.SUCCESS]
    assert (r.exists(store.attempts_key(a)), r.exists(store.attempts_key(b))) == (1, 0)
    store.forget([])  # nothing to delete: no command (DEL with no key is an error)
    store.clear_attempts([])
    assert sorted(r.keys()) == sorted([store.key(b).encode(), store.attempts_key(a).encode()])


# -- heartbeats (tasks.cluster.members) ------------------------------------------------------------------------


def _beat(hostname: str, pid: int, **fields: Any) -> Heartbeat:
    cache = CacheInfo(max_models=2, memory_budget_bytes=None, used_bytes=0, hits=0, misses=0, loads=0, evictions=0,
                      load_failures=0)
    values: dict[str, Any] = {
        "hostname": hostname, "pid": pid, "worker_id": f"{hostname}:{pid}", "queue": "jobs", "started_at": 1.0,
        "sent_at": time.time(), "interval_s": 2.0, "cache": cache, "loaded": [], "models": {}, "jobs_done": 0,
        "jobs_failed": 0, "backlog": 0, "queue_wait": WaitSummary(),
    }
    return Heartbeat(**(values | fields))


def test_read_heartbeats_lists_the_live_workers_of_the_index_by_hostname(r: fakeredis.FakeRedis) -> None:
    assert read_heartbeats(r, KEYS) == []  # no index yet
    beats = {"zeta@h:2": _beat("zeta@h", 2, jobs_done=7), "alpha@h:1": _beat("alpha@h", 1, redis_problem="OOM")}
    for worker_id, beat in beats.items():
        r.set(KEYS.heartbeat(worker_id), beat.model_dump_json(), px=6000)
    r.set(KEYS.heartbeat("broken@h:3"), b'{"hostname": "broken@h"}')  # unreadable: skipped, not fatal
    now = time.time()
    r.zadd(KEYS.heartbeats, {"zeta@h:2": now, "alpha@h:1": now, "broken@h:3": now, "gone@h:4": now - 9})
    found = read_heartbeats(r, KEYS)  # gone@h:4's key expired: only its index entry is left
    assert [(b.hostname, b.worker_id, b.jobs_done, b.redis_problem) for b in found] == [
        ("alpha@h", "alpha@h:1", 0, "OOM"), ("zeta@h", "zeta@h:2", 7, None)
    ]
    assert read_heartbeats(r, Keyspace("jobs", "other:")) == []  # another deployment's prefix sees none of them


def test_a_publisher_that_stops_deletes_its_heartbeat_and_its_index_entry(r: fakeredis.FakeRedis) -> None:
    publisher = HeartbeatPublisher(r, KEYS, "w@h:9", build=lambda: _beat("w@h", 9), interval_s=0.5)
    assert (publisher.key, publisher.index, publisher.ttl_ms) == ("t:swapless:worker:w@h:9", "t:swapless:workers", 1500)
    r.set(publisher.key, publisher.build().model_dump_json())  # as beat() leaves it (beat itself is a script)
    r.zadd(publisher.index, {"w@h:9": time.time(), "other@h:1": time.time()})
    publisher.stop()  # never started: no thread to join, the keys go all the same
    assert not r.exists(publisher.key)
    assert r.zrange(publisher.index, 0, -1) == [b"other@h:1"]


def test_worker_stats_add_up_group_reports_and_summarise_recent_queue_waits() -> None:
    stats = WorkerStats(window=4)
    stats(GroupReport("a", 3, {"InputError": 1}, 0.5, (0.1, 0.2, 0.3, 0.4), 0, 1, (0.2,), 0, ("b",)))
    stats(GroupReport("a", 2, {}, 0.25, (1.0, 2.0), 1, 0, (), 0, ()))
    stats.skipped("a", "expired", 5)
    stats.skipped("a", "cancelled", 2)
    models = stats.models()
    a, b = models["a"], models["b"]
    assert (a.groups, a.jobs_done, a.jobs_failed, a.jobs_expired, a.jobs_cancelled) == (2, 5, 1 + 5, 5, 2)
    assert (a.hits, a.misses, a.loads, a.load_s_last, a.evictions) == (1, 1, 1, 0.2, 0)
    assert a.run_s_total == pytest.approx(0.3 + 0.25)  # the load is not run time
    assert (b.evictions, b.groups) == (1, 0)  # evicted to make room for "a": counted on "b"
    models["a"].groups = 99  # a copy: the stats are not changed through it
    assert stats.models()["a"].groups == 2
    wait = stats.queue_wait()  # the last 4 of 6 waits: 0.3, 0.4, 1.0, 2.0
    assert (wait.count, wait.window, wait.p50_s, wait.p95_s, wait.max_s) == (6, 4, 1.0, 2.0, 2.0)
    assert wait.mean_s == pytest.approx(0.925)
    assert WorkerStats().queue_wait() == WaitSummary()


# -- what status reads (tasks.cluster.view, tasks.observe.queue) ----------------------------------------------


def test_read_placement_counts_each_model_s_lists_held_jobs_and_live_claims(redis_url: str, key_prefix: str) -> None:
    """On a real Redis: the read is a server-side script (fakeredis runs no Lua here)."""
    r = redis.Redis.from_url(redis_url)
    keys = Keyspace(key_prefix + "jobs", key_prefix)
    now_ms = int(time.time() * 1000)
    model = keys.model("sentiment")
    r.rpush(model.list_for(0), "m1", "m2")
    r.rpush(model.list_for(6), "m3")
    r.hset(model.held, mapping={"tag1": "m0"})
    r.zadd(model.holders, {"w2@h:2": now_ms + 30_000, "w1@h:1": now_ms + 60_000, "dead@h:3": now_ms - 1})  # one ended
    sentiment, spam = read_placement(r, keys, ["sentiment", "spam"])
    assert (sentiment.model_id, sentiment.queued, sentiment.waiting_messages, sentiment.held) == (
        "sentiment", {0: 2, 3: 0, 6: 1, 9: 0}, 3, 1)
    assert sentiment.holder_ids == ("w1@h:1", "w2@h:2")  # live claims only, by name
    assert dict(sentiment.holders)["w1@h:1"] == pytest.approx((now_ms + 60_000) / 1000)  # lease end, in seconds
    assert (spam.waiting_messages, spam.held, spam.holders) == (0, 0, ())
    other = read_placement(r, Keyspace(key_prefix + "other", key_prefix), ["sentiment"])
    assert other[0].waiting_messages == 0  # apart
    assert read_placement(r, keys, []) == []
    r.close()


def _message(args: list[Any]) -> bytes:
    """A job as kombu keeps it in Redis: the body (``[args, kwargs, embed]``) base64-encoded."""
    body = base64.b64encode(json.dumps([args, {}, {}]).encode()).decode()
    return json.dumps({"body": body, "properties": {"body_encoding": "base64"}, "headers": {}}).encode()


def test_queue_depth_counts_messages_per_model_and_priority_and_scales_up_an_ingress_sample(
    r: fakeredis.FakeRedis,
) -> None:
    r.lpush(KEYS.ingress(0), _message(["spam", "win"]), _message(["sentiment", "nice"]), b"not json")
    r.lpush(KEYS.ingress(6), _message(["sentiment", ["a", "b", "c"]]))  # a chunk: one message
    r.lpush(KEYS.model("spam").list_for(3), "m1", "m2")  # a model's own lists: exact, not decoded
    exact = read_queue_depth(r, KEYS, ["sentiment", "spam"])
    assert exact.by_priority == {0: 3, 3: 2, 6: 1, 9: 0} and exact.total == 6 and exact.ingress == 4
    assert exact.by_model == {"sentiment": 2, "spam": 3} and exact.unreadable == 1 and not exact.sampled
    r.delete(KEYS.ingress(0), KEYS.ingress(6), KEYS.model("spam").list_for(3))
    r.lpush(KEYS.ingress(6), *[_message(["spam", f"x{i}"]) for i in range(6)])
    r.lpush(KEYS.ingress(6), *[_message(["topic", f"y{i}"]) for i in range(4)])  # newest
    sampled = read_queue_depth(r, KEYS, ["sentiment", "spam"], sample=5)  # the next five to be moved: all spam
    assert sampled.sampled and sampled.total == 10 and sampled.by_model == {"spam": 10}  # an estimate


def test_write_refusals_are_reported_for_a_while_after_the_last_one_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis's memory flickers around its limit while it refuses writes: a refusal counted since the last look is
    reported, and so it stays for ``hold_s`` whatever the memory does; then it clears."""
    from swapless.tasks.observe import memory

    class Info:
        def __init__(self) -> None:
            self.used, self.oom = 900, 0

        def info(self, section: str) -> dict[str, Any]:
            if section == "memory":
                return {"used_memory": self.used, "maxmemory": 1000, "maxmemory_policy": "noeviction"}
            return {"errorstat_OOM": {"count": self.oom}}

    clock = [100.0]
    monkeypatch.setattr(memory.time, "monotonic", lambda: clock[0])
    redis_info = Info()
    refusals = memory.WriteRefusals(hold_s=10)
    assert refusals.check(redis_info) is None  # type: ignore[arg-type]  # the first look: a baseline
    redis_info.oom = 3
    clock[0] = 101.0
    assert "3 write(s) refused since the last look" in (refusals.check(redis_info) or "")  # type: ignore[arg-type]
    clock[0] = 105.0  # memory back under the limit, no new refusal: still said
    assert "writes refused 4 s ago" in (refusals.check(redis_info) or "")  # type: ignore[arg-type]
    clock[0] = 112.0
    assert refusals.check(redis_info) is None  # type: ignore[arg-type]
    redis_info.used = 1000  # at the limit: refusing, whatever the count says
    assert (refusals.check(redis_info) or "").startswith("Redis refusing writes: OOM")  # type: ignore[arg-type]
