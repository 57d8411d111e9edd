"""The pod deletion cost (``swapless.tasks.observe.podcost``): the removal rank as one integer, and a real worker
keeping its pod's annotation current over HTTPS, as in a cluster: its service account's token and CA, its pod from the
downward API. There is no Kubernetes API server here: the HTTPS server the worker writes to is a stand-in that checks
and records each write (the path, the token, a JSON merge patch of the one annotation), as the API server would
receive it."""

from __future__ import annotations

import http.server
import json
import logging
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bench.simulated import simulated_entry
from swapless.config.settings import Settings
from swapless.tasks.client import Client
from swapless.tasks.cluster.members import read_heartbeats
from swapless.tasks.keyspace import Keyspace
from swapless.tasks.observe.podcost import ANNOTATION, PodDeletionCost, deletion_cost
from swapless.tasks.observe.scaling import RemovalCost
from tests.conftest import WorkerProcess
from tests.faultkit import wait_for
from tests.tinymodels import write_models_file

TOKEN = "test-service-account-token"


def test_the_deletion_cost_orders_workers_as_the_removal_rank_does() -> None:
    costs = [
        RemovalCost((), 0.0, 0),
        RemovalCost(("bulk",), 2.0, 0),
        RemovalCost(("big",), 120.0, 0),  # loads weigh up to 99.9 s: a busy worker still costs more
        RemovalCost(("bulk",), 2.0, 300),
        RemovalCost(("chat",), 0.3, 0, ("chat",), 0.3),
        RemovalCost(("chat", "chat-2"), 2.3, 5, ("chat", "chat-2"), 2.3),
    ]
    assert sorted(costs, key=deletion_cost) == sorted(costs, key=lambda c: c.rank) == costs
    assert [deletion_cost(c) for c in costs] == [0, 20, 999, 1020, 6003, 47023]
    assert deletion_cost(RemovalCost(("x",), 1e9, 1, ("x",), 1e9)) == 2**31 - 1  # an int32


def test_without_its_pod_the_worker_says_what_is_missing_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "POD_NAME", "POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    client = redis.Redis()
    off = Settings(kubernetes_service_account_dir=tmp_path)
    assert PodDeletionCost.from_environment(off.scaling, client, Keyspace.of(off), "w") is None
    assert not caplog.records
    on = Settings(pod_deletion_cost=True, kubernetes_service_account_dir=tmp_path)
    with caplog.at_level(logging.WARNING):
        assert PodDeletionCost.from_environment(on.scaling, client, Keyspace.of(on), "w") is None
    [line] = [r.getMessage() for r in caplog.records]
    assert "KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT, POD_NAME, POD_NAMESPACE" in line
    assert str(tmp_path / "token") in line and "downward API" in line


class _StandIn(http.server.BaseHTTPRequestHandler):
    """Answers ``PATCH /api/v1/namespaces/<ns>/pods/<pod>`` as the API server would a valid one (200), after
    checking it; records the annotation's values."""

    writes: list[str]
    problems: list[str]

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        expected = ("/api/v1/namespaces/team-a/pods/swapless-worker-7d9f-x2", f"Bearer {TOKEN}",
                    "application/merge-patch+json")
        got = (self.path, self.headers.get("Authorization"), self.headers.get("Content-Type"))
        if got != expected or list(body) != ["metadata"] or list(body["metadata"]["annotations"]) != [ANNOTATION]:
            self.problems.append(f"{got} {body}")
            self.send_response(400)
        else:
            self.writes.append(body["metadata"]["annotations"][ANNOTATION])
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[tuple[int, Path, type[_StandIn]]]:
    """An HTTPS server with a certificate for 127.0.0.1 and the service account directory a pod would mount."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(account / "ca.crt")], check=True, capture_output=True)
    (account / "token").write_text(TOKEN + "\n")
    handler = type("Handler", (_StandIn,), {"writes": [], "problems": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(account / "ca.crt", tmp_path / "key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], account, handler
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_a_worker_keeps_its_pods_deletion_cost_current(
    api_server: tuple[int, Path, type[_StandIn]], swapless_env: dict[str, str],
    start_worker: Callable[..., WorkerProcess], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    port, account, handler = api_server
    models = write_models_file(tmp_path, [simulated_entry("chat", 0.3, 0.005, 0.0002)])
    monkeypatch.setenv("SWAPLESS_MODELS_FILE", str(models))
    worker = start_worker(env={
        "SWAPLESS_MODELS_FILE": str(models), "SWAPLESS_PLUGINS": "bench.simulated", "SWAPLESS_WARM_START": "false",
        "SWAPLESS_HEARTBEAT_INTERVAL_S": "0.5", "SWAPLESS_POD_DELETION_COST": "true",
        "SWAPLESS_POD_DELETION_COST_INTERVAL_S": "0.5", "SWAPLESS_KUBERNETES_SERVICE_ACCOUNT_DIR": str(account),
        "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port),
        "POD_NAME": "swapless-worker-7d9f-x2", "POD_NAMESPACE": "team-a",
    })
    wait_for(lambda: handler.writes, 20, "the worker's first write of its deletion cost")
    assert handler.writes[0] == "0"  # nothing loaded, nothing held: the cheapest to delete
    with Client() as client:
        assert client.submit("chat", "hello", priority="interactive").get(timeout=30)
    # chat is loaded on it alone, serving interactive traffic: its load (0.3 s: 3 tenths) weighs 2000 a tenth
    wait_for(lambda: handler.writes and int(handler.writes[-1]) >= 6000, 20,
             "the cost of the interactive model it alone holds")
    s = Settings()
    [beat] = read_heartbeats(redis.Redis.from_url(s.redis.broker_url), Keyspace.of(s))
    [chat] = beat.loaded
    assert chat.model_id == "chat" and chat.interactive
    assert handler.writes[-1] == str(deletion_cost(RemovalCost(("chat",), chat.load_s, 0, ("chat",), chat.load_s)))
    assert not handler.problems, handler.problems
    assert f"pod deletion cost now {handler.writes[-1]} (removing it: " in worker.log()
    assert "(chat interactive))" in worker.log() and "could not write" not in worker.log()
