"""Live status: the accounting of groups (pure), queue depth and heartbeats against the real Redis, and
`swapless status` against a real worker, whose heartbeat disappears when it is killed."""

from __future__ import annotations

import base64
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from swapless.config.errors import InputError
from swapless.config.settings import Settings
from swapless.manager import ModelEngine, ModelManager, ModelStore, Outcome, WorkItem, run_group
from swapless.tasks.client import Client
from swapless.tasks.cluster.members import read_heartbeats
from swapless.tasks.cluster.view import read_placement
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.accounting import GroupAccounting, GroupReport, SentTimes
from swapless.tasks.observe.beats import HeartbeatPublisher
from swapless.tasks.observe.events import TaskEvents
from swapless.tasks.observe.queue import message_model, read_queue_depth
from swapless.tasks.observe.stats import WorkerStats
from tests.conftest import WorkerProcess
from tests.fakes import FakeWorker, write_fake_models
from tests.stack import listening_ports, run_cli, wait_for
from tests.tinymodels import encode_image

pytestmark = pytest.mark.images

# -- the accounting, without Redis --------------------------------------------------------------------------


@pytest.fixture
def fake_manager(tmp_path: Path) -> Iterator[ModelManager]:
    FakeWorker.reset()
    engine = ModelEngine()
    store = ModelStore.from_file(write_fake_models(tmp_path, {"a": 10, "b": 20, "c": 30}), engine.frameworks)
    yield ModelManager(store, engine, max_models=2)
    FakeWorker.reset()


def test_each_group_gets_the_cache_activity_it_caused(fake_manager: ModelManager) -> None:
    reports: list[GroupReport] = []
    sent = SentTimes()
    now = [1000.0]
    accounting = GroupAccounting(fake_manager, [reports.append], sent, clock=lambda: now[0], monotonic=lambda: 50.0)

    def run(model_id: str, *texts: str) -> GroupReport:
        jobs = [WorkItem(f"{model_id}-{i}", model_id, text, received_s=49.0) for i, text in enumerate(texts)]
        accounting.on_group(model_id, jobs, run_group(fake_manager, model_id, jobs), run_s=0.25)
        return reports[-1]

    sent.record("a-0", 990.0)  # sent 10 s before its group started (1000 - 0.25)
    first = run("a", "x", "y")
    assert (first.hits, first.misses, len(first.load_s), first.evicted, first.size) == (0, 1, 1, (), 2)
    assert first.queue_wait_s == (pytest.approx(9.75), pytest.approx(0.75)), "sent time if known, else receipt"
    assert run("a", "z").hits == 1
    run("b", "x")
    third = run("c", "x", "boom", "   ")
    assert (third.misses, third.evicted) == (1, ("a",))
    assert third.succeeded == 1 and third.errors == {"PredictionFailed": 1, "InputError": 1}
    assert len(sent) == 0


def test_sent_times_are_taken_once_and_shared_by_the_items_of_a_chunk() -> None:
    sent = SentTimes(max_entries=2)
    sent.record("job", 1.0)
    sent.record("chunk", 2.0)
    assert (sent.take("job"), sent.take("job")) == (1.0, None)
    assert (sent.take("chunk:0"), sent.take("chunk:7")) == (2.0, 2.0)
    sent.record("x", 3.0)
    sent.record("y", 4.0)
    assert sent.take("chunk:8") is None and len(sent) == 2, "bounded: the oldest is forgotten"


class _Request:
    """What TaskEvents reads of a Celery request, recording the events sent."""

    def __init__(self, task_id: str, args: list[Any], sent: list[tuple[str, str, dict[str, Any]]]) -> None:
        self.id, self.args, self.name, self.argsrepr, self.kwargsrepr = (
            task_id,
            args,
            "swapless.predict",
            repr(args),
            "{}",
        )
        self._sent = sent

    def send_event(self, kind: str, **fields: Any) -> None:
        self._sent.append((kind, self.id, fields))


