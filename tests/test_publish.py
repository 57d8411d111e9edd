"""Client.submit and submit_jobs: messages built directly, identical to those Celery's send_task makes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis

from swapless.config.errors import InputError, UnknownModel
from swapless.tasks.client import Client
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.protocol import PREDICT_TASK, PRIORITY_BULK, PRIORITY_INTERACTIVE
from tests.conftest import WorkerProcess
from tests.tinymodels import encode_image

pytestmark = pytest.mark.images

# differ by design between any two messages
_PER_MESSAGE = {"id", "root_id", "argsrepr", "swapless_sent_at", "correlation_id", "delivery_tag"}


def _strip(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "body": message["body"],
        **{k: v for k, v in message.items() if k not in ("headers", "properties", "body")},
        "headers": {k: v for k, v in message["headers"].items() if k not in _PER_MESSAGE},
        "properties": {k: v for k, v in message["properties"].items() if k not in _PER_MESSAGE},
    }


@pytest.mark.parametrize(("priority", "level"), [("interactive", PRIORITY_INTERACTIVE), ("bulk", PRIORITY_BULK)])
def test_messages_are_those_send_task_makes(
    swapless_env: dict[str, str], redis_url: str, priority: str, level: int
) -> None:
    client = Client()
    r = redis.Redis.from_url(redis_url)
    s = client.settings
    by_send_task = client.app.send_task(PREDICT_TASK, args=["sentiment", "same input"], queue=s.jobs.queue,
                                        priority=level)
    [ours] = client.submit_jobs([("sentiment", "same input")], priority=priority)
    alone = client.submit("sentiment", "same input", priority=priority)
    keyspace = Keyspace.of(s)
    shared = r.lrange(keyspace.ingress(level), 0, -1)  # send_task's: the queue's ingress
    placed = r.lrange(keyspace.model("sentiment").list_for(level), 0, -1)  # ours: the model's list
    raw = [json.loads(m) for m in [*shared, *reversed(placed)]]
    assert [m["headers"]["id"] for m in raw] == [by_send_task.id, ours.id, alone.id]
    celery_msg, our_msg, alone_msg = raw
    assert _strip(our_msg) == _strip(celery_msg) == _strip(alone_msg)
    assert our_msg["headers"]["argsrepr"] == celery_msg["headers"]["argsrepr"] == "['sentiment', 'same input']"
    assert our_msg["headers"]["root_id"] == our_msg["properties"]["correlation_id"] == ours.id
    assert our_msg["properties"]["delivery_tag"] != celery_msg["properties"]["delivery_tag"]
    r.close()


def test_nothing_is_sent_when_one_job_is_invalid(swapless_env: dict[str, str], redis_url: str) -> None:
    client = Client()
    r = redis.Redis.from_url(redis_url)
    with pytest.raises(UnknownModel, match="nope"):
        client.submit_jobs([("sentiment", "ok"), ("nope", "x")])
    with pytest.raises(ValueError, match=r"job 1 \(spam\): its input cannot be sent as JSON"):
        client.submit_jobs([("sentiment", "ok"), ("spam", {1, 2})])
    with pytest.raises(ValueError, match="priority must be one of interactive, bulk"):
        client.submit_jobs([("sentiment", "ok")], priority="urgent")
    s = client.settings
    keyspace = Keyspace.of(s)
    keys = [keyspace.ingress(level) for level in (0, PRIORITY_BULK)]
    keys += [keyspace.model(m).list_for(level) for m in ("sentiment", "spam") for level in (0, 6)]
    assert all(r.llen(key) == 0 for key in keys)
    r.close()


def test_a_message_over_the_byte_bound_is_refused_and_nothing_of_its_call_is_sent(
    swapless_env: dict[str, str], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from swapless.config.settings import get_settings

    monkeypatch.setenv("SWAPLESS_MAX_MESSAGE_BYTES", "4096")
    get_settings.cache_clear()
    client = Client()
    r = redis.Redis.from_url(redis_url)
    with pytest.raises(InputError) as caught:
        client.submit_jobs([("sentiment", "small"), ("spam", "x" * 4000)])
    assert str(caught.value).startswith("bad input for model 'spam': the job's queue message would be ")
    assert str(caught.value).endswith(
        "bytes, over the limit of 4096 bytes (SWAPLESS_MAX_MESSAGE_BYTES): send a smaller input"
    )
    with pytest.raises(InputError, match=r"send a smaller chunk of inputs \(fewer inputs per chunk: --chunk-size\)"):
        client.submit_many("sentiment", ["y" * 500] * 10, chunk_size=10)
    s = client.settings
    keys = [Keyspace.of(s).model(m).list_for(level) for m in ("sentiment", "spam") for level in (0, 6)]
    assert all(r.llen(key) == 0 for key in keys)
    assert client.submit("sentiment", "small").id  # under the bound, as ever
    r.close()


def test_a_fresh_install_bounds_the_queue() -> None:
    from swapless.config.settings import Settings

    assert Settings().jobs.max_queued == 100_000, "one caller cannot fill a fresh install's Redis"


@pytest.mark.slow
def test_a_real_worker_answers_each_job_like_submit(start_worker: Callable[..., WorkerProcess]) -> None:
    start_worker("--max-models", "2")
    client = Client()
    image = encode_image(3)
    pairs = [("sentiment", f"text number {i}") for i in range(20)] + [("vision", image)] * 5 + [("spam", "")]
    pairs += [("spam", f"win a prize {i}") for i in range(20)]
    jobs = client.submit_jobs(pairs)
    assert len({job.id for job in jobs}) == len(pairs)
    results = client.gather(jobs, timeout=120)
    one_by_one = client.gather([client.submit(m, v) for m, v in pairs], timeout=120)
    # every job succeeds but the empty text (index 25), both ways, with the same predictions
    assert [i for i, (_, value) in enumerate(pairs) if value == ""] == [25]
    for index, ((model_id, _), got, want) in enumerate(zip(pairs, results, one_by_one, strict=True)):
        expected = "FAILURE" if index == 25 else "SUCCESS"
        assert got.state == want.state == expected, (index, model_id, got, want)
        if expected == "SUCCESS":
            assert got.value and [p["label"] for p in got.value] == [p["label"] for p in want.value], (index, got)
            assert [p["score"] for p in got.value] == pytest.approx([p["score"] for p in want.value], abs=1e-5)
    empty = results[25]
    assert empty.state == "FAILURE" and isinstance(empty.value, InputError) and "empty text" in str(empty.value)


def test_a_long_call_is_pushed_in_growing_slices_in_order(
    swapless_env: dict[str, str], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """6,000 jobs over two models: the first 64 reach Redis in the first round trip (a worker starts on them while
    the rest are built), then slices doubling to 1,024; every job is queued once, each model's in the order given."""
    from swapless.tasks.broker import publish as publishing
    from swapless.tasks.client import publisher

    pushed: list[int] = []
    real = publishing.push_to_models

    def counted(client: Any, pushes: Any, **kwargs: Any) -> Any:
        pushed.append(sum(len(p.messages) for p in pushes))
        return real(client, pushes, **kwargs)

    monkeypatch.setattr(publisher, "push_to_models", counted)
    client = Client()
    pairs = [("sentiment" if i % 3 else "spam", f"text {i}") for i in range(6000)]
    jobs = client.submit_jobs(pairs, priority="bulk")
    assert pushed == [64, 128, 256, 512, 1024, 1024, 1024, 1024, 944]
    r = redis.Redis.from_url(redis_url)
    keyspace = Keyspace.of(client.settings)
    for model in ("sentiment", "spam"):
        queued = [json.loads(m)["headers"]["id"] for m in reversed(r.lrange(keyspace.model(model).list_for(6), 0, -1))]
        assert queued == [job.id for job, (m, _) in zip(jobs, pairs, strict=True) if m == model]
    r.close()


