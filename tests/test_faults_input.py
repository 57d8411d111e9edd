"""Fault injection, jobs that fail on their own: a model that raises, results that cannot be stored, out of
memory, bad inputs through a real worker, and raw messages that are not JSON jobs (pickle included).

Workers load the ``crashy`` test framework (tests/crashy.py; see test_faults_delivery.py), and the tiny real
models where a test says so; everything uses the shared test Redis under a per-test prefix.

Each scenario tallies its jobs (``tests.faultkit.Scenario``): submitted, succeeded, failed with the expected error,
lost (no final state in time), conflicting (a final state other than its own); one table of every scenario of the
run is printed at the end (``pytest_terminal_summary`` in tests/conftest.py). Run them with ``pytest -m faults``.
"""

from __future__ import annotations

import base64
import os
import pickle
import struct
import uuid
import zlib
from collections import Counter
from pathlib import Path

import pytest
from celery import states

from swapless.config.errors import InputError, ModelTooLarge, PredictionFailed, SwaplessError, UnknownModel
from swapless.tasks.client import Client
from swapless.tasks.protocol import PREDICT_TASK
from tests import faultkit
from tests.faultkit import FaultEnv, Scenario, echoes, fails, gate, labels, publish_raw, settle
from tests.tinymodels import encode_image

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.images]


# -- 4. a batch whose code raises --------------------------------------------------------------------------------


def test_a_model_that_raises_on_every_batch_fails_each_job_with_its_message(one_worker: FaultEnv) -> None:
    scenario = Scenario("4. predict raises for the whole batch")
    faults, [worker] = one_worker, one_worker.workers
    client = Client()
    held = gate(client, faults)
    broken = [client.submit("broken", f"b-{i}") for i in range(10)]
    fine = [client.submit("echo", f"e-{i}") for i in range(10)]
    held.open()
    stored, _ = settle(client, [held.job, *broken, *fine], 30)

    message = "model 'broken' failed on this input: RuntimeError: crashy model is broken (1 inputs)"
    scenario.count(
        stored,
        [held.expect]
        + [fails(PredictionFailed, message)] * 10
        + [echoes(f"e-{i}") for i in range(10)],
    )
    scenario.assert_complete(faults.snapshot)
    faults.wait_broker_idle()
    assert worker.proc.poll() is None


def test_results_that_cannot_be_stored_fail_their_jobs_instead_of_hanging(one_worker: FaultEnv) -> None:
    # A custom framework returning something JSON cannot encode (a set, a numpy float): storing the batch raises.
    scenario = Scenario("4. unstorable results")
    faults, [worker] = one_worker, one_worker.workers
    client = Client()
    held = gate(client, faults)
    bad = [client.submit("unstorable", f"u-{i}") for i in range(5)]
    fine = [client.submit("echo", f"f-{i}") for i in range(5)]
    held.open()
    stored, _ = settle(client, [held.job, *bad, *fine], 20)

    scenario.count(
        stored,
        [held.expect]
        + [fails(SwaplessError, contains="not JSON serializable")] * 5
        + [echoes(f"f-{i}") for i in range(5)],
    )
    scenario.assert_complete(faults.snapshot)
    faults.wait_broker_idle(10)
    assert worker.proc.poll() is None


# -- 8. out of memory ----------------------------------------------------------------------------------------------


def test_out_of_memory_splits_the_batch_and_a_model_too_large_fails_alone(faults: FaultEnv) -> None:
    scenario = Scenario("8. OOM in a batch; model too large")
    faults.write_models(real=True)
    worker = faults.worker(env={"SWAPLESS_MEMORY_BUDGET_BYTES": "100000"})
    client = Client()
    held = gate(client, faults)
    oom = [client.submit("oom", f"oom-{i}") for i in range(16)]
    too_large = [client.submit("sentiment", f"text {i}") for i in range(4)]
    held.open()
    stored, _ = settle(client, [held.job, *oom, *too_large], 60)
    after = [client.submit("echo", f"after-{i}") for i in range(4)] + [client.submit("sentiment", "again")]
    stored_after, _ = settle(client, after, 30)

    budget = "more than the whole memory budget of 97.7 KiB; raise --memory-budget (SWAPLESS_MEMORY_BUDGET_BYTES)"
    scenario.count(
        stored + stored_after,
        [held.expect]
        + [echoes(f"oom-{i}") for i in range(16)]
        + [fails(ModelTooLarge, contains=budget)] * 4
        + [echoes(f"after-{i}") for i in range(4)]
        + [fails(ModelTooLarge, contains=budget)],
    )
    scenario.assert_complete(faults.snapshot)
    assert str(stored[-1].value).startswith("model 'sentiment' needs ")
    assert worker.count("retrying in halves") >= 1
    assert worker.proc.poll() is None


