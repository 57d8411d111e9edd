"""A framework plugin: sentence embeddings from any Hugging Face encoder (mean-pooled over the tokens, L2-normalised).

Serve it with this folder on ``PYTHONPATH`` and ``SWAPLESS_PLUGINS=embeddings``; a models entry names it with
``"framework": "sentence-embedding"`` and ``"path"`` to a saved encoder (``AutoModel`` + ``AutoTokenizer``, for
example a download of ``sentence-transformers/all-MiniLM-L6-v2``). Each job's input is one text; its result is one
vector, a list of floats of the encoder's hidden size.

Only the public surface is used: ``ModelWorker`` and the errors, from ``swapless``.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

from swapless import PLUGIN_API, ModelLoadError, ModelWorker

if PLUGIN_API != 1:  # the contract this plugin was written against (docs/guides/frameworks.md)
    raise ImportError(f"embeddings.py is written for Swapless's framework contract 1, this Swapless has {PLUGIN_API}")

__all__ = ["SentenceEmbedder"]


class SentenceEmbedder(ModelWorker, framework="sentence-embedding"):
    """One encoder; ``predict`` returns one unit-length vector per text."""

    #: evicted, the model may wait in host memory, built: ``to_host`` / ``to_device`` move it
    host_tier = True

    model: Any = None
    tokenizer: Any = None

    @classmethod
    def warm_up(cls) -> None:
        import transformers

        _ = transformers.AutoModel, transformers.AutoTokenizer  # resolve the lazy imports before the first load

    def load(self) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        if self.spec.path is None or not self.spec.path.is_dir():
            raise ModelLoadError(self.spec.id, f"'path' must be a saved encoder's directory, got {self.spec.path}")
        name = self.limits.device
        if name == "auto":
            name = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(name)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.spec.path, trust_remote_code=False)
            self.model = AutoModel.from_pretrained(self.spec.path, trust_remote_code=False).to(self.device).eval()
        except (OSError, ValueError) as err:
            self.unload()
            raise ModelLoadError(self.spec.id, f"{self.spec.path}: {err}") from err
        tensors = [*self.model.parameters(), *self.model.buffers()]
        self.memory_bytes = sum(t.numel() * t.element_size() for t in tensors)
        self.max_length = int(min(self.model.config.max_position_embeddings, self.tokenizer.model_max_length))

    def prepare(self, value: Any) -> str:
        return self.prepare_text(value)  # a non-empty string within SWAPLESS_MAX_TEXT_CHARS, else InputError

    def predict(self, batch: Sequence[str]) -> list[list[float]]:
        import torch

        vectors: list[list[float]] = []
        with torch.inference_mode():
            for texts in self.batched(batch):
                encoded = self.tokenizer(
                    list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
                ).to(self.device)
                hidden = self.model(**encoded).last_hidden_state.float()
                mask = encoded["attention_mask"].unsqueeze(-1).float()
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
                vectors += torch.nn.functional.normalize(pooled, dim=-1).cpu().tolist()
        return vectors

    def to_host(self) -> None:
        self.model = self.model.to("cpu")

    def to_device(self) -> None:
        self.model = self.model.to(self.device)

    def unload(self) -> None:
        self.model = None
        self.tokenizer = None
        self.memory_bytes = 0
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