def test_task_events_for_jobs_and_whole_chunks() -> None:
    sent: list[tuple[str, str, dict[str, Any]]] = []
    events = TaskEvents()
    events.on_received(_Request("j1", ["a", "x"], sent))
    events.on_received(_Request("j2", ["a", " "], sent))
    events.on_received(_Request("c", ["a", ["p", "q", "r"]], sent))
    jobs = [WorkItem("j1", "a", "x"), WorkItem("j2", "a", " "), WorkItem("c:0", "a", "p"), WorkItem("c:1", "a", "q")]
    outcomes = [
        Outcome(jobs[0], result=[1]),
        Outcome(jobs[1], error=InputError("a", "empty")),
        Outcome(jobs[2], result=2),
        Outcome(jobs[3], result=3),
    ]
    events.on_group("a", jobs, outcomes, 0.5)
    assert [(kind, task_id) for kind, task_id, _ in sent] == [
        ("task-received", "j1"),
        ("task-received", "j2"),
        ("task-received", "c"),
        ("task-succeeded", "j1"),
        ("task-failed", "j2"),
    ]
    assert sent[3][2] == {"result": "[1]", "runtime": 0.5} and "empty" in sent[4][2]["exception"]
    last = WorkItem("c:2", "a", "r")
    events.on_group("a", [last], [Outcome(last, result=4)], 0.25)
    assert sent[-1] == ("task-succeeded", "c", {"result": "4", "runtime": 0.75}), (
        "a chunk succeeds once all its items are done"
    )


def test_a_failing_listener_never_reaches_the_scheduler(fake_manager: ModelManager) -> None:
    def broken(_: GroupReport) -> None:
        raise RuntimeError("listener bug")

    seen: list[GroupReport] = []
    accounting = GroupAccounting(fake_manager, [broken, seen.append])
    job = WorkItem("j", "a", "x")
    accounting.on_group("a", [job], [Outcome(job, error=InputError("a", "bad"))], 0.1)  # does not raise
    assert seen == []


def test_worker_stats_sum_reports_per_model() -> None:
    stats = WorkerStats(window=3)
    stats(GroupReport("a", 2, {}, 0.5, (0.1, 0.2), 0, 1, (0.4,), 0, ()))
    stats(GroupReport("b", 1, {"InputError": 1}, 0.5, (0.3, 0.4), 0, 1, (0.6,), 0, ("a",)))
    models = stats.models()
    assert (models["a"].jobs_done, models["a"].misses, models["a"].evictions, models["a"].load_s_last) == (2, 1, 1, 0.4)
    assert (models["b"].jobs_failed, models["b"].loads) == (1, 1)
    wait = stats.queue_wait()
    assert (wait.count, wait.window, wait.max_s) == (4, 3, 0.4) and wait.mean_s == pytest.approx(0.3)


def test_message_model_reads_kombu_envelopes_and_survives_garbage() -> None:
    def envelope(args: list[object]) -> str:
        body = base64.b64encode(json.dumps([args, {}, {}]).encode()).decode()
        return json.dumps({"body": body, "properties": {"body_encoding": "base64"}})

    assert message_model(envelope(["spam", "hi"])) == "spam"
    assert message_model(envelope(["spam", ["a", "b", "c"]])) == "spam", "a chunk is one message"
    junk: list[bytes | str] = [
        b"not json",
        b"{}",
        json.dumps({"body": "!!", "properties": {"body_encoding": "base64"}}),
        b"[]",
    ]
    for raw in junk:
        assert message_model(raw) is None


# -- Redis, no worker ---------------------------------------------------------------------------------------


