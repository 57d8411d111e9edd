"""Typed entries of ``models.json``. Unknown keys are errors, never silently dropped."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["InputType", "ModelSpec", "ModelsFile"]


class InputType(str, Enum):
    """What a model's jobs carry: a string of text, or a base64-encoded image."""

    TEXT = "text"
    IMAGE = "image"


class ModelSpec(BaseModel):
    """One model the service can run.

    Attributes:
        id: what jobs address (any slug, or a UUID).
        aliases: other names jobs may use for this model (``sentiment`` for a UUID id, say).
        name: hub id (transformers), builder name (torchvision, e.g. ``mobilenet_v2``) or Triton model name.
        type: ``text`` or ``image``.
        framework: the worker that runs it (``transformers``, ``torchvision``, ``triton``).
        version: free-form version string, shown by ``swapless models``.
        description: free-form text.
        path: local directory or weights file used instead of the hub; relative to the models file.
        weights: torchvision weights enum member whose transforms and categories are used (default ``DEFAULT``).
        max_batch_size: inputs per forward pass; unset uses ``SWAPLESS_MAX_BATCH_SIZE``.
        top_k: labels returned per input, best first.
        triton_url: Triton HTTP endpoint for this model; unset uses ``SWAPLESS_TRITON_URL``.
        labels_file: text file with one label per line (Triton models), relative to the models file.
        dtype: the dtype of the parameters once loaded (``float32``, ``float16``, ``bfloat16``; transformers and
            torchvision models): half the memory in 16 bits. Unset keeps the checkpoint's. Scores are computed in
            float32 either way.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    aliases: tuple[str, ...] = ()
    name: str = Field(min_length=1)
    type: InputType
    framework: str = Field(min_length=1)
    version: str = "1"
    description: str = ""
    path: Path | None = None
    weights: str = "DEFAULT"
    max_batch_size: int | None = Field(default=None, ge=1)
    top_k: int = Field(default=5, ge=1)
    triton_url: str | None = None
    labels_file: Path | None = None
    dtype: Literal["float32", "float16", "bfloat16"] | None = None

    @model_validator(mode="after")
    def _check_dtype(self) -> ModelSpec:
        if self.dtype is not None and self.framework == "triton":
            raise ValueError("dtype is for transformers and torchvision models; a Triton model's types are in its config.pbtxt")
        return self


class ModelsFile(BaseModel):
    """The whole ``models.json``: ``{"models": [ModelSpec, ...]}``."""

    model_config = ConfigDict(extra="forbid")

    models: list[ModelSpec]
