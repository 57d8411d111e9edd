"""Bulk jobs: reading records, resuming outputs, image paths under the input root (fast, no Redis), and the bulk
path end to end through real `swapless worker` processes and the real Redis: `swapless bulk` as a user runs it,
interrupted with SIGINT and SIGKILL and resumed, and `Client.map` / `submit_many`."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from swapless.config.errors import BulkFileError, InputError, UnknownModel
from swapless.manager import InputType
from swapless.manager.frameworks.image_files import looks_like_path, read_image_file
from swapless.manager.frameworks.worker import ModelWorker, WorkerLimits
from swapless.manager.registry.specs import ModelSpec
from swapless.tasks.client import Client
from swapless.tasks.client.bulk import BulkJob, BulkRun, scan_output
from swapless.tasks.client.records import Record, RecordReader
from swapless.tasks.client.stream import ChunkEvent
from tests.conftest import REPO, WorkerProcess, Workers
from tests.faultkit import wait_for
from tests.tinymodels import encode_image

pytestmark = pytest.mark.images


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def keys_of(path: Path) -> list[Any]:
    return [json.loads(line)["key"] for line in path.read_text().splitlines()]


def texts(n: int) -> list[dict[str, str]]:
    return [{"id": f"k{i}", "text": f"review number {i} was great fun"} for i in range(n)]


# -- records, outputs and image files: no Redis --------------------------------------------------------------


def test_jsonl_records_carry_keys_and_per_record_errors(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "hi"}, "", "{oops", {"id": "c"}, 7, {"text": "x"}])
    reader = RecordReader(path, "sentiment", id_field="id")
    records = [r for r in reader.records() if r is not None]
    assert [(r.key, r.value) for r in records][:1] == [("a", "hi")]
    assert [r.key for r in records] == ["a", None, "c", None, None]  # the blank line is not a record
    messages = [str(r.error) for r in records[1:]]
    assert messages[0].startswith("bad input for model 'sentiment': line 3 is not valid JSON")
    assert messages[1] == "bad input for model 'sentiment': line 4 has no 'text' (--field; it has: id)"
    assert messages[2] == "bad input for model 'sentiment': line 5 is a number, not an object with 'text'"
    assert messages[3] == "bad input for model 'sentiment': line 6 has no 'id' (--id-field)"
    assert reader.estimate() == 6
    plain = RecordReader(write_jsonl(tmp_path / "s.jsonl", ['"just text"', '"more"']), "sentiment")
    assert list(plain.records()) == [Record(1, "just text"), Record(2, "more")]
    assert list(plain.records(parse_from=1)) == [None, Record(2, "more")]


def test_csv_records_and_header_checks(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text('name,review\nann,"good, really"\nbob,"two\nlines"\ncid,\n')
    records = list(RecordReader(path, "sentiment", field="review").records())
    assert records == [Record(2, "good, really"), Record(4, "two\nlines"), Record(5, "")]
    assert [r.key for r in RecordReader(path, "sentiment", field="review", id_field="name").records() if r] == [
        "ann",
        "bob",
        "cid",
    ]
    with pytest.raises(BulkFileError, match="no column 'text' \\(--field\\); the header has: name, review"):
        RecordReader(path, "sentiment")
    with pytest.raises(BulkFileError, match=r"unknown input format '\.txt'"):
        RecordReader(path.rename(tmp_path / "in.txt"), "sentiment")
    with pytest.raises(BulkFileError, match="no such input file"):
        RecordReader(tmp_path / "missing.jsonl", "sentiment")


def test_scan_output_counts_lines_and_cuts_a_partial_last_line(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    assert scan_output(out).records == 0
    out.write_bytes(b'{"ok":true,"key":"a","result":1}\n{"ok":false,"key":"b","error":"x","type":"InputError"}\n{"ok":tr')
    found = scan_output(out)
    assert (found.records, found.failed, found.last_key) == (2, 1, "b")
    assert out.read_bytes().endswith(b'"type":"InputError"}\n')
    out.write_text("not ours\n")
    with pytest.raises(BulkFileError, match="line 1 is not a bulk output line; use another --output, or --restart"):
        scan_output(out)


class _ImageWorker(ModelWorker):
    """The base class' input checks only (prepare_image_bytes), no framework."""

    def load(self) -> None: ...
    def unload(self) -> None: ...

    def predict(self, batch: Any) -> list[Any]:
        return list(batch)