def test_queue_depth_per_priority_and_model_exact_then_sampled(
    swapless_env: dict[str, str], settings: Settings
) -> None:
    """The ingress, where plain Celery producers' jobs wait until a worker moves them to their model's lists: read
    from a sample; and the models' own lists, exact."""
    from swapless.tasks.app import make_app
    from swapless.tasks.protocol import PREDICT_TASK

    celery = make_app(settings)
    for i in range(30):
        celery.send_task(PREDICT_TASK, args=["sentiment", f"text {i}"], queue=settings.jobs.queue, priority=0)
    for i in range(10):
        celery.send_task(PREDICT_TASK, args=["spam", "hi"], queue=settings.jobs.queue, priority=6)
        celery.send_task(PREDICT_TASK, args=["spam", "hi"], queue=settings.jobs.queue, priority=6)
        celery.send_task(PREDICT_TASK, args=["vision", encode_image(i)], queue=settings.jobs.queue, priority=6)
    celery.close()
    Client().submit_jobs([("topic", f"own list {i}") for i in range(5)])  # ours: the model's own list
    r = redis.Redis.from_url(settings.redis.broker_url)
    keyspace, models = Keyspace.of(settings), ["sentiment", "spam", "topic", "vision"]
    depth = read_queue_depth(r, keyspace, models)
    assert depth.by_priority == {0: 35, 3: 0, 6: 30, 9: 0} and depth.total == 65 and depth.ingress == 60
    assert depth.by_model == {"sentiment": 30, "spam": 20, "vision": 10, "topic": 5} and not depth.sampled
    sampled = read_queue_depth(r, keyspace, models, sample=9)
    assert sampled.sampled and sampled.total == 65
    assert sampled.by_model["sentiment"] == 30, "one model per level: the estimate is exact"
    assert sampled.by_model["spam"] == 20 and sampled.by_model["vision"] == 10, "9 oldest: 6 spam, 3 vision, x 30/9"
    assert sampled.by_model["topic"] == 5, "a model's own list is counted, not sampled"

    shown = run_cli("status", "--sample", "9")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert (f"queue {settings.jobs.queue}: 65 messages waiting in Redis (priority 0: 35, priority 6: 30); 60 of them "
            "in the ingress, not yet moved to their model's lists") in out
    assert "sentiment" in out and "~30" in out and "~20" in out and "~10" in out and "~5" in out
    assert "per-model counts are estimates: the ingress is read from a sample of the 9 next messages" in out
    assert "no live workers" in out
    as_json = json.loads(run_cli("status", "--json").stdout)
    assert as_json["queue"]["by_model"] == {"sentiment": 30, "spam": 20, "vision": 10, "topic": 5}
    assert as_json["workers"] == []


def test_each_model_s_own_lists_are_counted_exactly(swapless_env: dict[str, str], settings: Settings) -> None:
    """With placement (the default), each model's jobs wait in its own lists: counted exactly, by priority."""
    client = Client()
    client.submit_jobs([("sentiment", f"text {i}") for i in range(30)])
    client.submit_jobs([("spam", "hi")] * 20 + [("vision", encode_image(1))] * 10, priority="bulk")
    r = redis.Redis.from_url(settings.redis.broker_url)
    places = {p.model_id: p for p in read_placement(r, Keyspace.of(settings), ["sentiment", "spam", "vision", "topic"])}
    assert {m: p.queued for m, p in places.items() if p.waiting_messages} == {
        "sentiment": {0: 30, 3: 0, 6: 0, 9: 0}, "spam": {0: 0, 3: 0, 6: 20, 9: 0}, "vision": {0: 0, 3: 0, 6: 10, 9: 0}
    }
    assert not places["topic"].waiting_messages and all(not p.holders and not p.held for p in places.values())
    shown = run_cli("status")
    assert shown.returncode == 0, shown.stderr
    assert "models across workers: 60 messages waiting in their lists, 0 held by workers" in shown.stdout
    as_json = json.loads(run_cli("status", "--json").stdout)
    assert {m["model_id"]: m["waiting"] for m in as_json["models"] if m["waiting"]} == {
        "sentiment": 30, "spam": 20, "vision": 10}


