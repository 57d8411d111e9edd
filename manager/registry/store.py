"""ModelStore: which models exist. Metadata only; it never loads a model."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from pydantic import ValidationError

from swapless.config.describe import kind
from swapless.config.errors import ConfigError, InputError, UnknownModel
from swapless.manager.registry.routing import NoBranch, Resolved, resolve
from swapless.manager.registry.specs import InputType, ModelsFile, ModelSpec, RouteSpec, VariantSpec

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
        tagged = len(loc) >= 3 and loc[2] in ("model", "variant", "route")  # the entry's kind tag
        parts = loc[3:] if tagged else loc[2:]
        field = ".".join(str(part) for part in parts)
        return f"{source}: {entry_name}" + (f", field {field!r}" if field else "")
    return f"{source}: " + (".".join(str(part) for part in loc) or "top level")


def _existing(base: Path, value: Path | str, where: str) -> Path:
    """``value`` resolved against ``base`` (the models file's directory); ConfigError naming ``where`` if missing."""
    text = os.fspath(value)
    resolved = os.path.join(base, os.path.expanduser(text) if text.startswith("~") else text)  # absolute: as is
    if not os.path.exists(resolved):
        raise ConfigError(where, f"{resolved} does not exist")
    return Path(resolved)


class ModelStore:
    """The registry of models, read from ``models.json`` and validated at start-up.

    A variant is found by ``get`` but not iterated over: it is queued, placed, loaded and run as part of its base.

    Args:
        specs: the model entries.
        frameworks: framework names that have a worker (``None`` skips the check, as a producer needs no workers).
    """

    def __init__(self, specs: Iterable[ModelSpec | VariantSpec | RouteSpec],
                 frameworks: Iterable[str] | None = None, *, root: Path | None = None, source: str = "") -> None:
        self._specs: dict[str, ModelSpec] = {}
        #: Variant id -> its entry (expanded); base id -> its variants' ids.
        self._variants: dict[str, ModelSpec] = {}
        self._families: dict[str, list[str]] = {}
        self._aliases: dict[str, str] = {}
        self._routes: dict[str, RouteSpec] = {}
        known_frameworks = sorted(frameworks) if frameworks is not None else None
        routes: list[tuple[int, RouteSpec]] = []
        variants: list[tuple[int, VariantSpec]] = []
        for index, spec in enumerate(specs):
            if isinstance(spec, RouteSpec):
                routes.append((index, spec))
                continue
            if isinstance(spec, VariantSpec):
                variants.append((index, spec))
                continue
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
        for index, variant in variants:
            self._add_variant(index, variant, root, source)
        for index, route in routes:
            if route.id in self._specs or route.id in self._aliases or route.id in self._routes:
                raise ConfigError(f"models[{index}] (id {route.id!r})", "id is already used by a model, an alias or "
                                  "another route: a route needs its own id")
            self._routes[route.id] = route
        for index, route in routes:
            self._check_route(index, route)

    def _add_variant(self, index: int, variant: VariantSpec, root: Path | None, source: str) -> None:
        where = f"models[{index}] (id {variant.id!r})"
        def taken(name: str) -> bool:
            return name in self._specs or name in self._aliases or name in self._variants

        if taken(variant.id):
            raise ConfigError(where, "id is already used by another model, variant or alias")
        base = self._specs.get(self._aliases.get(variant.base, variant.base))
        if base is None:
            known = ", ".join(self._specs) or "none"
            raise ConfigError(f"{where}, field 'base'", f"unknown base model {variant.base!r} (known: {known})")
        if base.type is not InputType.TEXT:
            raise ConfigError(f"{where}, field 'base'", f"base {base.id!r} is an image model; adapters run over "
                              "text classifiers (framework transformers)")
        for alias in variant.aliases:
            if taken(alias) or alias == variant.id:
                raise ConfigError(f"{where}, field 'aliases'", f"alias {alias!r} is already used by another model")
            self._aliases[alias] = variant.id
        adapter = Path(variant.adapter) if root is None else _existing(
            root, variant.adapter, f"{source}: {where}, field 'adapter'" if source else f"{where}, field 'adapter'")
        self._variants[variant.id] = variant.expand(base, adapter)
        self._families.setdefault(base.id, []).append(variant.id)

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
        specs: list[ModelSpec | VariantSpec | RouteSpec] = []
        for index, spec in enumerate(parsed.models):
            if isinstance(spec, RouteSpec):
                specs.append(spec)
                continue
            if isinstance(spec, VariantSpec):  # its adapter is resolved as the store expands it
                specs.append(spec)
                continue
            updates: dict[str, Path] = {}
            for field in ("path", "labels_file"):
                value: Path | None = getattr(spec, field)
                if value is None:
                    continue
                updates[field] = _existing(base, value, f"{source}: models[{index}] (id {spec.id!r}), field {field!r}")
            specs.append(spec.model_copy(update=updates) if updates else spec)
        return cls(specs, frameworks, root=base, source=source)

    def _check_route(self, index: int, route: RouteSpec) -> None:
        """Every target exists, no route reaches itself, and every branch serves inputs of one type."""
        where = f"models[{index}] (id {route.id!r})"
        fields: dict[str, list[str]] = {
            "route": list(route.route or {}),
            "shadow": list(route.shadow or {}),
            "by_type": list((route.by_type or {}).values()),
        }
        for field, targets in fields.items():
            for target in targets:
                if field == "shadow" and target in self._routes:
                    raise ConfigError(f"{where}, field 'shadow'", f"{target!r} is a route: a shadow runs on one model")
                if target not in self._routes and target not in self:
                    known = ", ".join(sorted([*self._specs, *self._aliases, *self._routes])) or "none"
                    raise ConfigError(f"{where}, field {field!r}", f"unknown target {target!r} (known: {known})")
        self._route_types(route.id, (), where)
        if route.by_type is not None:
            for wanted, target in route.by_type.items():
                types = self._types(target, (route.id,), where)
                if types != {wanted}:
                    raise ConfigError(
                        f"{where}, field 'by_type'",
                        f"the {wanted.value!r} branch goes to {target!r}, which takes "
                        f"{' and '.join(sorted(t.value for t in types))} inputs",
                    )

    def _types(self, target: str, path: tuple[str, ...], where: str) -> set[InputType]:
        if target in self._routes:
            return self._route_types(target, path, where)
        return {self.get(target).type}

    def _route_types(self, route_id: str, path: tuple[str, ...], where: str) -> set[InputType]:
        """The input types a route serves (following routes to routes); a cycle or a split over models of
        different types is an error."""
        if route_id in path:
            cycle = " -> ".join([*path[path.index(route_id):], route_id])
            raise ConfigError(where, f"routes form a cycle: {cycle}")
        route = self._routes[route_id]
        if route.by_type is not None:
            for target in route.by_type.values():
                self._types(target, (*path, route_id), where)
            return set(route.by_type)
        types: set[InputType] = set()
        for target in [*(route.route or {}), *(route.shadow or {})]:
            types |= self._types(target, (*path, route_id), where)
        if len(types) > 1:
            raise ConfigError(f"{where}, field 'route'" if not path else where,
                              f"route {route_id!r} mixes text and image models: every version must take the same input")
        return types

    @property
    def routes(self) -> dict[str, RouteSpec]:
        """Route id -> its entry."""
        return dict(self._routes)

    def is_route(self, target: object) -> bool:
        return isinstance(target, str) and target in self._routes

    def route(
        self,
        target: str,
        value: object,
        key: str,
        overrides: Mapping[str, Mapping[str, float]] | None = None,
        *,
        paths: bool = True,
    ) -> Resolved:
        """The model that serves a job addressed to ``target``: itself for a model id or alias, else its route's pick
        and shadows. ``paths``: whether an input may be an image file's path.

        Raises:
            UnknownModel: no model, alias or route of that id.
            InputError: a ``by_type`` route has no branch for this input.
        """
        if not self._routes or target not in self._routes:
            return Resolved(self.resolve(target))
        try:
            found = resolve(self._routes, target, value, key, overrides, paths=paths)
        except NoBranch as err:
            kind_found = f"{err.found.value} input" if err.found is not None else f"{kind(value)} input"
            raise InputError(target, f"route {err.route_id!r} takes {' or '.join(err.accepts)} inputs, not "
                             f"{kind_found}; send one of those") from None
        return Resolved(self.resolve(found.model_id), tuple(self.resolve(m) for m in found.shadows), found.via)

    def get(self, model_id: str) -> ModelSpec:
        """The entry for ``model_id`` (an id or an alias).

        Raises:
            UnknownModel: no such id; the message lists the known ids.
        """
        try:
            canonical = self._aliases.get(model_id, model_id)
            found = self._specs.get(canonical)
            return found if found is not None else self._variants[canonical]
        except (KeyError, TypeError):
            raise UnknownModel(str(model_id), [*self._specs, *self._variants, *self._routes]) from None

    def resolve(self, model_id: str) -> str:
        """The canonical id of ``model_id`` (an id or an alias). Raises UnknownModel."""
        return self.get(model_id).id

    def home(self, model_id: str) -> str:
        """The model whose lists, cache entry and forward passes serve ``model_id`` (an id or alias): a variant's
        base, else the model itself. Raises UnknownModel."""
        spec = self.get(model_id)
        return spec.base or spec.id

    @property
    def has_variants(self) -> bool:
        return bool(self._variants)

    def variants(self, base_id: str | None = None) -> list[ModelSpec]:
        """The variants of ``base_id`` (all of them when None), in file order."""
        if base_id is None:
            return list(self._variants.values())
        return [self._variants[v] for v in self._families.get(base_id, ())]

    def __contains__(self, model_id: object) -> bool:
        return isinstance(model_id, str) and (
            model_id in self._specs or model_id in self._aliases or model_id in self._variants)

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def ids(self) -> list[str]:
        """All model ids, in file order."""
        return list(self._specs)
