"""The documentation's code runs: every fenced block of README.md, docs/ and bench/*.md (the site's pages) either
runs here against a real worker, or is checked (JSON, YAML), or says why it cannot run (``<!-- not run: REASON -->``
on the line before it); and the web app of examples/webapp answers its three routes against the same worker.

How each block is taken, by its language:

- ``python``: run as a script (``python -c``) in a fresh directory, with the worker's environment;
- ``bash``: run with ``bash -euo pipefail`` the same way (the ``swapless`` command on its PATH);
- ``json``: parsed (a document, or JSON Lines); ``yaml``: parsed;
- ``text``: not code (a drawing, or output shown): never run;
- any other language, and any block marked ``<!-- not run: REASON -->``: not run; the reason is required.

The blocks share one worker and one private queue; its models are the tiny text models (``sentiment``, ``spam``,
``topic``), a second version of ``sentiment`` and a route ``reviews`` over the two (``docs_models_file``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from swapless.config.settings import get_settings
from tests.conftest import REPO, Workers

#: A README a newcomer reads in one sitting: what it is, the two commands, one example per kind of user, links.
README_MAX_LINES = 300
#: The README's first screen: where the script, web-app and nightly-bulk guides must be linked.
FIRST_SCREEN_LINES = 50
#: Fence languages that are run, or checked, here; ``text`` is never code.
RUN = frozenset({"python", "bash"})
CHECK = frozenset({"json", "yaml"})
NOT_CODE = frozenset({"text"})

_FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<lang>[^\s`]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ ]*$",
                    re.MULTILINE | re.DOTALL)
_NOT_RUN = re.compile(r"^<!-- not run: (?P<reason>.+?) -->$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its text, and why it is not run (None: it runs)."""

    path: Path
    line: int
    lang: str
    body: str
    not_run: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def _pages() -> list[Path]:
    """The README, the pages of docs/, and the benchmark tables the site shows (bench/*.md)."""
    docs = sorted(p for p in (REPO / "docs").rglob("*.md") if "hooks" not in p.parts)
    return [REPO / "README.md", *docs, *sorted((REPO / "bench").glob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, each with the reason given on the line before it, if any."""
    text = path.read_text()
    found = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        marked = _NOT_RUN.match(before)
        body = "\n".join(row[len(match["indent"]) :] for row in match["body"].splitlines())
        found.append(Block(path, line, match["lang"], body, marked["reason"] if marked else None))
    return found


ALL_BLOCKS = [block for path in _pages() for block in blocks_of(path)]
RUNNABLE = [block for block in ALL_BLOCKS if block.lang in RUN and block.not_run is None]


def test_every_block_runs_is_checked_or_says_why_not() -> None:
    unnamed = [b.name for b in ALL_BLOCKS if not b.lang]
    assert not unnamed, f"blocks without a language (use text for output and drawings): {unnamed}"
    silent = [b.name for b in ALL_BLOCKS if b.lang not in RUN | CHECK | NOT_CODE and b.not_run is None]
    assert not silent, f"blocks that neither run nor say why (<!-- not run: REASON --> before them): {silent}"
    vague = [b.name for b in ALL_BLOCKS if b.not_run is not None and len(b.not_run.split()) < 3]
    assert not vague, f"say in a few words why these blocks cannot run: {vague}"
    assert len(RUNNABLE) >= 10, [b.name for b in RUNNABLE]


def test_the_collector_reads_marks_and_languages(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Intro\n\n<!-- not run: needs a GPU -->\n```bash\nnvidia-smi\n```\n\n"
                    "- item\n\n  ```python\n  print(1)\n  ```\n")
    first, second = blocks_of(page)
    assert (first.lang, first.body, first.not_run, first.line) == ("bash", "nvidia-smi", "needs a GPU", 4)
    assert (second.lang, second.body, second.not_run) == ("python", "print(1)", None)


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang in CHECK and b.not_run is None],
                         ids=lambda b: b.name)
def test_data_blocks_parse(block: Block) -> None:
    if block.lang == "yaml":
        list(yaml.safe_load_all(block.body))
        return
    try:
        json.loads(block.body)
    except json.JSONDecodeError:  # JSON Lines: one document per line
        for row in block.body.splitlines():
            json.loads(row)


def test_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
    first_screen = "\n".join(lines[:FIRST_SCREEN_LINES])
    for page in ("docs/guides/scripts.md", "docs/guides/web-apps.md", "docs/guides/nightly-bulk.md"):
        assert f"]({page})" in first_screen, f"the README's first screen does not link {page}"
        assert (REPO / page).is_file(), page


def test_ci_runs_the_readmes_test_command() -> None:
    section = (REPO / "README.md").read_text().split("\n## The two commands\n", 1)[1].split("\n## ", 1)[0]
    command = re.findall(r"```bash\n(.*?)\n```", section, re.DOTALL)[-1].strip()
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert any(line == command or line.startswith(command + " ") for line in ci), command


def docs_models_file(served: Path, directory: Path) -> Path:
    """The tiny text models, a second version of ``sentiment`` and the route ``reviews`` over both: the models the
    guides' blocks call (docs/guides/models-and-routes.md shows the route)."""
    entries = json.loads(served.read_text())["models"]
    for entry in entries:
        if "path" in entry:
            entry["path"] = str(served.parent / entry["path"])
    second = {**next(e for e in entries if e["id"] == "sentiment"), "id": "sentiment-v2", "version": "2"}
    route = {"id": "reviews", "route": {"sentiment": 90, "sentiment-v2": 10}}
    path = directory / "models.json"
    path.write_text(json.dumps({"models": [*entries, second, route]}, indent=2))
    return path


@pytest.fixture(scope="module")
def docs_worker(module_env: dict[str, str], module_workers: Workers, served_models_file: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One worker on the docs' models for every block and the web app; returns the environment to run in."""
    models = docs_models_file(served_models_file, tmp_path_factory.mktemp("docs-models"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SWAPLESS_MODELS_FILE", str(models))
        get_settings.cache_clear()
        module_workers.start(env={"SWAPLESS_MODELS_FILE": str(models)})
        bin_dir = str(Path(sys.executable).parent)
        yield {**os.environ, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]), "PYTHONPATH": str(REPO)}
    get_settings.cache_clear()


@pytest.fixture(scope="module")
def docs_gateway(docs_worker: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``swapless serve`` on the docs' worker, for the blocks that call ``GATEWAY_URL``; started by the first."""
    from tests.stack import GatewayProcess

    logs = tmp_path_factory.mktemp("docs-gateway")
    env = {**docs_worker, "SWAPLESS_BATCH_FILES_URL": str(logs / "files")}
    gateway = GatewayProcess(env, logs / "gateway.log")
    try:
        gateway.wait_ready()
        yield gateway.url
    finally:
        gateway.stop()


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.name)
def test_the_block_runs(block: Block, docs_worker: dict[str, str], request: pytest.FixtureRequest,
                        tmp_path: Path) -> None:
    env = dict(docs_worker)
    if "GATEWAY_URL" in block.body:
        env["GATEWAY_URL"] = request.getfixturevalue("docs_gateway")
    shell = ["bash", "-euo", "pipefail", "-c", block.body]
    argv = [sys.executable, "-c", block.body] if block.lang == "python" else shell
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    output = f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, f"{block.name} failed with status {done.returncode}:\n{output}"


@pytest.fixture(scope="module")
def webapp(docs_worker: dict[str, str]) -> Iterator[Any]:
    """The example web app (examples/webapp/app.py) in process, its Client on the docs' worker."""
    from fastapi.testclient import TestClient

    from examples.webapp.app import app

    with TestClient(app) as client:
        yield client


def test_the_web_app_submits_and_polls(webapp: Any) -> None:
    accepted = webapp.post("/reviews", json={"text": "What a lovely day"})
    assert accepted.status_code == 202
    job_id = accepted.json()["job_id"]
    deadline = time.monotonic() + 60
    while (answer := webapp.get(f"/reviews/{job_id}").json())["state"] == "pending":
        assert time.monotonic() < deadline, answer
        time.sleep(0.05)
    assert answer["state"] == "done"
    assert {label["label"] for label in answer["labels"]} == {"POSITIVE", "NEGATIVE"}


def test_the_web_app_awaits_the_labels(webapp: Any) -> None:
    answer = webapp.post("/reviews/classify", json={"text": "The battery died after an hour."})
    assert answer.status_code == 200, answer.text
    labels = answer.json()["labels"]
    assert labels[0]["score"] >= labels[-1]["score"] and len(labels) == 2


def test_the_web_app_answers_a_bad_input_with_its_error(webapp: Any) -> None:
    refused = webapp.post("/reviews/classify", json={"text": "   "})
    assert refused.status_code == 422 and "empty text" in refused.text
    job_id = webapp.post("/reviews", json={"text": "   "}).json()["job_id"]
    deadline = time.monotonic() + 60
    while (answer := webapp.get(f"/reviews/{job_id}").json())["state"] == "pending":
        assert time.monotonic() < deadline, answer
        time.sleep(0.05)
    assert answer["state"] == "failed" and "empty text" in answer["error"]
