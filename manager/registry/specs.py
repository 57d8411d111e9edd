"""Typed entries of ``models.json``. Unknown keys are errors, never silently dropped."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

__all__ = ["InputType", "ModelSpec", "ModelsFile", "RouteSpec", "VariantSpec"]

_ID = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"


class InputType(str, Enum):  # noqa: UP042 - str() and format() give the member name; StrEnum would give the value
    """What a model's jobs carry: a string of text, or a base64-encoded image."""

    TEXT = "text"
    IMAGE = "image"


class ModelSpec(BaseModel):
    """One model the service can run.

    Attributes:
        id: what jobs address (any slug, or a UUID).
        aliases: other names jobs may use for this model.
        name: hub id (transformers), builder name (torchvision) or Triton model name.
        type: ``text`` or ``image``.
        framework: the worker that runs it (``transformers``, ``torchvision``, ``triton``).
        version: free-form version string.
        description: free-form text.
        path: local directory or weights file used instead of the hub; relative to the models file.
        weights: torchvision weights enum member whose transforms and categories are used.
        max_batch_size: inputs per forward pass; unset uses ``SWAPLESS_MAX_BATCH_SIZE``.
        top_k: labels returned per input, best first.
        triton_url: Triton HTTP endpoint for this model; unset uses ``SWAPLESS_TRITON_URL``.
        labels_file: text file with one label per line (Triton models), relative to the models file.
        dtype: the parameters' dtype once loaded (``float32``, ``float16``, ``bfloat16``); unset keeps the checkpoint's.
        keep_loaded: loaded when a worker starts and kept resident (evicted last, never moved away by placement).
        base: set on a variant: the model whose weights it shares.
        adapter: a variant's PEFT adapter directory.
        labels: a variant's class names in class-index order (empty: its base's).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=128, pattern=_ID)
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
    keep_loaded: bool = False
    base: str | None = None
    adapter: Path | None = None
    labels: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check_dtype(self) -> ModelSpec:
        if self.dtype is not None and self.framework == "triton":
            raise ValueError(
                "dtype is for transformers and torchvision models; a Triton model's types are in its config.pbtxt"
            )
        return self


class VariantSpec(BaseModel):
    """A fine-tuned variant of another model entry: a PEFT adapter over that entry's weights, addressed as any model.

    Attributes:
        id: what jobs address.
        base: the id of the model entry it adapts (a ``transformers`` text classifier).
        adapter: the adapter directory, as PEFT's ``save_pretrained`` writes it; relative to the models file.
        labels: class names in class-index order; unset uses its base's.
        aliases, version, description, top_k: as for a model (``top_k`` unset: its base's).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=128, pattern=_ID)
    base: str = Field(min_length=1)
    adapter: str = Field(min_length=1)  # a path; the store resolves it (a thousand variants: no Path made twice)
    labels: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    version: str = "1"
    description: str = ""
    top_k: int | None = Field(default=None, ge=1)

    def expand(self, base: ModelSpec, adapter: Path | None = None) -> ModelSpec:
        """This variant as a model entry: its base's, with its own id, names, labels and adapter (``adapter``: its
        directory resolved, else as written)."""
        return base.model_copy(update={  # both entries are validated: no validation again
            "id": self.id, "aliases": self.aliases, "version": self.version, "description": self.description,
            "top_k": self.top_k or base.top_k, "base": base.id, "adapter": adapter or Path(self.adapter),
            "labels": self.labels,
            "keep_loaded": False,
        })


class RouteSpec(BaseModel):
    """One id over several models: a weighted ``route`` over versions with an optional ``shadow``, or a branch
    ``by_type`` of input. Its targets are model ids, aliases or other routes.

    Attributes:
        id: what jobs address.
        route: target -> weight (any positive numbers).
        shadow: target -> percent (0-100] of the jobs also run on it, results kept apart.
        by_type: input type (``text``, ``image``) -> target.
        description: free-form text.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=128, pattern=_ID)
    route: dict[str, float] | None = None
    shadow: dict[str, float] | None = None
    by_type: dict[InputType, str] | None = None
    description: str = ""

    @model_validator(mode="after")
    def _check(self) -> RouteSpec:
        if (self.route is None) == (self.by_type is None):
            raise ValueError(
                "a route entry has either 'route' (weights per version) or 'by_type' (a model per input type)"
            )
        if self.route is not None:
            if not self.route:
                raise ValueError("'route' names no target: give at least one, with a positive weight")
            bad = [
                f"{target}={weight:g}"
                for target, weight in self.route.items()
                if not weight > 0 or weight == float("inf")
            ]
            if bad:
                raise ValueError(f"route weights must be positive numbers, not {', '.join(bad)}")
        if self.shadow is not None:
            if self.route is None:
                raise ValueError("'shadow' goes with 'route': a by_type entry has no traffic split to copy")
            bad = [f"{target}={share:g}" for target, share in self.shadow.items() if not 0 < share <= 100]
            if bad:
                raise ValueError(f"shadow shares are percents in (0, 100], not {', '.join(bad)}")
        if self.by_type is not None and not self.by_type:
            raise ValueError("'by_type' names no branch: give a model for 'text', 'image' or both")
        return self


def _entry_kind(entry: Any) -> str:
    if isinstance(entry, dict) and ("route" in entry or "by_type" in entry):
        return "route"
    return "variant" if isinstance(entry, dict) and "base" in entry else "model"


class ModelsFile(BaseModel):
    """The whole ``models.json``: ``{"models": [ModelSpec | VariantSpec | RouteSpec, ...]}`` (an entry with
    ``route`` or ``by_type`` is a route, one with ``base`` a variant)."""

    model_config = ConfigDict(extra="forbid")

    models: list[
        Annotated[
            Annotated[ModelSpec, Tag("model")] | Annotated[VariantSpec, Tag("variant")]
            | Annotated[RouteSpec, Tag("route")],
            Discriminator(_entry_kind),
        ]
    ]
