"""tasks.broker.transport against the real Redis: the atomic bulk fetch and everything kombu does on top of it."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue

from tasks.broker.transport import FETCH, Channel, Transport, broker_connection

QUEUE = "jobs"


@pytest.fixture
def conn(redis_url: str, key_prefix: str) -> Iterator[Connection]:
    options = {"global_keyprefix": key_prefix, "priority_steps": [0, 3, 6, 9], "queue_order_strategy": "priority",
               "visibility_timeout": 1, "swapless_idle_poll_s": 0.05}
    with Connection(redis_url, transport=Transport, transport_options=options) as c:
        yield c


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def publish(conn: Connection, bodies: list[Any], priority: int = 0) -> None:
    queue = Queue(QUEUE, Exchange(QUEUE), QUEUE)
    with conn.Producer() as producer:
        for body in bodies:
            producer.publish(body, exchange=queue.exchange, routing_key=QUEUE, declare=[queue],
                             serializer="json", priority=priority)


def consume(conn: Connection, want: int, prefetch: int | None = None, timeout: float = 5.0) -> list[Any]:
    """Messages received (not acked) until ``want`` arrived or nothing more comes."""
    got: list[Any] = []
    channel = conn.channel()
    if prefetch:
        channel.basic_qos(0, prefetch, False)
    consumer = conn.Consumer(Queue(QUEUE, Exchange(QUEUE), QUEUE), channel=channel, callbacks=[lambda b, m: got.append(m)])
    consumer.consume()
    drain(conn, lambda: len(got) >= want, timeout)
    return got


def drain(conn: Connection, done: Callable[[], bool], timeout: float) -> None:
    """Let ``conn`` deliver messages until ``done()`` or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=0.2)
        except TimeoutError:
            pass


def unacked(r: redis.Redis, prefix: str) -> dict[str, list[Any]]:
    return {k.decode(): json.loads(v) for k, v in r.hgetall(f"{prefix}unacked").items()}


def test_a_fetched_message_is_in_the_unacked_records_the_moment_it_leaves_the_queue(
    conn: Connection, r: redis.Redis, key_prefix: str
) -> None:
    publish(conn, [{"n": i} for i in range(5)])
    queued = [json.loads(m) for m in r.lrange(f"{key_prefix}{QUEUE}", 0, -1)]
    got = consume(conn, 5)
    assert [m.payload for m in got] == [{"n": i} for i in range(5)]  # FIFO
    assert r.llen(f"{key_prefix}{QUEUE}") == 0
    records = unacked(r, key_prefix)
    index = {t.decode() for t in r.zrange(f"{key_prefix}unacked_index", 0, -1)}
    assert set(records) == index == {m.delivery_tag for m in got}
    # kombu's own record format, with the payload exactly as it was queued
    by_tag = {m["properties"]["delivery_tag"]: m for m in queued}
    for tag, (payload, exchange, routing_key) in records.items():
        assert payload == by_tag[tag]
        assert (exchange, routing_key) == (QUEUE, QUEUE)
    for m in got:
        m.ack()
    assert r.hlen(f"{key_prefix}unacked") == 0 and r.zcard(f"{key_prefix}unacked_index") == 0