def make_image_root(base: Path) -> Path:
    """``base/images``: an image, a file that is no image, and symlinks inside and out (to ``base/secret.png``)."""
    root = base / "images"
    (root / "cats").mkdir(parents=True)
    (root / "cats" / "one.png").write_bytes(base64.b64decode(encode_image(1)))
    (root / "notes.png").write_text("this is not an image")
    (base / "secret.png").write_bytes(base64.b64decode(encode_image(2)))
    (root / "escape.png").symlink_to(base / "secret.png")
    (root / "inside.png").symlink_to(root / "cats" / "one.png")
    return root


@pytest.fixture
def image_root(tmp_path: Path) -> Path:
    return make_image_root(tmp_path)


def test_image_paths_are_read_only_from_under_the_input_root(image_root: Path) -> None:
    spec = ModelSpec(id="vision", name="x", type=InputType.IMAGE, framework="none")
    worker = _ImageWorker(spec, WorkerLimits(input_root=str(image_root)))
    png = (image_root / "cats" / "one.png").read_bytes()
    assert worker.prepare_image_bytes("cats/one.png") == png
    assert worker.prepare_image_bytes(str(image_root / "cats" / "one.png")) == png
    assert worker.prepare_image_bytes("inside.png") == png  # a symlink that stays inside is fine
    assert worker.prepare_image_bytes(encode_image(1)) == png  # base64 still works
    refused = {
        "../secret.png": "is outside the input root",
        str(image_root.parent / "secret.png"): "is outside the input root",
        "escape.png": "is outside the input root",
        "notes.png": "'notes.png' is not an image file (PNG, JPEG, WebP, GIF or BMP)",
        "cats/none.png": "no file 'cats/none.png' under the input root",
        "cats/": "'cats/' is not a regular file",
    }
    for value, message in refused.items():
        with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
            worker.prepare_image_bytes(value)
        assert "secret" not in str(caught.value) or "secret" in value  # a symlink's target is never named
    small = _ImageWorker(spec, WorkerLimits(input_root=str(image_root), max_image_bytes=10))
    with pytest.raises(InputError, match="over the limit of 10 bytes"):
        small.prepare_image_bytes("cats/one.png")


def test_without_an_input_root_paths_are_refused_with_what_to_set(image_root: Path) -> None:
    worker = _ImageWorker(ModelSpec(id="vision", name="x", type=InputType.IMAGE, framework="none"))
    with pytest.raises(
        InputError, match="looks like a file path, but this worker reads no files: set SWAPLESS_INPUT_ROOT"
    ):
        worker.prepare_image_bytes(str(image_root / "cats" / "one.png"))
    with pytest.raises(InputError, match="image is not valid base64"):
        worker.prepare_image_bytes("hello there")  # plain text is not taken for a path
    assert not looks_like_path("hello there") and looks_like_path("a.jpg") and looks_like_path("dir/file")
    with pytest.raises(InputError, match="outside the input root"):
        read_image_file("vision", "/etc/passwd", str(image_root), 1000)


# -- end to end: real workers and Redis ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def module_image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``image_root`` for the module's worker (its SWAPLESS_INPUT_ROOT)."""
    return make_image_root(tmp_path_factory.mktemp("bulk-images"))


@pytest.fixture(scope="module")
def bulk_worker(module_workers: Workers, module_image_root: Path) -> WorkerProcess:
    """One real worker on the tiny models for the module's end-to-end tests (each reads only its own records),
    reading image paths from under ``module_image_root``."""
    return module_workers.start(env={"SWAPLESS_INPUT_ROOT": str(module_image_root)})


def run_cli(*args: str, timeout_s: float = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "swapless", *args],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
    )


