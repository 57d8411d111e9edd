"""Configuration: ``models.json`` (the model registry, data) and process settings from the environment."""

from config.settings import DEFAULT_MODELS_FILE, Settings, get_settings, parse_bytes

__all__ = ["DEFAULT_MODELS_FILE", "Settings", "get_settings", "parse_bytes"]
