"""Process settings from the ``SWAPLESS_`` variables, one model per component; the docs' reference is generated
from the fields' descriptions."""

from swapless.config.settings.connection import JobSettings, RedisSettings
from swapless.config.settings.fleet import ObserveSettings, ScalingSettings
from swapless.config.settings.gateway import BatchSettings, GatewaySettings, WebhookSettings
from swapless.config.settings.root import Settings, fields, get_settings, load_settings, unknown_variables
from swapless.config.settings.units import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MODELS_FILE, DEFAULT_REDIS_URL, parse_bytes
from swapless.config.settings.worker import CacheSettings, InputSettings, PlacementSettings, WorkerSettings

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MODELS_FILE",
    "DEFAULT_REDIS_URL",
    "BatchSettings",
    "CacheSettings",
    "GatewaySettings",
    "InputSettings",
    "JobSettings",
    "ObserveSettings",
    "PlacementSettings",
    "RedisSettings",
    "ScalingSettings",
    "Settings",
    "WebhookSettings",
    "WorkerSettings",
    "fields",
    "get_settings",
    "load_settings",
    "parse_bytes",
    "unknown_variables",
]
