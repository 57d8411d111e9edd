"""The batch API (``/v1/files``, ``/v1/batches``) with the real ``openai`` client against a real ``swapless serve``
and a real worker: upload, create, poll, download, counts, list, cancel mid-run, a gateway and a worker killed
mid-batch; and its pure parts (lines, the streaming multipart reader, windows) without either."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from swapless.tasks.gateway.batches.lines import LineChecker, error_line, output_line, status_of
from swapless.tasks.gateway.batches.routes import parse_window
from swapless.tasks.gateway.batches.upload import LineWriter, MultipartReader, boundary_of
from swapless.tasks.gateway.errors import BadBatch, BadBatchFile
from tests.conftest import WorkerProcess
from tests.stack import GatewayProcess, private_env, wait_for
from tests.webhook_receiver import SECRET, Receiver

FULL = "batch-full-key-" + "f" * 20
LIMITED = "batch-spam-key-" + "s" * 20


def request_line(custom_id: str, model: str, text: Any, **body: Any) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/predict",
                       "body": {"model_id": model, "input": text, **body}}) + "\n"


# -- pure parts ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "message"), [
    (b"{not json\n", "line 1: not valid JSON"),
    (b'["a"]\n', "line 1: a list, not an object with custom_id, method, url and body"),
    (b'{"custom_id": "a", "method": "GET", "url": "/predict", "body": {}}\n', "line 1: method must be \"POST\""),
    (b'{"custom_id": "a", "method": "POST", "url": "/jobs", "body": {}}\n', "line 1: url must be '/predict'"),
    (b'{"custom_id": "a", "method": "POST", "url": "/predict", "body": ["x"]}\n',
     "line 1: body must be an object (a /predict body), not a list"),
    (b'{"custom_id": "", "method": "POST", "url": "/predict", "body": {}}\n', "line 1: custom_id must be a string"),
])
def test_a_bad_line_is_refused_naming_its_line_and_field(line: bytes, message: str) -> None:
    """A line's envelope is the file's: one wrong refuses the upload (a body's own errors are its request's)."""
    with pytest.raises(BadBatchFile) as refused:
        LineChecker(10, 10_000).check(line)
    assert str(refused.value).startswith(message)
    assert str(refused.value).endswith("nothing was kept: fix it and upload the file again")


@pytest.mark.parametrize("body", [
    {"model_id": "m", "input": "x"}, {"model_id": "m", "input": None}, {"model_id": "m", "input": [1, {"a": 2}]},
    {"model_id": "m", "input": "x", "priority": "bulk"}, {"model_id": "m", "input": "x", "key": "user-1"},
    {"model_id": "m", "input": "x", "key": None}, {"model_id": "m", "input": "x", "expires_s": 30},
    {"model_id": "", "input": "x"}, {"model_id": "m" * 128, "input": "x"}, {"model_id": "m" * 129, "input": "x"},
    {"model_id": 5, "input": "x"}, {"model_id": None, "input": "x"}, {"model_id": "m"}, {"input": "x"},
    {"model_id": "m", "input": "x", "priority": "urgent"}, {"model_id": "m", "input": "x", "priority": ["bulk"]},
    {"model_id": "m", "input": "x", "priority": None}, {"model_id": "m", "input": "x", "key": ""},
    {"model_id": "m", "input": "x", "key": 7}, {"model_id": "m", "input": "x", "key": "k" * 257},
    {"model_id": "m", "input": "x", "colour": 1}, {"model_id": "m", "input": "x", "expires_s": -1},
])
def test_a_line_s_body_is_taken_exactly_as_predict_would_take_it(body: Any) -> None:
    """Lines are checked by hand where their body is plain: the same bodies pass and fail as ``JobRequest``'s; a body
    it refuses is that request's error (named by field), never the file's."""
    from pydantic import ValidationError

    from swapless.tasks.gateway.batches.lines import parse_line
    from swapless.tasks.gateway.schema import JobRequest

    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/predict", "body": body}).encode()
    try:
        job = JobRequest.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        failed = parse_line(line, 3)
        assert failed.error == ".".join(["body", *(str(part) for part in first["loc"])]) + ": " + first["msg"]
        assert failed.custom_id == "a" and failed.input is None
        return
    parsed = parse_line(line, 3)
    assert parsed.error is None
    assert (parsed.model_id, parsed.input, parsed.priority, parsed.key) == (job.model_id, job.input, job.priority,
                                                                            job.key)


def test_the_checker_bounds_lines_and_refuses_a_repeated_custom_id() -> None:
    checker = LineChecker(2, 200)
    checker.check(request_line("a", "spam", "hi").encode())
    checker.check(b"\n")  # blank lines are no requests, but they are lines
    with pytest.raises(BadBatchFile, match="line 3: custom_id 'a' repeats an earlier line's"):
        checker.check(request_line("a", "spam", "again").encode())
    checker.check(request_line("b", "spam", "hi").encode())
    with pytest.raises(BadBatchFile, match=r"line 5: more than 2 requests \(SWAPLESS_BATCH_MAX_LINES\)"):
        checker.check(request_line("c", "spam", "hi").encode())
    with pytest.raises(BadBatchFile, match="line 1: 301 bytes, over the 200 bytes one request may take"):
        LineChecker(2, 200).check(b"x" * 300 + b"\n")


async def _blocks(body: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def _multipart(boundary: str, parts: list[tuple[str, str | None, bytes]]) -> bytes:
    out = b""
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 16])
def test_the_multipart_reader_streams_the_file_part_line_by_line(block: int) -> None:
    content = "".join(request_line(f"r{i}", "spam", f"text {i}") for i in range(20)).encode()
    body = _multipart("xyzzy", [("purpose", None, b"batch"), ("file", "in.jsonl", content)])
    out = io.BytesIO()
    checker = LineChecker(100, 10_000)
    upload = asyncio.run(MultipartReader(b"xyzzy", "file", LineWriter(out, checker)).read(_blocks(body, block)))
    assert upload.fields == {"purpose": "batch"} and upload.filename == "in.jsonl"
    assert out.getvalue() == content and checker.lines == 20


def test_the_multipart_reader_stops_at_the_first_bad_line_and_at_a_cut_body() -> None:
    content = (request_line("a", "spam", "x") + "{oops\n" + request_line("b", "spam", "y")).encode()
    body = _multipart("b0", [("file", "in.jsonl", content), ("purpose", None, b"batch")])
    with pytest.raises(BadBatchFile, match="line 2: not valid JSON"):
        asyncio.run(MultipartReader(b"b0", "file", LineWriter(io.BytesIO(), LineChecker(9, 999))).read(
            _blocks(body, 5)))
    good = _multipart("b0", [("file", "in.jsonl", request_line("a", "spam", "x").encode())])
    with pytest.raises(BadBatchFile, match="ended before its closing boundary"):
        asyncio.run(MultipartReader(b"b0", "file", LineWriter(io.BytesIO(), LineChecker(9, 999))).read(
            _blocks(good[:-10], 5)))
    assert boundary_of('multipart/form-data; boundary="a b"') == b"a b"
    with pytest.raises(BadBatchFile, match="send the file as multipart/form-data"):
        boundary_of("application/json")


def test_the_multipart_reader_keeps_only_purpose_and_bounds_the_parts() -> None:
    """A body of many distinct form fields is neither held (only ``purpose`` is kept) nor read past 8 parts."""
    fields = [(f"junk{i}", None, b"z" * 1000) for i in range(6)]
    file = ("file", "in.jsonl", request_line("a", "s", "x").encode())
    body = _multipart("b0", [("purpose", None, b"batch"), *fields, file])
    upload = asyncio.run(MultipartReader(b"b0", "file", LineWriter(io.BytesIO(), LineChecker(9, 999))).read(
        _blocks(body, 64)))
    assert upload.fields == {"purpose": "batch"}
    many = _multipart("b0", [("purpose", None, b"batch"), *fields, *fields])
    with pytest.raises(BadBatchFile, match="more than 8 parts: send the fields purpose and file"):
        asyncio.run(MultipartReader(b"b0", "file", LineWriter(io.BytesIO(), LineChecker(9, 999))).read(
            _blocks(many, 64)))


def test_windows_and_the_lines_written() -> None:
    assert parse_window("24h", 86400) == 86400 and parse_window("30s", 86400) == 30
    with pytest.raises(BadBatch, match=r"not between 1 s and 86400 s \(SWAPLESS_BATCH_MAX_WINDOW_S\)"):
        parse_window("25h", 86400)
    with pytest.raises(BadBatch, match="a duration like 24h, 90m or 30s"):
        parse_window("tomorrow", 86400)
    ok = json.loads(output_line("batch_1", "r1", "spam", [{"label": "ham", "score": 1.0}]))
    assert ok["response"]["status_code"] == 200 and ok["error"] is None
    assert ok["response"]["body"]["result"] == [{"label": "ham", "score": 1.0}] and ok["custom_id"] == "r1"
    bad = json.loads(error_line("batch_1", "r2", "InputError", "empty text"))
    assert bad["response"]["status_code"] == 422 and bad["error"] == {"code": "InputError", "message": "empty text"}
    assert [status_of(name) for name in ("UnknownModel", "JobExpired", "JobCancelled", "ModelForbidden", "Nope")] == [
        404, 504, 409, 403, 500]


# -- a real gateway and worker, the openai client ----------------------------------------------------------------


class Deployment:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.gateways: list[GatewayProcess] = []
        self.workers: list[WorkerProcess] = []

    def gateway(self) -> GatewayProcess:
        gateway = GatewayProcess(self.env, self.logs / f"gateway-{len(self.gateways)}.log")
        self.gateways.append(gateway)
        gateway.wait_ready()
        return gateway

    def worker(self) -> WorkerProcess:
        worker = WorkerProcess(["--hostname", f"batch{len(self.workers)}@%h", "--no-warm-start"], self.env,
                               self.logs / f"worker-{len(self.workers)}.log")
        self.workers.append(worker)
        worker.wait_ready()
        return worker

    def client(self, gateway: GatewayProcess, key: str = FULL) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=30)

    def stop(self) -> None:
        for process in [*self.gateways, *self.workers]:
            process.stop()


@pytest.fixture(scope="module")
def deployment(
    redis_url: str, served_models_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("batches")
    extra = {"SWAPLESS_API_KEYS": f"{FULL},{LIMITED}:spam", "SWAPLESS_BATCH_FILES_URL": str(root / "files"),
             "SWAPLESS_BATCH_LEASE_S": "3", "SWAPLESS_WEBHOOK_SECRET": SECRET,
             "SWAPLESS_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1"}
    with private_env(redis_url, served_models_file, **extra) as env:
        deployment = Deployment(env, root)
        try:
            deployment.worker()
            deployment.gateway()
            yield deployment
        finally:
            deployment.stop()


def _upload(client: Any, tmp_path: Path, lines: list[str]) -> Any:
    path = tmp_path / "input.jsonl"
    path.write_text("".join(lines))
    with path.open("rb") as file:
        return client.files.create(file=file, purpose="batch")


def _wait_final(client: Any, batch_id: str, timeout_s: float = 60) -> Any:
    return wait_for(lambda: (b := client.batches.retrieve(batch_id)).status in
                    ("completed", "failed", "expired", "cancelled") and b, timeout_s, 0.2, what=f"batch {batch_id}")


def _lines(client: Any, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


@pytest.mark.slow
def test_a_batch_runs_to_completed_with_the_openai_client(deployment: Deployment, tmp_path: Path) -> None:
    client = deployment.client(deployment.gateways[-1])
    lines = [request_line(f"r{i}", "sentiment" if i % 2 else "spam", f"review number {i}") for i in range(300)]
    lines[7] = request_line("r7", "sentiment", "   ")  # a blank text: 422 for that line alone
    lines[8] = request_line("r8", "nope", "hello")  # an unknown model: 404
    lines[9] = json.dumps({"custom_id": "r9", "method": "POST", "url": "/predict", "body": {"model_id": "spam"}}) + "\n"
    lines[10] = request_line("r10", "spam", "hi", colour="red")  # bodies /predict refuses: 400 for each alone
    uploaded = _upload(client, tmp_path, lines)
    assert uploaded.purpose == "batch" and uploaded.bytes == len("".join(lines).encode())
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/predict", completion_window="24h",
                                  metadata={"run": "nightly"})
    assert batch.status == "validating" and batch.metadata == {"run": "nightly"}
    done = _wait_final(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (300, 296, 4)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output, errors = _lines(client, done.output_file_id), _lines(client, done.error_file_id)
    assert len(output) == 296 and {line["response"]["status_code"] for line in output} == {200}
    assert all(line["response"]["body"]["result"][0]["label"] for line in output)
    assert {line["custom_id"]: line["response"]["status_code"] for line in errors} == {
        "r7": 422, "r8": 404, "r9": 400, "r10": 400}
    by_id = {line["custom_id"]: line["error"]["message"] for line in errors}
    assert by_id["r9"] == "body.input: Field required" and by_id["r10"].startswith("body.colour: Extra inputs")
    assert sorted(line["custom_id"] for line in output + errors) == sorted(f"r{i}" for i in range(300))
    assert batch.id in [b.id for b in client.batches.list(limit=5)]
    assert {uploaded.id, done.output_file_id} <= {f.id for f in client.files.list()}
    assert client.files.content(uploaded.id).text == "".join(lines)
    assert client.files.delete(uploaded.id).deleted
    from openai import ConflictError, NotFoundError

    with pytest.raises(ConflictError):  # a finished batch cannot be cancelled
        client.batches.cancel(batch.id)
    with pytest.raises(NotFoundError):
        client.files.retrieve(uploaded.id)
    with pytest.raises(NotFoundError):  # another key sees none of it
        deployment.client(deployment.gateways[-1], LIMITED).batches.retrieve(batch.id)


@pytest.mark.slow
def test_a_malformed_file_is_refused_with_its_line_number(deployment: Deployment, tmp_path: Path) -> None:
    from openai import BadRequestError

    client = deployment.client(deployment.gateways[-1])
    lines = [request_line("a", "spam", "x"), request_line("b", "spam", "y"), '{"custom_id": "c", "method": "POST"}\n']
    with pytest.raises(BadRequestError) as refused:
        _upload(client, tmp_path, lines)
    message = ("line 3: url must be '/predict' (the batch's endpoint), not None; nothing was kept: fix it and "
               "upload the file again")
    assert refused.value.body == {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    assert str(refused.value) == f"Error code: 400 - {message}"  # what the openai client shows
    assert not any(f.purpose == "batch" and f.bytes == len("".join(lines)) for f in client.files.list())
    good = _upload(client, tmp_path, lines[:2])
    with pytest.raises(BadRequestError, match="String should have at most 512 characters") as refused:
        client.batches.create(input_file_id=good.id, endpoint="/predict", completion_window="1h",
                              metadata={"note": "x" * 513})  # OpenAI's limits: 16 pairs, 64 / 512 characters
    assert refused.value.param == "metadata.note"
    with pytest.raises(BadRequestError, match="its port must be a number from 1 to 65535"):
        client.batches.create(input_file_id=good.id, endpoint="/predict", completion_window="1h",
                              extra_body={"callback_url": "http://93.184.216.34:99999/done"})


@pytest.mark.slow
def test_a_key_limited_to_one_model_gets_403_lines_for_the_others(deployment: Deployment, tmp_path: Path) -> None:
    client = deployment.client(deployment.gateways[-1], LIMITED)
    lines = [request_line(f"s{i}", "spam", f"buy now {i}") for i in range(5)] + [request_line("t", "topic", "x")]
    batch = client.batches.create(input_file_id=_upload(client, tmp_path, lines).id, endpoint="/predict",
                                  completion_window="1h")
    done = _wait_final(client, batch.id)
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", 5, 1)
    [refused] = _lines(client, done.error_file_id)
    assert refused["custom_id"] == "t" and refused["response"]["status_code"] == 403
    assert "may call only the models spam, not 'topic'" in refused["error"]["message"]


@pytest.mark.slow
def test_cancel_mid_run_keeps_what_is_done(deployment: Deployment, tmp_path: Path) -> None:
    client = deployment.client(deployment.gateways[-1])
    total = 20_000
    lines = [request_line(f"c{i}", "sentiment", f"a long enough review, number {i}") for i in range(total)]
    batch = client.batches.create(input_file_id=_upload(client, tmp_path, lines).id, endpoint="/predict",
                                  completion_window="24h")
    wait_for(lambda: client.batches.retrieve(batch.id).request_counts.completed > 0, 60, 0.1, what="first results")
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = _wait_final(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
    counts = done.request_counts
    assert counts.total == total and 0 < counts.completed < total and counts.failed == 0
    output = _lines(client, done.output_file_id)
    assert len(output) == counts.completed and len({line["custom_id"] for line in output}) == counts.completed
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: the same answer


@pytest.mark.slow
def test_a_batch_survives_a_gateway_kill_and_a_worker_kill(deployment: Deployment, tmp_path: Path) -> None:
    gateway = deployment.gateways[-1]
    client = deployment.client(gateway)
    total = 4_000
    lines = [request_line(f"k{i}", "spam", f"message {i} of the night") for i in range(total)]
    batch = client.batches.create(input_file_id=_upload(client, tmp_path, lines).id, endpoint="/predict",
                                  completion_window="24h")
    first = wait_for(lambda: client.batches.retrieve(batch.id).request_counts.completed or None, 60, 0.05,
                     what="first results")
    gateway.stop(signal.SIGKILL)  # its lease lapses; the next gateway's runner takes the batch over
    gateway = deployment.gateway()
    client = deployment.client(gateway)
    later = wait_for(lambda: (c := client.batches.retrieve(batch.id).request_counts.completed) > first and c, 60, 0.05,
                     what="progress after the gateway's restart")
    assert later < total, "the batch ended before the worker could be killed: make it longer"
    deployment.workers[-1].stop(signal.SIGKILL)
    deployment.worker()
    done = _wait_final(client, batch.id, 120)
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", total, 0)
    ids = [line["custom_id"] for line in _lines(client, done.output_file_id)]
    assert len(ids) == total and set(ids) == {f"k{i}" for i in range(total)}  # no duplicate, none missing
    assert time.time() - done.created_at < 300


@pytest.mark.slow
def test_a_batch_past_its_window_expires_and_its_end_is_posted_signed(deployment: Deployment, tmp_path: Path) -> None:
    from openai import BadRequestError

    client = deployment.client(deployment.gateways[-1])
    receiver = Receiver().start()
    try:
        small = [request_line(f"w{i}", "spam", f"hooked {i}") for i in range(20)]
        done_batch = client.batches.create(input_file_id=_upload(client, tmp_path, small).id, endpoint="/predict",
                                           completion_window="1h", extra_body={"callback_url": receiver.url},
                                           metadata={"run": "hooked"})
        total = 20_000
        lines = [request_line(f"e{i}", "sentiment", f"a long enough review, number {i}") for i in range(total)]
        expiring = client.batches.create(input_file_id=_upload(client, tmp_path, lines).id, endpoint="/predict",
                                         completion_window="3s", extra_body={"callback_url": receiver.url})
        done, expired = _wait_final(client, done_batch.id), _wait_final(client, expiring.id)
        events = {payload["data"]["id"]: (headers, payload) for headers, payload in receiver.wait_for(2, 30)}
        with pytest.raises(BadRequestError) as refused:  # OpenAI answers an invalid request 400
            client.batches.create(input_file_id=_upload(client, tmp_path, small).id, endpoint="/predict",
                                  completion_window="1h", extra_body={"callback_url": "http://10.0.0.1/hook"})
    finally:
        receiver.stop()
    assert done.status == "completed" and expired.status == "expired", (done, expired)
    counts = expired.request_counts
    assert counts.total == total and counts.completed + counts.failed == total and counts.failed > 0
    errors = _lines(client, expired.error_file_id)
    assert len(errors) == counts.failed and {line["error"]["code"] for line in errors} == {"JobExpired"}
    assert len(_lines(client, expired.output_file_id)) == counts.completed
    assert receiver.rejected == 0  # every event verified with the same library
    headers, event = events[done.id]
    assert event["object"] == "event" and event["type"] == "batch.completed" and headers["webhook-id"] == event["id"]
    assert event["data"]["request_counts"] == {"total": 20, "completed": 20, "failed": 0}
    assert event["data"]["output_file_id"] == done.output_file_id and event["data"]["metadata"] == {"run": "hooked"}
    assert events[expired.id][1]["type"] == "batch.expired"
    assert "SWAPLESS_WEBHOOK_ALLOWED_HOSTS" in str(refused.value)


def test_a_batch_record_is_kept_for_its_window_and_the_retention_then_goes(redis_url: str, key_prefix: str) -> None:
    """A batch's record expires: created, it lives its completion window plus SWAPLESS_BATCH_RETENTION_S; ended,
    the retention from then; the listing forgets ids older than both."""
    import redis

    from swapless.tasks.gateway.batches.state import BatchStatus, BatchStore
    from swapless.tasks.keyspace import Keyspace

    r = redis.Redis.from_url(redis_url)
    keys = Keyspace(key_prefix + "jobs", key_prefix)
    store = BatchStore(r, keys, retention_s=1000, max_window_s=3600)
    r.zadd(keys.batches, {"batch_ancient": time.time() - 1000 - 3600 - 5, "batch_recent": time.time() - 10})
    store.create("batch_a", {"owner": "k", "expires_at": int(time.time()) + 3600, "metadata": {"run": "1"}})
    assert 4590 <= r.ttl(keys.batch("batch_a")) <= 4600
    assert [m.decode() for m in r.zrange(keys.batches, 0, -1)] == ["batch_recent", "batch_a"]
    assert store.set_status("batch_a", BatchStatus.COMPLETED) is BatchStatus.COMPLETED
    assert 990 <= r.ttl(keys.batch("batch_a")) <= 1000
    r.close()


def test_runner_slots_go_round_robin_between_keys_and_one_stays_for_another_key(
    redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """Key A's four long batches and key B's one, created after them, on a runner of 4 slots: B's starts at once
    (A takes 3, never the last slot while several keys exist); the order alternates keys, each key's oldest first."""
    import threading

    import redis
    from pydantic import SecretStr

    from bench.simulated import simulated_entry
    from swapless.config.settings import Settings
    from swapless.manager.registry.store import ModelStore
    from swapless.tasks.gateway.batches.runner import BatchRunner, fair_order
    from swapless.tasks.gateway.batches.state import BatchStore
    from swapless.tasks.keyspace import Keyspace
    from tests.tinymodels import write_models_file

    models_file = write_models_file(tmp_path, [simulated_entry("spam", 0.0, 0.0, 0.0)])
    waiting = [("a1", "A", 1.0), ("a2", "A", 2.0), ("a3", "A", 3.0), ("b1", "B", 4.0), ("b2", "B", 5.0)]
    assert fair_order(waiting, {}) == [("a1", "A"), ("b1", "B"), ("a2", "A"), ("b2", "B"), ("a3", "A")]
    assert fair_order(waiting, {"A": 2})[:3] == [("b1", "B"), ("b2", "B"), ("a1", "A")]

    settings = Settings(redis_url=redis_url, key_prefix=key_prefix, queue=key_prefix + "jobs", batch_max_active=4,
                        api_keys=SecretStr("first-key-" + "f" * 22 + ",second-key-" + "s" * 21),
                        models_file=models_file)
    r = redis.Redis.from_url(redis_url)
    store = BatchStore(r, Keyspace(key_prefix + "jobs", key_prefix))
    now = int(time.time())
    for i in range(4):
        store.create(f"batch_a{i}", {"owner": "key:A", "expires_at": now + 3600})
    runner = BatchRunner(settings, ModelStore.from_file(models_file))
    runner.store = store
    gate = threading.Event()
    runner._drive = lambda batch_id: gate.wait(30)  # type: ignore[method-assign]  # each batch holds its slot
    try:
        runner.tick()
        assert len(runner.driving()) == 3  # A alone: the last slot stays free
        store.create("batch_b0", {"owner": "key:B", "expires_at": now + 3600})  # B comes while A's batches run
        runner.tick()
        driving = runner.driving()
        assert "batch_b0" in driving and len(driving) == 4
    finally:
        gate.set()
        r.close()
