"""What both sides share, importing neither: ``models.json``, the settings, the error tree, ``describe``."""

from swapless.config.settings import DEFAULT_MODELS_FILE, Settings, get_settings, parse_bytes

__all__ = ["DEFAULT_MODELS_FILE", "Settings", "get_settings", "parse_bytes"]
