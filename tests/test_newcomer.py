"""What a newcomer meets first: a Redis that is down, messages with brackets, a command run from elsewhere.

Each test here is one thing a new user hit when trying the project: it must be one clear line, fast, with the
URL named and its password never shown.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from swapless.config.errors import BackendUnavailable, QueueUnavailable
from swapless.config.settings import get_settings
from swapless.tasks.broker.connection import redact
from swapless.tasks.cli.common import fail
from swapless.tasks.client import Client
from tests.conftest import REPO
from tests.stack import free_port

#: Generous on purpose: the promise is "a few seconds" (one connect attempt and one retry, 3 s connect timeout
#: each); a command that hangs on Celery's reconnect loop takes 20 s or more. A refused connection is instant.
FEW_SECONDS = 10.0
SECRET = "s3cret-pw"


@pytest.fixture
def down_url() -> str:
    """A Redis URL with a password, on a port where nothing listens."""
    return f"redis://swapless:{SECRET}@127.0.0.1:{free_port()}/0"


def test_redact_hides_passwords_only() -> None:
    assert redact(f"redis://user:{SECRET}@h:6379/0") == "redis://user:***@h:6379/0"
    assert redact(f"rediss://:{SECRET}@h/2") == "rediss://:***@h/2"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact("redis+socket:///tmp/x/redis.sock") == "redis+socket:///tmp/x/redis.sock"


@pytest.mark.parametrize("call", ["submit", "submit_jobs", "submit_many", "fetch", "get", "gather"])
def test_client_raises_queue_unavailable_fast(down_url: str, models_file: Path, monkeypatch: pytest.MonkeyPatch,
                                              call: str) -> None:
    monkeypatch.setenv("SWAPLESS_MODELS_FILE", str(models_file))
    client = Client(down_url)
    started = time.monotonic()
    with pytest.raises(QueueUnavailable) as caught:
        if call == "submit":
            client.submit("sentiment", "hello")
        elif call == "submit_jobs":
            client.submit_jobs([("sentiment", "hello")])
        elif call == "submit_many":
            client.submit_many("sentiment", ["a", "b"])
        elif call == "fetch":
            client.fetch(["some-id"])
        elif call == "get":
            client.job("some-id").get(timeout=30)
        else:
            client.gather([client.job("some-id")], timeout=30)
    assert time.monotonic() - started < FEW_SECONDS
    assert isinstance(caught.value, BackendUnavailable)  # what code that retries on a backend outage catches
    message = str(caught.value)
    assert message.startswith("cannot reach Redis at redis://swapless:***@127.0.0.1:")
    assert "SWAPLESS_REDIS_URL" in message and SECRET not in message and "\n" not in message


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A Redis URL on a host that does not answer: a listening socket whose one-slot accept queue is full, so new
    connections get no reply (their SYNs are dropped) and time out, as behind a firewall, instead of being refused."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    held = [socket.create_connection(("127.0.0.1", port), timeout=1)]  # fills the queue; never accepted
    probe = socket.socket()
    probe.settimeout(0.5)
    try:
        probe.connect(("127.0.0.1", port))
        held.append(probe)  # a second slot on this kernel: fill it too
        late = socket.socket()
        late.settimeout(0.5)
        with pytest.raises(TimeoutError):
            late.connect(("127.0.0.1", port))
        late.close()
    except TimeoutError:
        probe.close()
    yield f"redis://swapless:{SECRET}@127.0.0.1:{port}/0"
    for sock in held:
        sock.close()
    listener.close()


def test_a_host_that_does_not_answer_is_queue_unavailable_after_the_connect_timeout(
    silent_url: str, models_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWAPLESS_MODELS_FILE", str(models_file))
    monkeypatch.setenv("SWAPLESS_CONNECT_TIMEOUT_S", "1")
    get_settings.cache_clear()
    client = Client(silent_url)
    started = time.monotonic()
    with pytest.raises(QueueUnavailable) as caught:
        client.submit("sentiment", "hello")
    took = time.monotonic() - started
    get_settings.cache_clear()
    # waited out the connect timeout, twice (not a refusal, which is instant), and then no longer
    assert 2 * 1.0 <= took < FEW_SECONDS, took
    message = str(caught.value)
    assert message.startswith("cannot reach Redis at redis://swapless:***@127.0.0.1:") and "Timeout" in message
    assert "SWAPLESS_CONNECT_TIMEOUT_S" in message and SECRET not in message and "\n" not in message


def test_submit_against_a_host_that_does_not_answer_says_one_line(silent_url: str, models_file: Path) -> None:
    import os

    env = {**os.environ, "SWAPLESS_REDIS_URL": silent_url, "SWAPLESS_MODELS_FILE": str(models_file),
           "SWAPLESS_CONNECT_TIMEOUT_S": "1"}
    done = _swapless("submit", "sentiment", "hello", env=env)
    assert done.returncode == 2, done
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: cannot reach Redis at redis://swapless:***@127.0.0.1:") and "Timeout" in line
    assert SECRET not in done.stderr + done.stdout


def _swapless(*args: str, env: dict[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "swapless", *args],
        cwd=REPO,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.mark.parametrize(
    "args",
    [
        ("submit", "sentiment", "hello"),
        ("submit", "sentiment", "hello", "--wait"),
        ("result", "some-id", "--wait", "5"),
        ("status",),
        ("status", "--json"),
    ],
    ids=" ".join,
)
def test_commands_say_one_line_when_redis_is_down(down_url: str, models_file: Path, args: tuple[str, ...]) -> None:
    import os

    env = {**os.environ, "SWAPLESS_REDIS_URL": down_url, "SWAPLESS_MODELS_FILE": str(models_file)}
    started = time.monotonic()
    done = _swapless(*args, env=env)
    assert time.monotonic() - started < FEW_SECONDS + 10  # plus the interpreter's start-up
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: cannot reach Redis at redis://swapless:***@127.0.0.1:"), lines[0]
    assert SECRET not in done.stderr + done.stdout and "Traceback" not in done.stderr


def test_bulk_stops_with_one_line_and_status_3_when_redis_is_down(down_url: str, models_file: Path,
                                                                 tmp_path: Path) -> None:
    import os

    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "a"}\n{"text": "b"}\n')
    env = {**os.environ, "SWAPLESS_REDIS_URL": down_url, "SWAPLESS_MODELS_FILE": str(models_file)}
    done = _swapless("bulk", "sentiment", str(source), "-o", str(tmp_path / "out.jsonl"), "--no-local",
                     "--progress", "none", env=env)
    assert done.returncode == 3, done
    assert "error: cannot reach Redis at redis://swapless:***@" in done.stderr
    assert SECRET not in done.stderr and "Traceback" not in done.stderr


def test_error_lines_keep_their_brackets(capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    with pytest.raises(typer.Exit):
        fail("the gateway needs uvicorn: pip install 'swapless[gateway]' [then retry]")
    assert "pip install 'swapless[gateway]' [then retry]" in capsys.readouterr().err


def test_every_cli_error_goes_through_the_escaping_error_line() -> None:
    """No command prints an error with rich markup of its own: brackets in a message would be eaten."""
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in (REPO / "tasks" / "cli").glob("*.py")
        if path.name != "common.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "[bold red]" in line
    ]
    assert not offenders, offenders


def test_serve_starts_on_a_plain_install() -> None:
    """The gateway's dependencies are part of the base install: `swapless serve` needs no extra."""
    import tomllib

    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {dep.split(">")[0].split("=")[0].split("[")[0].strip().lower() for dep in dependencies}
    assert {"fastapi", "uvicorn"} <= names
    probe = "import swapless.tasks.gateway, uvicorn; print(swapless.tasks.gateway.create_app.__name__)"
    assert subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip() == "create_app"


def test_the_benchmarks_need_no_test_tools() -> None:
    """``python -m bench.scheduler`` runs on the base install (plus the ``bench`` extra): no pytest, no tests/."""
    probe = (
        "import sys; sys.modules['pytest'] = None; sys.modules['tests'] = None; "
        "import random, bench.scheduler, bench.bulk, bench.gpu, bench.common as c; "
        "c.text_inputs(random.Random(0), 2); c.image_inputs(1); print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, check=False, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr
