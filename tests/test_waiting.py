"""The one reading of waiting work, counted from list replies without Redis: messages and jobs per model."""

import json

from swapless.tasks.observe.queue import depth_of
from swapless.tasks.observe.waiting import count_waiting
from swapless.tasks.protocol import CHUNK_TASK, PRIORITY_STEPS, SENT_AT_HEADER

TASK = "swapless.predict"


def _message(model: str, value: object, task: str = TASK, sent_at: float | None = None) -> str:
    headers: dict[str, object] = {"task": task}
    if sent_at is not None:
        headers[SENT_AT_HEADER] = sent_at
    return json.dumps({"body": json.dumps([[model, value], {}, {}]), "headers": headers, "properties": {}})


def _replies(models: dict[str, list[tuple[int, list[str]]]], ingress: list[tuple[int, list[str]]]) -> list[object]:
    """Replies in ``waiting_commands``' order: per model and level ``LLEN`` and its sample, then the ingress's."""
    empty = [(0, [])] * len(PRIORITY_STEPS)
    flat: list[object] = []
    for lists in models.values():
        for length, sample in lists or empty:
            flat += [length, sample]
    for length, sample in ingress:
        flat += [length, sample]
    return flat


def test_a_chunk_is_one_message_and_as_many_jobs_as_its_inputs() -> None:
    chunk = _message("m", ["a", "b", "c"], task=CHUNK_TASK, sent_at=5.0)
    single = _message("m", "x", sent_at=7.0)
    lists = [(2, [chunk, single]), (0, []), (0, []), (0, [])]
    ingress = [(1, [_message("m", "y")]), (1, ["not json"]), (0, []), (0, [])]
    waiting = count_waiting(["m", "idle"], _replies({"m": lists, "idle": []}, ingress), sample=10)
    m = waiting.by_model["m"]
    assert (m.waiting_messages, m.waiting_jobs, m.oldest_sent_at) == (3, 5, {0: 5.0})
    assert "idle" not in waiting.by_model
    assert (waiting.ingress_messages, waiting.unreadable_messages) == (2, 1)
    assert waiting.messages_by_priority == {0: 3, 3: 1, 6: 0, 9: 0}
    assert not waiting.messages_estimated and not waiting.jobs_estimated
    depth = depth_of("q", waiting)
    assert depth.by_model == {"m": 3} and depth.total == 4 and depth.ingress == 2 and depth.unreadable == 1


def test_a_list_longer_than_its_sample_is_scaled_up_and_marked() -> None:
    chunk = _message("m", ["a", "b"], task=CHUNK_TASK)
    lists = [(10, [chunk]), (0, []), (0, []), (0, [])]
    waiting = count_waiting(["m"], _replies({"m": lists}, [(0, [])] * 4), sample=1)
    assert (waiting.by_model["m"].waiting_messages, waiting.by_model["m"].waiting_jobs) == (10, 20)
    assert waiting.jobs_estimated and not waiting.messages_estimated  # its own list's messages are exact


def test_known_lengths_are_not_read_again() -> None:
    single = _message("m", "x")
    replies = [[single, single], *_replies({}, [(0, [])] * 4)]  # only the non-empty list's sample, then the ingress
    waiting = count_waiting(["m"], replies, sample=10, known={"m": {0: 2}})
    assert (waiting.by_model["m"].waiting_messages, waiting.by_model["m"].waiting_jobs) == (2, 2)
