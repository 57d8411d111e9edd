"""Local mode: with no SWAPLESS_REDIS_URL, `swapless bulk`, `submit` and `demo` start an embedded Redis and a real
worker, run through them, and leave no process behind, also when the command is killed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from tests.conftest import REPO
from tests.webhook_receiver import SECRET, Receiver

pytestmark = [pytest.mark.slow, pytest.mark.images]


@pytest.fixture
def local_env(models_file: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a user with no Redis configured: SWAPLESS_REDIS_URL (and the test prefixes) unset."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAPLESS_")}
    env.update({"SWAPLESS_MODELS_FILE": str(models_file), "SWAPLESS_DEVICE": "cpu", "XDG_CACHE_HOME": str(tmp_path)})
    yield env


class Cli:
    """A `swapless` command run as a subprocess, whose descendants are recorded while it runs."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path, cwd: Path = REPO) -> None:
        self.log = log
        with log.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "swapless", *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=stderr
            )
        self.descendants: dict[int, str] = {}

    def watch(self, until: float) -> None:
        """Record the descendants (redis-server, the worker) until the command exits or ``until`` passes."""
        parent = psutil.Process(self.proc.pid)
        while self.proc.poll() is None and time.monotonic() < until:
            try:
                children = parent.children(recursive=True)
            except psutil.Error:
                children = []
            for child in children:
                try:  # one child starting or exiting (no cmdline yet, a zombie) must not hide the others
                    cmdline = child.cmdline()
                except psutil.Error:
                    continue
                if cmdline:  # the latest: a child seen between fork and exec still shows its parent's command line
                    self.descendants[child.pid] = " ".join(cmdline)
            time.sleep(0.05)

    def finish(self, timeout_s: float = 180) -> tuple[int, str, str]:
        self.watch(time.monotonic() + timeout_s)
        stdout = self.proc.communicate(timeout=30)[0].decode()
        return self.proc.returncode, stdout, self.log.read_text()

    def assert_nothing_left(self, timeout_s: float = 15) -> None:
        """The embedded redis-server and the worker were both seen while the command ran, and are gone now (with
        nothing recorded there would be nothing to find alive: the check would pass whatever was left)."""
        commands = list(self.descendants.values())
        assert any("redis-server" in cmd for cmd in commands), f"no redis-server recorded: {self.descendants}"
        assert any("swapless worker" in cmd for cmd in commands), f"no worker recorded: {self.descendants}"
        deadline = time.monotonic() + timeout_s
        alive = self.descendants
        while time.monotonic() < deadline:
            alive = {pid: cmd for pid, cmd in self.descendants.items() if _alive(pid)}
            if not alive:
                return
            time.sleep(0.1)
        raise AssertionError(f"left behind: {alive}")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_bulk_without_redis_runs_on_an_embedded_redis_and_cleans_up(local_env: dict[str, str], tmp_path: Path) -> None:
    source = tmp_path / "reviews.jsonl"
    source.write_text("".join(json.dumps({"text": f"a lovely film number {i}"}) + "\n" for i in range(120)))
    out = tmp_path / "out.jsonl"
    cli = Cli(["bulk", "sentiment", str(source), "-o", str(out), "--chunk-size", "32"], local_env, tmp_path / "log")
    status, _, log = cli.finish()
    assert status == 0, log
    assert "local mode: starting an embedded Redis and a worker" in log
    assert [json.loads(line)["key"] for line in out.read_text().splitlines()] == list(range(1, 121))
    assert any("redis-server" in cmd for cmd in cli.descendants.values()), cli.descendants
    assert any("-m swapless worker" in cmd for cmd in cli.descendants.values()), cli.descendants
    cli.assert_nothing_left()
    redis_cmd = next(cmd for cmd in cli.descendants.values() if "redis-server" in cmd)  # "... unixsocket:<path>"
    socket = Path(re.search(r"(/\S+/redis\.sock)", redis_cmd).group(1))  # type: ignore[union-attr]
    assert socket.parent.name.startswith("swapless-local-") and not socket.parent.exists(), "its temp dir is removed"


def test_killed_producer_takes_its_embedded_redis_and_worker_with_it(local_env: dict[str, str], tmp_path: Path) -> None:
    source = tmp_path / "many.jsonl"
    source.write_text("".join(json.dumps({"text": f"news item {i} about the economy"}) + "\n" for i in range(200000)))
    out = tmp_path / "out.jsonl"
    cli = Cli(["bulk", "topic", str(source), "-o", str(out), "--chunk-size", "50"], local_env, tmp_path / "log")
    deadline = time.monotonic() + 120
    while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
        cli.watch(time.monotonic() + 0.2)
    assert out.stat().st_size, cli.log.read_text()
    cli.proc.send_signal(signal.SIGKILL)
    cli.proc.communicate(timeout=10)
    assert len(cli.descendants) >= 2
    cli.assert_nothing_left()


