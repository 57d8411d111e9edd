"""Chunk expansion and assembly (tasks.protocol, tasks.worker.delivery, tasks.worker.chunks): plain data, no Redis,
no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from swapless.config.errors import InputError, JobFailed, PredictionFailed, UnknownModel
from swapless.config.settings import Settings
from swapless.manager import InputType, Outcome
from swapless.manager.registry.specs import ModelSpec
from swapless.manager.registry.store import ModelStore
from swapless.tasks.protocol import (
    CHUNK_TASK,
    SENT_AT_HEADER,
    decode_outcome,
    encode_outcome,
    item_id,
    split_item_id,
)
from swapless.tasks.routing import Router
from swapless.tasks.worker.chunks import ChunkAssembler
from swapless.tasks.worker.delivery import decode


def jobs_from_chunk(request: Any, store: ModelStore, received_s: float) -> list[Any]:
    """The item jobs of one chunk request, as the worker decodes it."""
    return list(decode(request, Router(store), Settings(), received_s).jobs)


def expand(chunks: ChunkAssembler, request: Any, store: ModelStore, received_s: float) -> list[Any]:
    return chunks.expand(decode(request, Router(store), Settings(), received_s))


@dataclass
class Request:
    """What the scheduler sees of a Celery request."""

    id: str
    args: Any
    kwargs: dict[str, Any] = field(default_factory=dict)
    delivery_info: dict[str, Any] = field(default_factory=lambda: {"priority": 6})
    name: str = CHUNK_TASK
    request_dict: dict[str, Any] = field(default_factory=dict)


@pytest.fixture
def store() -> ModelStore:
    return ModelStore(
        [
            ModelSpec(id="sentiment", aliases=("senti",), name="x", type=InputType.TEXT, framework="fake"),
            ModelSpec(id="spam", name="y", type=InputType.TEXT, framework="fake"),
        ]
    )


def test_a_job_has_waited_since_its_producer_sent_it(store: ModelStore) -> None:
    # fetched 40 s after it was sent (a long burst's jobs stay in Redis until their worker gets to them): the
    # starvation bound counts from the send; every job of one hand-over is timed from one reading of the clock
    sent = Request("c1", ["spam", ["a", "b"]], request_dict={SENT_AT_HEADER: 1000.0})
    delivery = decode(sent, Router(store), Settings(), 500.0, wall_s=1040.0)
    assert {job.received_s for job in delivery.jobs} == {460.0}
    ahead = Request("c2", ["spam", ["a"]], request_dict={SENT_AT_HEADER: 1050.0})  # a producer's clock ahead
    assert decode(ahead, Router(store), Settings(), 500.0, wall_s=1040.0).jobs[0].received_s == 500.0
    assert jobs_from_chunk(Request("c3", ["spam", ["a"]]), store, 500.0)[0].received_s == 500.0  # no send time


def test_item_ids_round_trip() -> None:
    assert item_id("0f1e-2d", 17) == "0f1e-2d:17"
    assert split_item_id("0f1e-2d:17") == ("0f1e-2d", 17)
    assert split_item_id("0f1e-2d") is None
    assert split_item_id("a:b") is None
    assert split_item_id(":3") is None


def test_a_chunk_becomes_one_job_per_item_with_the_canonical_model_id(store: ModelStore) -> None:
    jobs = jobs_from_chunk(Request("c1", ["senti", ["a", "b", "c"]]), store, received_s=5.0)
    assert [job.id for job in jobs] == ["c1:0", "c1:1", "c1:2"]
    assert [job.input for job in jobs] == ["a", "b", "c"]
    assert {job.model_id for job in jobs} == {"sentiment"}
    assert {job.received_s for job in jobs} == {5.0}
    assert not any(job.urgent for job in jobs)
    urgent = jobs_from_chunk(Request("c2", ["spam", ["a"]], delivery_info={"priority": 0}), store, 0.0)
    assert urgent[0].urgent


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (["sentiment"], {}, "malformed chunk payload: expected args [model_id, [input, ...]] and no kwargs"),
        (["sentiment", ["a"]], {"x": 1}, "malformed chunk payload: expected args"),
        ([3, ["a"]], {}, "model id must be a string, not int"),
        (["sentiment", "a"], {}, "inputs must be a non-empty list"),
        (["sentiment", []], {}, "inputs must be a non-empty list"),
    ],
)
def test_malformed_chunks_fail_whole(store: ModelStore, args: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        jobs_from_chunk(Request("c", args, kwargs), store, 0.0)


def test_unknown_model_fails_the_whole_chunk_and_registers_nothing(store: ModelStore) -> None:
    chunks = ChunkAssembler()
    with pytest.raises(UnknownModel, match="unknown model 'sentimnt' \\(known: sentiment, spam\\)"):
        expand(chunks, Request("c", ["sentimnt", ["a"]]), store, 0.0)
    assert len(chunks) == 0


def test_outcomes_are_assembled_in_item_order_across_groups(store: ModelStore) -> None:
    chunks = ChunkAssembler()
    request = Request("c1", ["sentiment", ["a", "b", "c"]])
    jobs = expand(chunks, request, store, 0.0)
    assert len(chunks) == 1 and chunks.owns("c1:2") and not chunks.owns("plain-job")
    plain = Outcome(jobs[0].__class__(id="plain-job", model_id="sentiment", input="x"), result="p")
    # The scheduler may run a chunk's items in several groups, in any order, mixed with plain jobs.
    others, done = chunks.collect([Outcome(jobs[2], result=[{"label": "x", "score": 1.0}]), plain])
    assert others == [plain] and done == []
    others, done = chunks.collect(
        [Outcome(jobs[1], error=InputError("sentiment", "empty text")), Outcome(jobs[0], result="first")]
    )
    assert others == []
    assert done == [
        (
            request,
            [
                {"ok": "first"},
                {
                    "error": "bad input for model 'sentiment': empty text",
                    "type": "InputError",
                    "args": ["sentiment", "empty text"],
                },
                {"ok": [{"label": "x", "score": 1.0}]},
            ],
            None,
        )
    ]
    assert len(chunks) == 0 and not chunks.owns("c1:0")


def test_only_a_chunk_none_of_whose_items_started_can_go_back_whole(store: ModelStore) -> None:
    chunks = ChunkAssembler()
    fresh = expand(chunks, Request("c1", ["sentiment", ["a", "b"]]), store, 0.0)
    started = expand(chunks, Request("c2", ["sentiment", ["a", "b"]]), store, 0.0)
    running = expand(chunks, Request("c3", ["sentiment", ["a", "b"]]), store, 0.0)
    chunks.collect([Outcome(started[0], result="done")])  # c2 has an outcome already
    waiting = [job.id for job in [*fresh, started[1], running[1]]]  # c3's first item is in a running group
    assert chunks.untouched(waiting) == {"c1"}
    assert chunks.untouched([fresh[0].id]) == set()  # its other item is not waiting


def test_a_second_delivery_of_a_chunk_in_progress_is_acked_with_the_first(store: ModelStore) -> None:
    chunks = ChunkAssembler()
    first, again = Request("c1", ["spam", ["a", "b"]]), Request("c1", ["spam", ["a", "b"]])
    jobs = expand(chunks, first, store, 0.0)
    assert expand(chunks, again, store, 0.0) == []  # no second copy of the work
    _, done = chunks.collect([Outcome(job, result=i) for i, job in enumerate(jobs)])
    assert [request for request, _, _ in done] == [first, again]
    assert done[0][1] == done[1][1] == [{"ok": 0}, {"ok": 1}]


def test_decode_rebuilds_the_workers_error() -> None:
    assert decode_outcome({"ok": [1, 2]}) == (True, [1, 2])
    ok, error = decode_outcome(encode_outcome(None, PredictionFailed("spam", "RuntimeError: boom")), "c:1")
    assert not ok and isinstance(error, PredictionFailed)
    assert str(error) == "model 'spam' failed on this input: RuntimeError: boom"
    ok, error = decode_outcome({"error": "it broke", "type": "ValueError", "args": ["it broke"]}, "c:1")
    assert isinstance(error, JobFailed) and str(error) == "job c:1 failed: ValueError: it broke"
    ok, error = decode_outcome("garbage", "c:2")
    assert isinstance(error, JobFailed) and "unexpected item outcome 'garbage'" in str(error)


def test_errors_with_unserializable_args_keep_their_message() -> None:
    class Odd(Exception):
        pass

    encoded = encode_outcome(None, Odd(object()))
    assert encoded["type"] == "Odd" and "args" not in encoded and encoded["error"].startswith("<object")
