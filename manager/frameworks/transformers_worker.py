"""TransformerWorker: Hugging Face sequence classifiers (AutoModelForSequenceClassification + AutoTokenizer)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from swapless.config.errors import ModelLoadError
from swapless.manager.frameworks.torch_utils import (
    free_memory,
    measure_load,
    module_bytes,
    module_to_device,
    module_to_host,
    resolve_device,
    to_dtype,
    top_k,
)
from swapless.manager.frameworks.worker import ModelWorker

__all__ = ["TransformerWorker"]


class TransformerWorker(ModelWorker, framework="transformers"):
    """A text classifier from the hub (``name``) or a local directory (``path``).

    Loading never runs code from the model repository (``trust_remote_code=False``) and prefers safetensors.
    Inputs are truncated to the model's maximum length and padded per forward pass; to waste less compute on
    padding, each group is sorted by length before it is cut into forward passes, and the outputs are put back
    in input order.
    """

    model: Any = None
    host_tier = True
    tokenizer: Any = None

    @classmethod
    def warm_up(cls) -> None:
        import transformers
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a progress bar per load floods worker logs
        _ = transformers.AutoModelForSequenceClassification, transformers.AutoTokenizer  # resolve the lazy imports

    def load(self) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.warm_up()

        source = str(self.spec.path or self.spec.name)
        if self.spec.path is not None and not self.spec.path.exists():
            # Else from_pretrained takes the missing path for a hub repo id and says "Repo id must be in the form...".
            raise ModelLoadError(self.spec.id, f"{source} does not exist")
        self.device = resolve_device(self.limits.device)
        try:
            with measure_load(self.device) as measured:
                self.tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
                model = AutoModelForSequenceClassification.from_pretrained(source, trust_remote_code=False)
                self.model = model.to(self.device, to_dtype(self.spec.dtype)).eval()
        except OSError as err:
            self.unload()
            raise ModelLoadError(self.spec.id, f"{source}: {err}") from err
        self.memory_bytes = max(module_bytes(self.model), measured.bytes)
        positions = getattr(self.model.config, "max_position_embeddings", None) or 512
        tokenizer_max = getattr(self.tokenizer, "model_max_length", None) or positions
        self.max_length = int(min(positions, tokenizer_max))
        self.labels = dict(self.model.config.id2label or {})

    def predict(self, batch: Sequence[str]) -> list[Any]:
        order = sorted(range(len(batch)), key=lambda i: len(batch[i]))
        outputs: list[Any] = [None] * len(batch)
        with torch.inference_mode():
            for chunk in self.batched(order):
                encoded = self.tokenizer(
                    [batch[i] for i in chunk],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                probabilities = torch.softmax(self.model(**encoded).logits.float(), dim=-1)
                for i, row in zip(chunk, top_k(probabilities, self.labels, self.spec.top_k), strict=True):
                    outputs[i] = row
        return outputs

    def to_host(self) -> None:
        self.model = module_to_host(self.model)

    def to_device(self) -> None:
        self.model = module_to_device(self.model, self.device)

    def unload(self) -> None:
        dropped = weakref.ref(self.model) if self.model is not None else None
        self.model = None
        self.tokenizer = None
        self.memory_bytes = 0
        free_memory(getattr(self, "device", None), dropped)
