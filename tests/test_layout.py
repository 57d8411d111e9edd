"""The house's boundaries: which part of the code may import which, read from every import in the tree (those
inside functions too), and checked once more by importing the producer side in a fresh interpreter.

    config/           settings, the error tree: nothing of the model side or the queue side
    manager/          the model side: never Celery, kombu, Redis or anything of tasks/
    tasks/protocol    what producers and workers share: nothing else of tasks/, no Celery, no Redis
    tasks/keyspace    every Redis key's name: nothing of tasks/ but the protocol, no Celery, no Redis
    tasks/tracing     trace context through the queue (OpenTelemetry): nothing else of tasks/, no Celery, no Redis
    tasks/broker/     Redis and kombu internals: nothing of the cluster, the worker, the client, observe, gateway or CLI
    tasks/cluster/    several workers as one cache: never observe, the worker, the client, the gateway or the CLI
    tasks/observe/    accounting, heartbeats, status: never the worker, the client, the gateway or the CLI
    tasks/worker/     the worker: never the client, the gateway or the CLI
    tasks/client/     producers: never the worker, the cluster, observe, the gateway or the CLI
    tasks/gateway/    a producer: never the worker or the CLI
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: part -> module prefixes it must never import (names under the import root ``swapless``)
NEVER: dict[str, tuple[str, ...]] = {
    "manager": ("tasks", "celery", "celery_batches", "kombu", "redis"),
    "tasks.protocol": ("tasks.app", "tasks.keyspace", "tasks.broker", "tasks.cluster", "tasks.worker",
                       "tasks.client", "tasks.observe", "tasks.gateway", "tasks.cli", "celery", "kombu", "redis"),
    "tasks.keyspace": ("tasks.app", "tasks.broker", "tasks.cluster", "tasks.worker", "tasks.client", "tasks.observe",
                       "tasks.gateway", "tasks.cli", "celery", "kombu", "redis"),
    "tasks.tracing": ("tasks.app", "tasks.keyspace", "tasks.protocol", "tasks.broker", "tasks.cluster",
                      "tasks.worker", "tasks.client", "tasks.observe", "tasks.gateway", "tasks.cli", "celery", "kombu",
                      "redis"),
    "config": ("manager", "tasks", "celery", "celery_batches", "kombu", "redis"),
    "tasks.broker": ("tasks.cluster", "tasks.worker", "tasks.client", "tasks.observe", "tasks.gateway", "tasks.cli"),
    "tasks.cluster": ("tasks.observe", "tasks.worker", "tasks.client", "tasks.gateway", "tasks.cli"),
    "tasks.app": ("tasks.worker", "tasks.client", "tasks.observe", "tasks.gateway", "tasks.cli"),
    "tasks.worker": ("tasks.client", "tasks.gateway", "tasks.cli"),
    "tasks.client": ("tasks.worker", "tasks.cluster", "tasks.observe", "tasks.gateway", "tasks.cli"),
    "tasks.observe": ("tasks.worker", "tasks.client", "tasks.gateway", "tasks.cli"),
    "tasks.gateway": ("tasks.worker", "tasks.cli"),
}

#: The one import root: every module of the repository is ``swapless.<its path>``.
ROOT = "swapless"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import in a file, at any depth; ``from a import b`` also yields ``a.b``. Names
    under the import root are given relative to it (``swapless.tasks.app`` as ``tasks.app``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return [(line, name.removeprefix(ROOT + ".")) for line, name in found]


def _raw_imports(path: Path) -> list[str]:
    """The module of every absolute import in a file, as written."""
    tree = ast.parse(path.read_text(), str(path))
    return [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names] + [
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and not node.level
    ]


def _sources() -> list[Path]:
    return sorted(p for folder in ("manager", "tasks", "config") for p in (REPO / folder).rglob("*.py"))


def _part(module: str) -> str | None:
    matches = [part for part in NEVER if module == part or module.startswith(part + ".")]
    return max(matches, key=len) if matches else None


def _is(module: str, prefix: str) -> bool:
    return module == prefix.rstrip(".") or module.startswith(prefix if prefix.endswith(".") else prefix + ".")


def test_no_part_imports_what_it_must_not() -> None:
    broken = []
    for path in _sources():
        module = _module_name(path)
        part = _part(module)
        if part is None:
            continue
        for line, imported in _imports(path):
            if imported.startswith("__future__") or imported == module:
                continue
            for banned in NEVER[part]:
                if _is(imported, banned):
                    broken.append(
                        f"{path.relative_to(REPO)}:{line} imports {imported} ({part} must not import {banned})"
                    )
    assert not broken, "\n".join(broken)


def test_every_import_of_the_project_goes_through_the_import_root() -> None:
    """Nothing imports ``tasks``, ``manager`` or ``config`` at top level: installed, they exist only as
    ``swapless.tasks`` and so on, and a user's own module of that name would be imported instead."""
    files = [*_sources(), *sorted((REPO / "tests").rglob("*.py")), *sorted((REPO / "bench").rglob("*.py")),
             *sorted((REPO / "examples").rglob("*.py")), *sorted((REPO / "src").rglob("*.py"))]
    bare = [
        f"{path.relative_to(REPO)}: {module}"
        for path in files
        for module in _raw_imports(path)
        if module.split(".")[0] in ("tasks", "manager", "config")
    ]
    assert len(files) > 200, "the check reads too few files: it could not fail"
    assert not bare, "\n".join(bare)


