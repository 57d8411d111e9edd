"""The package layout: one import root, ``swapless``, over the repository's folders.

``src/swapless`` is the package itself (its public surface); ``tasks/``, ``manager/`` and ``config/`` install as
``swapless.tasks``, ``swapless.manager`` and ``swapless.config``. Nothing else installs at top level. Everything
else about the distribution is in ``pyproject.toml``.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
FOLDERS = ("tasks", "manager", "config")


def packages() -> list[str]:
    """``swapless`` and every package under the three folders, named under it."""
    found = ["swapless"]
    for folder in FOLDERS:
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            found.append(".".join(("swapless", *init.parent.relative_to(ROOT).parts)))
    return found


setup(packages=packages(), package_dir={"swapless": "src/swapless", **{f"swapless.{f}": f for f in FOLDERS}})
