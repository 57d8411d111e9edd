"""ModelStore: which models exist. Metadata only; it never loads a model."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import ValidationError

from manager.errors import ConfigError, UnknownModel
from manager.specs import ModelSpec, ModelsFile

__all__ = ["ModelStore"]


def _where(source: str, raw: object, loc: tuple[int | str, ...]) -> str:
    """Name the entry (by index and id when known) and the field a validation error points at."""
    if len(loc) >= 2 and loc[0] == "models" and isinstance(loc[1], int):
        index = loc[1]
        entry_id = None
        if isinstance(raw, dict) and isinstance(raw.get("models"), list) and index < len(raw["models"]):
            entry = raw["models"][index]
            if isinstance(entry, dict):
                entry_id = entry.get("id")
        entry_name = f"models[{index}]" + (f" (id {entry_id!r})" if entry_id else "")
        field = ".".join(str(part) for part in loc[2:])
        return f"{source}: {entry_name}" + (f", field {field!r}" if field else "")
    return f"{source}: " + (".".join(str(part) for part in loc) or "top level")


class ModelStore:
    """The registry of models, read from ``models.json`` and validated at start-up.

    Args:
        specs: the model entries.
        frameworks: framework names that have a worker; entries naming another fail. ``None`` skips the check
            (a producer that only submits jobs does not need the workers).
    """

    def __init__(self, specs: Iterable[ModelSpec], frameworks: Iterable[str] | None = None) -> None:
        self._specs: dict[str, ModelSpec] = {}
        self._aliases: dict[str, str] = {}
        known_frameworks = sorted(frameworks) if frameworks is not None else None
        for index, spec in enumerate(specs):
            if spec.id in self._specs:
                raise ConfigError(f"models[{index}] (id {spec.id!r})", "duplicate id: every model needs its own id")
            if known_frameworks is not None and spec.framework not in known_frameworks:
                raise ConfigError(
                    f"models[{index}] (id {spec.id!r}), field 'framework'",
                    f"unknown framework {spec.framework!r} (known: {', '.join(known_frameworks)})",
                )
            for alias in spec.aliases:
                if alias in self._specs or alias in self._aliases or alias == spec.id:
                    raise ConfigError(
                        f"models[{index}] (id {spec.id!r}), field 'aliases'",
                        f"alias {alias!r} is already used by another model",
                    )
                self._aliases[alias] = spec.id
            if spec.id in self._aliases:
                raise ConfigError(f"models[{index}] (id {spec.id!r})", "id is already used as another model's alias")
            self._specs[spec.id] = spec

    @classmethod
    def from_file(cls, path: str | Path, frameworks: Iterable[str] | None = None) -> ModelStore:
        """Read and validate a models file.

        Relative ``path`` and ``labels_file`` values are resolved against the file's own directory, and must exist.

        Raises:
            ConfigError: the file is missing, not JSON, or an entry is invalid; the message names the entry and field.
        """
        file = Path(path)
        source = str(file)
        try:
            raw = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(source, "models file not found; set SWAPLESS_MODELS_FILE or --models") from None
        except json.JSONDecodeError as err:
            raise ConfigError(source, f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
        try:
            parsed = ModelsFile.model_validate(raw)
        except ValidationError as err:
            first = err.errors()[0]
            raise ConfigError(_where(source, raw, tuple(first["loc"])), first["msg"]) from None

        base = file.resolve().parent
        specs = []
        for index, spec in enumerate(parsed.models):
            updates: dict[str, Path] = {}
            for field in ("path", "labels_file"):
                value: Path | None = getattr(spec, field)
                if value is None:
                    continue
                resolved = (base / value.expanduser()) if not value.expanduser().is_absolute() else value.expanduser()
                if not resolved.exists():
                    raise ConfigError(
                        f"{source}: models[{index}] (id {spec.id!r}), field {field!r}",
                        f"{resolved} does not exist",
                    )
                updates[field] = resolved
            specs.append(spec.model_copy(update=updates) if updates else spec)
        return cls(specs, frameworks)

    def get(self, model_id: str) -> ModelSpec:
        """The entry for ``model_id`` (an id or an alias).

        Raises:
            UnknownModel: no such id; the message lists the known ids.
        """
        try:
            return self._specs[self._aliases.get(model_id, model_id)]
        except (KeyError, TypeError):
            raise UnknownModel(str(model_id), self._specs) from None

    def resolve(self, model_id: str) -> str:
        """The canonical id of ``model_id`` (an id or an alias). Raises UnknownModel."""
        return self.get(model_id).id

    def __contains__(self, model_id: object) -> bool:
        return isinstance(model_id, str) and (model_id in self._specs or model_id in self._aliases)

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def ids(self) -> list[str]:
        """All model ids, in file order."""
        return list(self._specs)
