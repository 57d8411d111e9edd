"""swapless.tasks.broker.transport against the real Redis: the atomic bulk fetch over the queue's one layout (the
models' lists and the ingress), and everything kombu does on top of it.

A kombu ``Connection`` with a worker's hooks (``ChannelHooks``: the queue, a placement that claims what the test
says, Redis's health), as a worker's consumer has them; the messages are published the way a plain Celery producer
does, to the ingress, or pushed to a model's own lists the way Swapless's producers do.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue

from swapless.tasks.broker.connection import RedisHealth
from swapless.tasks.broker.publish import ModelPush, push_to_models
from swapless.tasks.broker.queues import FETCH, RECOVER, ChannelHooks
from swapless.tasks.broker.transport import Channel, Transport, broker_connection
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import ITEMS_HEADER

QUEUE = "jobs"
WORKER = "w@test:1"


@dataclass
class Claims:
    """A placement as the transport sees it: the models claimed, and where an ingress message goes."""

    models: list[str] = field(default_factory=list)
    limit: int = 512
    routes: dict[str, str] = field(default_factory=dict)  # payload's "model" field -> model id
    worker_id: str = WORKER

    def hold_limit(self, model_id: str) -> int:
        return self.limit

    def claimed(self) -> Sequence[str]:
        return list(self.models)

    def route(self, payload: dict[str, Any]) -> str | None:
        raw = payload["body"]
        if payload["properties"].get("body_encoding") == "base64":
            raw = base64.b64decode(raw)
        body = json.loads(raw)
        return self.routes.get(body.get("model")) if isinstance(body, dict) else None


@pytest.fixture
def claims() -> Claims:
    return Claims()


@pytest.fixture
def keyspace(key_prefix: str) -> Keyspace:
    return Keyspace(QUEUE, key_prefix)


@pytest.fixture
def conn(redis_url: str, key_prefix: str, claims: Claims) -> Iterator[Connection]:
    hooks = ChannelHooks(QUEUE, claims, None, RedisHealth())
    options = {"global_keyprefix": key_prefix, "priority_steps": [0, 3, 6, 9], "queue_order_strategy": "priority",
               "visibility_timeout": 1, "swapless_idle_poll_s": 0.05, "swapless_hooks": hooks}
    with Connection(redis_url, transport=Transport, transport_options=options) as c:
        yield c


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def publish(conn: Connection, bodies: list[Any], priority: int = 0, queue: str = QUEUE) -> None:
    """As a plain Celery producer: to the queue's ingress."""
    target = Queue(queue, Exchange(queue), queue)
    with conn.Producer() as producer:
        for body in bodies:
            producer.publish(body, exchange=target.exchange, routing_key=queue, declare=[target],
                             serializer="json", priority=priority)


def consume(conn: Connection, want: int, prefetch: int | None = None, timeout: float = 5.0,
            queue: str = QUEUE) -> list[Any]:
    """Messages received (not acked) until ``want`` arrived or nothing more comes."""
    got: list[Any] = []
    channel = conn.channel()
    if prefetch:
        channel.basic_qos(0, prefetch, False)
    consumer = conn.Consumer(
        Queue(queue, Exchange(queue), queue), channel=channel, callbacks=[lambda b, m: got.append(m)]
    )
    consumer.consume()
    drain(conn, lambda: len(got) >= want, timeout)
    return got