def test_heartbeat_publisher_expires_and_cleans_up(settings: Settings) -> None:
    from swapless.tasks.cluster.members import CacheInfo, Heartbeat, WaitSummary

    r = redis.Redis.from_url(settings.redis.broker_url)
    cache = CacheInfo(
        max_models=2, memory_budget_bytes=None, used_bytes=0, hits=0, misses=0, loads=0, evictions=0, load_failures=0
    )
    beat = Heartbeat(
        hostname="unit@host", pid=1, queue=settings.jobs.queue, started_at=time.time(), sent_at=time.time(),
        interval_s=0.4,
        cache=cache, loaded=[], models={}, jobs_done=0, jobs_failed=0, backlog=0, queue_wait=WaitSummary(),
    )
    publisher = HeartbeatPublisher(r, Keyspace.of(settings), "unit@host", lambda: beat, interval_s=0.4)
    publisher.beat()
    assert [b.hostname for b in read_heartbeats(r, Keyspace.of(settings))] == ["unit@host"]
    assert 0 < r.pttl(Keyspace.of(settings).heartbeat("unit@host")) <= 1200
    wait_for(lambda: not read_heartbeats(r, Keyspace.of(settings)), 3, what="the heartbeat to expire")
    publisher.start()
    wait_for(lambda: read_heartbeats(r, Keyspace.of(settings)), 3, what="the thread's first beat")
    publisher.stop()
    assert read_heartbeats(r, Keyspace.of(settings)) == []
    assert r.zcard(f"{settings.jobs.key_prefix}swapless:workers") == 0


# -- a real worker ------------------------------------------------------------------------------------------

pytest_slow = pytest.mark.slow


class EventLog:
    """Celery events captured in a thread, as Flower receives them."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.types: list[str] = []
        self._stop = threading.Event()

        self._receiver: Any = None

        def capture() -> None:
            # One subscription for the whole capture: each ``capture`` call subscribes anew, and an event published
            # between two calls would be lost (pub/sub keeps nothing). ``stop`` ends it (``should_stop``, looked at
            # every second).
            with client.app.connection() as conn:
                self._receiver = client.app.events.Receiver(
                    conn, handlers={"*": lambda event: self.types.append(event["type"])}
                )
                while not self._stop.is_set():
                    try:
                        self._receiver.capture(limit=None, timeout=None, wakeup=False)
                    except OSError:
                        continue

        self._thread = threading.Thread(target=capture, daemon=True)
        self._thread.start()

    def count(self, kind: str) -> int:
        return self.types.count(kind)

    def stop(self) -> None:
        self._stop.set()
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(5)


def _assert_cache_counts(beat: Any) -> None:
    """The heartbeat's cache and per-model counts after the jobs of the test below."""
    assert [e.model_id for e in beat.loaded] == ["sentiment", "spam"], "least recently used first"
    assert all(e.bytes > 1_000_000 and e.load_s > 0 and not e.busy for e in beat.loaded)
    # sentiment, the model with most interactive jobs, is resident (one of two slots): topic's load evicts spam, not
    # it, so the last sentiment job is a hit; spam's load then evicts topic
    assert (beat.cache.hits, beat.cache.misses, beat.cache.evictions, beat.cache.max_models) == (2, 4, 2, 2)
    activity = dict(beat.models.items())
    assert (activity["sentiment"].hits, activity["sentiment"].misses, activity["sentiment"].evictions) == (2, 1, 0)
    assert (activity["spam"].hits, activity["spam"].misses, activity["spam"].loads, activity["spam"].evictions) == (
        0,
        2,
        2,
        1,
    )
    assert (activity["spam"].jobs_done, activity["spam"].jobs_failed) == (1, 1)
    assert (activity["topic"].misses, activity["topic"].evictions, activity["topic"].jobs_done) == (1, 1, 1)
    assert beat.jobs_done == 5 and beat.jobs_failed == 1 and beat.queue_wait.count == 6


def _assert_status_rows(out: str) -> None:
    """``swapless status``'s per-model rows for the same jobs, and the other queue's seven vision jobs."""
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
        for line in out.splitlines()
        if line.count("│") > 4
    }
    assert rows["spam"][:7] == ["spam", "loaded, claimed", rows["spam"][2], "0", "2", "1", "2"]
    assert rows["spam"][-5:] == ["1", "1", "0", "0", "0"]  # done, failed, expired, cancelled, held
    assert rows["topic"][1] == "-" and rows["sentiment"][1] == "loaded, claimed"  # topic: given up for a slot
    assert rows["spam"][2].endswith("MiB")
    assert "jobs 5 done, 1 failed" in out and "hits 2, misses 4, evictions 2" in out
    assert any(
        line.split("│")[1].strip() == "vision" and line.split("│")[2].strip() == "7"
        for line in out.splitlines()
        if "│" in line
    )


