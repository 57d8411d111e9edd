"""Webhooks: the targets a callback_url may name, the delivery queue in Redis, and real workers posting signed
webhooks to a real HTTP receiver that verifies them with the ``standardwebhooks`` library: through an outage of the
receiver, beside a slow one, and after a worker killed between storing a result and queueing its webhook."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis
from pydantic import SecretStr

from swapless.config.errors import WebhookRefused
from swapless.config.settings import Settings, get_settings
from swapless.tasks.client import Client
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.webhooks import WebhookDelivery, WebhookQueue, allowed_hosts, check_target
from swapless.tasks.worker.webhooks import WebhookSender, backoff_s
from tests.conftest import WorkerProcess
from tests.faultkit import wait_for
from tests.stack import GatewayProcess, worker_and_gateway
from tests.webhook_receiver import SECRET, Receiver

# -- targets -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "allowed", "message"),
    [
        ("ftp://example.com/x", "", "http:// or https:// URL"),
        ("http://127.0.0.1:9/x", "", "internal address (127.0.0.1)"),
        ("http://localhost/x", "", "names this machine"),
        ("http://[::1]/x", "", "internal address (::1)"),
        ("http://10.1.2.3/x", "", "internal address (10.1.2.3)"),
        ("http://169.254.169.254/latest", "", "internal address (169.254.169.254)"),
        ("http://internal.corp/x", "", "internal address (192.168.1.5)"),
        ("https://other.example/x", "hooks.example", "'other.example' is not in SWAPLESS_WEBHOOK_ALLOWED_HOSTS"),
        ("https://user:pw@hooks.example/x", "hooks.example", "must not carry a user or password"),
        ("https://hooks.example:99999/x", "hooks.example", "its port must be a number from 1 to 65535"),
        ("https://hooks.example:0/x", "hooks.example", "its port must be a number from 1 to 65535"),
        ("https://hooks.example:http/x", "hooks.example", "its port must be a number from 1 to 65535"),
    ],
)
def test_a_target_that_is_not_allowed_is_refused_saying_why(url: str, allowed: str, message: str) -> None:
    with pytest.raises(WebhookRefused, match="refused") as caught:
        check_target(url, allowed_hosts(allowed), resolve=lambda host: ["192.168.1.5"])
    assert message in str(caught.value)


def test_allowed_targets_pass() -> None:
    public = lambda host: ["93.184.216.34"]  # noqa: E731
    assert check_target("https://hooks.example/x", frozenset(), public) == "hooks.example"
    assert check_target("http://127.0.0.1:8080/x", allowed_hosts("127.0.0.1")) == "127.0.0.1"
    assert check_target("https://a.hooks.example/x", allowed_hosts("*.hooks.example")) == "a.hooks.example"


def test_backoff_doubles_to_ten_minutes() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_s(30) == 600.0


# -- the delivery queue ------------------------------------------------------------------------------------------


@pytest.fixture
def webhook_queue(redis_url: str, key_prefix: str) -> Iterator[WebhookQueue]:
    client = redis.Redis.from_url(redis_url)
    yield WebhookQueue(client, Keyspace("q", key_prefix), ttl_s=60, max_pending=3, max_failed=2)
    client.close()


def test_the_queue_is_bounded_and_deduplicated(webhook_queue: WebhookQueue) -> None:
    now = time.time()
    assert webhook_queue.enqueue([WebhookDelivery(f"j{i}", "http://x/", "{}") for i in range(3)], now) == (3, 0)
    assert webhook_queue.enqueue([WebhookDelivery("j0", "http://x/", "{}")], now) == (0, 0)  # already waiting
    assert webhook_queue.enqueue([WebhookDelivery("j9", "http://x/", "{}")], now) == (0, 1)  # over the bound: failed
    count, failed = webhook_queue.failed()
    assert count == 1 and failed[0].id == "j9" and "SWAPLESS_WEBHOOK_MAX_PENDING" in (failed[0].last_error or "")
    assert webhook_queue.pending() == 3
    ttl = webhook_queue.client.ttl(webhook_queue.keyspace.webhook("j0"))
    assert 0 < ttl <= 120


def test_one_api_key_cannot_fill_the_delivery_queue_for_the_others(redis_url: str, key_prefix: str) -> None:
    """SWAPLESS_WEBHOOK_MAX_PENDING_PER_KEY at 2: key A's third waiting delivery is kept as failed at once, saying
    why, while key B's and an unowned one are queued; one of A's delivered frees its place."""
    client = redis.Redis.from_url(redis_url)
    queue = WebhookQueue(client, Keyspace("q", key_prefix), ttl_s=60, max_pending=100, max_failed=10,
                         max_pending_per_key=2)
    now = time.time()
    mine = [WebhookDelivery(f"a{i}", "http://x/", "{}", owner="key:A") for i in range(3)]
    assert queue.enqueue(mine, now) == (2, 1)
    others = [WebhookDelivery("b0", "http://x/", "{}", owner="key:B"), WebhookDelivery("n0", "http://x/", "{}")]
    assert queue.enqueue(others, now) == (2, 0)
    count, failed = queue.failed()
    assert count == 1 and failed[0].id == "a2" and failed[0].owner == "key:A"
    assert failed[0].last_error == "this API key had too many webhooks waiting (SWAPLESS_WEBHOOK_MAX_PENDING_PER_KEY)"
    [first, *_] = [d for d in queue.claim(10, lease_s=30, now=now) if d.id == "a0"]
    queue.delivered(first)
    assert queue.enqueue([WebhookDelivery("a3", "http://x/", "{}", owner="key:A")], now) == (1, 0)
    assert queue.pending() == 4
    client.close()


def test_claims_lease_deliveries_and_failures_can_be_replayed(webhook_queue: WebhookQueue) -> None:
    now = time.time()
    webhook_queue.enqueue([WebhookDelivery("a", "http://x/", "{}"), WebhookDelivery("b", "http://x/", "{}")], now)
    taken = webhook_queue.claim(10, lease_s=30, now=now)
    assert sorted(d.id for d in taken) == ["a", "b"]
    assert webhook_queue.claim(10, lease_s=30, now=now + 1) == []  # leased
    assert sorted(d.id for d in webhook_queue.claim(10, lease_s=30, now=now + 31)) == ["a", "b"]  # lease over
    webhook_queue.delivered(taken[0])
    webhook_queue.fail(taken[1])
    assert webhook_queue.pending() == 0 and webhook_queue.failed()[0] == 1
    assert webhook_queue.replay() == 1
    assert webhook_queue.failed()[0] == 0 and webhook_queue.pending() == 1


def test_the_sender_retries_then_keeps_the_delivery_as_failed(webhook_queue: WebhookQueue, settings: Settings) -> None:
    calls: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(503)

    s = settings.model_copy(update={"webhook_secret": SecretStr(SECRET), "webhook_allowed_hosts": "hooks.test",
                                    "webhook_retry_s": 1.5})
    sender = WebhookSender(webhook_queue, s.webhooks, transport=httpx.MockTransport(answer),
                           resolve=lambda host: ["10.0.0.7"])
    webhook_queue.enqueue([WebhookDelivery("job-1", "http://hooks.test/h", json.dumps({"x": 1}))])
    sender.start()
    try:
        deadline = time.monotonic() + 10
        while webhook_queue.failed()[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sender.stop()
    count, failed = webhook_queue.failed()
    assert count == 1 and failed[0].attempts == 2 and failed[0].last_error == "the receiver answered 503"
    assert [r.headers["webhook-id"] for r in calls] == ["job-1", "job-1"]
    assert calls[0].headers["webhook-signature"].startswith("v1,")


def _send_once(webhook_queue: WebhookQueue, settings: Settings, url: str,
               resolve: Callable[[str], list[str]], allowed: str = "") -> tuple[list[httpx.Request], int]:
    """One delivery to ``url`` through a sender whose lookups ``resolve`` answers: (the requests it made, the
    deliveries kept as failed)."""
    calls: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(204)

    s = settings.model_copy(update={"webhook_secret": SecretStr(SECRET), "webhook_allowed_hosts": allowed})
    sender = WebhookSender(webhook_queue, s.webhooks, transport=httpx.MockTransport(answer), resolve=resolve)
    webhook_queue.enqueue([WebhookDelivery("job-pin", url, "{}")])
    sender.start()
    try:
        wait_for(lambda: webhook_queue.pending() == 0, 10, "the delivery to be settled")
    finally:
        sender.stop()
    return calls, webhook_queue.failed()[0]


def test_the_sender_connects_to_the_address_it_checked_under_the_host_s_own_name(
    webhook_queue: WebhookQueue, settings: Settings
) -> None:
    calls, failed = _send_once(webhook_queue, settings, "https://hooks.example:8443/in?x=1",
                               lambda host: ["93.184.216.34"])
    [request] = calls
    assert failed == 0
    assert str(request.url) == "https://93.184.216.34:8443/in?x=1"
    assert request.headers["host"] == "hooks.example:8443"
    assert request.extensions["sni_hostname"] == "hooks.example"  # the certificate is checked against the name


def test_a_name_that_rebinds_to_an_internal_address_after_the_check_is_not_followed(
    webhook_queue: WebhookQueue, settings: Settings
) -> None:
    answers = iter([["93.184.216.34"], ["127.0.0.1"], ["127.0.0.1"]])  # public when checked, then this machine
    looked_up: list[str] = []

    def rebinding(host: str) -> list[str]:
        looked_up.append(host)
        return next(answers)

    calls, failed = _send_once(webhook_queue, settings, "http://rebind.example/hook", rebinding)
    assert looked_up == ["rebind.example"]  # one lookup: the address checked is the address connected to
    assert [request.url.host for request in calls] == ["93.184.216.34"] and failed == 0


def test_an_allow_listed_name_is_pinned_too_and_an_internal_answer_is_refused_without_the_list(
    webhook_queue: WebhookQueue, settings: Settings
) -> None:
    calls, failed = _send_once(webhook_queue, settings, "http://hooks.internal/h", lambda host: ["10.0.0.7"],
                               allowed="hooks.internal")
    assert [(r.url.host, r.headers["host"]) for r in calls] == [("10.0.0.7", "hooks.internal")] and failed == 0
    calls, failed = _send_once(webhook_queue, settings, "http://hooks.internal/h", lambda host: ["10.0.0.7"])
    assert calls == [] and failed == 1
    assert "internal address (10.0.0.7)" in (webhook_queue.failed()[1][0].last_error or "")


def test_a_pinned_delivery_reaches_a_real_receiver_under_its_name_and_verifies(
    webhook_queue: WebhookQueue, settings: Settings
) -> None:
    receiver = Receiver().start()
    s = settings.model_copy(update={"webhook_secret": SecretStr(SECRET), "webhook_allowed_hosts": "localhost"})
    sender = WebhookSender(webhook_queue, s.webhooks, resolve=lambda host: ["127.0.0.1"])  # the network, one lookup
    url = f"http://localhost:{receiver.port}/hook"
    webhook_queue.enqueue([WebhookDelivery("job-real", url, json.dumps({"ok": 1}))])
    sender.start()
    try:
        [(headers, payload)] = receiver.wait_for(1, 10)
    finally:
        sender.stop()
        receiver.stop()
    assert headers["host"] == f"localhost:{receiver.port}" and headers["webhook-id"] == "job-real"
    assert payload == {"ok": 1} and receiver.rejected == 0


# -- real workers ------------------------------------------------------------------------------------------------

HOOK_ENV = {"SWAPLESS_WEBHOOK_SECRET": SECRET, "SWAPLESS_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1"}


@pytest.fixture
def hook_env(swapless_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in HOOK_ENV.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    return {**swapless_env, **HOOK_ENV}


@pytest.fixture
def client(hook_env: dict[str, str]) -> Iterator[Client]:
    with Client() as c:
        yield c


@pytest.fixture(scope="module")
def hooked(
    redis_url: str, served_models_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, str], WorkerProcess, GatewayProcess]]:
    """The module's worker and gateway with webhooks on (its own queue), for the tests that need nothing else."""
    with worker_and_gateway(redis_url, served_models_file, tmp_path_factory.mktemp("hooked"), "hooks@%h",
                            **HOOK_ENV) as stack:
        yield stack


