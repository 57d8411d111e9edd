"""Image inputs given as file paths, read by the worker only from under one directory (SWAPLESS_INPUT_ROOT): only
regular files whose real path is under ``input_root``; without it no path is read. A refusal fails that one job
and never names the real path a symlink points to.
"""

from __future__ import annotations

import os
import re
import stat

from swapless.config.errors import InputError

__all__ = ["IMAGE_SIGNATURES", "looks_like_path", "read_image_file"]

#: Leading bytes of the image formats the workers decode (manager.frameworks.inputs.ALLOWED_FORMATS).
IMAGE_SIGNATURES: tuple[bytes, ...] = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"RIFF")
#: Longest value taken for a path (Linux PATH_MAX); base64 images are longer.
_MAX_PATH_CHARS = 4096
_EXTENSION = re.compile(r"\.[A-Za-z0-9]{1,5}$")


def looks_like_path(value: str) -> bool:
    """Whether a value that is not valid base64 should be read as a file path: one line, not too long, and with a
    directory separator or a file extension (``cats/001``, ``001.jpg``); ``"hello there"`` is not a path."""
    if not value or len(value) > _MAX_PATH_CHARS or "\n" in value or "\x00" in value:
        return False
    return "/" in value or "\\" in value or bool(_EXTENSION.search(value))


def _is_image(head: bytes) -> bool:
    if head.startswith(b"RIFF"):
        return head[8:12] == b"WEBP"
    return head.startswith(IMAGE_SIGNATURES)


def read_image_file(model_id: str, path: str, input_root: str | None, max_bytes: int) -> bytes:
    """The bytes of the image file ``path`` (relative to ``input_root``, or absolute and under it).

    Raises:
        InputError: no ``input_root``; the path resolves outside it; no such regular file; larger than ``max_bytes``;
            not a PNG, JPEG, WebP, GIF or BMP file.
    """
    if not input_root:
        raise InputError(
            model_id,
            f"{path!r} is not valid base64 and looks like a file path, but this worker reads no files: set "
            "SWAPLESS_INPUT_ROOT on the worker to a directory, and send paths under it",
        )
    root = os.path.realpath(input_root)
    real = os.path.realpath(os.path.join(root, path))
    if os.path.commonpath([real, root]) != root:
        raise InputError(
            model_id, f"path {path!r} is outside the input root (SWAPLESS_INPUT_ROOT={input_root}); send paths under it"
        )
    try:
        # O_NOFOLLOW: the last component is no symlink now; O_NONBLOCK: a FIFO must not hang the worker.
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise InputError(
            model_id, f"no file {path!r} under the input root (SWAPLESS_INPUT_ROOT={input_root})"
        ) from None
    except OSError as err:
        raise InputError(model_id, f"cannot read {path!r}: {err.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise InputError(model_id, f"{path!r} is not a regular file")
    with os.fdopen(fd, "rb") as file:
        if info.st_size > max_bytes:
            raise InputError(
                model_id,
                f"image file {path!r} of {info.st_size} bytes is over the limit of {max_bytes} bytes "
                "(SWAPLESS_MAX_IMAGE_BYTES)",
            )
        data = file.read(max_bytes + 1)
    if not _is_image(data[:12]):
        raise InputError(model_id, f"{path!r} is not an image file (PNG, JPEG, WebP, GIF or BMP)")
    return data
