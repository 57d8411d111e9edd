"""Process settings, read from the environment under the ``SWAPLESS_`` prefix (pydantic-settings).

Every default is listed here with its unit; the CLI flags of ``swapless worker`` set the same variables.

| variable                        | default                    | meaning |
|---------------------------------|----------------------------|---------|
| SWAPLESS_REDIS_URL              | unset                      | broker and result backend. Unset: the worker uses redis://127.0.0.1:6379/0; ``swapless submit``/``bulk`` start an embedded Redis (local mode) |
| SWAPLESS_MODELS_FILE            | config/models.json         | the model registry |
| SWAPLESS_QUEUE                  | swapless                   | Celery queue the jobs go through |
| SWAPLESS_KEY_PREFIX             | unset                      | prefix for every Redis key (queues and results), to share one Redis |
| SWAPLESS_MAX_MODELS             | 2                          | local models loaded at once (count limit of the LRU cache) |
| SWAPLESS_MEMORY_BUDGET          | unset (no byte limit)      | bytes of loaded local models, e.g. ``4GiB`` |
| SWAPLESS_TRITON_MAX_MODELS      | 4                          | Triton models kept loaded on their servers |
| SWAPLESS_DEVICE                 | auto                       | ``auto`` (cuda if available, else cpu), ``cpu``, ``cuda``, ``cuda:1`` |
| SWAPLESS_MAX_BATCH_SIZE         | 32                         | inputs per forward pass unless the model entry says otherwise |
| SWAPLESS_PREFETCH               | 1024 jobs                  | unacked jobs one worker holds: the backlog its scheduler groups |
| SWAPLESS_MAX_GROUP              | 256 jobs                   | most jobs of one model run before the scheduler decides again |
| SWAPLESS_MAX_WAIT_S             | 30 s                       | a job older than this is served next even if its model is cold |
| SWAPLESS_RESULT_EXPIRES_S       | 86400 s                    | how long results stay in Redis |
| SWAPLESS_VISIBILITY_TIMEOUT_S   | 600 s                      | an unacked job is redelivered after this (worker refuses batches that could outlive it) |
| SWAPLESS_TRITON_URL             | 127.0.0.1:8000             | default Triton HTTP endpoint |
| SWAPLESS_INPUT_ROOT             | unset (paths refused)      | directory image file paths must stay under |
| SWAPLESS_MAX_TEXT_CHARS         | 100000 characters          | longer text inputs fail their job |
| SWAPLESS_MAX_IMAGE_BYTES        | 20 MiB                     | larger encoded images fail their job |
| SWAPLESS_MAX_IMAGE_PIXELS       | 89478485 pixels            | Pillow's decompression-bomb limit |
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULT_MODELS_FILE", "DEFAULT_REDIS_URL", "Settings", "get_settings", "parse_bytes"]

DEFAULT_MODELS_FILE = Path(__file__).with_name("models.json")
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def parse_bytes(value: str | int | float) -> int:
    """Parse a size such as ``4GiB``, ``512MB``, ``1.5 GiB`` or ``1048576`` into bytes.

    Raises:
        ValueError: the text is not a number followed by a known unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB).
    """
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return int(value)
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"cannot read {value!r} as a size: write a number and a unit, like 4GiB, 512MiB or 2000000000"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


class Settings(BaseSettings):
    """Process settings; see the module docstring for the table of variables and defaults."""

    model_config = SettingsConfigDict(env_prefix="SWAPLESS_", extra="ignore")

    redis_url: str | None = None
    models_file: Path = DEFAULT_MODELS_FILE
    queue: str = "swapless"
    key_prefix: str | None = None
    max_models: int = Field(2, ge=1)
    memory_budget: int | None = None
    triton_max_models: int = Field(4, ge=1)
    device: str = "auto"
    max_batch_size: int = Field(32, ge=1)
    prefetch: int = Field(1024, ge=1)
    max_group: int = Field(256, ge=1)
    max_wait_s: float = Field(30.0, gt=0)
    result_expires_s: int = Field(86400, ge=1)
    visibility_timeout_s: int = Field(600, ge=10)
    triton_url: str = "127.0.0.1:8000"
    input_root: Path | None = None
    max_text_chars: int = Field(100_000, ge=1)
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1)
    max_image_pixels: int = Field(89_478_485, ge=1)

    @field_validator("memory_budget", mode="before")
    @classmethod
    def _parse_budget(cls, value: object) -> int | None:
        if value is None or value == "":
            return None
        if isinstance(value, (str, int, float)):
            return parse_bytes(value)
        raise ValueError(f"cannot read {value!r} as a size")

    @property
    def broker_url(self) -> str:
        """The Redis URL the worker connects to: the configured one, else the local default."""
        return self.redis_url or DEFAULT_REDIS_URL


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment once."""
    return Settings()
