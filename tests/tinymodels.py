"""Small real models for the tests (and the benchmark), built on the spot with random weights.

The builders live in ``swapless.manager.demo.tiny`` and ``swapless.manager.demo.models`` (``swapless demo`` uses them
too); they are re-exported here so tests keep importing them from this module. Nothing downloads anything.

Fixtures (import them into a test module, or list this module in ``pytest_plugins``):

- ``tiny_models_dir`` (session): a directory holding ``sentiment``, ``spam``, ``topic`` and ``vision`` plus a
  ``models.json`` that lists them.
- ``models_file`` (session): the path of that ``models.json``.
- ``text_models_file`` (session): ``models-text.json`` beside it, the three text models alone: a worker serving it
  never imports torchvision (2 s of CPU per worker start).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from filelock import FileLock

from swapless.manager.demo.models import IMAGE_MODEL_ID, TEXT_MODELS, build_demo_models
from swapless.manager.demo.tiny import (
    TEXT_PRESETS,
    build_image_classifier,
    build_text_classifier,
    encode_image,
    vocabulary,
    write_models_file,
)

__all__ = [
    "IMAGE_MODEL_ID",
    "TEXT_MODELS",
    "TEXT_PRESETS",
    "build_demo_models",
    "build_image_classifier",
    "build_text_classifier",
    "encode_image",
    "models_file",
    "text_models_file",
    "tiny_models_dir",
    "vocabulary",
    "write_models_file",
]


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with three tiny text classifiers, a mobilenet_v2 and a ``models.json`` listing them.

    Built once per run: the test processes of ``pytest -n`` share it (the first builds it under a file lock, the
    others wait and read it), and no test writes into it."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = shared / "tiny-models"
    with FileLock(str(root) + ".lock"):
        if not (root / "models.json").exists():
            build_demo_models(root)  # models.json is written last
        text = root / "models-text.json"
        if not text.exists():
            entries = json.loads((root / "models.json").read_text())["models"]
            scratch = root / "models-text.tmp"
            scratch.write_text(json.dumps({"models": [e for e in entries if e["id"] != IMAGE_MODEL_ID]}, indent=2))
            scratch.replace(text)
    return root


@pytest.fixture(scope="session")
def models_file(tiny_models_dir: Path) -> Path:
    """The ``models.json`` of ``tiny_models_dir``."""
    return tiny_models_dir / "models.json"


@pytest.fixture(scope="session")
def text_models_file(tiny_models_dir: Path) -> Path:
    """The three text models of ``tiny_models_dir``, without the image model."""
    return tiny_models_dir / "models-text.json"
