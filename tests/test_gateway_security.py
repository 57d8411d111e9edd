"""The gateway against hostile callers, over real HTTP: a real `swapless serve` with API keys and small limits, a
real worker with the tiny models, the real Redis. Raw sockets send what no well-behaved client would (a smuggled
body, a body that never ends, malformed headers).

One worker and one gateway serve the module; every test uses API keys of its own (each key has its own budget).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import signal
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from swapless.tasks.keyspace import Keyspace
from tests.stack import GatewayProcess, Stack, private_env, wait_for, worker_and_gateway
from tests.tinymodels import encode_image, write_models_file

pytestmark = [pytest.mark.slow, pytest.mark.images]

MAX_BODY_BYTES = 256 * 1024
RATE = 20  # jobs/s per key: bursts of 40
INFLIGHT = 8
MAX_WAITS = 3
ADMIN = "admin-key-" + "a" * 22
#: keys limited to the text models and the by-type route, one per test (and a second where a test needs two)
KEYS = {name: f"{name}-key-" + name[0] * 20 for name in (
    "smuggle", "owner", "intruder", "rate", "rate2", "shared", "inflight", "waits", "route", "limits", "v2",
    "malformed", "turns", "turns2", "turnwait",
)}
ACTIVE = 2  # requests of one key at work at once
TURN_WAIT_S = 0.5


#: a gateway of its own with no API key (the module's keys are in the environment)
NO_KEYS = {"SWAPLESS_API_KEYS": "", "SWAPLESS_API_KEYS_FILE": ""}


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS.get(name, name)}"}


@pytest.fixture(scope="module")
def secure_models(models_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    entries = json.loads(models_file.read_text())["models"]
    for entry in entries:
        entry["path"] = str(models_file.parent / entry["path"])
    entries.append({"id": "classify", "by_type": {"text": "sentiment", "image": "vision"}})
    return write_models_file(tmp_path_factory.mktemp("secure-models"), entries)


@pytest.fixture(scope="module")
def input_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The worker's SWAPLESS_INPUT_ROOT, holding an image a remote caller must never have read."""
    root = tmp_path_factory.mktemp("input-root")
    (root / "secret.png").write_bytes(base64.b64decode(encode_image(5)))
    return root


