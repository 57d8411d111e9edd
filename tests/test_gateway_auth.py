"""API keys on the gateway: the key syntax and its errors, what each path needs, the middleware over an app that
echoes what reached it, the access log, and a real `swapless serve` (with keys, and refusing to bind a
non-loopback host without them)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import SecretStr

from swapless.config.errors import ConfigError
from swapless.config.settings import Settings
from swapless.manager.registry.store import ModelStore
from swapless.tasks.gateway import create_app
from swapless.tasks.gateway.auth import Callers, Need, RedactKeyFilter
from swapless.tasks.gateway.keys import KeyRule, load_keys, parse_keys
from swapless.tasks.gateway.turns import Turns
from tests.fakes import write_fake_models
from tests.stack import GatewayProcess, free_port, listening_ports, private_env, run_cli, wait_for

FULL = "full-key-" + "f" * 24
LIMITED = "limited-key-" + "l" * 20
OTHER = "unknown-key-" + "u" * 20
MAX_BODY_BYTES = 4096


@pytest.fixture
def models_json(tmp_path: Path) -> Path:
    """Models with a UUID id and an alias, a plain id, and a route over two versions."""
    entries = [
        {"id": "550e8400-e29b-41d4-a716-446655440000", "aliases": ["sentiment"], "name": "a", "type": "text",
         "framework": "fake"},
        {"id": "spam", "name": "b", "type": "text", "framework": "fake"},
        {"id": "topic", "name": "c", "type": "text", "framework": "fake"},
        {"id": "tone-v1", "name": "d", "type": "text", "framework": "fake"},
        {"id": "tone-v2", "name": "e", "type": "text", "framework": "fake"},
        {"id": "tone", "route": {"tone-v1": 50, "tone-v2": 50}},
    ]
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": entries}))
    return path


@pytest.fixture
def store(models_json: Path) -> ModelStore:
    return ModelStore.from_file(models_json)


def settings_with(keys: str | None = None, keys_file: Path | None = None) -> Settings:
    return Settings(api_keys=SecretStr(keys) if keys is not None else None, api_keys_file=keys_file)


# -- the syntax ---------------------------------------------------------------------------------------------------


def test_entries_name_a_key_and_optionally_its_models() -> None:
    entries = parse_keys(f" {FULL} , {LIMITED}:sentiment|spam ,", "SWAPLESS_API_KEYS", per_line=False)
    assert [e.models for e in entries] == [None, ("sentiment", "spam")]
    assert [e.where for e in entries] == ["SWAPLESS_API_KEYS entry 1", "SWAPLESS_API_KEYS entry 2"]
    text = f"# the gateway's keys\n\n{FULL}   # ops\n  {LIMITED}:tone\n"
    assert [(e.models, e.where) for e in parse_keys(text, "keys.txt", per_line=True)] == [
        (None, "keys.txt line 3"), (("tone",), "keys.txt line 4")
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("short-key", ("SWAPLESS_API_KEYS entry 1: the key is 9 characters; use 16 to 512: make one with: python -c "
                       "'import secrets; print(secrets.token_urlsafe(32))'")),
        (f"{FULL},has space in it 0123456789", ("SWAPLESS_API_KEYS entry 2: an API key holds only letters, digits "
                                                "and - . _ ~ + / (= at the end), with no spaces; write KEY or "
                                                "KEY:MODEL|MODEL")),
        (f"{LIMITED}:", ("SWAPLESS_API_KEYS entry 1: after the ':' name the models the key may call, separated by |, "
                         "like KEY:sentiment|spam (or drop the ':' for every model)")),
        (f"{LIMITED}:spam||topic", "SWAPLESS_API_KEYS entry 1: after the ':' name the models"),
    ],
)
def test_a_malformed_entry_is_one_line_naming_it_never_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_keys(text, "SWAPLESS_API_KEYS", per_line=False)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
    for secret in ("short-key", "has space", LIMITED):
        assert secret not in str(caught.value)


def test_keys_are_kept_as_digests_and_models_resolved_to_their_ids(store: ModelStore, tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"# more keys\n{LIMITED}:sentiment|tone\n")
    settings = settings_with(FULL, keys_file)
    rules = load_keys(settings.gateway, store)
    assert [r.models for r in rules] == [None, frozenset({"550e8400-e29b-41d4-a716-446655440000", "tone"})]
    assert [r.names for r in rules] == [(), ("sentiment", "tone")]
    for shown in (repr(rules), repr(settings), settings.model_dump_json()):
        assert FULL not in shown and LIMITED not in shown
    limited = rules[1]
    assert limited.allows(store, "sentiment") and limited.allows(store, "550e8400-e29b-41d4-a716-446655440000")
    assert limited.allows(store, "tone") and not limited.allows(store, "tone-v1")  # the route, not its versions
    assert not limited.allows(store, "spam") and not limited.allows(store, "no-such-model")
    assert load_keys(settings_with().gateway, store) == [] and load_keys(settings_with("  ").gateway, store) == []


@pytest.mark.parametrize(
    ("keys", "file_text", "message"),
    [
        (f"{LIMITED}:sentimnt", None, ("SWAPLESS_API_KEYS entry 1: unknown model 'sentimnt' (known: "
                                       "550e8400-e29b-41d4-a716-446655440000, spam, tone, tone-v1, tone-v2, topic); "
                                       "name models of the models file")),
        (f"{FULL},{FULL}:spam", None, ("SWAPLESS_API_KEYS entry 2: the same key as SWAPLESS_API_KEYS entry 1: list "
                                       "each key once")),
        (" , ", None, "SWAPLESS_API_KEYS: it lists no key: write KEY or KEY:MODEL|MODEL, comma-separated, or unset it"),
        (None, "# only a comment\n", "lists no key: write one KEY or KEY:MODEL|MODEL per line, or unset the variable"),
        (FULL, f"{FULL}\n", "line 1: the same key as SWAPLESS_API_KEYS entry 1: list each key once"),
    ],
)
def test_a_bad_key_configuration_stops_the_gateway_with_one_line(
    store: ModelStore, tmp_path: Path, keys: str | None, file_text: str | None, message: str
) -> None:
    keys_file = None
    if file_text is not None:
        keys_file = tmp_path / "keys.txt"
        keys_file.write_text(file_text)
    with pytest.raises(ConfigError) as caught:
        load_keys(settings_with(keys, keys_file).gateway, store)
    assert message in str(caught.value)


def test_a_missing_keys_file_says_what_to_point_it_at(store: ModelStore, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_keys(settings_with(keys_file=tmp_path / "nope.txt").gateway, store)
    assert str(caught.value) == (f"SWAPLESS_API_KEYS_FILE: cannot read {tmp_path / 'nope.txt'} (No such file or "
                                 "directory): point it at a readable UTF-8 file of keys, one per line")


# -- the real app, its routes' declarations, and the middleware ---------------------------------------------------


@pytest.fixture
def guarded(models_json: Path, redis_url: str, key_prefix: str) -> Iterator[TestClient]:
    """The gateway's real app with a full key and one limited to sentiment and tone, on a private corner of Redis
    (no worker: jobs are queued, not run)."""
    settings = Settings(api_keys=SecretStr(f"{FULL},{LIMITED}:sentiment|tone"), redis_url=redis_url,
                        key_prefix=key_prefix, queue=key_prefix + "jobs", models_file=models_json,
                        gateway_max_body_bytes=MAX_BODY_BYTES)
    with TestClient(create_app(settings), base_url="http://localhost") as http:
        yield http


def call(http: TestClient, method: str, path: str, key: str | None = None, **kwargs: Any) -> httpx.Response:
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **kwargs.pop("headers", {})}
    return http.request(method, path, headers=headers, **kwargs)


@pytest.mark.parametrize(
    ("method", "path", "need"),
    [
        ("GET", "/healthz", Need.NOTHING),
        ("GET", "/v2", Need.NOTHING),
        ("GET", "/v2/health/ready", Need.NOTHING),
        ("GET", "/docs", Need.NOTHING),
        ("GET", "/openapi.json", Need.NOTHING),
        ("GET", "/", Need.NOTHING),
        ("POST", "/jobs", Need.KEY),
        ("POST", "/predict", Need.KEY),
        ("GET", "/jobs/abc-123", Need.KEY),
        ("DELETE", "/jobs/abc-123", Need.KEY),
        ("GET", "/models", Need.KEY),
        ("GET", "/status", Need.KEY),
        ("GET", "/status.json", Need.KEY),
        ("GET", "/metrics", Need.EVERY_MODEL),
        ("GET", "/v2/models/spam", Need.KEY),
        ("POST", "/v2/models/spam/infer", Need.KEY),
        ("POST", "/v2/models/tone/versions/2/infer", Need.KEY),
        ("POST", "/v2/repository/index", Need.EVERY_MODEL),
        ("POST", "/v2/repository/models/spam/load", Need.EVERY_MODEL),
        ("POST", "/models", Need.KEY),  # no such route: any key gets its 405
        ("GET", "/nowhere", Need.KEY),
    ],
)
def test_each_route_declares_what_it_needs(guarded: TestClient, method: str, path: str, need: Need) -> None:
    callers = next(m for m in guarded.app.user_middleware if m.cls is Callers)  # type: ignore[attr-defined]
    middleware = Callers(guarded.app, **callers.kwargs)  # type: ignore[arg-type]
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "query_string": b"", "headers": []}
    assert middleware._need(scope)[0] is need


def test_no_key_or_an_unknown_one_is_401_saying_what_to_send(guarded: TestClient) -> None:
    missing = call(guarded, "POST", "/jobs", json={"model_id": "spam", "input": "hi"})
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == 'Bearer realm="swapless"'
    assert missing.headers["connection"] == "close"  # the server reads no more of what the caller sends
    assert missing.json() == {"detail": "this gateway needs an API key: send the header 'Authorization: Bearer <key>'"}
    unknown = call(guarded, "GET", "/jobs/abc", OTHER)
    assert unknown.status_code == 401
    assert unknown.headers["www-authenticate"] == 'Bearer realm="swapless", error="invalid_token"'
    assert unknown.json() == {"detail": "this API key is not one the gateway accepts: send a key from its "
                                        "SWAPLESS_API_KEYS or SWAPLESS_API_KEYS_FILE as 'Authorization: Bearer <key>'"}
    basic = call(guarded, "GET", "/models", headers={"Authorization": f"Basic {FULL}"})
    assert basic.status_code == 401
    assert call(guarded, "GET", "/models", FULL[:-1]).status_code == 401
    assert call(guarded, "GET", "/models", headers={"Authorization": f"bearer  {FULL} "}).status_code == 200
    status = call(guarded, "GET", "/status")
    assert status.json()["detail"].endswith("'Authorization: Bearer <key>', or open /status?key=<key>")
    assert call(guarded, "POST", "/v2/models/spam/infer", OTHER).json() == {"error": unknown.json()["detail"]}


def test_health_checks_and_docs_stay_open(guarded: TestClient) -> None:
    assert call(guarded, "GET", "/healthz").status_code == 200
    assert call(guarded, "GET", "/v2/health/live").status_code == 200
    assert call(guarded, "GET", "/docs").status_code == 200


def test_a_limited_key_calls_its_models_only(guarded: TestClient) -> None:
    for model in ("sentiment", "550e8400-e29b-41d4-a716-446655440000", "tone"):
        answer = call(guarded, "POST", "/jobs", LIMITED, json={"model_id": model, "input": "hello"})
        assert answer.status_code == 202, (model, answer.text)
    other = call(guarded, "POST", "/jobs", LIMITED, json={"model_id": "spam", "input": "hi"})
    assert other.status_code == 403
    assert other.json() == {"detail": "this API key may call only the models sentiment, tone, not 'spam': use a key "
                                      "for 'spam'"}
    assert call(guarded, "POST", "/predict", LIMITED, json={"model_id": "tone-v1", "input": "hi"}).status_code == 403
    # the same name twice: json.loads keeps the last, and the check reads what the route reads
    twice = call(guarded, "POST", "/jobs", LIMITED,
                 content=b'{"model_id": "sentiment", "model_id": "spam", "input": "x"}',
                 headers={"content-type": "application/json"})
    assert twice.status_code == 403
    in_path = call(guarded, "POST", "/v2/models/spam/infer", LIMITED, content=b"{}")
    assert in_path.status_code == 403
    assert in_path.json() == {"error": "this API key may call only the models sentiment, tone, not 'spam': use a key "
                                       "for 'spam'"}
    assert call(guarded, "GET", "/v2/models/spam", LIMITED).status_code == 403
    assert call(guarded, "GET", "/v2/models/tone", LIMITED).status_code == 200
    every = call(guarded, "POST", "/v2/repository/index", LIMITED)
    assert every.status_code == 403
    assert every.json() == {"error": "this API key may call only the models sentiment, tone; POST "
                                     "/v2/repository/index needs a key for every model"}
    assert call(guarded, "POST", "/v2/repository/index", FULL, content=b"{}").status_code == 200
    for method, path in [("GET", "/models"), ("GET", "/status.json")]:
        assert call(guarded, method, path, LIMITED).status_code == 200, path


def test_the_body_limit_still_holds_for_a_limited_key(guarded: TestClient) -> None:
    big = [b'{"model_id": "sentiment", "input": "', b"a" * MAX_BODY_BYTES, b'"}']
    assert call(guarded, "POST", "/jobs", LIMITED, content=iter(big)).status_code == 413
    assert call(guarded, "POST", "/jobs", LIMITED, content=b"".join(big)).status_code == 413


def test_a_query_key_opens_the_status_paths_only_and_goes_no_further(guarded: TestClient) -> None:
    assert call(guarded, "GET", "/status", params={"key": LIMITED, "x": "1"}).status_code == 200
    assert call(guarded, "GET", "/status.json", params={"key": FULL}).status_code == 200
    assert call(guarded, "GET", "/status.json", params={"key": OTHER}).status_code == 401
    assert call(guarded, "GET", "/models", params={"key": FULL}).status_code == 401
    assert call(guarded, "GET", "/jobs/abc", params={"key": FULL}).status_code == 401
    assert (
        call(guarded, "POST", "/jobs", params={"key": FULL}, json={"model_id": "spam", "input": "x"}).status_code == 401
    )


def test_the_query_key_goes_no_further_than_the_check() -> None:
    seen: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["query_string"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    from swapless.tasks.gateway.keys import KeyRing

    rules = parse_keys(FULL, "SWAPLESS_API_KEYS", per_line=False)
    middleware = Callers(app, KeyRing([KeyRule(rules[0].digest, None)]), [], frozenset(), Turns(4, 10.0))
    scope = {"type": "http", "method": "GET", "path": "/status", "query_string": f"key={FULL}&x=1".encode(),
             "headers": []}
    taken = Callers._presented(scope, query_key=True)
    assert taken == FULL and scope["query_string"] == b"x=1" and middleware.keys.match(FULL) is not None
    assert seen == []


def test_the_openapi_schema_declares_the_bearer_keys(guarded: TestClient) -> None:
    schema = call(guarded, "GET", "/openapi.json").json()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "security" not in schema["paths"]["/healthz"]["get"]
    assert schema["paths"]["/models"]["get"]["security"] == [{"HTTPBearer": []}]
    assert schema["paths"]["/jobs"]["post"]["x-swapless-needs"] == "key"


def test_without_keys_every_caller_is_an_operator_known_by_its_address(models_json: Path, redis_url: str,
                                                                        key_prefix: str) -> None:
    settings = Settings(redis_url=redis_url, key_prefix=key_prefix, queue=key_prefix + "jobs", models_file=models_json)
    app = create_app(settings)
    assert app.state.api_keys_required is False
    with TestClient(app, base_url="http://localhost") as http:
        accepted = http.post("/jobs", json={"model_id": "spam", "input": "hi"})
        assert accepted.status_code == 202
        job_id = accepted.json()["job_id"]
        record = redis.Redis.from_url(redis_url).hgetall(f"{key_prefix}swapless-owner-{job_id}")
        assert record == {b"owner": b"addr:testclient"}


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        (f"/status?key={FULL}", "/status?key=***"),
        (f"/?x=1&key={FULL}&y=2", "/?x=1&key=***&y=2"),
        (f"/status?%6Bey={FULL}", "/status?key=***"),  # however the name is spelt
        ("/jobs/abc?monkey=1", "/jobs/abc?monkey=1"),
    ],
)
def test_the_access_log_shows_no_query_key(line: str, shown: str) -> None:
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5000", "GET", line, "1.1", 200), None)
    assert RedactKeyFilter().filter(record)
    assert record.getMessage() == f'127.0.0.1:5000 - "GET {shown} HTTP/1.1" 200'


# -- a real `swapless serve` ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "gateway.example"])  # a name may resolve to any address
def test_serve_without_keys_refuses_a_non_loopback_host(tmp_path: Path, redis_url: str, host: str) -> None:
    with private_env(redis_url, write_fake_models(tmp_path, {"spam": 1})) as env:
        done = run_cli("serve", "--host", host, "--port", str(free_port()), env=env, timeout_s=30)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        (f"error: no API key is configured, so the gateway listens on a loopback address only, not {host}: set "
         "SWAPLESS_API_KEYS (or SWAPLESS_API_KEYS_FILE), or pass --insecure-no-auth to serve it open")
    ]


@pytest.mark.parametrize("where", ["SWAPLESS_API_KEYS", "SWAPLESS_API_KEYS_FILE"])
def test_serve_with_a_malformed_key_setting_exits_2_with_one_line_never_the_key(tmp_path: Path, where: str) -> None:
    secret = "not a key 0123456789"  # a space: no key can hold one
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"# the gateway's keys\n{FULL}\n{secret}\n")
    setting = {where: secret if where == "SWAPLESS_API_KEYS" else str(keys_file)}
    env = {"SWAPLESS_REDIS_URL": "redis://127.0.0.1:1/0",  # never reached: the keys are checked first
           "SWAPLESS_MODELS_FILE": str(write_fake_models(tmp_path, {"spam": 1})), "SWAPLESS_API_KEYS": "",
           "SWAPLESS_API_KEYS_FILE": "", **setting}
    done = run_cli("serve", "--port", str(free_port()), env=env, timeout_s=30)
    assert done.returncode == 2
    named = "SWAPLESS_API_KEYS entry 1" if where == "SWAPLESS_API_KEYS" else f"{keys_file} line 3"
    assert done.stderr.strip().splitlines() == [
        (
            f"error: {named}: an API key holds only letters, digits and - . _ ~ + / (= at the end), with no spaces; "
            "write KEY or KEY:MODEL|MODEL; make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    ]
    assert secret not in done.stderr + done.stdout and FULL not in done.stderr + done.stdout


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    yield started
    for gateway in started:
        gateway.stop()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["--insecure-no-auth", "SWAPLESS_GATEWAY_INSECURE_NO_AUTH", "SWAPLESS_API_KEYS"])
def test_serve_binds_a_non_loopback_host_when_told_or_with_keys(
    how: str, tmp_path: Path, redis_url: str, models_file: Path, gateways: list[GatewayProcess]
) -> None:
    extra = {"SWAPLESS_GATEWAY_INSECURE_NO_AUTH": "true"} if how.startswith("SWAPLESS_GATEWAY") else {}
    if how == "SWAPLESS_API_KEYS":
        extra = {how: FULL}
    with private_env(redis_url, models_file, **extra) as env:
        gateway = GatewayProcess(
            env, tmp_path / "gw.log", "--host", "0.0.0.0", *([how] if how.startswith("--") else [])
        )
        gateways.append(gateway)
        gateway.wait_ready()
    assert ("0.0.0.0", gateway.port) in listening_ports(gateway.proc.pid)
    models = httpx.get(gateway.url + "/models", timeout=10)
    assert models.status_code == (401 if how == "SWAPLESS_API_KEYS" else 200)


@pytest.mark.slow
def test_a_real_gateway_with_keys(
    tmp_path: Path, redis_url: str, models_file: Path, gateways: list[GatewayProcess]
) -> None:
    """Against `swapless serve` (no worker: jobs are queued, not run), its access log at info level."""
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"# the gateway's keys\n{LIMITED}:sentiment|spam\n")
    with private_env(redis_url, models_file, SWAPLESS_API_KEYS=FULL, SWAPLESS_API_KEYS_FILE=str(keys_file)) as env:
        gateway = GatewayProcess(env, tmp_path / "gw.log", "--log-level", "info")
        gateways.append(gateway)
        gateway.wait_ready()
        with httpx.Client(base_url=gateway.url, timeout=30) as http:
            def with_key(key: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {key}"}

            assert http.get("/healthz").status_code == 200
            assert http.get("/v2/health/live").status_code == 200
            assert http.get("/v2").status_code == 200
            assert http.post("/jobs", json={"model_id": "spam", "input": "hi"}).status_code == 401
            # keys that are no keys of the gateway's: refused, and never written to its log
            assert (
                http.post("/jobs", json={"model_id": "spam", "input": "hi"}, headers=with_key(OTHER)).status_code == 401
            )
            assert http.get("/status.json", params={"key": OTHER + "-query"}).status_code == 401
            accepted = http.post("/jobs", json={"model_id": "spam", "input": "hi"}, headers=with_key(LIMITED))
            assert accepted.status_code == 202
            job_id = accepted.json()["job_id"]
            assert http.get(f"/jobs/{job_id}", headers=with_key(LIMITED)).json()["state"] == "PENDING"
            assert http.get(f"/jobs/{job_id}").status_code == 401
            # the body reaches the gateway's own checks untouched
            invalid = http.post("/jobs", json={"model_id": "spam", "input": 5}, headers=with_key(LIMITED))
            assert invalid.status_code == 422 and invalid.json()["detail"][0]["loc"] == ["body", "input"]
            assert (
                http.post("/predict", json={"model_id": "topic", "input": "hi"}, headers=with_key(LIMITED)).status_code
                == 403
            )
            assert (
                http.post("/jobs", json={"model_id": "topic", "input": "hi"}, headers=with_key(FULL)).status_code == 202
            )
            assert http.get("/v2/models/topic", headers=with_key(LIMITED)).status_code == 403
            assert http.get("/v2/models/spam", headers=with_key(LIMITED)).status_code == 200
            assert http.get("/status.json", params={"key": LIMITED}).status_code == 200
            assert http.get("/", params={"key": FULL}).headers["location"] == f"status?key={FULL}"
            assert http.delete(f"/jobs/{job_id}", headers=with_key(LIMITED)).json()["status"] == "cancelled"
            schema = http.get("/openapi.json").json()
            assert "HTTPBearer" in schema["components"]["securitySchemes"]

    def logged() -> str | None:
        log = gateway.log()
        return log if f'"DELETE /jobs/{job_id} HTTP/1.1" 200' in log else None

    log = wait_for(logged, 10, what="the access log line of the last request")
    assert '"GET /status.json HTTP/1.1" 200' in log and '"GET /?key=*** HTTP/1.1" 307' in log
    assert FULL not in log and LIMITED not in log
    assert OTHER not in log and '"GET /status.json HTTP/1.1" 401' in log  # the refused key's request, logged bare


def test_the_status_shows_a_limited_key_its_own_batches_and_no_one_s_callback_urls(
    guarded: TestClient, redis_url: str, key_prefix: str
) -> None:
    """Two tenants' batches and a failed webhook with a token in its URL: a key that is no operator's sees its own
    batch only and the webhooks' counts; the operator's key sees every batch and the URLs without their query."""
    import hashlib

    from swapless.tasks.gateway.batches.state import BatchStore
    from swapless.tasks.keyspace import Keyspace
    from swapless.tasks.webhooks import WebhookDelivery

    def owner(key: str) -> str:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:32]

    r = redis.Redis.from_url(redis_url)
    keys = Keyspace(key_prefix + "jobs", key_prefix)
    store = BatchStore(r, keys)
    store.create("batch_mine", {"owner": owner(LIMITED), "total": 3, "expires_at": int(time.time()) + 60})
    store.create("batch_theirs", {"owner": owner(FULL), "total": 9, "expires_at": int(time.time()) + 60})
    failed = WebhookDelivery("job-1", "https://hooks.example/done?token=s3cret", "{}", attempts=3, last_error="502",
                      failed_at=time.time())
    r.lpush(keys.webhooks_failed, failed.encode())

    limited = call(guarded, "GET", "/status.json", LIMITED).json()
    assert [b["id"] for b in limited["batches"]["batches"]] == ["batch_mine"] and limited["batches"]["active"] == 1
    assert limited["webhooks"]["failed"] == 1 and limited["webhooks"]["recent_failed"] == []
    full = call(guarded, "GET", "/status.json", FULL).json()
    assert sorted(b["id"] for b in full["batches"]["batches"]) == ["batch_mine", "batch_theirs"]
    assert [d["url"] for d in full["webhooks"]["recent_failed"]] == ["https://hooks.example/done?…"]
    assert "s3cret" not in json.dumps(full) and "owner" not in json.dumps(full["batches"])
    r.close()


def test_each_key_lists_its_own_batch_records_and_is_held_to_its_quotas(
    models_json: Path, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """Two tenants on one gateway with small quotas (no runner: batches stay active): each key's listing reads its
    own index; a third file, a file past the key's bytes and a second active batch are refused 429 / 413 naming the
    setting, in OpenAI's error shape; the other key is not affected."""
    other = "second-key-" + "s" * 21
    settings = Settings(api_keys=SecretStr(f"{FULL},{LIMITED}:spam,{other}:spam"), redis_url=redis_url,
                        key_prefix=key_prefix, queue=key_prefix + "jobs", models_file=models_json,
                        batch_files_url=str(tmp_path / "files"), batch_runner=False, batch_max_files_per_key=2,
                        batch_max_bytes_per_key=4096, batch_max_active_per_key=1)
    def lines(count: int) -> str:
        return "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/predict",
                                   "body": {"model_id": "spam", "input": "x"}}) + "\n" for i in range(count))

    line = lines(1)

    def upload(http: TestClient, key: str, text: str) -> httpx.Response:
        return call(http, "POST", "/v1/files", key, data={"purpose": "batch"},
                    files={"file": ("in.jsonl", text.encode(), "application/jsonl")})

    with TestClient(create_app(settings), base_url="http://localhost") as http:
        first, second = upload(http, LIMITED, line), upload(http, LIMITED, lines(2))
        assert first.status_code == second.status_code == 200
        third = upload(http, LIMITED, line)
        assert third.status_code == 429
        assert third.json()["error"]["message"] == (
            "this API key keeps 2 files, its limit (SWAPLESS_BATCH_MAX_FILES_PER_KEY): delete some, or wait for them "
            "to end and expire, then send again")
        theirs = upload(http, other, line)
        assert theirs.status_code == 200  # the quota is per key
        listed = call(http, "GET", "/v1/files", LIMITED).json()["data"]  # newest first: here, the same second
        assert {f["id"] for f in listed} == {second.json()["id"], first.json()["id"]} and len(listed) == 2
        assert [f["id"] for f in call(http, "GET", "/v1/files", other).json()["data"]] == [theirs.json()["id"]]
        assert call(http, "DELETE", f"/v1/files/{second.json()['id']}", LIMITED).status_code == 200
        big = upload(http, LIMITED, lines(60))  # ~5.6 KB: past the 4,096 bytes the key may keep
        assert big.status_code == 413 and "SWAPLESS_BATCH_MAX_BYTES_PER_KEY" in big.json()["error"]["message"]

        create = {"input_file_id": first.json()["id"], "endpoint": "/predict", "completion_window": "1h"}
        made = call(http, "POST", "/v1/batches", LIMITED, json=create)
        assert made.status_code == 200
        again = call(http, "POST", "/v1/batches", LIMITED, json=create)
        assert again.status_code == 429 and "SWAPLESS_BATCH_MAX_ACTIVE_PER_KEY" in again.json()["error"]["message"]
        assert [b["id"] for b in call(http, "GET", "/v1/batches", LIMITED).json()["data"]] == [made.json()["id"]]
        assert call(http, "GET", "/v1/batches", other).json()["data"] == []
        everyone = call(http, "GET", "/v1/files", FULL).json()["data"]  # an operator's key sees every file
        assert {f["id"] for f in everyone} == {first.json()["id"], theirs.json()["id"]}