def drain(conn: Connection, done: Callable[[], bool], timeout: float) -> None:
    """Let ``conn`` deliver messages until ``done()`` or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.2)


def held(r: redis.Redis, hashed: str) -> dict[str, Any]:
    return {k.decode(): json.loads(v) for k, v in r.hgetall(hashed).items()}


def test_a_fetched_message_is_in_its_records_the_moment_it_leaves_its_list(
    conn: Connection, r: redis.Redis, keyspace: Keyspace
) -> None:
    publish(conn, [{"n": i} for i in range(5)])
    ingress = keyspace.ingress_lists
    queued = [json.loads(m) for m in r.lrange(ingress.lists[0], 0, -1)]
    got = consume(conn, 5)
    assert [m.payload for m in got] == [{"n": i} for i in range(5)]  # FIFO
    assert r.llen(ingress.lists[0]) == 0
    records = held(r, ingress.held)
    seen = {t.decode() for t in r.zrange(ingress.seen, 0, -1)}
    owners = {k.decode(): v.decode() for k, v in r.hgetall(ingress.owner).items()}
    assert set(records) == seen == set(owners) == {m.delivery_tag for m in got}
    assert set(owners.values()) == {f"{WORKER}|1"}  # who holds it, and the list it goes back to
    by_tag = {m["properties"]["delivery_tag"]: m for m in queued}
    assert records == by_tag  # the payload exactly as it was queued
    assert r.hlen(f"{keyspace.prefix}unacked") == 0, "kombu's own records are not used"
    for m in got:
        m.ack()
    assert r.hlen(ingress.held) == 0 and r.zcard(ingress.seen) == 0 and r.hlen(ingress.owner) == 0


def count_fetches(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[int]]:
    """From now on, record the name of every command this process sends to Redis (commands written together
    joined by ``+``), and how many messages each round delivered here (a round is one write and its replies read:
    one round trip)."""
    sent: list[str] = []
    taken: list[int] = []
    send_command = redis.connection.AbstractConnection.send_command
    pack_commands = redis.connection.AbstractConnection.pack_commands
    deliver = Channel._deliver_round

    def name(args: tuple[Any, ...]) -> str:
        return "FETCH" if tuple(args[:2]) == ("EVAL", FETCH) else str(args[0]).upper()

    def counting_send(self: Any, *args: Any, **kwargs: Any) -> None:
        sent.append(name(args))
        send_command(self, *args, **kwargs)

    def counting_pack(self: Any, commands: Any) -> Any:  # several commands in one write (pipelines, wait + fetch)
        commands = list(commands)
        sent.append("+".join(name(args) for args in commands))
        return pack_commands(self, commands)

    def counting_deliver(self: Channel, hooks: Any, replies: Sequence[Any]) -> int:
        delivered = deliver(self, hooks, replies)
        taken.append(delivered)
        return delivered

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_command", counting_send)
    monkeypatch.setattr(redis.connection.AbstractConnection, "pack_commands", counting_pack)
    monkeypatch.setattr(Channel, "_deliver_round", counting_deliver)
    return sent, taken


def test_one_round_trip_takes_many_messages_within_the_prefetch_credit(
    conn: Connection, r: redis.Redis, keyspace: Keyspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(conn, [{"n": i} for i in range(30)])
    sent, taken = count_fetches(monkeypatch)
    got = consume(conn, 10, prefetch=10, timeout=1.0)
    assert [m.payload for m in got] == [{"n": i} for i in range(10)]
    # one round (one write of FETCH commands, their replies read) brought all ten; no other command took a message
    rounds = [write for write in sent if "FETCH" in write.split("+")]
    assert taken[0] == 10 and rounds[0].split("+").count("FETCH") == 1, (sent, taken)
    assert not {"BRPOP", "RPOP", "LPOP", "BLMOVE", "LMOVE"} & {n for write in sent for n in write.split("+")}, sent
    assert r.llen(keyspace.ingress(0)) == 20  # the credit bounds the fetch: nothing taken beyond it
    assert r.hlen(keyspace.ingress_lists.held) == 10


def test_a_round_fetches_every_claimed_model_and_the_ingress_each_within_its_hold_limit(
    conn: Connection, r: redis.Redis, keyspace: Keyspace, claims: Claims, monkeypatch: pytest.MonkeyPatch
) -> None:
    for model_id in ("a", "b"):
        push_to_models(r, [ModelPush(keyspace.model(model_id), 0, [_message(conn, {"m": model_id, "n": i})
                                                                   for i in range(6)])],
                       bound=None, placement_bell=keyspace.placement_bell)
    publish(conn, [{"n": "ingress"}])
    claims.models, claims.limit = ["a", "b"], 4
    sent, _ = count_fetches(monkeypatch)
    got = consume(conn, 9, timeout=2.0)
    rounds = [write for write in sent if "FETCH" in write.split("+")]
    assert rounds[0].split("+").count("FETCH") == 3, sent  # a, b and the ingress, in one write
    assert sorted(str(m.payload.get("m")) for m in got) == ["None", *["a"] * 4, *["b"] * 4]
    assert [r.llen(keyspace.model(m).list_for(0)) for m in ("a", "b")] == [2, 2]  # the rest waits for a copy
    for m in got:
        m.ack()
    assert all(r.hlen(keyspace.model(m).held) == 0 for m in ("a", "b"))


def _chunk(conn: Connection, n: int, items: int) -> str:
    """A chunk message of ``items`` inputs, as Swapless's producers send it (``ITEMS_HEADER``)."""
    message = json.loads(_message(conn, {"chunk": n}))
    message["headers"][ITEMS_HEADER] = items
    return json.dumps(message)