@pytest.fixture(scope="module")
def stack(redis_url: str, secure_models: Path, input_root: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("security-logs")
    keys_file = logs / "keys.txt"
    keys_file.write_text("".join(f"{key}:sentiment|spam|topic|classify|vision\n" for key in KEYS.values()))
    extra = {
        "SWAPLESS_API_KEYS": ADMIN, "SWAPLESS_API_KEYS_FILE": str(keys_file),
        "SWAPLESS_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY_BYTES), "SWAPLESS_GATEWAY_BODY_TIMEOUT_S": "1",
        "SWAPLESS_GATEWAY_RATE_PER_KEY": str(RATE), "SWAPLESS_GATEWAY_INFLIGHT_PER_KEY": str(INFLIGHT),
        "SWAPLESS_GATEWAY_MAX_WAITS": str(MAX_WAITS), "SWAPLESS_GATEWAY_MAX_ELEMENTS": "64",
        "SWAPLESS_GATEWAY_ACTIVE_PER_KEY": str(ACTIVE), "SWAPLESS_GATEWAY_TURN_WAIT_S": str(TURN_WAIT_S),
        "SWAPLESS_MAX_TEXT_CHARS": "2000", "SWAPLESS_MAX_IMAGE_PIXELS": "5000",
        "SWAPLESS_INPUT_ROOT": str(input_root),
    }
    with worker_and_gateway(redis_url, secure_models, logs, "sec@%h", "--log-level", "info", **extra) as (
        env, worker, gateway
    ), httpx.Client(base_url=gateway.url, timeout=30) as http:
        yield Stack(env, worker, gateway, http)


def frozen(stack: Stack) -> Any:
    """A context in which the worker is stopped (SIGSTOP): jobs wait, nothing finishes."""
    class _Frozen:
        def __enter__(self) -> None:
            os.kill(stack.worker.proc.pid, signal.SIGSTOP)

        def __exit__(self, *exc: object) -> None:
            os.kill(stack.worker.proc.pid, signal.SIGCONT)

    return _Frozen()


def raw(
    port: int, head: bytes, body: bytes = b"", *, then: bytes = b"", read_s: float = 5.0
) -> tuple[int, dict[str, str], bytes, bool]:
    """Send ``head`` and ``body`` on a fresh socket, then try ``then``; return the status, headers, body and whether
    the server closed the connection after answering."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_s) as sock:
        sock.sendall(head + body)
        try:
            if then:
                sock.sendall(then)
        except OSError:
            pass  # the server has closed: what we wanted to see
        data = b""
        closed = False
        deadline = time.monotonic() + read_s
        while time.monotonic() < deadline:
            try:
                piece = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                closed = True
                break
            if not piece:
                closed = True
                break
            data += piece
            if b"\r\n\r\n" in data:
                top, _, rest = data.partition(b"\r\n\r\n")
                lengths = [
                    line.split(b":", 1)[1] for line in top.split(b"\r\n") if line.lower().startswith(b"content-length:")
                ]
                if lengths and len(rest) >= int(lengths[0]):
                    sock.settimeout(2.0)
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, rest, closed


def request_head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def sent_to(stack: Stack, model_id: str) -> int:
    """Messages ever pushed to the model's lists that the worker has not taken: they hold none in between."""
    keys = Keyspace(stack.env["SWAPLESS_QUEUE"], stack.env["SWAPLESS_KEY_PREFIX"]).model(model_id)
    client = redis.Redis.from_url(stack.env["SWAPLESS_REDIS_URL"])
    return sum(client.llen(key) for key in keys.lists)


# -- 1. bodies bounded by what arrives ------------------------------------------------------------------------------


def test_a_smuggled_body_is_refused_before_it_is_read(stack: Stack) -> None:
    head = request_head("POST", "/jobs", {**bearer("smuggle"), "Content-Length": "20", "Transfer-Encoding": "chunked",
                                         "Content-Type": "application/json"})
    status, headers, body, closed = raw(stack.gateway.port, head, b"4000\r\n" + b"a" * 0x4000 + b"\r\n",
                                        then=b"4000\r\n" + b"a" * 0x4000 + b"\r\n")
    assert status == 400 and closed and headers["connection"] == "close"
    assert json.loads(body) == {"detail": "the request has both Content-Length and Transfer-Encoding: send one of them"}


def test_a_chunked_body_is_counted_as_it_arrives(stack: Stack) -> None:
    chunk = b"a" * 65536
    head = request_head("POST", "/jobs", {**bearer("smuggle"), "Transfer-Encoding": "chunked",
                                         "Content-Type": "application/json"})
    pieces = b"".join(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(6))  # 384 KiB, over 256
    status, _, body, closed = raw(stack.gateway.port, head, pieces, then=pieces)
    assert status == 413 and closed
    assert json.loads(body)["detail"] == (f"request body is over the limit of {MAX_BODY_BYTES} bytes "
                                          "(SWAPLESS_GATEWAY_MAX_BODY_BYTES)")


def test_no_key_is_401_before_any_of_the_body_is_read(stack: Stack) -> None:
    head = request_head(
        "POST", "/jobs", {"Content-Length": str(MAX_BODY_BYTES - 10), "Content-Type": "application/json"}
    )
    started = time.monotonic()
    status, headers, body, closed = raw(stack.gateway.port, head, b'{"model_id": "sentiment", "input": "')
    assert status == 401 and closed and time.monotonic() - started < 2.0  # answered with 256 KiB still to come
    assert headers["www-authenticate"] == 'Bearer realm="swapless"'
    wrong = request_head("POST", "/v2/models/sentiment/infer", {"Authorization": "Bearer not-a-key-of-this-gateway",
                                                              "Content-Length": str(MAX_BODY_BYTES - 10)})
    status, _, body, closed = raw(stack.gateway.port, wrong, b"{")
    assert status == 401 and closed and json.loads(body)["error"].startswith("this API key is not one")


def test_a_body_that_takes_too_long_is_408(stack: Stack) -> None:
    head = request_head(
        "POST", "/jobs", {**bearer("smuggle"), "Content-Length": "100", "Content-Type": "application/json"}
    )
    started = time.monotonic()
    status, _, body, closed = raw(stack.gateway.port, head, b'{"model_id": ', read_s=10)
    assert status == 408 and closed and 0.9 < time.monotonic() - started < 8
    assert json.loads(body) == {"detail": "the request body did not arrive within 1 s "
                                          "(SWAPLESS_GATEWAY_BODY_TIMEOUT_S): send it at once"}


def test_a_job_body_larger_than_any_input_the_models_take_is_refused_before_it_is_read(
    redis_url: str, secure_models: Path, tmp_path: Path
) -> None:
    # text models only, of at most 1000 characters: no one-job body needs more than 12 x 1000 + 64 KiB bytes
    entries = [e for e in json.loads(secure_models.read_text())["models"] if e.get("type") == "text"]
    (tmp_path / "text-only").mkdir()
    text_only = write_models_file(tmp_path / "text-only", entries)
    with private_env(redis_url, text_only, SWAPLESS_MAX_TEXT_CHARS="1000", **NO_KEYS) as env:
        gateway = GatewayProcess(env, tmp_path / "text-only.log")
        try:
            gateway.wait_ready()
            limit = 12 * 1000 + 64 * 1024
            head = request_head("POST", "/jobs", {"Content-Length": str(limit + 1), "Content-Type": "application/json"})
            started = time.monotonic()
            status, _, body, closed = raw(gateway.port, head, b'{"model_id": "spam", "input": "')
            assert status == 413 and closed and time.monotonic() - started < 2.0  # answered before the body came
            assert json.loads(body)["detail"] == (
                f"request body of {limit + 1} bytes is over the {limit} bytes that one job's input can take here "
                "(SWAPLESS_MAX_TEXT_CHARS): send a smaller input")
            chunked = request_head("POST", "/predict", {"Transfer-Encoding": "chunked",
                                                        "Content-Type": "application/json"})
            piece = b"a" * 32768
            pieces = b"".join(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" for _ in range(4))  # 128 KiB: over
            status, _, body, closed = raw(gateway.port, chunked, pieces, then=pieces)
            assert status == 413 and closed and "that one job's input can take here" in json.loads(body)["detail"]
            with httpx.Client(base_url=gateway.url, timeout=30) as http:  # a body within it is taken
                answer = http.post("/jobs", json={"model_id": "spam", "input": "\U0001F600" * 1000})
                assert answer.status_code == 202, answer.text
                v2 = http.post("/v2/models/spam/infer", content=b"{" + b" " * (limit + 10) + b"}")
                assert v2.status_code == 400  # /v2 bodies carry many inputs: the gateway's own bound holds there
        finally:
            gateway.stop()


# -- 2. fan-out and size bounded before parsing -------------------------------------------------------------------


def test_a_compressed_request_declaring_millions_of_elements_queues_nothing(stack: Stack) -> None:
    inputs = [
        {"name": "TEXT", "datatype": "BYTES", "shape": [2_000_000], "parameters": {"binary_data_size": 8_000_000}}
    ]
    header = json.dumps({"inputs": inputs}).encode()
    bomb = gzip.compress(header + struct.pack("<I", 0) * 2_000_000)  # 8 MB inflated: the header is read first
    assert len(bomb) < 20_000
    started = time.monotonic()
    with frozen(stack):  # anything queued would stay in the lists
        answer = stack.http.post("/v2/models/sentiment/infer", content=bomb, headers={
            **bearer("v2"), "Content-Encoding": "gzip", "Inference-Header-Content-Length": str(len(header))})
        assert sent_to(stack, "sentiment") == 0
    assert answer.status_code == 413 and time.monotonic() - started < 5
    assert answer.json() == {"error": "the request's shapes declare 2000000 elements, over the limit of 64 per request "
                                      "(SWAPLESS_GATEWAY_MAX_ELEMENTS): send them in several requests"}


def test_inputs_over_the_workers_limits_are_refused_at_the_gateway_for_models_and_routes(stack: Stack) -> None:
    http = stack.http
    long_text = "word " * 401  # 2005 characters, over SWAPLESS_MAX_TEXT_CHARS=2000
    for model in ("sentiment", "classify"):
        refused = http.post("/jobs", json={"model_id": model, "input": long_text}, headers=bearer("limits"))
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["msg"] == ("bad input for model 'sentiment': text of 2005 characters is "
                                                      "over the limit of 2000 (SWAPLESS_MAX_TEXT_CHARS)")
    big_picture = encode_image(1, size=(100, 100))  # 10,000 pixels, over SWAPLESS_MAX_IMAGE_PIXELS=5000
    for model in ("vision", "classify"):
        refused = http.post("/jobs", json={"model_id": model, "input": big_picture}, headers=bearer("limits"))
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["msg"] == ("bad input for model 'vision': image of 100x100 pixels is over "
                                                      "the limit of 5000 pixels (SWAPLESS_MAX_IMAGE_PIXELS)")
    assert (
        http.post(
            "/jobs", json={"model_id": "classify", "input": encode_image(2)}, headers=bearer("limits")
        ).status_code
        == 202
    )


def test_a_route_never_has_a_worker_open_a_file_a_remote_caller_names(stack: Stack) -> None:
    """The worker reads image paths under its SWAPLESS_INPUT_ROOT, which holds secret.png: from the network, a path
    is text, so the by-type route sends it to the text branch."""
    answer = stack.http.post("/predict", json={"model_id": "classify", "input": "secret.png"}, headers=bearer("route"))
    assert answer.status_code == 200 and answer.json()["model"] == "sentiment"
    direct = stack.http.post("/predict", json={"model_id": "vision", "input": "secret.png"}, headers=bearer("route"))
    assert direct.status_code == 422 and "the gateway reads no file paths" in direct.json()["detail"][0]["msg"]


# -- 3. jobs belong to their key ------------------------------------------------------------------------------------


def test_a_job_is_read_and_cancelled_by_its_key_alone(stack: Stack) -> None:
    http = stack.http
    job_id = http.post("/jobs", json={"model_id": "spam", "input": "mine"}, headers=bearer("owner")).json()["job_id"]
    done = wait_for(
        lambda: (r := http.get(f"/jobs/{job_id}", headers=bearer("owner"))).json()["state"] == "SUCCESS" and r,
        30,
        what="the owner's job",
    )
    assert done.json()["model"] == "spam"
    stranger = http.get(f"/jobs/{job_id}", headers=bearer("intruder"))
    never = http.get(f"/jobs/{uuid.uuid4()}", headers=bearer("intruder"))
    assert stranger.status_code == never.status_code == 404  # no oracle: the same answer as an id never submitted
    assert stranger.json()["detail"] == (
        f"no job {job_id} for this caller: use the job_id that POST /jobs returned to this key (records are kept "
        "until its result expires)"
    )
    assert http.delete(f"/jobs/{job_id}", headers=bearer("intruder")).status_code == 404
    assert http.get(f"/jobs/{job_id}", headers=bearer(ADMIN)).json()["state"] == "SUCCESS"  # an operator reads all


def test_cancelling_an_id_never_submitted_writes_nothing(stack: Stack) -> None:
    store = redis.Redis.from_url(stack.env["SWAPLESS_REDIS_URL"])
    prefix = stack.env["SWAPLESS_KEY_PREFIX"]
    ids = [str(uuid.uuid4()) for _ in range(20)]
    for job_id in ids:
        assert stack.http.delete(f"/jobs/{job_id}", headers=bearer("intruder")).status_code == 404
    written = [f"{prefix}{kind}-{job_id}" for job_id in ids for kind in ("celery-task-meta", "swapless-owner")]
    assert store.exists(*written) == 0


def test_an_expired_result_is_410_not_pending_forever(stack: Stack) -> None:
    http = stack.http
    job_id = http.post(
        "/jobs", json={"model_id": "topic", "input": "soon gone"}, headers=bearer("owner")
    ).json()["job_id"]
    wait_for(lambda: http.get(f"/jobs/{job_id}", headers=bearer("owner")).json()["state"] == "SUCCESS", 30, what="job")
    store = redis.Redis.from_url(stack.env["SWAPLESS_REDIS_URL"])
    prefix = stack.env["SWAPLESS_KEY_PREFIX"]
    assert store.delete(f"{prefix}celery-task-meta-{job_id}") == 1  # what its expiry does
    gone = http.get(f"/jobs/{job_id}", headers=bearer("owner"))
    assert gone.status_code == 410
    assert gone.json()["detail"] == (f"job {job_id} finished, but its result has expired (results are kept 3600 s, "
                                     "SWAPLESS_RESULT_EXPIRES_S): send the job again")
    assert 3600 < store.ttl(f"{prefix}swapless-owner-{job_id}") <= 7200  # the record outlives the result by one expiry


def test_a_cancel_holds_as_long_as_the_job_may_still_run(stack: Stack) -> None:
    http = stack.http
    store = redis.Redis.from_url(stack.env["SWAPLESS_REDIS_URL"])
    prefix = stack.env["SWAPLESS_KEY_PREFIX"]
    with frozen(stack):
        later = http.post("/jobs", json={"model_id": "spam", "input": "in three days", "expires_s": 3 * 86400},
                          headers=bearer("owner")).json()["job_id"]
        plain = http.post("/jobs", json={"model_id": "spam", "input": "no deadline"},
                          headers=bearer("owner")).json()["job_id"]
        for job_id in (later, plain):
            assert http.delete(f"/jobs/{job_id}", headers=bearer("owner")).json()["status"] == "cancelled"
    assert 3 * 86400 < store.ttl(f"{prefix}celery-task-meta-{later}") <= 3 * 86400 + 3700
    assert store.ttl(f"{prefix}celery-task-meta-{plain}") > 7 * 86400  # SWAPLESS_CANCEL_HOLD_S, not one result TTL
    for job_id in (later, plain):
        assert http.get(f"/jobs/{job_id}", headers=bearer("owner")).json()["error"]["type"] == "JobCancelled"


# -- 4. per-key limits ----------------------------------------------------------------------------------------------


def test_a_key_over_its_rate_gets_429_while_other_keys_are_served(stack: Stack) -> None:
    http = stack.http

    def send(name: str, i: int) -> httpx.Response:
        return http.post("/jobs", json={"model_id": "spam", "input": f"flood {i}"}, headers=bearer(name))

    started = time.monotonic()
    answers = [send("rate", i) for i in range(150)]
    elapsed = time.monotonic() - started
    codes = [a.status_code for a in answers]
    # a burst of 2 x RATE, then RATE per second (the window is a sliding estimate: a little slack)
    assert set(codes) == {202, 429} and codes.count(202) <= 2 * RATE + RATE * elapsed + RATE / 2, (
        codes.count(202),
        elapsed,
    )
    refused = next(a for a in answers if a.status_code == 429 and "RATE" in a.json()["detail"])
    assert 1 <= int(refused.headers["retry-after"]) <= 2
    assert refused.json()["detail"].startswith(f"this caller has sent more than {RATE} jobs/s (bursts of {2 * RATE}) "
                                               "(SWAPLESS_GATEWAY_RATE_PER_KEY): try again in ")
    assert send("rate2", 0).status_code == 202  # another key's budget is its own
    accepted = [a.json()["job_id"] for a in answers if a.status_code == 202]
    def all_done() -> bool:
        return all(
            http.get(f"/jobs/{job_id}", headers=bearer("rate")).json()["state"] == "SUCCESS" for job_id in accepted
        )

    wait_for(all_done, 60, interval_s=0.5, what="every accepted job's result")  # nothing accepted is lost


def test_the_rate_is_one_budget_across_gateway_processes(stack: Stack, tmp_path: Path) -> None:
    sent = 240
    # two gateways of their own whose in-flight cap does not bind: only the rate refuses
    env = {**stack.env, "SWAPLESS_GATEWAY_INFLIGHT_PER_KEY": "100000"}
    gateways = [GatewayProcess(env, tmp_path / f"gateway-{n}.log") for n in range(2)]
    try:
        for gateway in gateways:
            gateway.wait_ready()
        clients = [httpx.Client(base_url=g.url, timeout=30, headers=bearer("shared")) for g in gateways]

        def send(i: int) -> int:
            return clients[i % 2].post("/jobs", json={"model_id": "spam", "input": f"shared {i}"}).status_code

        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:  # fast enough that two budgets would take far more than one
            codes = list(pool.map(send, range(sent)))
        elapsed = time.monotonic() - started
        for client in clients:
            client.close()
    finally:
        for gateway in gateways:
            gateway.stop()
    # one budget: a burst of 2 x RATE and RATE per second after it, not twice that (each process its own)
    one_budget = 2 * RATE + RATE * elapsed + RATE / 2
    assert one_budget < min(sent, 2 * (2 * RATE + RATE * elapsed)), f"too slow to tell ({elapsed:.1f} s)"
    assert codes.count(202) <= one_budget and 429 in codes, (codes.count(202), elapsed)


def test_a_key_at_its_in_flight_limit_gets_429_until_its_jobs_finish(stack: Stack) -> None:
    http = stack.http

    def send(i: int) -> httpx.Response:
        return http.post("/jobs", json={"model_id": "sentiment", "input": f"pending {i}"}, headers=bearer("inflight"))

    with frozen(stack):
        answers = [send(i) for i in range(INFLIGHT + 2)]
        assert [a.status_code for a in answers] == [202] * INFLIGHT + [429, 429]
        assert answers[-1].json()["detail"] == (f"this caller has {INFLIGHT} jobs submitted and not yet finished, and "
                                                f"1 more would pass the limit of {INFLIGHT} "
                                                "(SWAPLESS_GATEWAY_INFLIGHT_PER_KEY): try again in 1 s")
        assert answers[-1].headers["retry-after"] == "1"
    wait_for(lambda: send(99).status_code == 202, 30, what="the key's jobs to finish and free its budget")


def test_waits_past_the_gateway_cap_are_503(stack: Stack) -> None:
    def predict(i: int) -> httpx.Response:
        with httpx.Client(base_url=stack.gateway.url, timeout=30) as client:
            return client.post("/predict", params={"timeout_s": 3}, json={"model_id": "topic", "input": f"wait {i}"},
                               headers=bearer("waits"))

    with frozen(stack), ThreadPoolExecutor(MAX_WAITS + 2) as pool:
        answers = list(pool.map(predict, range(MAX_WAITS + 2)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [503] * 2 + [504] * MAX_WAITS, codes
    busy = next(a for a in answers if a.status_code == 503)
    assert busy.headers["retry-after"] == "1"
    assert busy.json()["detail"].startswith(f"the gateway is holding {MAX_WAITS} requests waiting for results "
                                            "(SWAPLESS_GATEWAY_MAX_WAITS)")


def test_a_key_s_requests_take_turns_and_other_keys_are_served_meanwhile(stack: Stack) -> None:
    # two requests of one key hold its two turns: their bodies arrive slowly (a turn is held while its body is read)
    head = request_head(
        "POST", "/jobs", {**bearer("turns"), "Content-Length": "100", "Content-Type": "application/json"}
    )
    slow = [socket.create_connection(("127.0.0.1", stack.gateway.port), timeout=5) for _ in range(ACTIVE)]
    try:
        for sock in slow:
            sock.sendall(head + b'{"model_id": ')
        time.sleep(0.2)
        with ThreadPoolExecutor(2) as pool:
            third = pool.submit(stack.http.post, "/jobs", json={"model_id": "sentiment", "input": "third"},
                                headers=bearer("turns"))
            time.sleep(0.1)
            started = time.monotonic()
            other = stack.http.post(
                "/jobs", json={"model_id": "sentiment", "input": "other key"}, headers=bearer("turns2")
            )
            other_s = time.monotonic() - started
            refused = third.result(10)
        assert other.status_code == 202 and other_s < TURN_WAIT_S  # not behind the busy key's queue
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["detail"] == (
            f"this caller has more requests at work than its {ACTIVE} at once, and this one waited {TURN_WAIT_S:g} s "
            "for a turn: send fewer requests at a time (SWAPLESS_GATEWAY_ACTIVE_PER_KEY): try again in 1 s")
    finally:
        for sock in slow:
            sock.close()
    # the turns come back once those requests end: the key is served again
    wait_for(lambda: stack.http.post("/jobs", json={"model_id": "sentiment", "input": "after"},
                                     headers=bearer("turns")).status_code == 202, 10, "the key's turns to come back")


def test_a_request_waiting_for_its_results_gives_its_turn_back(stack: Stack) -> None:
    def predict(i: int) -> httpx.Response:
        with httpx.Client(base_url=stack.gateway.url, timeout=30) as client:
            return client.post("/predict", params={"timeout_s": 2}, json={"model_id": "topic", "input": f"turn {i}"},
                               headers=bearer("turnwait"))

    # more waits than turns, each longer than a turn may be waited for: every one is let through to its wait
    with frozen(stack), ThreadPoolExecutor(ACTIVE + 1) as pool:
        answers = list(pool.map(predict, range(ACTIVE + 1)))
    assert [a.status_code for a in answers] == [504] * (ACTIVE + 1), [a.text for a in answers]


# -- 5. nothing leaks to the open routes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "message"),
    [
        ("\u0661\u0662", "Inference-Header-Content-Length is '"),  # Arabic-Indic digits: str.isdigit() says yes
        ("9" * 5000, "is '999999999999999999999999...' for a body of"),  # an int() of it would refuse: over 4300 digits
        ("-3", "is '-3' for a body of"),
    ],
)
def test_malformed_infer_headers_are_400_with_a_message(stack: Stack, length: str, message: str) -> None:
    body = json.dumps({"inputs": []}).encode()
    head = request_head("POST", "/v2/models/sentiment/infer", {
        **bearer("malformed"), "Content-Length": str(len(body)), "Inference-Header-Content-Length": length})
    status, _, answer, _ = raw(
        stack.gateway.port, head.replace(length.encode("latin-1", "replace"), length.encode()), body
    )
    error = json.loads(answer)["error"]
    assert (
        status == 400
        and message in error
        and error.endswith("give the length in bytes of the JSON part, in ASCII digits")
    )


def test_deeply_nested_json_is_a_400_or_422_never_a_500(stack: Stack) -> None:
    nested = b"[" * 100_000 + b"]" * 100_000
    v2 = stack.http.post("/v2/models/sentiment/infer", content=nested, headers=bearer("malformed"))
    assert v2.status_code == 400 and "nested too deeply" in v2.json()["error"]
    rest = stack.http.post("/jobs", content=b'{"model_id": "spam", "input": ' + nested + b"}",
                           headers={**bearer("malformed"), "Content-Type": "application/json"})
    assert rest.status_code == 422 and rest.json()["detail"][0]["type"] == "json_invalid"
    assert "Traceback" not in stack.gateway.log()


def test_framing_the_server_cannot_trust_is_400(stack: Stack) -> None:
    for headers in ({"Content-Length": "5", "Content-Length ": "7"}, {"Transfer-Encoding": "gzip, chunked"}):
        head = request_head("POST", "/jobs", {**bearer("malformed"), **headers})
        status, _, _, closed = raw(stack.gateway.port, head, b"hello")
        assert status == 400 and closed, headers


def test_a_web_page_cannot_drive_a_loopback_gateway_without_keys(redis_url: str, secure_models: Path,
                                                                 tmp_path: Path) -> None:
    with private_env(redis_url, secure_models, **NO_KEYS) as env:
        gateway = GatewayProcess(env, tmp_path / "open.log")
        try:
            gateway.wait_ready()
            job = json.dumps({"model_id": "spam", "input": "hi"}).encode()
            head = request_head("POST", "/jobs", {"Content-Length": str(len(job)), "Content-Type": "application/json"})
            rebound = head.replace(b"Host: 127.0.0.1", b"Host: attacker.example")
            status, _, body, _ = raw(gateway.port, rebound, job)
            assert status == 400 and json.loads(body)["detail"].startswith(
                "this gateway answers to the hosts 127.0.0.1, ::1, localhost, not 'attacker.example'")
            cross = head.replace(b"Host: 127.0.0.1", f"Host: 127.0.0.1:{gateway.port}\r\nOrigin: http://attacker.example".encode())
            status, _, body, _ = raw(gateway.port, cross, job)
            assert status == 403 and json.loads(body)["detail"] == (
                "requests from web pages of http://attacker.example are refused: call the gateway from a server, or "
                "add the origin to SWAPLESS_GATEWAY_ALLOWED_ORIGINS")
            same = head.replace(b"Host: 127.0.0.1", f"Host: 127.0.0.1:{gateway.port}\r\nOrigin: http://127.0.0.1:{gateway.port}".encode())
            assert raw(gateway.port, same, job)[0] == 202
        finally:
            gateway.stop()


def test_without_keys_the_limits_count_per_client_address(redis_url: str, secure_models: Path, tmp_path: Path) -> None:
    with private_env(redis_url, secure_models, SWAPLESS_GATEWAY_RATE_PER_KEY="5", **NO_KEYS) as env:
        gateway = GatewayProcess(env, tmp_path / "open.log")
        try:
            gateway.wait_ready()
            job = {"model_id": "spam", "input": "hi"}
            with httpx.Client(base_url=gateway.url, timeout=30) as first, httpx.Client(
                base_url=gateway.url, timeout=30, transport=httpx.HTTPTransport(local_address="127.0.0.2")
            ) as second:
                codes = [first.post("/jobs", json=job).status_code for _ in range(30)]
                assert codes.count(202) < 30 and 429 in codes
                assert second.post("/jobs", json=job).status_code == 202  # another address, its own budget
        finally:
            gateway.stop()


def test_a_client_gone_mid_body_is_one_warning_line_not_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """Starlette's ClientDisconnect (a caller that hung up mid-upload) maps to a 400 and one throttled warning, never
    to the internal-error path that logs a traceback."""
    import logging

    from starlette.requests import ClientDisconnect

    from swapless.tasks.gateway.errors import LogThrottle, problem

    log = LogThrottle()
    with caplog.at_level(logging.WARNING):
        found = [problem(ClientDisconnect(), "rest", "redis://127.0.0.1:6379/0", log) for _ in range(3)]
    assert {p.status for p in found} == {400}
    assert [r.getMessage() for r in caplog.records] == [
        "a client disconnected before its request body had arrived; the request was dropped"]
    assert not any(r.exc_info for r in caplog.records)
