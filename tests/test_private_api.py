"""Every private kombu, Celery and celery-batches member the adapter uses exists in the installed versions."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from swapless.tasks.broker import kombu_private
from swapless.tasks.broker.kombu_private import PRIVATE_MEMBERS


def _owner(spec: str) -> type:
    module, _, name = spec.partition(":")
    owner = getattr(importlib.import_module(module), name)
    assert isinstance(owner, type), spec
    return owner


def _has(owner: type, name: str) -> bool:
    """Whether ``owner`` (or a class above it) has ``name``, or its source sets ``self.<name>``."""
    if any(name in vars(cls) for cls in owner.__mro__):
        return True
    setter = re.compile(rf"self\.{re.escape(name)}\b(\s*:[^=\n]+)?\s*=[^=]")
    for cls in owner.__mro__:
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if setter.search(source):
            return True
    return False


@pytest.mark.parametrize(("owner", "name", "used_by"), PRIVATE_MEMBERS, ids=[f"{o}.{n}" for o, n, _ in PRIVATE_MEMBERS])
def test_each_private_member_exists_in_the_installed_version(owner: str, name: str, used_by: str) -> None:
    assert _has(_owner(owner), name), (
        f"{owner} has no {name} in the installed version (used by swapless.tasks.broker.kombu_private: {used_by}). "
        f"Find what replaced it in the new version's source, change kombu_private to match, then raise the pin in "
        f"pyproject.toml."
    )


def test_the_adapter_names_no_private_member_it_does_not_list() -> None:
    """The adapter's list is complete: each private member it reaches on a library object is in PRIVATE_MEMBERS."""
    source = inspect.getsource(kombu_private)
    listed = {name for _, name, _ in PRIVATE_MEMBERS}
    used = set(re.findall(r"(?:self|task|qos|message|backend|request|connection|super\(\))\.(_[a-z]\w*)", source))
    used |= set(re.findall(r'"(_[a-z]\w*)"', source.split("PRIVATE_MEMBERS:", 1)[1].split("\n)\n", 1)[1]))
    assert used <= listed, sorted(used - listed)


def test_the_check_sees_a_missing_member() -> None:
    assert not _has(_owner("kombu.transport.redis:Channel"), "_no_such_member")
    assert _has(_owner("kombu.transport.redis:Channel"), "_queue_cycle")  # set in __init__ only


def test_no_other_module_names_a_private_member() -> None:
    """The adapter is the only module of the product naming these members (attributes, overrides, strings)."""
    names = {name for _, name, _ in PRIVATE_MEMBERS}
    repo = Path(__file__).resolve().parent.parent
    found = []
    for path in sorted(p for folder in ("tasks", "manager", "config", "src") for p in (repo / folder).rglob("*.py")):
        if path.name == "kombu_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            named = (node.attr if isinstance(node, ast.Attribute) else
                     node.name if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else
                     node.value if isinstance(node, ast.Constant) else None)
            if named in names:
                found.append(f"{path.relative_to(repo)}:{node.lineno} {named}")
    assert not found, "private kombu/Celery members named outside tasks/broker/kombu_private.py:\n" + "\n".join(found)