def count_fetches(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[int]]:
    """From now on, record the name of every command this process sends to Redis (commands written together
    joined by ``+``), and the number of messages each ``FETCH`` reply carried to the channel (a fetch is one command
    sent and its one reply read: a round trip)."""
    sent: list[str] = []
    taken: list[int] = []
    send_command = redis.connection.AbstractConnection.send_command
    pack_commands = redis.connection.AbstractConnection.pack_commands
    deliver = Channel._deliver_fetched

    def name(args: tuple[Any, ...]) -> str:
        return "FETCH" if tuple(args[:2]) == ("EVAL", FETCH) else str(args[0]).upper()

    def counting_send(self: Any, *args: Any, **kwargs: Any) -> None:
        sent.append(name(args))
        send_command(self, *args, **kwargs)

    def counting_pack(self: Any, commands: Any) -> Any:  # several commands in one write (pipelines, wait + fetch)
        commands = list(commands)
        sent.append("+".join(name(args) for args in commands))
        return pack_commands(self, commands)

    def counting_deliver(self: Channel, reply: list[Any]) -> None:
        taken.append(len(reply) // 2)  # [key index, message, key index, message, ...]
        deliver(self, reply)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_command", counting_send)
    monkeypatch.setattr(redis.connection.AbstractConnection, "pack_commands", counting_pack)
    monkeypatch.setattr(Channel, "_deliver_fetched", counting_deliver)
    return sent, taken


def test_one_round_trip_takes_many_messages_within_the_prefetch_credit(
    conn: Connection, r: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(conn, [{"n": i} for i in range(30)])
    sent, taken = count_fetches(monkeypatch)
    got = consume(conn, 10, prefetch=10, timeout=1.0)
    assert [m.payload for m in got] == [{"n": i} for i in range(10)]
    # one FETCH script call (one command out, one reply back) brought all ten; no other command took a message
    assert sent.count("FETCH") == 1 and taken == [10], (sent, taken)
    assert not {"BRPOP", "RPOP", "LPOP", "BLMOVE", "LMOVE"} & {n for write in sent for n in write.split("+")}, sent
    assert r.llen(f"{key_prefix}{QUEUE}") == 20  # the credit bounds the fetch: nothing taken beyond it
    assert r.hlen(f"{key_prefix}unacked") == 10


def test_lower_priority_numbers_are_served_first(conn: Connection) -> None:
    publish(conn, [{"bulk": i} for i in range(3)], priority=6)
    publish(conn, [{"interactive": i} for i in range(3)], priority=0)
    got = consume(conn, 6)
    assert [m.payload for m in got] == [{"interactive": i} for i in range(3)] + [{"bulk": i} for i in range(3)]


def test_an_idle_consumer_wakes_for_new_messages_on_any_priority(conn: Connection, redis_url: str,
                                                                 key_prefix: str) -> None:
    channel = conn.channel()
    got: list[Any] = []
    consumer = conn.Consumer(Queue(QUEUE, Exchange(QUEUE), QUEUE), channel=channel, callbacks=[lambda b, m: got.append(m)])
    consumer.consume()
    drain(conn, lambda: False, 0.3)  # several empty polls: the channel is now waiting (BLMOVE), not fetching
    with Connection(redis_url, transport=Transport, transport_options={"global_keyprefix": key_prefix}) as producer:
        publish(producer, [{"late": 0}], priority=0)
        publish(producer, [{"late": 1}], priority=6)
    drain(conn, lambda: len(got) >= 2, 5)
    assert sorted(m.payload["late"] for m in got) == [0, 1]


def test_a_waiting_consumer_gets_the_message_that_wakes_it_in_the_same_round_trip(
    conn: Connection, redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = conn.channel()
    got: list[Any] = []
    consumer = conn.Consumer(Queue(QUEUE, Exchange(QUEUE), QUEUE), channel=channel, callbacks=[lambda b, m: got.append(m)])
    consumer.consume()
    drain(conn, lambda: False, 0.3)  # several empty polls: the channel waits now, its fetch sent behind the wait
    with Connection(redis_url, transport=Transport, transport_options={"global_keyprefix": key_prefix}) as producer:
        publish(producer, [{"wake": 1}], priority=0)
    sent, _ = count_fetches(monkeypatch)
    counted = Channel._deliver_fetched

    def marking(self: Channel, reply: list[Any]) -> None:
        sent.append(f"deliver {len(reply) // 2}")
        counted(self, reply)

    monkeypatch.setattr(Channel, "_deliver_fetched", marking)
    drain(conn, lambda: len(got) >= 1, 5)
    assert [m.payload for m in got] == [{"wake": 1}]
    # in the reply of a wait's own fetch (written with it): no fetch of its own went out after the wake
    at = sent.index("deliver 1")
    assert at == 0 or sent[at - 1] == "BLMOVE+FETCH", sent


def test_unacked_messages_come_back_after_the_visibility_timeout_exactly_as_sent(
    conn: Connection, r: redis.Redis, key_prefix: str
) -> None:
    publish(conn, [{"n": 1}])
    original = json.loads(r.lindex(f"{key_prefix}{QUEUE}", 0))
    got = consume(conn, 1)
    assert len(got) == 1
    time.sleep(1.2)  # visibility_timeout is 1 s in this test
    got[0].channel.qos.restore_visible(num=10, interval=1)
    [back] = [json.loads(m) for m in r.lrange(f"{key_prefix}{QUEUE}", 0, -1)]
    assert back["headers"].pop("redelivered") is True  # kombu marks a restored message
    assert back["properties"]["delivery_info"].pop("redelivered") is True
    assert back == original
    assert r.hlen(f"{key_prefix}unacked") == 0


def test_closing_a_channel_puts_back_what_it_held(conn: Connection, r: redis.Redis, key_prefix: str) -> None:
    publish(conn, [{"n": i} for i in range(4)])
    got = consume(conn, 4)
    got[0].ack()
    got[0].channel.close()
    assert r.llen(f"{key_prefix}{QUEUE}") == 3
    assert r.hlen(f"{key_prefix}unacked") == 0


def test_a_queued_item_that_is_not_a_kombu_message_is_dropped_with_an_error_and_the_rest_delivered(
    conn: Connection, r: redis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    publish(conn, [{"n": 0}])
    r.lpush(f"{key_prefix}{QUEUE}", b"\x80not json")
    publish(conn, [{"n": 1}])
    with caplog.at_level(logging.ERROR, logger="tasks.broker.transport"):
        got = consume(conn, 2)
    assert [m.payload for m in got] == [{"n": 0}, {"n": 1}]
    assert "is not a kombu message" in caplog.text
    assert r.hlen(f"{key_prefix}unacked") == 2


def test_broker_urls_pick_this_transport_for_redis_and_leave_others_to_kombu() -> None:
    assert broker_connection("redis://h:6379/0") == ("redis://h:6379/0", "tasks.broker.transport:Transport")
    assert broker_connection("rediss://:pw@h:6380/0?ssl_cert_reqs=required")[1] == "tasks.broker.transport:Transport"
    assert broker_connection("redis+socket:///tmp/r.sock") == ("swapless+socket:///tmp/r.sock", None)
    assert Connection("swapless+socket:///tmp/r.sock").get_transport_cls() is Transport
    assert broker_connection("sentinel://h:26379") == ("sentinel://h:26379", None)