@pytest.fixture
def hooked_client(hooked: tuple[dict[str, str], WorkerProcess, GatewayProcess]) -> Iterator[Client]:
    """A client on the module's worker (``hooked`` set its environment in this process)."""
    with Client() as c:
        yield c


def _delivery(client: Client, job_id: str) -> WebhookDelivery | None:
    raw = client.redis.get(Keyspace.of(client.settings).webhook(job_id))
    return WebhookDelivery.decode(raw) if raw is not None else None


@pytest.mark.slow
def test_webhooks_arrive_signed_and_survive_a_receiver_outage(hooked_client: Client) -> None:
    client = hooked_client
    receiver = Receiver()  # not listening yet: the receiver is down
    job = client.submit("sentiment", "what a lovely day", callback_url=receiver.url)
    bad = client.submit("sentiment", "", callback_url=receiver.url)  # fails its own job: InputError
    result = job.get(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the first attempt failed: the receiver was down
        found = _delivery(client, job.id)
        if found is not None and found.attempts >= 1:
            break
        time.sleep(0.05)
    assert found is not None and found.attempts >= 1 and found.last_error
    receiver.start()
    try:
        got = {headers["webhook-id"]: payload for headers, payload in receiver.wait_for(2, 30)}
    finally:
        receiver.stop()
    assert receiver.rejected == 0  # every signature verified, with the same library
    assert got[job.id]["type"] == "job.succeeded"
    assert got[job.id]["data"]["result"] == result and got[job.id]["data"]["model"] == "sentiment"
    assert got[job.id]["data"]["timings"]["total_s"] >= 0
    assert got[bad.id]["type"] == "job.failed" and got[bad.id]["data"]["error"]["type"] == "InputError"
    # delivered: off the queue (the sender takes it off once the receiver's answer is in)
    wait_for(lambda: _delivery(client, job.id) is None, 10, "the delivery to leave the queue")


@pytest.mark.slow
def test_a_slow_receiver_leaves_the_worker_throughput_unchanged(
    hook_env: dict[str, str], client: Client, start_worker: Callable[..., WorkerProcess]
) -> None:
    """The jobs' results do not wait for their webhooks. Untimed: 200 webhooks to a receiver that takes 1 s each, 2
    at a time, need 100 s; all 200 results come within the 60 s the gather allows, with most webhooks still to
    send. How much a webhook costs per job is ``python -m bench.webhooks``'s to measure."""
    start_worker(env={"SWAPLESS_WEBHOOK_CONCURRENCY": "2"})
    receiver = Receiver(delay_s=1.0).start()
    try:
        client.gather(client.submit_jobs([("spam", "warm-up")]), timeout=60)
        n = 200
        plain = client.submit_jobs([("spam", f"plain {i}") for i in range(n)])
        hooked = client.submit_jobs([("spam", f"hooked {i}") for i in range(n)], callback_url=receiver.url)
        answers = client.gather(plain + hooked, timeout=60)
        delivered = len(receiver.received)
        receiver.wait_for(2, 30)  # the sender is posting meanwhile
    finally:
        receiver.stop()
    assert len(answers) == 2 * n
    assert delivered < n // 2, f"{delivered} of {n} webhooks were delivered before the results were all in"


@pytest.mark.slow
def test_a_worker_killed_between_storing_and_queueing_still_sends_the_webhook(
    hook_env: dict[str, str], client: Client, start_worker: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    from tests.webhookhook import MARKER_ENV, TRIGGER

    marker = tmp_path / "killed"
    receiver = Receiver().start()
    try:
        doomed = start_worker(env={"SWAPLESS_PLUGINS": "tests.webhookhook", MARKER_ENV: str(marker)})
        job = client.submit("spam", TRIGGER, callback_url=receiver.url)
        assert doomed.proc.wait(60) != 0 and marker.exists()  # SIGKILLed after the store, before the webhook
        assert client.fetch([job.id])[0].ready  # the result was stored
        start_worker()  # a restart on this machine takes the dead worker's jobs back at once
        (headers, payload), *more = receiver.wait_for(1, 60)
    finally:
        receiver.stop()
    assert headers["webhook-id"] == job.id and payload["data"]["result"] == job.get(timeout=5)
    assert all(h["webhook-id"] == job.id for h, _ in more)  # maybe twice: the same id


@pytest.mark.slow
def test_map_sends_one_webhook_per_chunk(hooked_client: Client) -> None:
    client = hooked_client
    receiver = Receiver().start()
    try:
        texts = [f"mapped {i}" for i in range(7)]
        answers = list(client.map("spam", texts, chunk_size=3, callback_url=receiver.url))
        got = receiver.wait_for(3, 30)
    finally:
        receiver.stop()
    assert len(answers) == 7 and receiver.rejected == 0
    assert len({headers["webhook-id"] for headers, _ in got}) == 3  # one per chunk, each its own id
    sizes = sorted(len(payload["data"]["result"]) for _, payload in got)
    assert sizes == [1, 3, 3] and all(payload["type"] == "job.succeeded" for _, payload in got)


@pytest.mark.slow
def test_the_gateway_takes_a_callback_url_and_refuses_one_the_workers_would_refuse(
    hooked: tuple[dict[str, str], WorkerProcess, GatewayProcess]
) -> None:
    _, _, gateway = hooked
    receiver = Receiver().start()
    try:
        with httpx.Client(base_url=gateway.url, timeout=60) as http:
            queued = http.post("/jobs", json={"model_id": "spam", "input": "hooked", "callback_url": receiver.url})
            answered = http.post("/predict", json={"model_id": "spam", "input": "hooked too",
                                                   "callback_url": receiver.url})
            assert (queued.status_code, answered.status_code) == (202, 200), (queued.text, answered.text)
            got = {headers["webhook-id"]: payload for headers, payload in receiver.wait_for(2, 30)}
            assert queued.json()["job_id"] in got and answered.json()["job_id"] in got
            for url, says in [("http://10.0.0.1/hook", "is not in SWAPLESS_WEBHOOK_ALLOWED_HOSTS"),
                              ("ftp://127.0.0.1/hook", "http:// or https:// URL")]:
                for path in ("/jobs", "/predict"):
                    refused = http.post(path, json={"model_id": "spam", "input": "x", "callback_url": url})
                    assert refused.status_code == 422, refused.text
                    assert says in refused.json()["detail"] and "Traceback" not in refused.text
    finally:
        receiver.stop()
    assert receiver.rejected == 0 and len(receiver.received) == 2  # nothing of a refused job was sent