def test_a_hold_limit_counts_a_chunk_s_items_so_a_worker_alone_leaves_chunks_for_others(
    conn: Connection, r: redis.Redis, keyspace: Keyspace, claims: Claims
) -> None:
    push_to_models(r, [ModelPush(keyspace.model("a"), 6, [_chunk(conn, i, 32) for i in range(40)])], bound=None,
                   placement_bell=keyspace.placement_bell)
    claims.models, claims.limit = ["a"], 100  # a hold of 100 jobs: four chunks of 32, not 100 chunks
    got = consume(conn, 40, timeout=2.0)
    assert len(got) == 4, len(got)
    channel = got[0].channel
    assert channel._held_per_model["a"] == 4 * 32
    assert r.llen(keyspace.model("a").list_for(6)) == 36  # left for the workers that join
    got[0].ack()
    assert channel._held_per_model["a"] == 3 * 32
    for m in got[1:]:
        m.ack()
    assert channel._held_per_model["a"] == 0


def test_jobs_of_a_claim_given_up_while_the_round_was_out_go_straight_back(
    conn: Connection, r: redis.Redis, keyspace: Keyspace, claims: Claims, monkeypatch: pytest.MonkeyPatch
) -> None:
    push_to_models(r, [ModelPush(keyspace.model("a"), 6, [_chunk(conn, i, 32) for i in range(3)])], bound=None,
                   placement_bell=keyspace.placement_bell)
    claims.models = ["a"]
    fetch_commands = Channel._fetch_commands

    def given_up_once_sent(channel: Channel, *args: Any) -> list[tuple[Any, ...]]:
        commands = fetch_commands(channel, *args)
        claims.models = []  # placement moves the model on while the round is out
        return commands

    monkeypatch.setattr(Channel, "_fetch_commands", given_up_once_sent)
    got = consume(conn, 1, timeout=1.0)
    assert got == []
    assert r.llen(keyspace.model("a").list_for(6)) == 3  # back at the head of its list, for its new holder
    assert r.hlen(keyspace.model("a").held) == 0


def test_acks_that_free_room_under_a_hold_limit_wake_the_waiting_fetch(
    conn: Connection, r: redis.Redis, keyspace: Keyspace, claims: Claims
) -> None:
    """A model at its hold limit gets no fetch; the round waits (for up to the idle poll, 30 s here) and the acks
    that free room ring the worker's wake bell: that model's next fetch follows at once, not after the poll."""
    push_to_models(r, [ModelPush(keyspace.model("a"), 0, [_message(conn, {"n": i}) for i in range(6)])],
                   bound=None, placement_bell=keyspace.placement_bell)
    claims.models, claims.limit = ["a"], 4
    channel = conn.channel()
    channel.swapless_idle_poll_s = 30.0
    got: list[Any] = []
    consumer = conn.Consumer(Queue(QUEUE, Exchange(QUEUE), QUEUE), channel=channel,
                             callbacks=[lambda b, m: got.append(m)])
    consumer.consume()
    drain(conn, lambda: len(got) >= 4, 5)
    drain(conn, lambda: False, 0.5)  # at its limit: the channel waits now, its wake bell among the bells
    assert len(got) == 4
    started = time.monotonic()
    got[0].ack()
    got[1].ack()
    drain(conn, lambda: len(got) >= 6, 10)
    assert len(got) == 6 and time.monotonic() - started < 5
    assert r.llen(keyspace.model("a").list_for(0)) == 0
    for m in got[2:]:
        m.ack()
    assert r.exists(keyspace.wake(WORKER)) == 0  # the wait took the token


def _message(conn: Connection, body: Any, priority: int = 0) -> str:
    """A kombu envelope of ``body`` as Swapless's producers push it to a model's list."""
    channel = conn.channel()
    message = channel.prepare_message(json.dumps(body), priority, "application/json", "utf-8", {}, {})
    message["properties"].update({"delivery_tag": f"tag-{time.monotonic_ns()}", "delivery_info":
                                  {"exchange": QUEUE, "routing_key": QUEUE}, "body_encoding": "utf-8"})
    channel.close()
    return json.dumps(message)


