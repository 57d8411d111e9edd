"""The live status page in a real browser: headless chromium loads ``/status`` from a real `swapless serve` (with
API keys) over a real worker and Redis, after known jobs, and the page shows what `swapless status` shows.

Chromium runs as a subprocess (``--dump-dom`` prints the page once its script has drawn it; ``--screenshot``);
without it on the machine these tests are skipped (CI's ``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from swapless.config.errors import InputError
from swapless.tasks.client import Client
from swapless.tasks.webhooks import WebhookDelivery, WebhookQueue
from tests.stack import Stack as GatewayStack
from tests.stack import run_cli, wait_for, worker_and_gateway

pytestmark = pytest.mark.slow

KEY = "status-page-key-" + "k" * 24
SPAM_ONLY = "spam-only-key-" + "s" * 24


@pytest.fixture(scope="module")
def chromium() -> str:
    """The chromium binary, or skip (before the module's worker and gateway start, when listed before ``stack``)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("chromium is not installed: apt-get install -y chromium (CI's .ci/run installs it)")


def browse(chromium: str, url: str, profile: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """Headless chromium on ``url``: its scripts run and its timers fire for 5 s of virtual time (fetches pause it,
    so the page's first reading is drawn), then ``flags`` (``--dump-dom``, ``--screenshot=...``) act."""
    argv = [chromium, "--headless", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--virtual-time-budget=5000", *flags, url]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")  # chromium's sandbox refuses to run as root (CI)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.parts).strip()

    def find_all(self, tag: str | None = None, **attrs: str) -> list[Node]:
        found = []
        for child in self.children:
            if (tag is None or child.tag == tag) and all(
                child.attrs.get(k.rstrip("_").replace("_", "-")) == v for k, v in attrs.items()
            ):
                found.append(child)
            found += child.find_all(tag, **attrs)
        return found

    def find(self, tag: str | None = None, **attrs: str) -> Node:
        found = self.find_all(tag, **attrs)
        assert found, f"no <{tag or '*'} {attrs}> under <{self.tag} {self.attrs}>"
        return found[0]


class _Tree(HTMLParser):
    VOID: ClassVar[frozenset[str]] = frozenset({"meta", "link", "br", "img", "input", "hr"})

    def __init__(self) -> None:
        super().__init__()
        self.root = Node("document", {})
        self.open = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.open[-1].children.append(node)
        if tag not in self.VOID:
            self.open.append(node)

    def handle_endtag(self, tag: str) -> None:
        while len(self.open) > 1:
            if self.open.pop().tag == tag:
                break

    def handle_data(self, data: str) -> None:
        for node in self.open[1:]:
            node.parts.append(data)


def parse(html: str) -> Node:
    tree = _Tree()
    tree.feed(html)
    return tree.root


@dataclass
class Stack(GatewayStack):
    hostname: str


def cells(row: Node) -> dict[str, str]:
    return {cell.attrs["data-col"]: cell.text for cell in row.find_all("td") if "data-col" in cell.attrs}


@pytest.fixture(scope="module")
def stack(redis_url: str, served_models_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A worker and a keyed gateway, after known jobs: 3 sentiment and 2 spam done, 1 failed (blank text, sent by a
    plain client: the gateway refuses it), 1 expired
    and 1 cancelled (sent while the worker was frozen)."""
    logs = tmp_path_factory.mktemp("status-page")
    extra = {"SWAPLESS_HEARTBEAT_INTERVAL_S": "0.5", "SWAPLESS_API_KEYS": f"{KEY},{SPAM_ONLY}:spam",
             "SWAPLESS_BATCH_FILES_URL": str(logs / "files")}
    with (
        worker_and_gateway(redis_url, served_models_file, logs, "page@%h", "--log-level", "info", **extra) as (
            env,
            worker,
            gateway,
        ),
        httpx.Client(base_url=gateway.url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as http,
    ):
        for model_id, text in [("sentiment", "a"), ("sentiment", "b"), ("sentiment", "c"), ("spam", "d"),
                               ("spam", "e")]:
            assert http.post("/predict", json={"model_id": model_id, "input": text}).status_code == 200
        assert http.post("/predict", json={"model_id": "sentiment", "input": "  "}).status_code == 422
        with pytest.raises(InputError):  # the gateway refuses it; a producer of its own reaches the worker
            Client().submit("sentiment", "  ").get(timeout=30)
        os.kill(worker.proc.pid, signal.SIGSTOP)
        try:
            late = http.post("/jobs", json={"model_id": "spam", "input": "late", "expires_s": 0.3}).json()
            dropped = http.post("/jobs", json={"model_id": "spam", "input": "dropped"}).json()
            assert http.delete(f"/jobs/{dropped['job_id']}").json()["status"] == "cancelled"
            time.sleep(0.6)
        finally:
            os.kill(worker.proc.pid, signal.SIGCONT)
        assert wait_for(lambda: http.get(f"/jobs/{late['job_id']}").json()["state"] == "FAILURE", 30,
                        what="the late job to expire")

        def settled() -> dict[str, Any] | None:
            [beat] = http.get("/status.json").json()["workers"] or [None]
            spam = (beat or {}).get("models", {}).get("spam", {})
            return beat if spam.get("jobs_expired") == 1 and spam.get("jobs_cancelled") == 1 else None

        beat = wait_for(settled, 30, what="a heartbeat with the expired and the cancelled job")
        yield Stack(env, worker, gateway, http, beat["hostname"])


def test_status_json_is_what_swapless_status_json_prints(stack: Stack) -> None:
    def counted() -> bool:  # the setup's last jobs are in the worker's heartbeat (sent every interval)
        beats = stack.http.get("/status.json").json()["workers"]
        return bool(beats) and (beats[0]["jobs_done"], beats[0]["jobs_failed"]) == (5, 2)

    wait_for(counted, 20, what="the heartbeat to count the setup's jobs")
    served = stack.http.get("/status.json")
    assert served.status_code == 200 and served.headers["cache-control"] == "no-store"
    done = run_cli("status", "--json", env=stack.env)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    data = served.json()
    assert sorted(data) == sorted(printed) == ["batches", "models", "now", "queue", "redis", "shadow",
                                                              "webhooks", "workers"]
    assert [m["model_id"] for m in data["models"]] == [m["model_id"] for m in printed["models"]]
    assert data["queue"] == printed["queue"]
    [beat], [printed_beat] = data["workers"], printed["workers"]
    for name in ("hostname", "worker_id", "jobs_done", "jobs_failed", "models", "loaded", "cache"):
        assert beat[name] == printed_beat[name], name
    assert beat["jobs_done"] == 5 and beat["jobs_failed"] == 2  # the blank text and the expired job
    assert sorted(beat["models"]) == ["sentiment", "spam"]
    assert stack.http.get("/status.json", headers={"Authorization": ""}).status_code == 401


def test_the_page_shows_the_workers_their_models_and_the_job_counts(
    chromium: str, stack: Stack, tmp_path: Path
) -> None:
    page = parse(browse(chromium, f"{stack.gateway.url}/status?key={KEY}", tmp_path / "profile", "--dump-dom").stdout)
    assert page.find(id="state").text == "live"
    cards = {
        card.attrs["data-card"]: card.find(class_="value").text for card in page.find_all() if "data-card" in card.attrs
    }
    assert cards["workers"] == "1"
    assert (cards["done"], cards["failed"], cards["expired"], cards["cancelled"]) == ("5", "2", "1", "1")
    assert cards["wait_p95"].endswith(" s") and cards["waiting"] == "0"
    worker = page.find("section", data_worker=stack.hostname)
    assert worker.find("h3").text == f"worker {stack.hostname}"
    assert "jobs 5 done, 2 failed" in worker.find(data_field="counts").text
    rows = {row.attrs["data-model"]: cells(row) for row in worker.find_all("tr") if "data-model" in row.attrs}
    assert sorted(rows) == ["sentiment", "spam"]
    sentiment, spam = rows["sentiment"], rows["spam"]
    assert sentiment["cache"].startswith("loaded") and sentiment["bytes"].endswith("MiB")
    assert (sentiment["done"], sentiment["failed"], sentiment["loads"], sentiment["misses"]) == ("3", "1", "1", "1")
    assert float(sentiment["load_last"]) > 0
    assert (spam["done"], spam["expired"], spam["cancelled"], spam["failed"]) == ("2", "1", "1", "1")
    placement = {row.attrs["data-model"]: cells(row) for row in page.find(id="placement").find_all("tr")
                 if "data-model" in row.attrs}
    assert stack.hostname in placement["sentiment"]["holders"]
    assert "Redis memory" in page.find(id="redis").text


def test_the_page_lists_a_webhook_the_worker_could_not_deliver(chromium: str, stack: Stack, tmp_path: Path) -> None:
    """A delivery queued as a job's result would queue it; this worker has no signing secret, so its sender keeps
    it as failed at once, and the page says so with what to run."""
    with Client() as client:
        WebhookQueue.of(client.redis, client.settings).enqueue(
            [WebhookDelivery("page-hook-job", "http://127.0.0.1:9/hook", "{}")])

    def failed() -> dict[str, Any] | None:
        hooks = stack.http.get("/status.json").json()["webhooks"]
        return hooks if hooks["failed"] and hooks["pending"] == 0 else None

    wait_for(failed, 30, what="the worker's sender to keep the delivery as failed")
    page = parse(browse(chromium, f"{stack.gateway.url}/status?key={KEY}", tmp_path / "profile", "--dump-dom").stdout)
    box = page.find(id="webhooks")
    assert box.find(data_field="webhooks").text == (
        "0 waiting to be delivered, 1 failed after their last retry (swapless webhooks --replay sends them again)")
    row = cells(box.find("tr", data_webhook="page-hook-job"))
    assert row["url"] == "http://127.0.0.1:9/hook" and row["attempts"] == "1"
    assert "SWAPLESS_WEBHOOK_SECRET is not set" in row["last_error"]


def test_the_page_and_swapless_status_list_a_batch_with_its_progress(
    chromium: str, stack: Stack, tmp_path: Path
) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=stack.gateway.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    source = tmp_path / "batch.jsonl"
    source.write_text("".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/predict",
                                          "body": {"model_id": "spam", "input": f"batch {i}"}}) + "\n"
                              for i in range(12)))
    with source.open("rb") as file:
        upload = client.files.create(file=file, purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/predict", completion_window="1h",
                                  metadata={"secret": "never on the page"})
    wait_for(lambda: client.batches.retrieve(batch.id).status == "completed", 60, what="the batch to complete")
    [listed] = [b for b in stack.http.get("/status.json").json()["batches"]["batches"] if b["id"] == batch.id]
    assert (listed["status"], listed["total"], listed["completed"], listed["failed"]) == ("completed", 12, 12, 0)
    assert "metadata" not in listed and "owner" not in listed
    page = parse(browse(chromium, f"{stack.gateway.url}/status?key={KEY}", tmp_path / "profile", "--dump-dom").stdout)
    row = cells(page.find(id="batches").find("tr", data_batch=batch.id))
    assert (row["status"], row["progress"], row["completed"], row["failed"]) == (
        "completed", "12/12 (100 %)", "12", "0")
    assert "never on the page" not in str(page.find(id="batches").text)
    printed = run_cli("status", env=stack.env)
    assert printed.returncode == 0, printed.stderr
    assert f"{batch.id}  completed  12/12 (12 completed, 0 failed)" in printed.stdout


def test_the_key_stays_out_of_the_logs_and_the_data_requests(chromium: str, stack: Stack, tmp_path: Path) -> None:
    """The page fetches its data with the key as a header (chromium's net log has every URL it asked for), and the
    gateway's access log never shows the key."""
    net_log = tmp_path / "net.json"
    # "/" redirects to the page
    browse(chromium, f"{stack.gateway.url}/?key={KEY}", tmp_path / "profile", "--dump-dom", f"--log-net-log={net_log}")
    urls = set(re.findall(r'"url":"([^"]*)"', net_log.read_text()))
    assert f"{stack.gateway.url}/status?key={KEY}" in urls and f"{stack.gateway.url}/status.json" in urls
    assert [url for url in urls if "status.json" in url] == [f"{stack.gateway.url}/status.json"]

    def logged() -> str | None:
        text = stack.gateway.log()
        return text if '"GET /?key=*** HTTP/1.1" 307' in text else None

    log = wait_for(logged, 10, what="the redirect's line in the access log, its key redacted")
    assert '"GET /status HTTP/1.1" 200' in log and '"GET /status.json HTTP/1.1" 200' in log
    assert KEY not in log and SPAM_ONLY not in log


def test_without_a_key_the_page_says_what_to_send(chromium: str, stack: Stack, tmp_path: Path) -> None:
    text = browse(chromium, f"{stack.gateway.url}/status", tmp_path / "profile", "--dump-dom").stdout
    assert "this gateway needs an API key" in text and "or open /status?key=&lt;key&gt;" in text
    wrong = browse(
        chromium, f"{stack.gateway.url}/status?key=not-a-key-0123456789", tmp_path / "profile", "--dump-dom"
    ).stdout
    assert "this API key is not one the gateway accepts" in wrong
    # any valid key reads the status, one limited to some models too
    limited = parse(
        browse(chromium, f"{stack.gateway.url}/status?key={SPAM_ONLY}", tmp_path / "profile", "--dump-dom").stdout
    )
    assert limited.find(id="state").text == "live"


def test_a_screenshot_of_the_page(chromium: str, stack: Stack, tmp_path: Path) -> None:
    shot = tmp_path / "status.png"
    browse(chromium, f"{stack.gateway.url}/status?key={KEY}", tmp_path / "profile", "--hide-scrollbars",
           "--window-size=1280,900", f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a drawn page, not a blank one
