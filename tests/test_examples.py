"""The worked example of a framework plugin (``examples/embeddings``), end to end as a user runs it: the encoder
built offline by its own script, a real worker that imports the plugin through ``SWAPLESS_PLUGINS``, and the
example's producer script. Each vector is the one the encoder gives for that text run alone."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from swapless import Client, InputError
from swapless.config.settings import get_settings
from tests.conftest import REPO, WorkerProcess

EXAMPLE = REPO / "examples" / "embeddings"


@pytest.fixture
def embedder(
    tmp_path: Path, swapless_env: dict[str, str], start_worker: Callable[..., WorkerProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """The example's models file, served by a worker with the plugin loaded; returns the models file."""
    subprocess.run([sys.executable, str(EXAMPLE / "build_model.py"), str(tmp_path / "built")], check=True,
                   capture_output=True, timeout=300)
    models = tmp_path / "built" / "models.json"
    monkeypatch.setenv("SWAPLESS_MODELS_FILE", str(models))
    get_settings.cache_clear()
    path = os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH")]))
    start_worker(env={"SWAPLESS_MODELS_FILE": str(models), "SWAPLESS_PLUGINS": "embeddings", "PYTHONPATH": path})
    return models


def _alone(encoder: Path, text: str) -> list[float]:
    """The mean-pooled, normalised vector of one text, computed here without Swapless."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(encoder)
    model = AutoModel.from_pretrained(encoder).eval()
    with torch.inference_mode():
        encoded = tokenizer([text], return_tensors="pt")
        hidden = model(**encoded).last_hidden_state[0]
    mean = hidden.mean(dim=0)
    return (mean / mean.norm()).tolist()


@pytest.mark.slow
def test_the_plugin_serves_embeddings_through_a_worker(embedder: Path) -> None:
    client = Client()
    texts = ["the cat sat on the mat", "stock markets fell", "a"]
    jobs = client.submit_jobs([("embedder", text) for text in texts])
    bad = client.submit("embedder", "   ")  # fails alone: the others in its group are answered
    vectors = [job.get(timeout=120) for job in jobs]
    with pytest.raises(InputError, match="empty text"):
        bad.get(timeout=60)
    for text, vector in zip(texts, vectors, strict=True):
        assert len(vector) == 64 and math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-4)
        expected = _alone(embedder.parent / "encoder", text)
        assert max(abs(a - b) for a, b in zip(vector, expected, strict=True)) < 1e-4, text


@pytest.mark.slow
def test_the_example_producer_script_ranks_documents(embedder: Path, swapless_env: dict[str, str]) -> None:
    env = {**os.environ, "SWAPLESS_MODELS_FILE": str(embedder)}
    done = subprocess.run([sys.executable, str(EXAMPLE / "search.py"), "the cat"], env=env, capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = done.stdout.strip().splitlines()
    assert len(rows) == 4
    scores = [float(row.split()[0]) for row in rows]
    assert scores == sorted(scores, reverse=True) and all(-1.0 <= s <= 1.0 for s in scores)
