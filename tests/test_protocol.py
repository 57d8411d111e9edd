"""The job message's args: ``[model_id, input]``, or the input alone with the model id as a keyword (a Celery
chain's next step, fed the previous result), read the same by the router (``message_args``) and the worker."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from swapless.tasks.protocol import message_args, normal_args


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        (["m", "text"], {}, ["m", "text"]),
        (["m", ["a", "b"]], None, ["m", ["a", "b"]]),
        (["the previous result"], {"model_id": "m"}, ["m", "the previous result"]),
        ([], {"model_id": "m", "input": "text"}, ["m", "text"]),
        (["m"], {}, None),
        (["m", "text", "extra"], {}, None),
        (["m", "text"], {"model_id": "m"}, None),
        (["text"], {"model_id": "m", "top_k": 3}, None),
        (["text"], {"input": "other"}, None),
        (["text"], {"model_id": "m", "input": "other"}, None),
        ("m", {}, None),
    ],
)
def test_the_args_of_a_job_in_either_shape(args: Any, kwargs: Any, expected: list[Any] | None) -> None:
    assert normal_args(args, kwargs) == expected


def test_the_router_reads_a_keyword_model_id_from_the_message_as_it_lies_in_redis() -> None:
    body = base64.b64encode(json.dumps([["fed"], {"model_id": "spam"}, {}]).encode()).decode()
    message = {"body": body, "properties": {"body_encoding": "base64"}}
    assert message_args(message) == ["spam", "fed"]
    assert message_args({"body": "not json"}) is None


def test_new_ids_are_fresh_uuid4_strings() -> None:
    """What ``str(uuid.uuid4())`` gives, thousands at a time from one read of the random source: version 4, the
    RFC 4122 variant, each different."""
    import uuid

    from swapless.tasks.protocol import new_ids

    ids = new_ids(5000)
    parsed = [uuid.UUID(job_id) for job_id in ids]
    assert len(set(ids)) == 5000 and all(str(u) == job_id for u, job_id in zip(parsed, ids, strict=True))
    assert {u.version for u in parsed} == {4} and {u.variant for u in parsed} == {uuid.RFC_4122}
    assert new_ids(0) == [] and new_ids(1) != new_ids(1)
