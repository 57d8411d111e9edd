"""Checks of one raw job input, shared by the workers (``ModelWorker.prepare``) and the HTTP gateway, which refuses
what a worker would fail before anything is queued. Pure functions; each problem is an ``InputError`` naming the
model, the limit and its setting. An image is checked from its length and header before anything is decoded.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import Any

from PIL import Image, UnidentifiedImageError

from swapless.config.describe import kind
from swapless.config.errors import InputError

__all__ = ["ALLOWED_FORMATS", "base64_image", "image_header", "image_payload", "text_input"]

ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")


def text_input(model_id: str, value: Any, max_chars: int) -> str:
    """``value`` when it is a non-blank string of at most ``max_chars`` characters.

    Raises:
        InputError: not a string, blank, or too long (naming ``SWAPLESS_MAX_TEXT_CHARS``).
    """
    if not isinstance(value, str):
        raise InputError(model_id, f"this is a text model; send a string, not {kind(value)}")
    if not value.strip():
        raise InputError(model_id, "empty text; send at least one non-blank character")
    if len(value) > max_chars:
        raise InputError(model_id, f"text of {len(value)} characters is over the limit of {max_chars} "
                         "(SWAPLESS_MAX_TEXT_CHARS)")
    return value


def image_payload(model_id: str, value: Any, max_bytes: int) -> str:
    """The base64 payload of an image input (``value`` stripped, a ``data:...;base64,`` prefix removed), checked for
    type, emptiness and size (from its length: nothing is decoded).

    Raises:
        InputError: not a string, empty, or over ``max_bytes`` once decoded (naming ``SWAPLESS_MAX_IMAGE_BYTES``).
    """
    if not isinstance(value, str):
        raise InputError(
            model_id, f"this is an image model; send a base64 string of a PNG/JPEG/WebP, not {kind(value)}"
        )
    text = value.strip()
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    if not text:
        raise InputError(model_id, "empty image; send a base64 string of a PNG/JPEG/WebP")
    if len(text) * 3 // 4 > max_bytes:
        raise InputError(model_id, f"encoded image of about {len(text) * 3 // 4} bytes is over the limit of "
                         f"{max_bytes} bytes (SWAPLESS_MAX_IMAGE_BYTES)")
    return text


def base64_image(model_id: str, value: Any, max_bytes: int) -> bytes | None:
    """The encoded image bytes of a base64 image input, or None when its payload is not valid base64.

    Raises:
        InputError: as ``image_payload``.
    """
    text = image_payload(model_id, value, max_bytes)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def image_header(model_id: str, data: bytes, max_pixels: int) -> Image.Image:
    """The image of encoded ``data``, opened lazily: its header is read and checked, no pixel is decoded.

    Raises:
        InputError: not an image, a format outside ``ALLOWED_FORMATS``, a header cut short, or more than
            ``max_pixels`` pixels (naming ``SWAPLESS_MAX_IMAGE_PIXELS``).
    """
    try:
        with warnings.catch_warnings():
            # Pillow warns (and later raises) on huge images; the size is checked here, before decoding.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=list(ALLOWED_FORMATS))
    except UnidentifiedImageError:
        raise InputError(
            model_id, f"the bytes are not an image Pillow can read ({', '.join(ALLOWED_FORMATS)})"
        ) from None
    except Image.DecompressionBombError as err:
        raise InputError(model_id, f"image rejected as a decompression bomb: {err}") from None
    except (OSError, SyntaxError, ValueError) as err:
        # A header cut short or corrupt fails in open() already (plain OSError, e.g. any truncated WebP).
        raise InputError(model_id, f"image data is truncated or corrupt ({err})") from None
    width, height = image.size
    if width * height > max_pixels:
        raise InputError(model_id, f"image of {width}x{height} pixels is over the limit of {max_pixels} pixels "
                         "(SWAPLESS_MAX_IMAGE_PIXELS)")
    return image