def test_submit_without_redis_waits_and_prints_the_result(local_env: dict[str, str], tmp_path: Path) -> None:
    cli = Cli(["submit", "spam", "win a free prize now"], local_env, tmp_path / "log")
    status, stdout, log = cli.finish()
    assert status == 0, log
    payload = json.loads(stdout)
    assert {row["label"] for row in payload["result"]} == {"ham", "spam"}
    cli.assert_nothing_left()


def test_demo_is_one_command_from_an_installed_package(local_env: dict[str, str], tmp_path: Path) -> None:
    """``pip install .`` then ``swapless demo`` in any directory, one with its own ``tasks.py`` and ``config``
    package too: the sample ships in the package, and the demo's sentiment model has learnt its labels (``This movie
    is awful...`` comes back NEGATIVE)."""
    source = tmp_path / "source"  # a copy: building in the checkout would leave build/ there
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for part in ("src", "tasks", "manager", "config"):
        shutil.copytree(REPO / part, source / part, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(source)], check=True, capture_output=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "config").mkdir(parents=True)
    (elsewhere / "config" / "__init__.py").write_text("")  # a Django project's settings package
    (elsewhere / "tasks.py").write_text("from celery import Celery\n\napp = Celery('tasks')\n")  # Celery's tasks.py
    env = {**local_env, "PYTHONPATH": str(site)}
    env.pop("SWAPLESS_MODELS_FILE")
    probe = "import swapless, swapless.manager.demo.sample as s; print(swapless.__file__); print(s.SAMPLE_PATH)"
    where = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    assert all(path.startswith(str(site)) for path in where), where  # the installed copy, not the checkout
    cli = Cli(["demo", "-o", "demo.jsonl"], env, tmp_path / "log", cwd=elsewhere)
    status, _, log = cli.finish(timeout_s=300)
    assert status == 0, log
    from swapless.manager.demo.sample import read_sample

    sample = read_sample(site / "swapless" / "manager" / "demo" / "data" / "reviews.jsonl")
    lines = [json.loads(line) for line in (elsewhere / "demo.jsonl").read_text().splitlines()]
    assert [line["key"] for line in lines] == [row["id"] for row in sample] and len(lines) == 300
    top = [line["result"][0]["label"] for line in lines]
    assert sample[1]["text"].startswith("This movie is awful") and top[1] == "NEGATIVE"
    right = sum(label == row["label"] for label, row in zip(top, sample, strict=True)) / len(sample)
    assert right >= 0.95, right
    assert "model sentiment: tiny bert (2 layers) trained" in log and "not a real sentiment model" in log
    cli.assert_nothing_left()


def test_a_worker_that_cannot_start_is_reported_with_its_log(local_env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "models.json"  # the client accepts it (it does not check frameworks); the worker refuses it
    bad.write_text(json.dumps({"models": [{"id": "x", "name": "y", "type": "text", "framework": "onnx"}]}))
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "hello"}\n')
    env = {**local_env, "SWAPLESS_MODELS_FILE": str(bad)}
    cli = Cli(["bulk", "x", str(source), "-o", str(tmp_path / "out.jsonl")], env, tmp_path / "log")
    status, _, log = cli.finish()
    assert status == 3, log
    assert "local mode: the local worker exited with 2" in log
    assert "unknown framework 'onnx'" in log
    cli.assert_nothing_left()


def test_local_mode_reads_image_paths_next_to_the_input(local_env: dict[str, str], tmp_path: Path) -> None:
    import base64

    from tests.tinymodels import encode_image

    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(base64.b64decode(encode_image(1)))
    source = tmp_path / "images.csv"
    source.write_text("image\npics/a.png\n../elsewhere.png\n")
    out = tmp_path / "out.jsonl"
    cli = Cli(["bulk", "vision", str(source), "-o", str(out), "--field", "image"], local_env, tmp_path / "log")
    status, _, log = cli.finish()
    assert status == 1, log  # the second record is outside the input file's directory
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["ok"] and len(lines[0]["result"]) == 5
    assert not lines[1]["ok"] and "outside the input root" in lines[1]["error"]
    cli.assert_nothing_left()


def test_local_forces_local_mode_when_a_redis_url_is_set(local_env: dict[str, str], tmp_path: Path) -> None:
    env = {**local_env, "SWAPLESS_REDIS_URL": "redis://127.0.0.1:1/0"}  # nothing listens there
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": f"a fine day {i}"}) + "\n" for i in range(40)))
    out = tmp_path / "out.jsonl"
    cli = Cli(["bulk", "sentiment", str(source), "-o", str(out), "--local"], env, tmp_path / "log")
    status, _, log = cli.finish()
    assert status == 0, log
    assert "local mode: starting an embedded Redis and a worker (--local)" in log
    assert [json.loads(line)["key"] for line in out.read_text().splitlines()] == list(range(1, 41))
    cli.assert_nothing_left()