# -- 9. bad input through a real worker ----------------------------------------------------------------------------


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels, with almost no data (a decompression bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\0" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


GOOD_TEXTS = ["what a lovely day", "terrible service, never again", "meeting moved to thursday", "a"]


def test_one_worker_survives_every_bad_input_in_one_batch_and_the_rest_succeeds(faults: FaultEnv) -> None:
    scenario = Scenario("9. bad inputs in one batch")
    model_ids = faults.write_models(real=True)
    worker = faults.worker(env={"SWAPLESS_MAX_TEXT_CHARS": "500", "SWAPLESS_MAX_IMAGE_BYTES": "50000"})
    client = Client()
    held = gate(client, faults)  # everything below waits in the backlog: one batch per model
    image = encode_image(1)
    png = base64.b64decode(image)
    big = encode_image(2, size=(160, 120))

    def text_fails(problem: str) -> faultkit.Expect:
        return fails(InputError, f"bad input for model 'sentiment': {problem}")

    def image_fails(problem: str) -> faultkit.Expect:
        return fails(InputError, f"bad input for model 'vision': {problem}")

    formats = "PNG, JPEG, WEBP, GIF, BMP"
    over_chars = "characters is over the limit of 500 (SWAPLESS_MAX_TEXT_CHARS)"
    not_base64 = "image is not valid base64; this is an image model (did you send plain text or a file path?)"
    cases: list[tuple[str, object, faultkit.Expect]] = [
        *[("sentiment", text, labels()) for text in GOOD_TEXTS],
        *[("vision", encode_image(seed), labels()) for seed in (10, 11, 12)],
        ("sentiment", "   ", text_fails("empty text; send at least one non-blank character")),
        ("sentiment", "word " * 200, text_fails(f"text of 1000 {over_chars}")),
        ("sentiment", image, text_fails(f"text of {len(image)} {over_chars}")),  # an image to a text model
        ("sentiment", {"image": image}, text_fails("this is a text model; send a string, not an object")),
        ("vision", "a photo of a cat", image_fails(not_base64)),  # text to an image model
        ("vision", "@@ not*base64 @@", image_fails(not_base64)),
        ("vision", _b64(os.urandom(3000)), image_fails(f"the bytes are not an image Pillow can read ({formats})")),
        ("vision", _b64(png[: len(png) * 2 // 3]), fails(InputError, contains="image data is truncated or corrupt")),
        (
            "vision",
            _b64(_png_header(10_000, 10_000)),
            image_fails("image of 10000x10000 pixels is over the limit of 89478485 pixels (SWAPLESS_MAX_IMAGE_PIXELS)"),
        ),
        ("vision", _b64(_png_header(100_000, 100_000)), fails(InputError, contains="rejected as a decompression bomb")),
        (
            "vision",
            big,
            image_fails(
                f"encoded image of about {len(big) * 3 // 4} bytes is over the limit of 50000 bytes "
                "(SWAPLESS_MAX_IMAGE_BYTES)"
            ),
        ),
        ("vision", "cats/001.jpg", fails(InputError, contains="looks like a file path, but this worker reads no")),
    ]
    jobs = [client.submit(model_id, value) for model_id, value, _ in cases]  # type: ignore[arg-type]
    expected = [expect for _, _, expect in cases]
    known = ", ".join(sorted(model_ids))
    jobs.append(Client(validate=False).submit("sentimnt", "hello"))
    expected.append(fails(UnknownModel, f"unknown model 'sentimnt' (known: {known})"))
    malformed = "bad input for model '?': malformed job payload: "
    expected_args = "expected args [model_id, input] and no kwargs, or args [value] and the keyword model_id"
    for args, kwargs, problem in [
        (["sentiment"], None, expected_args),
        (["sentiment", "hi", "extra"], None, expected_args),
        (["sentiment", "hi"], {"top_k": 3}, expected_args),
        ([42, "hi"], None, "model id must be a string, not int"),
    ]:
        sent = client.app.send_task(PREDICT_TASK, args=args, kwargs=kwargs, queue=faults.queue)
        jobs.append(client.job(sent.id))
        expected.append(fails(InputError, malformed + problem))
    held.open()
    stored, _ = settle(client, [held.job, *jobs], 60)

    scenario.count(stored, [held.expect, *expected])
    scenario.assert_complete(faults.snapshot)
    assert worker.proc.poll() is None
    assert isinstance(client.submit("sentiment", "still serving?").get(timeout=30), list)
    faults.wait_broker_idle()


class _CreatesFile:
    """Unpickling this calls ``open(path, "w")``: the file appears only if a worker ever unpickles the payload."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize(
    "kind, body, content_type, answer",
    [
        ("not JSON", b"{this is not json", "application/json", "message body is not valid JSON"),
        ("pickle", None, "application/x-python-serialize", "message refused, nothing in it was decoded"),
        (
            "JSON object, not [args, kwargs, embed]",
            b'{"model": "echo"}',
            "application/json",
            "expected args [model_id, input]",
        ),
        ("JSON null", b"null", "application/json", "expected args [model_id, input]"),
    ],
)
def test_a_message_that_is_not_a_json_job_is_dropped_and_the_worker_keeps_serving(
    one_worker: FaultEnv, tmp_path: Path, kind: str, body: bytes | None, content_type: str, answer: str
) -> None:
    scenario = Scenario(f"9. raw message: {kind}")
    faults, [worker] = one_worker, one_worker.workers
    ran_before = faults.executions()  # the module's worker ran other tests' jobs
    tag = uuid.uuid4().hex[:6]
    marker = tmp_path / "unpickled"
    if body is None:
        armed = tmp_path / "armed"
        pickle.loads(pickle.dumps(_CreatesFile(armed))).close()  # the payload does create its file when unpickled
        assert armed.exists()
        body = pickle.dumps(_CreatesFile(marker))
    client = Client()
    bad_id = str(uuid.uuid4())
    publish_raw(client, body, content_type, bad_id)
    good = [client.submit("echo", f"good-{tag}-{i}") for i in range(5)]
    stored, _ = settle(client, good, 10)

    scenario.count(stored, [echoes(f"good-{tag}-{i}") for i in range(5)])
    state = "running" if worker.proc.poll() is None else f"exited with {worker.proc.returncode}"
    log = worker.log()
    assert "Unrecoverable error" not in log, f"a {kind} message stopped the worker ({state}):\n{log[-2500:]}"
    scenario.assert_complete(faults.snapshot)
    assert worker.proc.poll() is None, f"the worker died on a {kind} message:\n{worker.log()[-3000:]}"
    faults.wait_broker_idle(10)  # the bad message is gone, not left held or requeued
    refused = client.fetch([bad_id])[0]  # the producer is answered: an error result under the message's id
    assert refused.state == states.FAILURE and answer in str(refused.value), (refused.state, refused.value)
    assert not marker.exists(), "the worker unpickled a message"
    # the log has a line per input run: exactly the good jobs', once each; nothing of the bad message ran
    assert faults.executions() - ran_before == Counter(f"good-{tag}-{i}" for i in range(5)), faults.executions()
    scenario.submitted += 1  # the bad message: dropped, and answered with its error
    scenario.failed_expected += 1


# -- 10. security: JSON only -----------------------------------------------------------------------------------------


def test_the_app_accepts_json_only(swapless_env: dict[str, str]) -> None:
    from swapless.tasks.worker.task import app

    for celery_app in (app, Client().app):
        conf = celery_app.conf
        assert (conf.task_serializer, conf.result_serializer) == ("json", "json")
        assert list(conf.accept_content) == ["json"]
        assert list(conf.result_accept_content) == ["json"]
