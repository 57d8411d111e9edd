"""Plumbing for the fault-injection tests (tests/test_faults_delivery.py, test_faults_redis.py,
test_faults_input.py): the models and environment of a fault test, waiting on jobs and on the broker, tallying
each scenario's jobs, and publishing raw messages by hand.

Each scenario keeps a ``Scenario`` tally (submitted, succeeded, failed as expected, lost, conflicting, recovery
time); ``SCENARIOS`` collects them over the whole run, and ``print_table`` (called by ``pytest_terminal_summary``
in tests/conftest.py) prints one table of every scenario at the end.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import states

from swapless.config.settings import get_settings
from swapless.tasks.broker.connection import redis_client
from swapless.tasks.broker.results import StoredResult
from swapless.tasks.broker.sentinel import SentinelOptions, is_sentinel_url
from swapless.tasks.client import Client, Job
from swapless.tasks.keyspace import JobLists, Keyspace
from swapless.tasks.protocol import PREDICT_TASK
from tests.conftest import WorkerProcess
from tests.crashy import GATES_ENV, LOG_ENV, crashy_entry, executions

__all__ = [
    "PRESSURE",
    "SCENARIOS",
    "Expect",
    "FaultEnv",
    "Gate",
    "PressureRow",
    "Scenario",
    "echoes",
    "elsewhere_wrapper",
    "fails",
    "gate",
    "labels",
    "print_table",
    "publish_raw",
    "settle",
    "wait_for",
]

#: The heartbeat interval of fault-test workers: a dead worker's heartbeat is gone three intervals (3 s) after it
#: died, and its jobs go back to their lists then, well before the visibility timeout (the last resort).
HEARTBEAT_S = 1.0
#: The visibility timeout of fault-test workers (SWAPLESS_VISIBILITY_TIMEOUT_S) and its refresh.
VISIBILITY_TIMEOUT_S = 6
VISIBILITY_REFRESH_S = 1

#: The crashy models every fault test's models file lists.
CRASHY_MODELS = {
    "echo": "echo",
    "echo2": "echo",
    "hold": "echo",
    "broken": "broken",
    "oom": "oom",
    "unstorable": "unstorable",
}


def wait_for(
    predicate: Callable[[], Any],
    timeout_s: float,
    what: str,
    pause_s: float = 0.05,
    on_timeout: Callable[[], str] | None = None,
) -> float:
    """Poll ``predicate`` until it is true; return the monotonic time it became true.

    Raises:
        AssertionError: still false after ``timeout_s``, naming ``what``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            detail = f"\n{on_timeout()}" if on_timeout is not None else ""
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{detail}")
        time.sleep(pause_s)


def settle(client: Client, jobs: Sequence[Job], timeout_s: float) -> tuple[list[StoredResult], float]:
    """Wait until every job has a final state or ``timeout_s`` passes (never raises for a pending job).

    Returns:
        the states (PENDING ones are lost so far) and the monotonic time the last one became final (or now).
    """
    deadline = time.monotonic() + timeout_s
    ids = [job.id for job in jobs]
    while True:
        stored = client.fetch(ids)
        if all(s.ready for s in stored) or time.monotonic() > deadline:
            return stored, time.monotonic()
        time.sleep(0.05)


@dataclass(frozen=True)
class Expect:
    """What one job should end as: ``ok`` (SUCCESS) or not (FAILURE), and a check of the value."""

    ok: bool
    check: Callable[[Any], bool]
    describe: str

    def matches(self, stored: StoredResult) -> bool:
        return stored.state == (states.SUCCESS if self.ok else states.FAILURE) and bool(self.check(stored.value))


def echoes(text: str) -> Expect:
    """SUCCESS with the crashy echo of this very input (a result of another job would not match)."""
    return Expect(True, lambda value: isinstance(value, dict) and value.get("echo") == text, f"echo of {text!r}")


def labels() -> Expect:
    """SUCCESS with a list of ``{label, score}`` predictions (a real model)."""
    return Expect(
        True, lambda value: isinstance(value, list) and bool(value) and {"label", "score"} <= set(value[0]), "labels"
    )