def test_an_ingress_message_for_a_known_model_is_moved_to_its_lists_and_one_for_none_is_kept(
    conn: Connection, r: redis.Redis, keyspace: Keyspace, claims: Claims
) -> None:
    claims.routes = {"spam": "spam"}
    publish(conn, [{"model": "spam", "n": 1}, {"model": "nobody", "n": 2}], priority=6)
    got = consume(conn, 1, timeout=2.0)
    assert [m.payload for m in got] == [{"model": "nobody", "n": 2}]  # kept here: its worker answers it
    moved = [json.loads(raw) for raw in r.lrange(keyspace.model("spam").list_for(6), 0, -1)]
    assert [json.loads(base64.b64decode(m["body"])) for m in moved] == [{"model": "spam", "n": 1}]  # for its holder
    assert r.llen(keyspace.ingress(6)) == 0 and r.hlen(keyspace.ingress_lists.held) == 1  # only the kept one
    assert r.llen(keyspace.model("spam").bell) == 1  # its holder's bell rang
    claims.models = ["spam"]
    [then] = consume(conn, 1, timeout=2.0)
    assert then.payload == {"model": "spam", "n": 1}


def test_an_ingress_message_for_a_model_this_worker_holds_runs_here_within_its_hold_limit(
    conn: Connection, r: redis.Redis, keyspace: Keyspace, claims: Claims
) -> None:
    claims.routes, claims.models, claims.limit = {"spam": "spam"}, ["spam"], 2
    publish(conn, [{"model": "spam", "n": i} for i in range(3)])
    got = consume(conn, 2, timeout=1.0)
    assert sorted(m.payload["n"] for m in got) == [0, 1]  # delivered here, no push and second fetch
    assert r.hlen(keyspace.ingress_lists.held) == 2  # recorded where they came from
    # beyond the hold limit: moved to the model's lists, for whichever holder has room
    assert [json.loads(base64.b64decode(json.loads(raw)["body"]))["n"]
            for raw in r.lrange(keyspace.model("spam").list_for(0), 0, -1)] == [2]
    channel = got[0].channel
    assert channel._held_per_model["spam"] == 2
    for m in got:
        m.ack()
    assert r.hlen(keyspace.ingress_lists.held) == 0 and channel._held_per_model["spam"] == 0


def test_lower_priority_numbers_are_served_first(conn: Connection) -> None:
    publish(conn, [{"bulk": i} for i in range(3)], priority=6)
    publish(conn, [{"interactive": i} for i in range(3)], priority=0)
    got = consume(conn, 6)
    assert [m.payload for m in got] == [{"interactive": i} for i in range(3)] + [{"bulk": i} for i in range(3)]


def test_an_idle_consumer_wakes_for_new_messages_on_any_priority(conn: Connection, redis_url: str,
                                                                 key_prefix: str) -> None:
    channel = conn.channel()
    got: list[Any] = []
    consumer = conn.Consumer(
        Queue(QUEUE, Exchange(QUEUE), QUEUE), channel=channel, callbacks=[lambda b, m: got.append(m)]
    )
    consumer.consume()
    drain(conn, lambda: False, 0.3)  # several empty polls: the channel is now waiting, not fetching
    with Connection(redis_url, transport=Transport, transport_options={"global_keyprefix": key_prefix}) as producer:
        publish(producer, [{"late": 0}], priority=0)
        publish(producer, [{"late": 1}], priority=6)
    drain(conn, lambda: len(got) >= 2, 5)
    assert sorted(m.payload["late"] for m in got) == [0, 1]


