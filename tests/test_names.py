"""One name per concept: no public class name is defined twice in the product."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARTS = ("src", "tasks", "manager", "config")


def _public_classes(sources: dict[str, str]) -> dict[str, list[str]]:
    """Public (not ``_``-prefixed) class name -> the modules that define it at their top level."""
    found: dict[str, list[str]] = defaultdict(list)
    for module, text in sorted(sources.items()):
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(module)
    return found


def _defined_twice(sources: dict[str, str]) -> list[str]:
    return [f"{name} is defined in {', '.join(modules)}: give each its own name, or keep one"
            for name, modules in sorted(_public_classes(sources).items()) if len(modules) > 1]


def test_no_public_class_name_is_defined_twice() -> None:
    sources = {str(path.relative_to(REPO)): path.read_text()
               for part in PARTS for path in sorted((REPO / part).rglob("*.py"))}
    assert _defined_twice(sources) == []


def test_the_name_check_sees_a_class_defined_twice() -> None:
    sources = {"a.py": "class Job:\n    pass\nclass _Hidden:\n    pass\n",
               "b.py": "class Job:\n    pass\nclass _Hidden:\n    pass\n", "c.py": "class Other:\n    pass\n"}
    assert _defined_twice(sources) == ["Job is defined in a.py, b.py: give each its own name, or keep one"]
