"""Shared fixtures: a private corner of the real Redis, tiny real models, real worker processes; the fault table."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from tests.redis_server import RedisServer

if TYPE_CHECKING:
    from tests.faultkit import FaultEnv

from swapless.config.settings import Settings, get_settings

pytest_plugins = ["tests.tinymodels"]

REDIS_HOST = os.environ.get("SWAPLESS_TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("SWAPLESS_TEST_REDIS_PORT", "6379"))
#: The tests use this database number, and only keys under their own per-run prefix inside it.
REDIS_DB = int(os.environ.get("SWAPLESS_TEST_REDIS_DB", "11"))
REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full", action="store_true", default=False,
        help="also run the full-size variants (marked full: the 50,000-job soak, 6,000-record bulk interrupts)",
    )


#: The fixtures that start real worker processes: a test using one is ``slow``.
WORKER_FIXTURES = frozenset({"start_worker", "module_workers", "faults", "module_faults", "one_worker"})


#: The modules that take a test process longest, longest first: ``pytest -n`` hands them out first.
LONGEST_FIRST = (
    "test_batches", "test_bulk", "test_e2e", "test_faults_delivery", "test_warmup", "test_gateway_security",
    "test_bench_autoscale", "test_bench_device", "test_tracing", "test_webhooks", "test_docs", "test_residency",
    "test_triton", "test_longtail",
)


def _in_schedule_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """Whole modules, longest first: ``LONGEST_FIRST``, then those with slow tests (most first), then the rest."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def rank(path: str) -> tuple[int, int]:
        name = Path(path).stem
        if name in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(name)
        slow = sum(1 for item in modules[path] if item.get_closest_marker("slow") is not None)
        return (1, -slow) if slow else (2, -len(modules[path]))

    return [item for path in sorted(modules, key=rank) for item in modules[path]]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests ``redis`` (they use ``redis_url``) and ``slow`` (they use ``WORKER_FIXTURES``); deselect ``full``
    tests unless ``--full``; put the modules in ``_in_schedule_order``."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "redis_url" in fixtures:
            item.add_marker(pytest.mark.redis)
        if fixtures & WORKER_FIXTURES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    if not config.getoption("--full"):
        full = [item for item in items if item.get_closest_marker("full") is not None]
        if full:
            config.hook.pytest_deselected(items=full)
            items[:] = [item for item in items if item.get_closest_marker("full") is None]
    items[:] = _in_schedule_order(items)


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}"
    try:
        redis.Redis.from_url(url).ping()
    except redis.ConnectionError as err:  # pragma: no cover - CI starts Redis first
        pytest.fail(f"Redis is not reachable at {url} ({err}); start it with `redis-server --daemonize yes`")
    return url


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A fresh key prefix (and queue name) per test; the test's keys are deleted afterwards."""
    prefix = f"swapless-test-{uuid.uuid4().hex[:10]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture(scope="module")
def served_models_file(request: pytest.FixtureRequest, models_file: Path, text_models_file: Path) -> Path:
    """The module's models file: the tiny text models, plus the image model where the module is marked ``images``
    (a worker serving it imports torchvision)."""
    return models_file if request.node.get_closest_marker("images") else text_models_file