def test_a_waiting_consumer_gets_the_message_that_wakes_it_in_the_same_round_trip(
    conn: Connection, r: redis.Redis, keyspace: Keyspace, claims: Claims, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims.models = ["spam"]
    channel = conn.channel()
    got: list[Any] = []
    consumer = conn.Consumer(
        Queue(QUEUE, Exchange(QUEUE), QUEUE), channel=channel, callbacks=[lambda b, m: got.append(m)]
    )
    consumer.consume()
    drain(conn, lambda: False, 0.3)  # several empty polls: the channel waits now, its fetch sent behind the wait
    sent, taken = count_fetches(monkeypatch)
    push_to_models(r, [ModelPush(keyspace.model("spam"), 0, [_message(conn, {"wake": 1})])], bound=None,
                   placement_bell=keyspace.placement_bell)  # rings the model's bell
    drain(conn, lambda: len(got) >= 1, 5)
    assert [m.payload for m in got] == [{"wake": 1}]
    # in the reply of a wait's own fetch (written with it): no fetch of its own went out after the wake
    first = next(i for i, n in enumerate(taken) if n)
    waits = [write for write in sent if write.startswith("BLPOP")]
    assert waits and waits[-1] == "BLPOP+FETCH+FETCH" and first == len(waits) - 1, (sent, taken)


def test_a_dead_worker_s_messages_come_back_exactly_as_sent(conn: Connection, r: redis.Redis,
                                                            keyspace: Keyspace) -> None:
    publish(conn, [{"n": 1}])
    ingress = keyspace.ingress_lists
    original = r.lindex(ingress.lists[0], 0)
    got = consume(conn, 1)
    assert len(got) == 1 and r.llen(ingress.lists[0]) == 0
    # what the cluster's recovery runs: WORKER is not among the live workers
    assert r.eval(RECOVER, 7, *ingress.queue_and_records, repr(time.time() - 60), "someone-else") == 1
    assert r.lrange(ingress.lists[0], 0, -1) == [original]
    assert r.hlen(ingress.held) == 0
    # and a live worker's silent records (not refreshed for the visibility timeout) come back too
    got = consume(conn, 1)
    assert r.eval(RECOVER, 7, *ingress.queue_and_records, repr(time.time() + 1), WORKER) == 1


def test_closing_a_channel_puts_back_what_it_held(conn: Connection, r: redis.Redis, keyspace: Keyspace) -> None:
    publish(conn, [{"n": i} for i in range(4)])
    got = consume(conn, 4)
    got[0].ack()
    got[0].channel.close()
    assert r.llen(keyspace.ingress(0)) == 3
    assert r.hlen(keyspace.ingress_lists.held) == 0


def test_a_queued_item_that_is_not_a_kombu_message_is_dropped_with_an_error_and_the_rest_delivered(
    conn: Connection, r: redis.Redis, keyspace: Keyspace, caplog: pytest.LogCaptureFixture
) -> None:
    publish(conn, [{"n": 0}])
    r.lpush(keyspace.ingress(0), b"\x80not json")
    publish(conn, [{"n": 1}])
    with caplog.at_level(logging.ERROR, logger="swapless.tasks.broker.transport"):
        got = consume(conn, 2)
    assert [m.payload for m in got] == [{"n": 0}, {"n": 1}]
    assert "is not a kombu message" in caplog.text
    assert r.hlen(keyspace.ingress_lists.held) == 2


def test_a_channel_that_consumes_another_queue_is_kombu_s_own(
    conn: Connection, r: redis.Redis, key_prefix: str
) -> None:
    """Celery's own reply queues, another app's queue: the worker's hooks are for its queue alone."""
    publish(conn, [{"other": 1}], queue="replies")
    [got] = consume(conn, 1, queue="replies")
    assert got.payload == {"other": 1}
    assert r.hlen(f"{key_prefix}unacked") == 1  # kombu's own record
    got.ack()


def test_broker_urls_pick_this_transport_for_redis_and_leave_others_to_kombu() -> None:
    assert broker_connection("redis://h:6379/0") == ("redis://h:6379/0", "swapless.tasks.broker.transport:Transport")
    secure = broker_connection("rediss://:pw@h:6380/0?ssl_cert_reqs=required")
    assert secure[1] == "swapless.tasks.broker.transport:Transport"
    assert broker_connection("redis+socket:///tmp/r.sock") == ("swapless+socket:///tmp/r.sock", None)
    assert Connection("swapless+socket:///tmp/r.sock").get_transport_cls() is Transport
    # a Sentinel URL goes to this transport's Sentinel channel (tests/test_sentinel_config.py has the details)
    assert broker_connection("sentinel://h:26379") == ("swapless-sentinel://h:26379", None)
    assert broker_connection("amqp://h:5672//") == ("amqp://h:5672//", None)
