"""Where the batch API keeps its files: a directory, or any fsspec URL (``SWAPLESS_BATCH_FILES_URL``).

Each file is ``<id>.jsonl`` and its ``<id>.json`` sidecar, written last: a file without a sidecar does not exist.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import fsspec
from fsspec.spec import AbstractFileSystem

from swapless.config.settings import BatchSettings

__all__ = ["FileInfo", "FileStore", "default_files_url", "new_file_id"]

logger = logging.getLogger(__name__)

_COPY_BYTES = 1 << 20


def default_files_url() -> str:
    """Where files go without ``SWAPLESS_BATCH_FILES_URL``: ``~/.local/share/swapless/files``."""
    return str(Path.home() / ".local" / "share" / "swapless" / "files")


def new_file_id() -> str:
    """A fresh file id (``file-`` and 24 hex digits: unguessable, so ids cannot be probed)."""
    return "file-" + secrets.token_hex(12)


@dataclass(frozen=True)
class FileInfo:
    """A stored file's metadata, in the shape of OpenAI's file object (``public``), and its owner."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    expires_at: int
    owner: str
    #: requests in the file (an input file's lines)
    lines: int = 0

    def public(self) -> dict[str, Any]:
        """What ``GET /v1/files/{id}`` answers."""
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "expires_at": self.expires_at, "status_details": None}


class FileStore:
    """The files of one deployment under one root.

    Args:
        url: the root: a path or an fsspec URL.
        retention_s: seconds a file is kept after it was written.
    """

    def __init__(self, url: str, retention_s: int) -> None:
        self.url = url
        self.retention_s = retention_s
        fs, root = fsspec.core.url_to_fs(url)
        self.fs: AbstractFileSystem = fs
        self.root = root.rstrip("/")
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))

    @classmethod
    def of(cls, settings: BatchSettings) -> FileStore:
        """The store ``SWAPLESS_BATCH_FILES_URL`` names."""
        return cls(settings.batch_files_url or default_files_url(), settings.batch_file_retention_s)

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def ensure(self) -> None:
        """Create the root (a directory) if it is missing."""
        self.fs.makedirs(self.root, exist_ok=True)

    def put(self, local: Path, *, file_id: str, filename: str, purpose: str, owner: str, lines: int = 0,
            move: bool = False) -> FileInfo:
        """Store ``local`` under ``file_id``, then its sidecar; ``move``: rename rather than copy where possible.

        Raises:
            OSError: the store cannot be written.
        """
        self.ensure()
        now = int(time.time())
        size = local.stat().st_size
        info = FileInfo(file_id, size, now, filename, purpose, now + self.retention_s, owner, lines)
        partial = self._path(f".{file_id}.{secrets.token_hex(4)}.partial")
        if move and self.local:
            os.replace(local, partial)
        else:
            self.fs.put_file(str(local), partial)
        self.fs.mv(partial, self._path(f"{file_id}.jsonl"))
        with self.fs.open(self._path(f"{file_id}.json"), "w") as sidecar:
            sidecar.write(json.dumps(asdict(info)))
        return info

    def info(self, file_id: str) -> FileInfo | None:
        """The file's metadata; None when there is no such file (or it has expired)."""
        if not file_id.startswith("file-") or "/" in file_id or len(file_id) > 128:
            return None
        try:
            with self.fs.open(self._path(f"{file_id}.json"), "r") as sidecar:
                info = FileInfo(**json.loads(sidecar.read()))
        except (FileNotFoundError, ValueError, TypeError):
            return None
        return None if info.expires_at <= time.time() else info

    def open(self, file_id: str) -> IO[bytes]:
        """The file's bytes, to read.

        Raises:
            FileNotFoundError: no such file.
        """
        file: IO[bytes] = self.fs.open(self._path(f"{file_id}.jsonl"), "rb")
        return file

    def chunks(self, file_id: str) -> Iterator[bytes]:
        """The file's bytes in blocks of 1 MiB (a download streams; it never holds the file)."""
        with self.open(file_id) as file:
            while block := file.read(_COPY_BYTES):
                yield block

    def delete(self, file_id: str) -> None:
        """Delete the file (its sidecar first: from then on it does not exist)."""
        for name in (f"{file_id}.json", f"{file_id}.jsonl"):
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self._path(name))

    def list(self) -> list[FileInfo]:
        """Every file not expired, newest first."""
        try:
            names = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            base = os.path.basename(str(name).rstrip("/"))
            if base.endswith(".json") and base.startswith("file-"):
                info = self.info(base[: -len(".json")])
                if info is not None:
                    found.append(info)
        return sorted(found, key=lambda info: (info.created_at, info.id), reverse=True)

    def purge(self) -> int:
        """Delete the files past their retention, and partial uploads a day old; returns how many files went."""
        try:
            entries = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return 0
        now = time.time()
        gone = 0
        for entry in entries:
            base = os.path.basename(str(entry["name"]).rstrip("/"))
            if base.endswith(".json") and base.startswith("file-"):
                file_id = base[: -len(".json")]
                try:
                    with self.fs.open(self._path(base), "r") as sidecar:
                        expires_at = json.loads(sidecar.read()).get("expires_at", 0)
                except (FileNotFoundError, ValueError):
                    continue
                if expires_at <= now:
                    self.delete(file_id)
                    gone += 1
            elif base.endswith(".partial"):
                modified = entry.get("mtime") or entry.get("LastModified") or now
                if isinstance(modified, (int, float)) and now - modified > 86400:
                    self.fs.rm(self._path(base))
        if gone:
            logger.info("deleted %d batch file(s) past SWAPLESS_BATCH_FILE_RETENTION_S", gone)
        return gone