def _default_sigint() -> None:
    # A suite started in the background by a non-interactive shell inherits SIGINT ignored, and Python then
    # installs no Ctrl-C handler: give the producer the disposition a terminal's Ctrl-C finds.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_bulk(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "swapless", "bulk", *args, "--progress", "log", "--log-every", "0.5"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=_default_sigint,  # noqa: PLW1509 - it only sets a signal disposition
        )


def wait_for_lines(path: Path, at_least: int, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= at_least:
            return
        assert proc.poll() is None, "the producer ended before it could be interrupted"
        time.sleep(0.02)
    raise AssertionError(f"fewer than {at_least} lines in {path} after {timeout_s} s")


@pytest.mark.slow
def test_bulk_keeps_order_and_keys_and_fails_bad_records_alone(bulk_worker: WorkerProcess, tmp_path: Path) -> None:
    rows: list[Any] = texts(300)
    rows[3] = {"id": "k3", "text": "   "}
    rows[10] = "{not json"
    rows[20] = {"id": "k20"}
    rows[150] = {"id": "k150", "text": 5}
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    done = run_cli("bulk", "sentiment", str(source), "-o", str(out), "--id-field", "id", "--chunk-size", "16")
    assert done.returncode == 1, done.stderr  # some records failed
    assert "300 records in" in done.stderr and "296 ok, 4 failed" in done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["key"] for line in lines] == [f"k{i}" if i != 10 else None for i in range(300)]
    failed = {i: line for i, line in enumerate(lines) if not line["ok"]}
    assert sorted(failed) == [3, 10, 20, 150]
    assert failed[3]["error"] == "bad input for model 'sentiment': empty text; send at least one non-blank character"
    assert failed[3]["type"] == "InputError"
    assert "line 11 is not valid JSON" in failed[10]["error"]
    assert "line 21 has no 'text'" in failed[20]["error"]
    assert failed[150]["error"].endswith("send a string, not a number")
    ok = [line for line in lines if line["ok"]]
    assert all({r["label"] for r in line["result"]} == {"POSITIVE", "NEGATIVE"} for line in ok)
    # Rerun: nothing left to do; --allow-failures turns the exit status to 0.
    again = run_cli("bulk", "sentiment", str(source), "-o", str(out), "--id-field", "id", "--allow-failures")
    assert again.returncode == 0, again.stderr
    assert "300 of them from an earlier run" in again.stderr and len(out.read_text().splitlines()) == 300


@pytest.mark.slow
def test_bulk_csv_keys_are_line_numbers_and_a_clean_run_exits_0(bulk_worker: WorkerProcess, tmp_path: Path) -> None:
    source = tmp_path / "in.csv"
    with source.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["review", "stars"])
        for i in range(40):
            writer.writerow([f"spam offer number {i}, call now", i % 5])
    out = tmp_path / "out.jsonl"
    done = run_cli("bulk", "spam", str(source), "-o", str(out), "--field", "review", "--chunk-size", "7")
    assert done.returncode == 0, done.stderr
    assert keys_of(out) == list(range(2, 42))
    assert "bulk: 40 records" in done.stderr and "(40 ok, 0 failed)" in done.stderr
    wrong = run_cli("bulk", "spam", str(source), "-o", str(out), "--field", "text")
    assert wrong.returncode == 2 and "no column 'text' (--field); the header has: review, stars" in wrong.stderr
    unknown = run_cli("bulk", "spm", str(source), "-o", str(tmp_path / "x.jsonl"), "--field", "review")
    assert unknown.returncode == 2 and "unknown model 'spm'" in unknown.stderr
    assert not (tmp_path / "x.jsonl").exists()
    other = write_jsonl(tmp_path / "other.jsonl", texts(50))
    mismatch = run_cli("bulk", "spam", str(other), "-o", str(out), "--id-field", "id")
    assert mismatch.returncode == 2
    assert "does not continue" in mismatch.stderr and "use another --output, or --restart" in mismatch.stderr


