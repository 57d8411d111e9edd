"""Local mode: with no SWAPLESS_REDIS_URL, `swapless bulk`, `submit` and `demo` start an embedded Redis and a real
worker, run through them, and leave no process behind, also when the command is killed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture
def local_env(models_file: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a user with no Redis configured: SWAPLESS_REDIS_URL (and the test prefixes) unset."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAPLESS_")}
    env.update({"SWAPLESS_MODELS_FILE": str(models_file), "SWAPLESS_DEVICE": "cpu", "XDG_CACHE_HOME": str(tmp_path)})
    yield env


class Cli:
    """A `swapless` command run as a subprocess, whose descendants are recorded while it runs."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tasks.cli", *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr
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
                if cmdline:
                    self.descendants.setdefault(child.pid, " ".join(cmdline))
            time.sleep(0.05)

    def finish(self, timeout_s: float = 180) -> tuple[int, str, str]:
        self.watch(time.monotonic() + timeout_s)
        stdout = self.proc.communicate(timeout=30)[0].decode()
        return self.proc.returncode, stdout, self.log.read_text()

    def assert_nothing_left(self, timeout_s: float = 15) -> None:
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
    assert any("tasks.cli" in cmd for cmd in cli.descendants.values()), cli.descendants
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


def test_demo_is_one_command(local_env: dict[str, str], tiny_models_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo.jsonl"
    cli = Cli(["demo", "-o", str(out), "--models-dir", str(tiny_models_dir)], local_env, tmp_path / "log")
    status, _, log = cli.finish()
    assert status == 0, log
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    sample = (REPO / "examples" / "reviews.jsonl").read_text().splitlines()
    assert len(lines) == len(sample) >= 200
    assert [line["key"] for line in lines] == [json.loads(row)["id"] for row in sample]
    assert "random weights: the labels mean nothing" in log
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
