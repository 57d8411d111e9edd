"""The distribution as a user installs it: a wheel built from the repository, installed (not editable) into a fresh
environment, used from a project folder that has its own ``tasks.py`` (Celery's first-steps layout), ``config/``
(Django's) and ``manager/`` packages. Nothing of the checkout is importable there: the dependencies come from the
test environment's site-packages, Swapless from the wheel alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

#: What the sdist of the repository needs to build a wheel.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "src", "tasks", "manager", "config")

#: A user's project: modules named like Swapless's old top-level packages, each of which shadowed them.
USER_FILES = {
    "tasks.py": "from celery import Celery\n\napp = Celery('tasks')\n\n\n@app.task\ndef add(x, y):\n    return x + y\n",
    "config/__init__.py": "",
    "config/settings.py": "DEBUG = True\n",
    "manager/__init__.py": "NAME = 'the user own manager'\n",
}

SCRIPT = """
import json, sys
import config.settings, manager, tasks
from swapless import Client, InputError, UnknownModel

assert tasks.add(1, 2) == 3 and manager.NAME == "the user own manager"  # the user's modules are theirs
client = Client()
job = client.submit("sentiment", "what a lovely day")
prediction = job.get(timeout=90)
bad = client.submit("sentiment", "")
try:
    bad.get(timeout=90)
    raise SystemExit("an empty text was accepted")
except InputError as err:
    error = type(err).__module__ + "." + type(err).__name__
import swapless
print(json.dumps({"prediction": prediction, "error": error, "swapless": swapless.__file__}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the repository's sources (no build/ or egg-info left in the checkout)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work), "."],
        cwd=source, check=True, capture_output=True, timeout=300,
    )
    (built,) = work.glob("swapless-*.whl")
    return built


@pytest.fixture(scope="module")
def user_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtual environment with the wheel installed; its dependencies are this environment's."""
    env = tmp_path_factory.mktemp("userenv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # The dependencies (celery, torch, ...) from this environment, after the fresh one's own site-packages.
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield env


@pytest.fixture
def user_project(tmp_path: Path) -> Path:
    project = tmp_path / "webapp"
    for name, text in USER_FILES.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    return project


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would put the checkout on the path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("SWAPLESS_")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def test_the_wheel_installs_one_top_level_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
        (record_dir,) = {name.split("/")[0] for name in names if ".dist-info/" in name}
        declared = archive.read(f"{record_dir}/top_level.txt").decode().split()
        entry_points = archive.read(f"{record_dir}/entry_points.txt").decode()
    assert top_level == {"swapless"}, sorted(top_level)
    assert declared == ["swapless"]
    assert "swapless = swapless.tasks.cli.main:main" in entry_points
    # the data files the package reads at run time travel with it
    shipped = {"swapless/config/models.json", "swapless/tasks/gateway/static/status.html", "swapless/py.typed"}
    assert shipped <= set(names)
    assert any(name.startswith("swapless/manager/demo/data/") for name in names)


def test_a_user_project_with_tasks_and_config_modules_submits_and_reads_a_result(
    user_env: Path, user_project: Path, swapless_env: dict[str, str], tmp_path: Path
) -> None:
    """The wheel's ``swapless`` command runs the worker from the user's folder, and a script there imports its own
    ``tasks``, ``config`` and ``manager`` beside ``swapless``: a prediction, and a bad input's own error."""
    env = _clean_env(**swapless_env, SWAPLESS_WARM_START="false")
    with (tmp_path / "worker.log").open("wb") as worker_log:
        worker = subprocess.Popen([str(user_env / "bin" / "swapless"), "worker"], cwd=user_project, env=env,
                                  stdout=worker_log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            done = subprocess.run([str(user_env / "bin" / "python"), "-c", SCRIPT], cwd=user_project, env=env,
                                  capture_output=True, text=True, timeout=180, check=False)
        finally:
            worker.terminate()
            worker.wait(60)
    log = (tmp_path / "worker.log").read_text(errors="replace")
    assert done.returncode == 0, f"{done.stderr[-3000:]}\nworker:\n{log[-3000:]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["prediction"] and {"label", "score"} <= set(out["prediction"][0])
    assert out["error"] == "swapless.InputError"
    assert str(user_env) in out["swapless"] and str(REPO) not in out["swapless"]
    assert "ready." in log and "Traceback" not in log


def test_celery_finds_the_worker_app_as_swapless(user_env: Path, user_project: Path) -> None:
    """``celery -A swapless`` resolves the app from the installed package (the app is built on first access)."""
    probe = "from celery.app.utils import find_app; app = find_app('swapless'); print(app.main, app.conf.worker_pool)"
    done = subprocess.run([str(user_env / "bin" / "python"), "-c", probe], cwd=user_project, env=_clean_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["swapless", "solo"]