@pytest.fixture
def swapless_env(
    redis_url: str, key_prefix: str, served_models_file: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """This test's environment: its own queue and key prefix, the tiny models."""
    env = {
        "SWAPLESS_REDIS_URL": redis_url,
        "SWAPLESS_KEY_PREFIX": key_prefix,
        "SWAPLESS_QUEUE": key_prefix + "jobs",
        "SWAPLESS_MODELS_FILE": str(served_models_file),
        "SWAPLESS_DEVICE": "cpu",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield env
    get_settings.cache_clear()


@pytest.fixture
def settings(swapless_env: dict[str, str]) -> Settings:
    return Settings()


class CliProcess:
    """A real `swapless <command>` process in its own session, with its log in a file."""

    def __init__(
        self, argv: list[str], env: dict[str, str], log_path: Path, wrapper: Sequence[str] = (),
        module: str = "swapless",
    ) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, "-m", module, *argv],
            cwd=REPO,
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def count(self, text: str) -> int:
        return self.log().count(text)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait for the ``ready.`` line a worker (Swapless's or a plain Celery one) logs once it consumes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "ready." in self.log():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log()[-4000:]}")
            time.sleep(0.1)
        raise AssertionError(f"worker not ready after {timeout_s} s:\n{self.log()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


class WorkerProcess(CliProcess):
    """A real `swapless worker` process."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path, wrapper: Sequence[str] = ()) -> None:
        super().__init__(["worker", *args], env, log_path, wrapper)



class Workers:
    """Real worker processes on one environment, their logs in one directory; ``stop_all`` stops them together."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.started: list[WorkerProcess] = []

    def start(
        self, *args: str, env: dict[str, str] | None = None, ready: bool = True, wrapper: Sequence[str] = ()
    ) -> WorkerProcess:
        """Start ``swapless worker ARGS`` (``wrapper``: a command it runs under) and, with ``ready``, wait for it."""
        log_path = self.logs / f"worker-{len(self.started)}.log"
        # No warm start unless a test asks for it (tests/test_warmup.py): it would cost every worker seconds and
        # run synthetic inputs through the test's models.
        defaults = {"SWAPLESS_WARM_START": "false"}
        worker = WorkerProcess(list(args), {**defaults, **self.env, **(env or {})}, log_path, wrapper)
        self.started.append(worker)
        if ready:
            worker.wait_ready()
        return worker

    def stop_all(self) -> None:
        """SIGTERM every worker still running at once, then wait for each: their warm shutdowns overlap."""
        for worker in self.started:
            if worker.proc.poll() is None:
                worker.proc.send_signal(signal.SIGTERM)
        for worker in self.started:
            worker.stop()


@pytest.fixture
def start_worker(swapless_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Factory fixture: start real worker processes; all are stopped at the end of the test."""
    workers = Workers(swapless_env, tmp_path)
    yield workers.start
    workers.stop_all()


@pytest.fixture(scope="module")
def module_env(redis_url: str, served_models_file: Path) -> Iterator[dict[str, str]]:
    """``swapless_env`` for a whole module (set in this process until it ends; its keys deleted then)."""
    from tests.stack import private_env  # tests.stack imports this module

    with private_env(redis_url, served_models_file) as env:
        yield env


@pytest.fixture(scope="module")
def module_workers(module_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    """Real workers on ``module_env``, stopped when the module ends."""
    workers = Workers(module_env, tmp_path_factory.mktemp("module-workers"))
    yield workers
    workers.stop_all()


@pytest.fixture
def faults(
    swapless_env: dict[str, str],
    models_file: Path,
    start_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[FaultEnv]:
    """Workers of the ``crashy`` test framework, its execution log and the Redis views the fault tests read."""
    from tests.faultkit import FaultEnv  # faultkit imports this module

    env = FaultEnv(tmp_path, swapless_env, models_file, start_worker, monkeypatch)
    yield env
    env.open_gates()  # before the workers stop: a batch held at a gate would hold up their warm shutdown


@pytest.fixture(scope="module")
def module_faults(
    module_env: dict[str, str], models_file: Path, module_workers: Workers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FaultEnv]:
    """``faults`` for a whole module; tests share its worker through ``one_worker`` (inputs are unique per test)."""
    from tests.faultkit import FaultEnv

    with pytest.MonkeyPatch.context() as patch:
        env = FaultEnv(tmp_path_factory.mktemp("module-faults"), module_env, models_file, module_workers.start, patch)
        yield env
        env.open_gates()
        module_workers.stop_all()


@pytest.fixture
def one_worker(module_faults: FaultEnv) -> Iterator[FaultEnv]:
    """The module's one crashy worker; after each test its gates are open and the broker idle."""
    if not module_faults.workers:
        module_faults.worker()
    shared = module_faults.workers[0]
    assert shared.proc.poll() is None, f"the module's worker has died:\n{shared.log()[-3000:]}"
    yield module_faults
    module_faults.end_test()


#: Fault-scenario rows the test processes handed over (``pytest -n``: each runs its own share of the tests).
_WORKER_ROWS: tuple[list[str], list[str]] = ([], [])


def _local_rows() -> tuple[list[str], list[str]]:
    faultkit = sys.modules.get("tests.faultkit")  # not even imported when no fault test ran
    return faultkit.rows() if faultkit is not None else ([], [])


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a test process of ``pytest -n``: hand its fault-scenario rows to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["fault_rows"] = _local_rows()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """In the controller of ``pytest -n``: keep the fault-scenario rows of a test process that finished."""
    scenario_rows, pressure_rows = getattr(node, "workeroutput", {}).get("fault_rows", ([], []))
    _WORKER_ROWS[0].extend(scenario_rows)
    _WORKER_ROWS[1].extend(pressure_rows)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One table of every fault scenario at the end of the run (``tests.faultkit.print_table``)."""
    scenario_rows, pressure_rows = _local_rows()
    scenario_rows, pressure_rows = scenario_rows + _WORKER_ROWS[0], pressure_rows + _WORKER_ROWS[1]
    if scenario_rows or pressure_rows:
        from tests.faultkit import print_table

        print_table(terminalreporter, scenario_rows, pressure_rows)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Factory: a private redis-server (AOF, fsync always) on a free port; all are stopped at the end."""
    servers: list[RedisServer] = []

    def start(**options: Any) -> RedisServer:
        server = RedisServer(tmp_path / f"redis-{len(servers)}", **options)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop(signal.SIGKILL)