#: Records of the interrupted runs: CI's size, and the full size (``--full``) that gives the interrupt a long run
#: to land in.
INTERRUPTED = [pytest.param(1000, id="1000"), pytest.param(6000, id="6000", marks=pytest.mark.full)]


@pytest.mark.slow
@pytest.mark.parametrize("count", INTERRUPTED)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_an_interrupted_bulk_job_resumes_with_no_duplicates_and_no_gaps(
    bulk_worker: WorkerProcess, tmp_path: Path, sig: int, count: int
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", texts(count))
    out = tmp_path / "out.jsonl"
    args = ("sentiment", str(source), "-o", str(out), "--id-field", "id", "--chunk-size", "20", "--max-in-flight", "2")
    first = start_bulk(*args, log=tmp_path / "first.log")
    wait_for_lines(out, 200, first)
    first.send_signal(sig)
    status = first.wait(60)
    written = out.read_bytes()
    assert 200 <= written.count(b"\n") < count, "interrupted mid-run"
    if sig == signal.SIGINT:
        assert status == 130
        assert "interrupted; rerun the same command to resume" in (tmp_path / "first.log").read_text()
        assert written.endswith(b"\n"), "Ctrl-C leaves only complete lines"
    else:
        assert status == -signal.SIGKILL
        with out.open("ab") as file:  # as if killed in the middle of a write
            file.write(b'{"ok":true,"key":"k')
    second = run_cli("bulk", *args[:-2], "--max-in-flight", "8", "--chunk-size", "64")  # other sizes: still exact
    assert second.returncode == 0, second.stderr
    assert "from an earlier run" in second.stderr
    assert keys_of(out) == [f"k{i}" for i in range(count)]  # every record once, in order


@pytest.mark.slow
def test_chunks_in_flight_never_exceed_the_bound_and_nothing_is_left_in_redis(
    bulk_worker: WorkerProcess, tmp_path: Path, redis_url: str, module_env: dict[str, str]
) -> None:
    r = redis.Redis.from_url(redis_url)
    prefix = module_env["SWAPLESS_KEY_PREFIX"]
    before = {key.decode() for key in r.scan_iter(match=f"{prefix}*", count=1000)}  # earlier tests' keys
    events: list[ChunkEvent] = []
    source = write_jsonl(tmp_path / "in.jsonl", texts(400))
    job = BulkJob("topic", source, tmp_path / "out.jsonl", id_field="id", chunk_size=10, max_in_flight=3)
    summary = BulkRun(job, Client(), on_event=events.append).run()
    assert summary.complete and summary.records == 400 and summary.failed == 0
    sent = [e for e in events if e.kind == "sent"]
    assert len(sent) == 40 == summary.chunks_sent
    assert max(e.in_flight for e in events) == 3 == summary.max_in_flight_seen  # reached, never passed
    assert keys_of(tmp_path / "out.jsonl") == [f"k{i}" for i in range(400)]
    # Results are deleted once written and per-item bookkeeping ends with its chunk: Redis does not grow with the input.
    # bindings, heartbeats, the worker's claim on the model, what it learned of the model (kept for later workers)
    live = ("_kombu", ":swapless:worker", "}:holders", ":swapless:learned:")

    def left() -> list[str]:
        new = {key.decode() for key in r.scan_iter(match=f"{prefix}*", count=1000)} - before
        return sorted(key for key in new if not any(mark in key for mark in live))

    # the worker acks the last chunks a moment after storing their results (bulk acks): their records go then
    wait_for(lambda: not left(), 10, "this run's keys to go", on_timeout=lambda: str(left()))
    r.close()


@pytest.mark.slow
def test_map_reads_inputs_lazily_and_yields_in_order(bulk_worker: WorkerProcess) -> None:
    client = Client()
    pulled = 0

    def inputs() -> Iterator[str]:
        nonlocal pulled
        for i in range(500):
            pulled += 1
            yield "" if i == 7 else f"message {i} free prize"

    chunk_size, max_in_flight = 16, 4
    results = []
    for i, value in enumerate(
        client.map("spam", inputs(), chunk_size=chunk_size, max_in_flight=max_in_flight, return_exceptions=True)
    ):
        # Never more than the chunks in flight are read ahead of what has been yielded.
        assert pulled <= (i // chunk_size + max_in_flight) * chunk_size
        results.append(value)
    assert len(results) == 500
    assert isinstance(results[7], InputError) and "empty text" in str(results[7])
    assert all(isinstance(r, list) for i, r in enumerate(results) if i != 7)
    with pytest.raises(InputError, match="empty text"):
        list(client.map("spam", ["fine", "", "fine"]))
    with pytest.raises(UnknownModel, match="unknown model 'spm'"):
        list(Client(validate=False).map("spm", ["a", "b"]))


@pytest.mark.slow
def test_submit_many_sends_chunks_and_returns_one_job_per_input(bulk_worker: WorkerProcess) -> None:
    client = Client()
    jobs = client.submit_many("topic", [f"news {i} about the economy" for i in range(10)] + [" "], chunk_size=4)
    assert len(jobs) == 11 and len({job.id.rsplit(":", 1)[0] for job in jobs}) == 3  # three chunk messages
    states = client.gather(jobs, timeout=60)
    assert [s.state for s in states] == ["SUCCESS"] * 10 + ["FAILURE"]
    assert isinstance(states[10].value, InputError)
    looked_up = Client(validate=False).job(jobs[5].id)
    assert looked_up.get(timeout=5) == states[5].value
    shown = json.loads(run_cli("result", jobs[10].id).stdout)
    assert shown["state"] == "FAILURE" and shown["type"] == "InputError"


@pytest.mark.slow
def test_bulk_image_paths_under_the_input_root(
    bulk_worker: WorkerProcess, tmp_path: Path, module_image_root: Path
) -> None:
    image_root = module_image_root
    source = tmp_path / "images.csv"
    values = [
        "cats/one.png",
        str(image_root / "cats" / "one.png"),
        "../secret.png",
        "escape.png",
        "notes.png",
        encode_image(5),
    ]
    with source.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["name", "image"])
        writer.writerows([f"img{i}", value] for i, value in enumerate(values))
    out = tmp_path / "out.jsonl"
    done = run_cli("bulk", "vision", str(source), "-o", str(out), "--field", "image", "--id-field", "name")
    assert done.returncode == 1, done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["key"] for line in lines] == [f"img{i}" for i in range(6)]
    assert [line["ok"] for line in lines] == [True, True, False, False, False, True]
    assert lines[0]["result"] == lines[1]["result"] and len(lines[0]["result"]) == 5
    assert "outside the input root" in lines[2]["error"] and "outside the input root" in lines[3]["error"]
    assert "'notes.png' is not an image file" in lines[4]["error"]
    assert os.fspath(tmp_path / "secret.png") not in out.read_text()