def fails(error: type[BaseException], message: str | None = None, *, contains: str | None = None) -> Expect:
    """FAILURE with ``error`` (rebuilt client side) whose message is ``message`` or contains ``contains``."""

    def check(value: Any) -> bool:
        if not isinstance(value, error):
            return False
        return (message is None or str(value) == message) and (contains is None or contains in str(value))

    return Expect(False, check, f"{error.__name__}({message or contains!r})")


SCENARIOS: list[Scenario] = []


@dataclass
class Scenario:
    """One row of the fault table; registered on creation so that a failing test still reports its counts."""

    name: str
    submitted: int = 0
    succeeded: int = 0
    failed_expected: int = 0
    lost: int = 0
    conflicting: int = 0
    recovery_s: float | None = None
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        SCENARIOS.append(self)

    def count(self, stored: Sequence[StoredResult], expected: Sequence[Expect]) -> None:
        """Tally final states against expectations: lost = still pending; conflicting = final but not as expected."""
        assert len(stored) == len(expected)
        for result, expect in zip(stored, expected, strict=True):
            self.submitted += 1
            if not result.ready:
                self.lost += 1
                self.problems.append(f"{result.job_id}: lost (still {result.state}), expected {expect.describe}")
            elif expect.matches(result):
                if result.state == states.SUCCESS:
                    self.succeeded += 1
                else:
                    self.failed_expected += 1
            else:
                self.conflicting += 1
                self.problems.append(
                    f"{result.job_id}: expected {expect.describe}, got {result.state} "
                    f"{type(result.value).__name__}: {result.value!r}"
                )

    def assert_complete(self, broker: Callable[[], str] | None = None) -> None:
        """Every job reached the final state it should have: none lost, none conflicting.

        Args:
            broker: describes what the broker holds, added to the failure message.
        """
        if (self.lost, self.conflicting) != (0, 0):
            detail = "\n".join(self.problems[:20])
            if broker is not None:
                detail += "\nbroker now:\n" + broker()
            raise AssertionError(f"{self.name}: {self.lost} lost, {self.conflicting} conflicting\n{detail}")
        assert self.succeeded + self.failed_expected == self.submitted

    def row(self) -> str:
        recovery = "-" if self.recovery_s is None else f"{self.recovery_s:.1f} s"
        return (
            f"| {self.name} | {self.submitted} | {self.succeeded} | {self.failed_expected} | {self.lost} | "
            f"{self.conflicting} | {recovery} |"
        )


@dataclass
class PressureRow:
    """One Redis-under-memory-pressure scenario: what producers sent, what Redis took, what came back."""

    name: str
    submitted: int = 0
    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    answered: int = 0
    lost: int = 0
    recovery_s: float | None = None

    def __post_init__(self) -> None:
        PRESSURE.append(self)

    def row(self) -> str:
        refused = ", ".join(f"{n} {kind}" for kind, n in self.refused.items()) or "0"
        recovery = "-" if self.recovery_s is None else f"{self.recovery_s:.1f} s"
        return (
            f"| {self.name} | {self.submitted} | {self.accepted} | {refused} | {self.answered} | {self.lost} | "
            f"{recovery} |"
        )


#: Every memory-pressure scenario of the run, in order.
PRESSURE: list[PressureRow] = []


def rows() -> tuple[list[str], list[str]]:
    """The table rows of every delivery scenario and every memory-pressure scenario run so far in this process."""
    return [s.row() for s in SCENARIOS], [s.row() for s in PRESSURE]


def table(scenario_rows: list[str], pressure_rows: list[str]) -> str:
    """The markdown tables of these scenario rows (``rows``, of this process or of every test process)."""
    parts = []
    if scenario_rows:
        head = "| scenario | submitted | succeeded | failed as expected | lost | conflicting | recovery |\n"
        head += "|---|---|---|---|---|---|---|\n"
        parts.append(head + "\n".join(scenario_rows))
    if pressure_rows:
        head = "| Redis memory scenario | submitted | accepted | refused (error) | answered | lost | recovery |\n"
        head += "|---|---|---|---|---|---|---|\n"
        parts.append(head + "\n".join(pressure_rows))
    return "\n\n".join(parts)