@pytest.mark.redis
def test_no_local_refuses_local_mode_and_uses_the_default_redis(local_env: dict[str, str], tmp_path: Path) -> None:
    """With no SWAPLESS_REDIS_URL, ``--no-local`` starts nothing and sends to redis://127.0.0.1:6379/0 (the
    worker's default): with no worker there, ``--timeout`` stops it. The built-in default is what is under test,
    so this test alone reaches that address whatever SWAPLESS_TEST_REDIS_HOST says (and is skipped where nothing
    answers there); its keys carry this test's own queue name and prefix, and are deleted afterwards."""
    tag = f"swapless-test-nolocal-{uuid.uuid4().hex[:10]}"
    env = {**local_env, "SWAPLESS_QUEUE": tag, "SWAPLESS_KEY_PREFIX": f"{tag}:"}
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": f"no worker {i}"}) + "\n" for i in range(10)))
    default = redis.Redis(host="127.0.0.1", port=6379, db=0, socket_connect_timeout=2)
    try:
        default.ping()
    except redis.ConnectionError:
        pytest.skip("no Redis answers at redis://127.0.0.1:6379/0, the built-in default under test")
    seen: set[bytes] = set()
    cli = Cli(["bulk", "sentiment", str(source), "-o", str(tmp_path / "out.jsonl"), "--no-local", "--timeout", "2",
               "--chunk-size", "5"], env, tmp_path / "log")
    try:
        deadline = time.monotonic() + 60
        while cli.proc.poll() is None and time.monotonic() < deadline:
            seen.update(default.scan_iter(match=f"*{tag}*"))  # the queue is emptied when the chunks are cancelled
            cli.watch(time.monotonic() + 0.1)
        cli.proc.communicate(timeout=30)
        status, log = cli.proc.returncode, cli.log.read_text()
        seen.update(default.scan_iter(match=f"*{tag}*"))
        assert status == 3, log
        assert "local mode" not in log and "has no result after 2 s" in log and "Traceback" not in log
        assert not cli.descendants, cli.descendants  # no embedded Redis, no worker
        assert seen, "nothing reached redis://127.0.0.1:6379/0"
    finally:
        left = list(default.scan_iter(match=f"*{tag}*"))
        if left:
            default.delete(*left)
        default.close()


def test_a_local_run_sends_one_signed_webhook_when_it_ends(local_env: dict[str, str], tmp_path: Path) -> None:
    receiver = Receiver().start()
    env = {**local_env, "SWAPLESS_WEBHOOK_SECRET": SECRET, "SWAPLESS_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1"}
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": f"a fine day {i}"}) + "\n" for i in range(30)) + '{"text": ""}\n')
    out = tmp_path / "out.jsonl"
    try:
        cli = Cli(["bulk", "sentiment", str(source), "-o", str(out), "--chunk-size", "8", "--allow-failures",
                   "--callback-url", receiver.url], env, tmp_path / "log")
        status, _, log = cli.finish()
        [(headers, payload)] = receiver.wait_for(1, 5)
    finally:
        receiver.stop()
    assert status == 0, log
    assert receiver.rejected == 0 and headers["webhook-id"].startswith("bulk-")
    assert f"bulk: the run's webhook ({headers['webhook-id']}) was delivered to {receiver.url}" in log
    assert payload["type"] == "bulk.completed"
    data = payload["data"]
    assert (data["model"], data["output"], data["records"], data["ok"], data["failed"]) == (
        "sentiment", str(out), 31, 30, 1)
    assert data["complete"] is True and data["stopped"] is None and data["this_run"] == 31
    cli.assert_nothing_left()


@pytest.mark.parametrize(
    ("url", "allowed", "says"),
    [("http://10.0.0.1/hook", "", "internal address (10.0.0.1)"),
     ("https://other.example/hook", "hooks.example", "'other.example' is not in SWAPLESS_WEBHOOK_ALLOWED_HOSTS")],
)
def test_a_callback_url_the_workers_would_refuse_stops_the_run_before_it_starts(
    local_env: dict[str, str], tmp_path: Path, url: str, allowed: str, says: str
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "never sent"}\n')
    done = subprocess.run(
        [sys.executable, "-m", "swapless", "bulk", "sentiment", str(source), "-o", str(tmp_path / "out.jsonl"),
         "--callback-url", url], cwd=REPO, env={**local_env, "SWAPLESS_WEBHOOK_ALLOWED_HOSTS": allowed},
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "local mode" not in done.stderr
    assert not (tmp_path / "out.jsonl").exists()