def test_only_the_broker_touches_kombu_internals() -> None:
    """kombu's transport internals (its Redis channel, QoS, message delivery) are subclassed in one place."""
    users = {
        str(path.relative_to(REPO))
        for path in _sources()
        for _, imported in _imports(path)
        if _is(imported, "kombu.transport") or _is(imported, "kombu.utils")
    }
    assert users, "the check reads no import at all: it could not fail"
    assert all(user.startswith("tasks/broker/") for user in users), users


def test_the_check_sees_a_broken_rule(tmp_path: Path) -> None:
    """The import reader finds imports inside functions too (the rules above would miss none)."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from swapless.tasks.worker.task import app\n    import redis\n")
    assert [m for _, m in _imports(sample)] == ["tasks.worker.task", "tasks.worker.task.app", "redis"]
    assert _raw_imports(sample)[-1] == "swapless.tasks.worker.task"


@pytest.mark.parametrize("module", ["Client", "tasks.client", "tasks.gateway", "tasks.protocol", "tasks.observe.view"])
def test_producer_modules_load_no_worker_code(module: str) -> None:
    """Importing the producer side in a fresh interpreter loads nothing of the worker, and no model framework."""
    probe = (
        (f"import json, sys; from {ROOT} import Client, Job, SwaplessError; " if module == "Client" else
         f"import json, sys, {ROOT}.{module}; ")
        + "print(json.dumps(sorted(m for m in sys.modules"
        " if m.startswith(('swapless.tasks.worker', 'torch', 'transformers')))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_no_celery_app_is_built_at_import() -> None:
    """Importing the protocol, the app factory or the client builds no Celery app; building one is seen."""
    probe = (
        "import swapless, swapless.tasks.protocol, swapless.tasks.app, swapless.tasks.client; "
        "from celery import _state; "
        "before = len(list(_state._get_active_apps())); swapless.tasks.app.make_app(); "
        "print(before, len(list(_state._get_active_apps())))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "1"]


#: The concepts page whose drawing names every module.
LAYOUT_PAGE = REPO / "docs" / "concepts" / "layout.md"


def _layout_blocks(page: str) -> dict[str, str]:
    """The layout page's drawing (its section "Modules") as ``package path -> its text``: a line ``name/`` at the
    left margin or two spaces in opens a block (``tasks/``, ``tasks/broker/``), a line ``name.py`` there is a block
    of its own (``tasks/protocol.py``); the lines indented further belong to the block above."""
    section = page.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    drawing = section.split("```text\n", 1)[1].split("```", 1)[0]
    blocks: dict[str, str] = {}
    top = current = ""
    for line in drawing.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        name, _, rest = line.strip().partition(" ")
        if indent == 0:
            top = current = name
        elif indent == 2:
            current = top + name
        else:
            blocks[current] += " " + line.strip()
            continue
        blocks[current] = rest
    return blocks


def _unnamed_modules(blocks: dict[str, str], sources: list[Path]) -> list[str]:
    """Each module under manager/, tasks/ and config/ whose name is not in its package's block (or is not a
    block of its own), with the sub-package it sits in, if deeper, named there too."""
    missing = []
    for path in sources:
        if path.name == "__init__.py":
            continue
        parts = path.relative_to(REPO).parts
        own = f"{parts[0]}/{parts[1]}"
        if own in blocks:  # tasks/protocol.py
            continue
        block = blocks.get(f"{parts[0]}/{parts[1]}/", "") if len(parts) > 2 else blocks.get(f"{parts[0]}/", "")
        words = set("".join(" " if c in ",:;()`" else c for c in block).split())
        wanted = [*(f"{p}/" for p in parts[2:-1]), path.name]
        if not all(w in words for w in wanted):
            missing.append("/".join(parts))
    return missing


def test_the_layout_page_names_every_module() -> None:
    blocks = _layout_blocks(LAYOUT_PAGE.read_text())
    assert {"config/", "manager/", "tasks/", "tasks/broker/", "manager/frameworks/"} <= set(blocks), sorted(blocks)
    missing = _unnamed_modules(blocks, _sources())
    assert not missing, f"docs/concepts/layout.md (Modules) does not name: {', '.join(missing)}"


def test_the_layout_check_sees_a_module_left_out() -> None:
    blocks = _layout_blocks(LAYOUT_PAGE.read_text())
    extra = REPO / "tasks" / "broker" / "not_on_the_page.py"  # a path only: nothing is written
    assert _unnamed_modules(blocks, [extra]) == ["tasks/broker/not_on_the_page.py"]


def _import_graph(sources: list[Path]) -> dict[str, set[str]]:
    """Each module of ``sources`` and the modules of ``sources`` it imports (every import counted, those inside
    functions and under ``TYPE_CHECKING`` too)."""
    modules = {_module_name(path): path for path in sources}
    return {name: {imported for _, imported in _imports(path) if imported in modules and imported != name}
            for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each strongly connected group of two or more modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_module_imports_another_that_imports_it_back() -> None:
    """No import circle, at any depth (two modules in a circle can only be understood together)."""
    assert _circles(_import_graph(_sources())) == []


def test_the_circle_check_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


#: Most lines of a module: one sitting's reading (the house style's).
MAX_LINES = 450
#: Modules over ``MAX_LINES`` today, each with the most lines it may keep until it is split: none may grow, and a
#: module that gets under the limit leaves this list (the test says so); a new module over the limit fails.
OVER_LIMIT = {
    "tasks/client/client.py": 483,
    "manager/cache/lru.py": 507,
}


def _module_lines() -> dict[str, int]:
    return {str(path.relative_to(REPO)): len(path.read_text().splitlines())
            for part in ("src", "tasks", "manager", "config") for path in sorted((REPO / part).rglob("*.py"))}


def _too_long(lines: dict[str, int], allowed: dict[str, int]) -> list[str]:
    """What breaks the size rule: a module over its line budget, and a listed module now under the limit."""
    found = []
    for module, count in sorted(lines.items()):
        budget = allowed.get(module, MAX_LINES)
        if count > budget:
            found.append(f"{module} has {count} lines (at most {budget}): split it by responsibility")
    for module in sorted(allowed):
        if lines.get(module, 0) <= MAX_LINES:
            found.append(f"{module} is under {MAX_LINES} lines now: take it out of OVER_LIMIT")
    return found


def test_no_module_grows_past_one_sitting() -> None:
    """No module over 450 lines, but those listed, which may only shrink."""
    assert _too_long(_module_lines(), OVER_LIMIT) == []


def test_the_size_check_sees_a_module_that_grew() -> None:
    lines = {"a.py": 451, "b.py": 500, "c.py": 100, "d.py": 300}
    assert _too_long(lines, {"b.py": 499, "c.py": 200}) == [
        "a.py has 451 lines (at most 450): split it by responsibility",
        "b.py has 500 lines (at most 499): split it by responsibility",
        "c.py is under 450 lines now: take it out of OVER_LIMIT",
    ]