def print_table(reporter: pytest.TerminalReporter, scenario_rows: list[str], pressure_rows: list[str]) -> None:
    """Print the table of these scenario rows (nothing if there are none); also write it to the file named by
    ``SWAPLESS_FAULTS_REPORT`` when that is set."""
    if not scenario_rows and not pressure_rows:
        return
    text = table(scenario_rows, pressure_rows)
    reporter.write_line("")
    for line in text.splitlines():
        reporter.write_line(line)
    report = os.environ.get("SWAPLESS_FAULTS_REPORT")
    if report:
        Path(report).write_text(text + "\n")


#: Names the host ``elsewhere``, then runs the command given (``os.execv``: the same process, the same pid).
_RENAME_HOST = "import os, socket, sys; socket.sethostname('elsewhere'); os.execv(sys.argv[1], sys.argv[1:])"


def elsewhere_wrapper() -> list[str]:
    """A command prefix that runs a worker as if on another machine: in its own UTS namespace, with its own host
    name. Workers on this machine then cannot tell from its pid that it died, only from its heartbeat.

    Skips the test (saying why) where unprivileged user namespaces are not available.
    """
    unshare = shutil.which("unshare")
    probe = [unshare, "--user", "--map-root-user", "--uts", "true"] if unshare else None
    if probe is None or subprocess.run(probe, check=False, capture_output=True).returncode != 0:
        pytest.skip("needs `unshare --user --uts` to run a worker as if on another machine")
    return [unshare, "--user", "--map-root-user", "--uts", sys.executable, "-c", _RENAME_HOST]  # type: ignore[list-item]


