"""``Settings``: the components composed, read from the flat ``SWAPLESS_`` variables."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from functools import cache, lru_cache
from typing import Any, Self

from pydantic import BaseModel, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from swapless.config.errors import ConfigError
from swapless.config.settings.connection import JobSettings, RedisSettings
from swapless.config.settings.fleet import ObserveSettings, ScalingSettings
from swapless.config.settings.gateway import BatchSettings, GatewaySettings, WebhookSettings
from swapless.config.settings.worker import CacheSettings, InputSettings, PlacementSettings, WorkerSettings

__all__ = ["Settings", "fields", "get_settings", "load_settings", "unknown_variables"]

_PREFIX = "SWAPLESS_"


class _FlatEnvironment(PydanticBaseSettingsSource):
    """Each component's fields from ``SWAPLESS_<FIELD>``, case-insensitive."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every component at once

    def __call__(self) -> dict[str, Any]:
        environ = {name.upper(): value for name, value in os.environ.items()}
        found: dict[str, Any] = {}
        for component, (_, names) in _components().items():
            values = {name: environ[_PREFIX + name.upper()] for name in names if _PREFIX + name.upper() in environ}
            if values:
                found[component] = values
        return found


class Settings(BaseSettings):
    """Process settings by component; the constructor and ``model_copy`` also take fields by name."""

    model_config = SettingsConfigDict(env_prefix=_PREFIX, extra="ignore")

    redis: RedisSettings = Field(default_factory=RedisSettings)
    jobs: JobSettings = Field(default_factory=JobSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    placement: PlacementSettings = Field(default_factory=PlacementSettings)
    inputs: InputSettings = Field(default_factory=InputSettings)
    observe: ObserveSettings = Field(default_factory=ObserveSettings)
    scaling: ScalingSettings = Field(default_factory=ScalingSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)
    batches: BatchSettings = Field(default_factory=BatchSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _FlatEnvironment(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, data: Any) -> Any:
        return _nested(data, {}) if isinstance(data, dict) else data

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied; its keys may be components or fields."""
        return super().model_copy(update=_nested(dict(update or {}), self.__dict__), deep=deep)


@cache
def _components() -> dict[str, tuple[type[BaseModel], tuple[str, ...]]]:
    found = {}
    for component, info in Settings.model_fields.items():
        model = info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        found[component] = (model, tuple(model.model_fields))
    return found


def fields() -> dict[str, tuple[str, FieldInfo]]:
    """Every setting by name: its component and its field."""
    return {
        name: (component, model.model_fields[name])
        for component, (model, names) in _components().items()
        for name in names
    }


def _nested(data: dict[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with each field given by name moved into its component."""
    where = {name: component for name, (component, _) in fields().items()}
    flat = {name: data.pop(name) for name in list(data) if name in where}
    for name, value in flat.items():
        component = where[name]
        held = data.get(component, current.get(component))
        if isinstance(held, BaseModel):
            held = held.model_copy(update={name: value}) if current else {**held.__dict__, name: value}
        else:
            held = {**(held or {}), name: value}
        data[component] = held
    return data


def _misspelt_variable() -> ConfigError | None:
    """A variable that looks like a setting's name misspelt, if any."""
    known = [name.upper() for name in fields()]
    for variable in sorted(os.environ):
        if not variable.startswith(_PREFIX) or variable[len(_PREFIX) :] in known:
            continue
        name = variable[len(_PREFIX) :]
        close = [k for k in known if k.startswith(name + "_")] or difflib.get_close_matches(name, known, 1, 0.85)
        if close:
            return ConfigError(variable, f"no such setting; did you mean {_PREFIX}{close[0]}? (see config/settings/)")
    return None


#: Variables under the prefix that belong to other tools (the test suite, the benchmarks, CI), not to settings.
_OTHER_TOOLS = ("SWAPLESS_TEST_", "SWAPLESS_BENCH_", "SWAPLESS_FAULTS_", "SWAPLESS_PYTHON")


def unknown_variables() -> list[str]:
    """The ``SWAPLESS_*`` variables that are no setting, each with its likeliest setting (``X (SWAPLESS_Y?)``)."""
    known = [name.upper() for name in fields()]
    found = []
    for variable in sorted(os.environ):
        name = variable[len(_PREFIX) :]
        if not variable.startswith(_PREFIX) or name in known or variable.startswith(_OTHER_TOOLS):
            continue
        close = difflib.get_close_matches(name, known, 1, 0.5)
        found.append(f"{variable} ({_PREFIX}{close[0]}?)" if close else variable)
    return found


def load_settings(**overrides: object) -> Settings:
    """The environment's settings with ``overrides`` (by field name; None: not given) on top.

    Raises:
        ConfigError: a variable or an override is invalid, or a variable looks misspelt.
    """
    misspelt = _misspelt_variable()
    if misspelt is not None:
        raise misspelt
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return Settings(**given)  # type: ignore[arg-type]  # pydantic validates each value
    except ValidationError as err:
        first = err.errors()[0]
        known = fields()
        named = [str(part) for part in first["loc"] if str(part) in known]
        where = f"{_PREFIX}{named[-1].upper()}" if named else "settings"
        raise ConfigError(where, first["msg"].removeprefix("Value error, ")) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The environment's settings, read once per process.

    Raises:
        ConfigError: as ``load_settings``.
    """
    return load_settings()
