"""The HTTP gateway over real HTTP: a real `swapless serve` process, a real worker and the real Redis.

One worker and one gateway serve the whole module (each start costs seconds); every test reads only its own jobs.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from swapless.tasks.client import Client
from tests.redis_server import redis_server_binary
from tests.stack import GatewayProcess, Stack, free_port, pubsub_connections, wait_for, worker_and_gateway
from tests.tinymodels import encode_image

pytestmark = [pytest.mark.slow, pytest.mark.images]

MAX_BODY_BYTES = 256 * 1024


@pytest.fixture(scope="module")
def stack(redis_url: str, models_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("gateway-logs")
    extra = {"SWAPLESS_HEARTBEAT_INTERVAL_S": "0.5", "SWAPLESS_GATEWAY_MAX_BODY_BYTES": str(MAX_BODY_BYTES)}
    with (
        worker_and_gateway(redis_url, models_file, logs, "gw@%h", **extra) as (env, worker, gateway),
        httpx.Client(base_url=gateway.url, timeout=30) as http,
    ):
        yield Stack(env, worker, gateway, http)


def poll_job(http: httpx.Client, job_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = http.get(f"/jobs/{job_id}").json()
        return body if body["state"] != "PENDING" else None

    return wait_for(done, timeout_s, what=f"job {job_id}")  # type: ignore[no-any-return]


def test_openapi_docs_and_health(stack: Stack) -> None:
    docs = stack.http.get("/docs")
    assert docs.status_code == 200 and "swagger-ui" in docs.text
    paths = stack.http.get("/openapi.json").json()["paths"]
    assert {"/jobs", "/jobs/{job_id}", "/predict", "/models", "/healthz"} <= set(paths)
    assert "202" in paths["/jobs"]["post"]["responses"] and "504" in paths["/predict"]["post"]["responses"]
    health = wait_for(lambda: (h := stack.http.get("/healthz").json())["workers"] and h, what="a worker heartbeat")
    assert health == {"status": "ok", "redis": "ok", "workers": 1}


def test_requests_are_checked_before_anything_is_queued(stack: Stack) -> None:
    http = stack.http
    unknown = http.post("/jobs", json={"model_id": "sentimnt", "input": "hi"})
    assert unknown.status_code == 404
    assert unknown.json() == {
        "detail": "unknown model 'sentimnt' (known: sentiment, spam, topic, vision)",
        "known": ["sentiment", "spam", "topic", "vision"],
    }
    assert http.post("/predict", json={"model_id": "nope", "input": "hi"}).status_code == 404

    def problem(body: dict[str, Any], path: str = "/jobs") -> tuple[int, list[Any], str]:
        response = http.post(path, json=body)
        detail = response.json()["detail"]
        return response.status_code, detail[0]["loc"], detail[0]["msg"]

    assert problem({"model_id": "sentiment", "input": 5}) == (
        422, ["body", "input"], "bad input for model 'sentiment': this is a text model; send a string, not a number"
    )
    assert problem({"model_id": "sentiment", "input": "   "}) == (
        422, ["body", "input"], "bad input for model 'sentiment': empty text; send at least one non-blank character"
    )
    assert problem({"model_id": "vision", "input": "hello there"}, "/predict") == (
        422, ["body", "input"], ("bad input for model 'vision': the image is not valid base64: send the image's "
                                 "bytes in base64 (the gateway reads no file paths)")
    )
    assert problem({"model_id": "vision", "input": {"image": encode_image(1)}}) == (
        422, ["body", "input"], ("bad input for model 'vision': this is an image model; send a base64 string of "
                                 "a PNG/JPEG/WebP, not an object")
    )
    status, loc, _ = problem({"model_id": "sentiment"})
    assert (status, loc) == (422, ["body", "input"])
    status, loc, _ = problem({"model_id": "sentiment", "input": "hi", "modle": "x"})
    assert (status, loc) == (422, ["body", "modle"])
    assert "input" not in http.post("/jobs", json={"model_id": "sentiment"}).json()["detail"][0], "values not echoed"

    too_big = {"model_id": "sentiment", "input": "a" * MAX_BODY_BYTES}
    declared = http.post("/jobs", json=too_big)
    assert declared.status_code == 413
    assert declared.json()["detail"].endswith(
        f"is over the limit of {MAX_BODY_BYTES} bytes (SWAPLESS_GATEWAY_MAX_BODY_BYTES)"
    )
    chunks = [b'{"model_id": "sentiment", "input": "', b"a" * MAX_BODY_BYTES, b'"}']
    streamed = http.post("/jobs", content=iter(chunks), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    # a chunked body under the limit still goes through
    small = http.post(
        "/jobs",
        content=iter([b'{"model_id": "spam", ', b'"input": "hello"}']),
        headers={"content-type": "application/json"},
    )
    assert small.status_code == 202


def test_submit_then_read_the_result_or_the_error(stack: Stack) -> None:
    http = stack.http
    image = encode_image(7)
    cut = base64.b64encode(base64.b64decode(image)[:60]).decode()  # a PNG header the gateway reads; its pixels cut off
    accepted = {
        "text": http.post("/jobs", json={"model_id": "sentiment", "input": "what a lovely day"}),
        "image": http.post(
            "/jobs", json={"model_id": "vision", "input": "data:image/png;base64," + image, "priority": "bulk"}
        ),
        "cut": http.post("/jobs", json={"model_id": "vision", "input": cut}),
    }
    assert {name: r.status_code for name, r in accepted.items()} == {"text": 202, "image": 202, "cut": 202}
    ids = {name: r.json()["job_id"] for name, r in accepted.items()}
    assert accepted["text"].json()["status_url"] == f"/jobs/{ids['text']}"

    text = poll_job(http, ids["text"])
    assert text["state"] == "SUCCESS" and {r["label"] for r in text["result"]} == {"POSITIVE", "NEGATIVE"}
    assert text["result"] == Client().job(ids["text"]).get(timeout=5), "the gateway reads what the client reads"
    picture = poll_job(http, ids["image"])
    assert picture["state"] == "SUCCESS" and len(picture["result"]) == 5
    failed = poll_job(http, ids["cut"])
    assert failed["state"] == "FAILURE" and failed["error"]["type"] == "InputError"
    assert failed["error"]["message"].startswith("bad input for model 'vision': image data is truncated or corrupt")
    unknown = http.get("/jobs/no-such-job")
    assert unknown.status_code == 404 and unknown.json() == {"detail": "no job no-such-job for this caller: use the "
                                                            "job_id that POST /jobs returned to this key (records are "
                                                            "kept until its result expires)"}
    assert http.get("/jobs/bad id!").status_code == 422


def test_predict_waits_for_the_result_and_reports_failures(stack: Stack) -> None:
    http = stack.http
    ok = http.post("/predict", json={"model_id": "spam", "input": "win a free prize now"})
    assert ok.status_code == 200
    body = ok.json()
    assert set(body) == {"job_id", "model", "result"} and {r["label"] for r in body["result"]} == {"ham", "spam"}
    assert body["model"] == "spam"  # the model that served it
    image = http.post(
        "/predict", json={"model_id": "vision", "input": base64.b64encode(base64.b64decode(encode_image(2))).decode()}
    )
    assert image.status_code == 200 and len(image.json()["result"]) == 5

    refused = http.post(
        "/predict", json={"model_id": "vision", "input": base64.b64encode(b"GIF89a not really").decode()}
    )
    assert refused.status_code == 422 and "not an image Pillow can read" in refused.json()["detail"][0]["msg"]
    cut = base64.b64encode(base64.b64decode(encode_image(3))[:60]).decode()  # the header passes; the pixels fail
    failed = http.post("/predict", json={"model_id": "vision", "input": cut})
    assert failed.status_code == 422
    failure = failed.json()
    assert failure["error"]["type"] == "InputError" and "image data is truncated or corrupt" in failure["detail"]
    assert poll_job(http, failure["job_id"])["state"] == "FAILURE"


def test_predict_times_out_with_the_job_id_then_polling_succeeds(stack: Stack) -> None:
    """With the worker frozen, many /predict calls wait at once; the loop still answers, then each gets 504."""
    texts = [f"message number {i}" for i in range(40)]

    async def scenario() -> tuple[list[httpx.Response], list[float]]:
        async with httpx.AsyncClient(base_url=stack.gateway.url, timeout=30) as client:
            waiting = [
                asyncio.create_task(
                    client.post("/predict", params={"timeout_s": 2.0}, json={"model_id": "topic", "input": t})
                )
                for t in texts
            ]
            await asyncio.sleep(0.5)
            latencies = []
            for _ in range(5):  # the event loop is free while 40 requests wait on Redis
                started = time.perf_counter()
                assert (await client.get("/jobs/some-other-job")).status_code == 404
                latencies.append(time.perf_counter() - started)
            return list(await asyncio.gather(*waiting)), latencies

    os.kill(stack.worker.proc.pid, signal.SIGSTOP)
    try:
        responses, latencies = asyncio.run(scenario())
    finally:
        os.kill(stack.worker.proc.pid, signal.SIGCONT)
    # a loop blocked by the waits would answer only when they end (2 s); the bound is generous for a loaded machine
    assert max(latencies) < 1.5, latencies
    assert [r.status_code for r in responses] == [504] * len(texts)
    first = responses[0].json()
    assert first["detail"] == (
        f"no result after 2 s; the job is still queued or running: poll GET /jobs/{first['job_id']}"
    )
    assert responses[0].headers["location"] == first["status_url"] == f"/jobs/{first['job_id']}"
    job_ids = [r.json()["job_id"] for r in responses]
    assert len(set(job_ids)) == len(texts)
    states = [poll_job(stack.http, job_id, timeout_s=60) for job_id in job_ids]
    assert all(s["state"] == "SUCCESS" and len(s["result"]) == 4 for s in states), states[:2]


def test_every_waiting_predict_shares_the_gateway_s_one_pub_sub_connection(stack: Stack) -> None:
    """With the worker frozen, 30 /predict calls wait at once on one pub/sub connection of the gateway; once the
    worker runs again, each is woken by its own result."""
    admin = redis.Redis.from_url(stack.env["SWAPLESS_REDIS_URL"])
    texts = [f"one connection for all {i}" for i in range(30)]

    def subscribed() -> list[dict[str, Any]] | None:
        found = pubsub_connections(admin, stack.gateway.proc.pid)
        return found if sum(int(c["sub"]) for c in found) >= len(texts) else None

    async def scenario() -> tuple[list[dict[str, Any]], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=stack.gateway.url, timeout=60) as client:
            waiting = [
                asyncio.create_task(
                    client.post("/predict", params={"timeout_s": 30}, json={"model_id": "topic", "input": t})
                )
                for t in texts
            ]
            connections = await asyncio.to_thread(wait_for, subscribed, 20, what="30 waits subscribed")
            os.kill(stack.worker.proc.pid, signal.SIGCONT)
            return connections, list(await asyncio.gather(*waiting))

    os.kill(stack.worker.proc.pid, signal.SIGSTOP)
    try:
        connections, responses = asyncio.run(scenario())
    finally:
        os.kill(stack.worker.proc.pid, signal.SIGCONT)
    assert len(connections) == 1 and int(connections[0]["sub"]) == len(texts), connections
    assert [r.status_code for r in responses] == [200] * len(texts)
    assert all(len(r.json()["result"]) == 4 for r in responses)


def test_a_deadline_in_the_body_is_kept_and_a_late_job_is_not_run(stack: Stack) -> None:
    http = stack.http
    assert http.post("/jobs", json={"model_id": "sentiment", "input": "hi", "expires_s": 0}).status_code == 422
    os.kill(stack.worker.proc.pid, signal.SIGSTOP)  # nothing starts while it is frozen
    try:
        late = http.post("/jobs", json={"model_id": "sentiment", "input": "too late", "expires_s": 0.5})
        in_time = http.post("/jobs", json={"model_id": "sentiment", "input": "in time", "expires_s": 120})
        time.sleep(1.0)
    finally:
        os.kill(stack.worker.proc.pid, signal.SIGCONT)
    assert poll_job(http, late.json()["job_id"])["error"]["type"] == "JobExpired"
    assert poll_job(http, in_time.json()["job_id"])["state"] == "SUCCESS"
    predicted = http.post("/predict", json={"model_id": "sentiment", "input": "now", "expires_s": 30})
    assert predicted.status_code == 200


def test_predict_with_a_deadline_that_passes_first_is_504_job_expired(stack: Stack) -> None:
    replies: list[httpx.Response] = []

    def predict() -> None:
        with httpx.Client(base_url=stack.gateway.url, timeout=30) as http:
            replies.append(http.post("/predict", json={"model_id": "sentiment", "input": "late", "expires_s": 0.5}))

    os.kill(stack.worker.proc.pid, signal.SIGSTOP)  # nothing starts while it is frozen
    try:
        waiting = threading.Thread(target=predict)
        waiting.start()
        time.sleep(1.0)  # past the job's deadline: the worker answers it JobExpired once it runs again
    finally:
        os.kill(stack.worker.proc.pid, signal.SIGCONT)
    waiting.join(30)
    [reply] = replies
    body = reply.json()
    assert reply.status_code == 504, body
    assert body["error"]["type"] == "JobExpired" and "was not started by its deadline" in body["detail"]
    assert "status_url" not in body  # not the 504 of a wait that ran out: the job has its answer
    assert stack.http.get(f"/jobs/{body['job_id']}").json()["error"]["type"] == "JobExpired"


def test_models_shows_the_registry_beside_what_each_worker_has_loaded(stack: Stack) -> None:
    http = stack.http
    for model_id in ["spam", "topic", "sentiment"]:
        assert http.post("/predict", json={"model_id": model_id, "input": "hello"}).status_code == 200

    def settled() -> dict[str, Any] | None:
        view = http.get("/models").json()
        loaded = {m["id"] for m in view["models"] if m["loaded_on"]}
        return view if loaded == {"topic", "sentiment"} else None

    view = wait_for(settled, 10, what="the heartbeat to show topic and sentiment loaded")
    by_id = {m["id"]: m for m in view["models"]}
    assert list(by_id) == ["sentiment", "spam", "topic", "vision"]
    assert by_id["vision"]["type"] == "image" and by_id["vision"]["framework"] == "torchvision"
    assert not any(m["keep_loaded"] for m in view["models"])  # none kept in this models file
    assert by_id["spam"]["loaded_on"] == [] and by_id["vision"]["loaded_on"] == []
    [where] = by_id["sentiment"]["loaded_on"]
    assert where["worker"].startswith("gw@") and where["bytes"] > 1_000_000 and where["load_s"] > 0
    [worker] = view["workers"]
    assert worker["hostname"] == where["worker"] and worker["max_models"] == 2
    # the workers that fetch each model's jobs: the one worker claimed what it holds loaded, nobody claimed vision
    # (spam, evicted, is let go by a later placement round: over-claimed, not loaded)
    assert {m: by_id[m]["claimed_by"] for m in ("sentiment", "topic", "vision")} == {
        "sentiment": [worker["worker_id"]], "topic": [worker["worker_id"]], "vision": []
    }
    assert sorted(worker["loaded"]) == ["sentiment", "topic"] and worker["jobs_done"] >= 3
    assert view["waiting_estimated"] is False


@pytest.mark.faults
def test_health_and_submit_say_when_redis_is_down_and_recover(stack: Stack, tmp_path: Path) -> None:
    """Against a private redis-server that is killed and restarted: 503 at once while it is down, naming nothing of
    where Redis is (the gateway's log says), then back to work."""
    port = free_port()

    def start_redis() -> subprocess.Popen[bytes]:
        server = subprocess.Popen(
            [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        wait_for(lambda: _pings(port), 10, what="redis-server")
        return server

    server = start_redis()
    gateway = GatewayProcess({**stack.env, "SWAPLESS_REDIS_URL": f"redis://127.0.0.1:{port}/0"}, tmp_path / "gw.log")
    try:
        gateway.wait_ready()
        with httpx.Client(base_url=gateway.url, timeout=30) as http:
            job = {"model_id": "spam", "input": "hi"}
            assert http.get("/healthz").json() == {"status": "ok", "redis": "ok", "workers": 0}
            assert http.post("/jobs", json=job).status_code == 202
            server.kill()
            server.wait(10)
            health = http.get("/healthz")
            assert health.status_code == 503
            assert health.json() == {"status": "unavailable", "redis": "unavailable"}
            started = time.perf_counter()
            down = http.post("/jobs", json=job)
            assert down.status_code == 503 and time.perf_counter() - started < 5
            assert down.json() == {"detail": "the queue (Redis) is unavailable: try again in 5 s"}
            assert down.headers["retry-after"] == "5"
            polled = http.get("/jobs/some-job")
            assert polled.status_code == 503 and polled.json() == down.json()
            ready = http.get("/v2/health/ready")
            assert ready.status_code == 503 and ready.json() == {"error": down.json()["detail"]}
            for answer in (health, down, polled, ready):
                assert str(port) not in answer.text and "127.0.0.1" not in answer.text
            assert f"cannot reach Redis at redis://127.0.0.1:{port}/0" in gateway.log()  # where to look, for operators
            server = start_redis()
            assert http.get("/healthz").status_code == 200
            assert http.post("/jobs", json=job).status_code == 202
    finally:
        gateway.stop()
        server.kill()
        server.wait(10)


def _pings(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_connect_timeout=0.5) as client:
            return bool(client.ping())
    except redis.ConnectionError:
        return False
