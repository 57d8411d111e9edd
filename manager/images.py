"""Decoding untrusted image bytes with Pillow, failing one job with a clear message per problem."""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

from manager.errors import InputError

__all__ = ["ALLOWED_FORMATS", "decode_image"]

ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


def decode_image(model_id: str, data: bytes, max_pixels: int) -> Image.Image:
    """Decode encoded image bytes into an RGB image.

    Raises:
        InputError: not an image, a format outside ``ALLOWED_FORMATS``, truncated data, or more than
            ``max_pixels`` pixels (a decompression bomb), checked from the header before any pixel is decoded.
    """
    try:
        with warnings.catch_warnings():
            # Pillow warns (and later raises) on huge images; we check the size ourselves, before decoding.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=list(ALLOWED_FORMATS))
    except UnidentifiedImageError:
        raise InputError(model_id, f"the bytes are not an image Pillow can read ({', '.join(ALLOWED_FORMATS)})") from None
    except Image.DecompressionBombError as err:
        raise InputError(model_id, f"image rejected as a decompression bomb: {err}") from None
    except (OSError, SyntaxError, ValueError) as err:
        # A header cut short or corrupt fails in open() already (plain OSError, e.g. any truncated WebP).
        raise InputError(model_id, f"image data is truncated or corrupt ({err})") from None
    width, height = image.size
    if width * height > max_pixels:
        raise InputError(
            model_id,
            f"image of {width}x{height} pixels is over the limit of {max_pixels} pixels (SWAPLESS_MAX_IMAGE_PIXELS)",
        )
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as err:
        raise InputError(model_id, f"image data is truncated or corrupt ({err})") from None
    return image.convert("RGB")