# -- progress, --restart, --timeout, a lost Redis ------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_live_bar_on_a_terminal_and_plain_lines_otherwise() -> None:
    from swapless.tasks.client.progress import LogProgress, RichProgress, make_progress

    terminal = _Terminal()
    bar = make_progress(terminal)
    assert isinstance(bar, RichProgress)
    bar.start(100, 0, 0)
    bar.update(40, 2)
    bar.stop()
    shown = terminal.getvalue()
    assert "bulk" in shown and "40/100" in shown and "2 failed" in shown
    logged = io.StringIO()
    lines = make_progress(logged, interval_s=0.0)
    assert isinstance(lines, LogProgress)
    lines.start(100, 10, 1)
    lines.update(60, 3)
    lines.notice("the queue refused a chunk; sending it again")
    first, status, notice = logged.getvalue().splitlines()
    assert first == "bulk: starting, about 100 records, resuming after 10 records already in the output"
    # the rate and the time left depend on the clock: their form does not
    assert re.fullmatch(r"bulk: 60/100 records \(3 failed\), \d+ records/s, ETA (\?|\d+ s)", status), status
    assert notice == "bulk: the queue refused a chunk; sending it again"
    assert "\x1b[" not in logged.getvalue()  # no terminal codes in a log


@pytest.mark.slow
def test_the_command_draws_a_bar_on_a_terminal_and_no_log_lines(bulk_worker: WorkerProcess, tmp_path: Path) -> None:
    import pty

    source = write_jsonl(tmp_path / "in.jsonl", texts(60))
    out = tmp_path / "out.jsonl"
    master, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "swapless", "bulk", "topic", str(source), "-o", str(out),
                             "--id-field", "id", "--chunk-size", "10", "--no-local"],
                            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    shown = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the command exited and closed its end
            break
        if not data:
            break
        shown += data
    os.close(master)
    assert proc.wait(60) == 0, shown.decode(errors="replace")
    text = shown.decode(errors="replace")
    assert "60/60" in text and "\x1b[" in text, text  # a bar redrawn in place, with terminal codes
    assert "records (" not in text, text  # not the plain log lines of a pipe
    assert keys_of(out) == [f"k{i}" for i in range(60)]