@pytest_slow
def test_heartbeat_and_status_table_of_a_live_worker_then_expiry_after_a_kill(
    start_worker: Callable[..., WorkerProcess], settings: Settings
) -> None:
    worker = start_worker("--hostname", "st@%h", "--task-events", env={"SWAPLESS_HEARTBEAT_INTERVAL_S": "0.5"})
    assert listening_ports(worker.proc.pid) == [], "without --metrics-port the worker opens no port"
    client = Client()
    events = EventLog(client)
    # Redis delivers events by pub/sub: only once one arrives is the receiver surely subscribed
    wait_for(lambda: events.count("worker-heartbeat"), 10, what="a worker-heartbeat event")
    # one job at a time: each is its own group, so the counts below are exact
    for model_id in ["sentiment", "sentiment", "spam", "topic", "sentiment"]:
        client.submit(model_id, "hello there").get(timeout=60)
    with pytest.raises(InputError):
        client.submit("spam", " ").get(timeout=60)
    r = redis.Redis.from_url(settings.redis.broker_url)

    def beat_after_all_jobs():  # type: ignore[no-untyped-def]
        beats = read_heartbeats(r, Keyspace.of(settings))
        return beats[0] if beats and beats[0].jobs_done + beats[0].jobs_failed == 6 else None

    beat = wait_for(beat_after_all_jobs, 10, what="a heartbeat counting all jobs")

    # topic was evicted for a slot: the worker gives up its claim at its next placement round
    def claimed() -> set[str]:
        return {p.model_id for p in read_placement(r, Keyspace.of(settings), ["topic"]) if p.holders}

    try:
        wait_for(lambda: not claimed(), 30, what="the claim on the evicted topic to be given up")
    except AssertionError as err:
        raise AssertionError(f"{err}\n--- worker log ---\n{worker.log()[-4000:]}") from None
    # Celery task events, as Flower reads them: each job received, then succeeded or failed
    try:
        wait_for(lambda: events.count("task-succeeded") == 5 and events.count("task-failed") == 1, 30,
                 what="task events")
    except AssertionError as err:
        raise AssertionError(f"{err}: received {events.types}") from None
    events.stop()
    assert events.count("task-received") == 6 and events.count("worker-heartbeat") >= 1
    assert beat.hostname.startswith("st@") and beat.queue == settings.jobs.queue and beat.pid == worker.proc.pid
    _assert_cache_counts(beat)

    # jobs on another queue, which this worker does not consume: `status --queue` shows them beside the worker
    other = settings.model_copy(update={"queue": f"{settings.jobs.key_prefix}other"})
    parked = Client(settings=other)
    for i in range(7):
        parked.submit("vision", encode_image(i), priority="bulk")
    parked.submit("topic", "later")
    shown = run_cli("status", "--queue", other.jobs.queue)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "models across workers: 8 messages waiting in their lists, 0 held by workers" in out
    assert f"worker {beat.hostname} (pid {worker.proc.pid}, queue {settings.jobs.queue}" in out
    _assert_status_rows(out)

    watched = run_cli("status", "--watch", "--interval", "0.2", "--count", "3")
    assert watched.returncode == 0 and f"worker {beat.hostname}" in watched.stdout

    worker.stop(signal.SIGKILL)
    assert read_heartbeats(r, Keyspace.of(settings)), "a killed worker deletes nothing: its heartbeat lingers"
    left_ms = r.pttl(Keyspace.of(settings).heartbeat(beat.worker_id))
    assert 0 < left_ms <= 1500, left_ms  # Redis drops it within its TTL (3 intervals of 0.5 s): no clock needed
    wait_for(lambda: not read_heartbeats(r, Keyspace.of(settings)), 10, what="the heartbeat to expire")
    assert "no live workers" in run_cli("status").stdout
