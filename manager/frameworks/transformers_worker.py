"""TransformerWorker: Hugging Face sequence classifiers (AutoModelForSequenceClassification + AutoTokenizer)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch

from swapless.config.errors import ModelLoadError
from swapless.manager.frameworks.adapters import AdapterInput, AdapterPool
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
from swapless.manager.registry.specs import ModelSpec

__all__ = ["TransformerWorker"]


class TransformerWorker(ModelWorker, framework="transformers"):
    """A text classifier from the hub (``name``) or a local directory (``path``); never runs the repository's code.

    Each group is sorted by length before it is cut into forward passes (less padding); outputs come back in input
    order. Its variants run in the same passes, each row with its adapter and labels.
    """

    model: Any = None
    host_tier = True
    runs_adapters = True
    tokenizer: Any = None
    adapters: AdapterPool | None = None

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
        self.adapters = AdapterPool(self.model, self.limits.max_adapters, self.limits.adapter_host_bytes,
                                    self.limits.adapter_shapes)
        self.memory_bytes += self.limits.adapter_bytes.get(self.spec.id, 0)

    def prepare_for(self, variant: ModelSpec | None, value: Any) -> Any:
        text = self.prepare_text(value)
        return text if variant is None else AdapterInput(text, variant)

    def predict(self, batch: Sequence[Any]) -> list[Any]:
        texts = [item.text if isinstance(item, AdapterInput) else item for item in batch]
        variants = [item.variant if isinstance(item, AdapterInput) else None for item in batch]
        order = sorted(range(len(batch)), key=lambda i: len(texts[i]))
        outputs: list[Any] = [None] * len(batch)
        with torch.inference_mode():
            for chunk in self.batched(order):
                for run in self._runs(chunk, variants):
                    self._forward(run, texts, variants, outputs)
        return outputs

    def _runs(self, chunk: Sequence[int], variants: Sequence[ModelSpec | None]) -> list[list[int]]:
        """A pass's rows cut so that no run needs more variants than the adapter slots hold."""
        if self.adapters is None or not any(variants[i] is not None for i in chunk):
            return [list(chunk)]
        runs = self.adapters.groups([variants[i] for i in chunk])
        return [[chunk[j] for j in run] for run in runs if run]

    def _forward(self, rows: Sequence[int], texts: Sequence[str], variants: Sequence[ModelSpec | None],
                 outputs: list[Any]) -> None:
        encoded = self.tokenizer(
            [texts[i] for i in rows],
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        ).to(self.device)
        pool = self.adapters
        made = pool.made if pool is not None else 0
        with pool.rows([variants[i] for i in rows]) if pool is not None else nullcontext():
            logits = self.model(**encoded).logits
        if pool is not None and pool.made != made:
            self._first_pass = True  # a pass that filled new slots: not a cost the batch tuner should learn
        probabilities = torch.softmax(logits.float(), dim=-1)
        for i, row in zip(rows, self._top_k(probabilities, [variants[i] for i in rows]), strict=True):
            outputs[i] = row

    def _top_k(self, probabilities: torch.Tensor, variants: Sequence[ModelSpec | None]) -> list[Any]:
        if all(v is None or not v.labels for v in variants):
            k = {v.top_k if v is not None else self.spec.top_k for v in variants}
            if len(k) == 1:
                return top_k(probabilities, self.labels, k.pop())
        return [top_k(probabilities[j : j + 1], v.labels if v is not None and v.labels else self.labels,
                      v.top_k if v is not None else self.spec.top_k)[0]
                for j, v in enumerate(variants)]

    def to_host(self) -> None:
        self.model = module_to_host(self.model)
        self._rewrap()

    def to_device(self) -> None:
        self.model = module_to_device(self.model, self.device)
        self._rewrap()

    def _rewrap(self) -> None:
        """The adapter slots moved with the model (the host tier)."""
        if self.adapters is not None:
            self.adapters.base = self.model
            self.adapters.to(next(self.model.parameters()).device)

    def unload(self) -> None:
        dropped = weakref.ref(self.model) if self.model is not None else None
        if self.adapters is not None:
            self.adapters.close()
        self.model = None
        self.tokenizer = None
        self.adapters = None
        self.memory_bytes = 0
        free_memory(getattr(self, "device", None), dropped)