@pytest.mark.slow
def test_restart_overwrites_the_output_and_timeout_stops_with_status_3(
    bulk_worker: WorkerProcess, tmp_path: Path, module_env: dict[str, str]
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", texts(30))
    out = tmp_path / "out.jsonl"
    # a queue no worker serves: nothing answers, and --timeout gives up, resumably, with one line
    unserved = {"SWAPLESS_QUEUE": module_env["SWAPLESS_KEY_PREFIX"] + "unserved"}
    stalled = run_cli("bulk", "topic", str(source), "-o", str(out), "--id-field", "id", "--chunk-size", "10",
                      "--timeout", "2", "--no-local", env=unserved)
    assert stalled.returncode == 3, stalled.stderr
    assert "has no result after 2 s" in stalled.stderr and "Traceback" not in stalled.stderr
    assert "rerun the same command to resume" in stalled.stderr
    first = run_cli("bulk", "topic", str(source), "-o", str(out), "--id-field", "id", "--no-local")
    assert first.returncode == 0, first.stderr
    assert keys_of(out) == [f"k{i}" for i in range(30)]
    out.write_text(out.read_text().replace('"ok":true', '"ok":true,"stale":1', 1))  # mark the old output
    again = run_cli("bulk", "topic", str(source), "-o", str(out), "--id-field", "id", "--restart", "--no-local")
    assert again.returncode == 0, again.stderr
    assert "from an earlier run" not in again.stderr and '"stale"' not in out.read_text()
    assert keys_of(out) == [f"k{i}" for i in range(30)]


@pytest.mark.slow
def test_a_bulk_job_that_loses_redis_midway_stops_with_status_3_and_resumes(
    faults: Any, private_redis: Callable[..., Any], tmp_path: Path
) -> None:
    server = private_redis()
    faults.set(SWAPLESS_REDIS_URL=server.url(0))
    faults.worker()
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"k{i}", "text": f"sleep:0.05:r{i}"} for i in range(400)])
    out = tmp_path / "out.jsonl"
    args = ("echo", str(source), "-o", str(out), "--id-field", "id", "--chunk-size", "10", "--max-in-flight", "2",
            "--no-local")
    log = tmp_path / "bulk.log"
    bulk = start_bulk(*args, log=log)
    wait_for_lines(out, 50, bulk)
    server.stop(signal.SIGKILL)
    killed_at = time.monotonic()
    assert bulk.wait(60) == 3
    # within a few connect timeouts (3 s each), not after the worker's minute of retried writes: the cancel of the
    # chunks in flight on the way out is a producer's write and gives up as quickly as the reads did
    assert time.monotonic() - killed_at < 20
    stderr = log.read_text()
    assert "cannot reach Redis at redis://127.0.0.1:" in stderr and "Traceback" not in stderr
    assert "rerun the same command to resume" in stderr
    written = len(out.read_text().splitlines())
    assert 50 <= written < 400
    server.start()
    resumed = run_cli(*("bulk", *args), timeout_s=180)
    assert resumed.returncode == 0, resumed.stderr
    assert keys_of(out) == [f"k{i}" for i in range(400)]