def test_a_long_call_queues_each_models_jobs_whole_or_not_at_all(
    swapless_env: dict[str, str], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With SWAPLESS_MAX_QUEUED at 1,000: a call of 1,500 jobs of one model and 100 of another sends the second's
    100 and none of the first's (its first slice already counts all 1,500), naming what was queued; an input that
    cannot be encoded, or a message over the byte bound, at the call's end sends nothing at all."""
    from swapless.config.errors import QueueFull
    from swapless.config.settings import get_settings

    monkeypatch.setenv("SWAPLESS_MAX_QUEUED", "1000")
    monkeypatch.setenv("SWAPLESS_MAX_MESSAGE_BYTES", "65536")
    get_settings.cache_clear()
    client = Client()
    r = redis.Redis.from_url(redis_url)
    keyspace = Keyspace.of(client.settings)

    def queued(model: str) -> int:
        return sum(r.llen(key) for key in keyspace.model(model).lists)

    bad = [("spam", f"s {i}") for i in range(1999)]
    with pytest.raises(ValueError, match=r"job 1999 \(spam\): its input cannot be sent as JSON"):
        client.submit_jobs([*bad, ("spam", {1, 2})])
    with pytest.raises(InputError, match="over the limit of 65536 bytes"):
        client.submit_jobs([*bad, ("spam", "x" * 70_000)])
    assert queued("spam") == queued("sentiment") == 0

    pairs = [("sentiment", f"a {i}") if i % 16 else ("spam", f"b {i}") for i in range(1600)]
    with pytest.raises(QueueFull, match="model 'sentiment' has 0 messages queued, its bound is 1000") as caught:
        client.submit_jobs(pairs, priority="bulk")
    assert queued("sentiment") == 0 and queued("spam") == 100
    assert len(caught.value.queued) == 100 and "(100 of these jobs were queued)" in str(caught.value)
    assert len(client.submit_jobs([("sentiment", f"c {i}") for i in range(900)], priority="bulk")) == 900
    assert queued("sentiment") == 900
    r.close()


@pytest.mark.parametrize("value", [
    "great movie", "", "it's", 'say "hi"', "new\nline", "tab\there", "back\\slash", "é ü 中文 😀", "\x00\x1f",
    "x" * 990, "x" * 1100, "nbsp\u00a0here", 5, None, [1, "a"], {"k": "v"},
])
def test_argsrepr_is_what_send_task_writes(value: Any) -> None:
    """The header a monitor shows for a job's arguments: the plain repr where it equals Celery's saferepr, saferepr
    itself elsewhere (escapes, long texts, non-strings)."""
    from celery.utils.saferepr import saferepr

    from swapless.tasks.broker.publish import argsrepr

    assert argsrepr(["sentiment", value]) == saferepr(["sentiment", value], 1024)
