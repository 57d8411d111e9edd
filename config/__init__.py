"""What every side shares and nothing else: ``models.json`` (the model registry, data), the process settings from
the environment (``settings``), the error tree (``errors``) and how values are named in messages (``describe``).
Nothing here imports the model side or the queue side."""

from swapless.config.settings import DEFAULT_MODELS_FILE, Settings, get_settings, parse_bytes

__all__ = ["DEFAULT_MODELS_FILE", "Settings", "get_settings", "parse_bytes"]