class FaultEnv:
    """The environment of one fault test: crashy models, an execution log, and the variables of its workers.

    Variables set with ``set`` apply to this process (the Client) and to every worker started afterwards.
    Gates (``gate``) that a test leaves closed are opened by ``end_test``.
    """

    def __init__(
        self,
        root: Path,
        base_env: dict[str, str],
        tiny_models_file: Path,
        start_worker: Callable[..., WorkerProcess],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        self.root = root
        self.base_env = base_env
        self.tiny_models_file = tiny_models_file
        self._start_worker = start_worker
        self._monkeypatch = monkeypatch
        self.exec_log = root / "executions.log"
        self.gates = root / "gates"
        self.gates.mkdir(parents=True, exist_ok=True)
        self.models_file = root / "fault-models" / "models.json"
        self.env: dict[str, str] = {}
        self.workers: list[WorkerProcess] = []
        self.write_models(real=False)
        self.set(
            SWAPLESS_PLUGINS="tests.crashy",
            SWAPLESS_MODELS_FILE=str(self.models_file),
            SWAPLESS_VISIBILITY_TIMEOUT_S=str(VISIBILITY_TIMEOUT_S),
            SWAPLESS_VISIBILITY_REFRESH_S=str(VISIBILITY_REFRESH_S),
            SWAPLESS_HEARTBEAT_INTERVAL_S=str(HEARTBEAT_S),
            **{LOG_ENV: str(self.exec_log), GATES_ENV: str(self.gates)},
        )

    @property
    def key_prefix(self) -> str:
        return self.base_env["SWAPLESS_KEY_PREFIX"]

    @property
    def queue(self) -> str:
        return self.base_env["SWAPLESS_QUEUE"]

    def set(self, **values: str) -> None:
        """Set variables for this process and for workers started from now on."""
        self.env.update(values)
        for name, value in values.items():
            self._monkeypatch.setenv(name, value)
        get_settings.cache_clear()

    def write_models(self, *, real: bool, extra: Sequence[dict[str, Any]] = ()) -> list[str]:
        """Write the models file: the crashy models, plus (``real``) the tiny real models and ``extra`` entries;
        returns the ids."""
        entries = [crashy_entry(model_id, behaviour) for model_id, behaviour in CRASHY_MODELS.items()]
        entries += list(extra)
        if real:
            tiny = json.loads(self.tiny_models_file.read_text())["models"]
            for entry in tiny:
                if entry.get("path"):
                    entry["path"] = str((self.tiny_models_file.parent / entry["path"]).resolve())
            entries += tiny
        self.models_file.parent.mkdir(parents=True, exist_ok=True)
        self.models_file.write_text(json.dumps({"models": entries}, indent=2))
        return [entry["id"] for entry in entries]

    def worker(
        self, *args: str, env: dict[str, str] | None = None, ready: bool = True, elsewhere: bool = False
    ) -> WorkerProcess:
        """Start a real ``swapless worker`` with this test's variables (plus ``env``); ``elsewhere``: as if on
        another machine (``elsewhere_wrapper``)."""
        wrapper = elsewhere_wrapper() if elsewhere else ()
        worker = self._start_worker(*args, env={**self.env, **(env or {})}, ready=ready, wrapper=wrapper)
        self.workers.append(worker)
        return worker

    def gate_text(self) -> str:
        """A new closed gate: the input ``gate:<name>`` that holds a crashy batch until ``open_gates`` (or
        ``Gate.open``). Its marker lets ``end_test`` open the gates a failing test left closed."""
        name = f"gate-{uuid.uuid4().hex[:8]}"
        (self.gates / f"{name}.closed").touch()
        return f"gate:{name}"

    def open_gates(self) -> None:
        """Open every gate a test made (a gate job still waiting then runs at once)."""
        for closed in self.gates.glob("*.closed"):
            closed.rename(closed.with_suffix(""))

    def end_test(self, timeout_s: float = 30.0) -> None:
        """After a test on a worker that later tests share: its gates open, nothing of it left in the broker."""
        self.open_gates()
        self.wait_broker_idle(timeout_s)

    def executions(self) -> Counter[str]:
        """How many times each input was run by a crashy model, over every worker process."""
        return Counter(text for _, _, text in executions(self.exec_log))

    def pids_of(self, text: str) -> list[int]:
        """The worker processes that ran ``text``, in order."""
        return [pid for pid, _, ran in executions(self.exec_log) if ran == text]

    def wait_executed(self, text: str, timeout_s: float = 30.0, times: int = 1) -> float:
        """Wait until a crashy model has started running ``text`` (``times`` times)."""
        return wait_for(lambda: self.executions()[text] >= times, timeout_s, f"{text!r} to run {times} time(s)")

    # -- the broker's view --------------------------------------------------------------------------------

    def broker(self) -> redis.Redis:
        url = os.environ.get("SWAPLESS_REDIS_URL") or self.base_env["SWAPLESS_REDIS_URL"]
        if is_sentinel_url(url):  # the primary the sentinels name now
            return redis_client(url, sentinel=SentinelOptions.of(get_settings()))
        return redis.Redis.from_url(url)

    def _job_lists(self) -> list[JobLists]:
        """The queue's one layout: every model's lists and records (of the models file), then the ingress's."""
        keyspace = Keyspace(self.queue, self.key_prefix)
        ids = [entry["id"] for entry in json.loads(self.models_file.read_text())["models"]]
        return [*(keyspace.model(model_id) for model_id in ids), keyspace.ingress_lists]

    def queued(self) -> int:
        """Messages waiting in the queue: every model's lists and the ingress, every priority level."""
        with self.broker() as client:
            return sum(int(client.llen(name)) for lists in self._job_lists() for name in lists.lists)

    def unacked(self) -> int:
        """Messages delivered to some worker and not yet acked (the held records of every set of lists)."""
        with self.broker() as client:
            return sum(int(client.hlen(lists.held)) for lists in self._job_lists())

    def held_by(self, worker_id: str) -> int:
        """Jobs that the records of every model say ``worker_id`` holds (fetched, not acked, not put back)."""
        with self.broker() as client:
            owners = [owner for lists in self._job_lists() for owner in client.hvals(lists.owner)]
        return sum(1 for owner in owners if owner.decode().rsplit("|", 1)[0] == worker_id)

    def worker_id(self, worker: WorkerProcess, timeout_s: float = 10.0) -> str:
        """The id a worker's heartbeat gives it (``hostname:pid``), once it has beaten."""
        from swapless.tasks.cluster.members import read_heartbeats

        def found() -> str | None:
            with self.broker() as client:
                beats = read_heartbeats(client, Keyspace(self.queue, self.key_prefix))
            return next((beat.worker_id for beat in beats if beat.pid == worker.proc.pid), None)

        wait_for(lambda: found() is not None, timeout_s, f"the heartbeat of worker {worker.proc.pid}")
        return found() or ""

    def _raw(self) -> list[tuple[str, dict[str, Any], float | None]]:
        """``(where, message, seconds since stamped)`` of every message the broker holds now."""
        found: list[tuple[str, dict[str, Any], float | None]] = []
        with self.broker() as client:
            for lists in self._job_lists():
                for name in lists.lists:
                    found += [(f"queued {name[-14:]!r}", json.loads(raw), None) for raw in client.lrange(name, 0, -1)]
                seen = dict(client.zrange(lists.seen, 0, -1, withscores=True))
                for tag, raw in client.hgetall(lists.held).items():
                    found.append(("unacked", json.loads(raw), time.time() - seen[tag] if tag in seen else None))
        return found

    def messages(self) -> list[tuple[str, str]]:
        """``(job id, where)`` of every message the broker holds now: ``queued`` or ``unacked``."""
        return [(message["headers"]["id"], where.split()[0]) for where, message, _ in self._raw()]

    def snapshot(self) -> str:
        """What the broker holds now, for failure messages: queued and unacked jobs (id, args, age of the stamp)."""
        lines = []
        for where, message, age in self._raw():
            place = where
            if where == "unacked":
                place += " (no index entry)" if age is None else f" (stamped {age:.1f} s ago)"
            lines.append(f"{place}: {_describe(message)}")
        return "\n".join(lines) or "(nothing queued or unacked)"

    def wait_broker_idle(self, timeout_s: float = 20.0) -> float:
        """Wait until no message is queued or held by a worker (twice in a row: a fetch is not atomic)."""

        def idle() -> bool:
            if self.queued() or self.unacked():
                return False
            time.sleep(0.2)
            return not (self.queued() or self.unacked())

        return wait_for(idle, timeout_s, "the broker to be idle (nothing queued or unacked)", on_timeout=self.snapshot)


def _describe(message: dict[str, Any]) -> str:
    try:
        body = json.loads(base64.b64decode(message["body"]))
        return f"{message['headers']['id']} args={body[0]!r}"
    except Exception as err:  # noqa: BLE001 - a diagnostic, never the failure itself
        return f"(undecodable: {err!r})"


def publish_raw(client: Client, body: bytes, content_type: str, task_id: str, content_encoding: str = "utf-8") -> None:
    """Publish a message to the jobs queue by hand, with Celery's protocol-2 headers for ``task_id`` and ``body``
    as the raw payload, exactly as a hostile or buggy producer could."""
    app = client.app
    message = app.amqp.as_task_v2(task_id, PREDICT_TASK, args=["echo", "raw"])
    queue = app.amqp.queues[client.settings.jobs.queue]
    with app.producer_or_acquire() as producer:
        producer.publish(
            body,
            exchange=queue.exchange,
            routing_key=queue.routing_key,
            declare=[queue],
            content_type=content_type,
            content_encoding=content_encoding,
            headers=message.headers,
            **message.properties,
        )


@dataclass
class Gate:
    """A ``hold`` job that keeps its worker busy until the test opens it (``open``), however long the test
    takes to send what must wait behind it: nothing is timed."""

    job: Job
    text: str
    path: Path

    @property
    def expect(self) -> Expect:
        """What the gate job ends as: the echo of its own input."""
        return echoes(self.text)

    def open(self) -> None:
        """Let the gate job's batch go (and so the jobs waiting behind it)."""
        closed = self.path.with_name(self.path.name + ".closed")
        if closed.exists():
            closed.rename(self.path)
        else:
            self.path.touch()


def gate(client: Client, faults: FaultEnv, model: str = "hold") -> Gate:
    """Keep the worker busy on ``model`` until ``Gate.open``: the jobs sent meanwhile wait in its backlog and are
    grouped into one batch per model. Returns once the gate job runs."""
    text = faults.gate_text()
    job = client.submit(model, text)
    faults.wait_executed(text)
    return Gate(job, text, faults.gates / text.split(":", 1)[1])
