"""Decoding untrusted image bytes with Pillow, failing one job with a clear message per problem."""

from __future__ import annotations

from PIL import Image

from swapless.config.errors import InputError
from swapless.manager.frameworks.inputs import ALLOWED_FORMATS, image_header

__all__ = ["ALLOWED_FORMATS", "decode_image"]


def decode_image(model_id: str, data: bytes, max_pixels: int) -> Image.Image:
    """Decode encoded image bytes into an RGB image.

    Raises:
        InputError: not an image, a format outside ``ALLOWED_FORMATS``, truncated data, or more than
            ``max_pixels`` pixels (a decompression bomb), checked from the header before any pixel is decoded.
    """
    image = image_header(model_id, data, max_pixels)
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as err:
        raise InputError(model_id, f"image data is truncated or corrupt ({err})") from None
    return image.convert("RGB")
