"""``POST /v1/files``'s body: ``multipart/form-data`` parsed as it streams, the file written to disk line by line."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO

from swapless.tasks.gateway.batches.lines import LineChecker
from swapless.tasks.gateway.errors import BadBatchFile

__all__ = ["LineWriter", "MultipartReader", "Upload", "boundary_of"]

_FIELD_BYTES = 1024
_HEADER_BYTES = 16 * 1024
#: Most parts of an upload (``purpose``, ``file``, and a few a client may add): more are refused, so that a body of
#: many small fields cannot make the gateway hold them.
_MAX_PARTS = 8
#: The small fields kept; any other's bytes are checked against ``_FIELD_BYTES`` and dropped.
_KEPT_FIELDS = frozenset({"purpose"})
_BOUNDARY = re.compile(r'boundary=(?:"([^"]{1,70})"|([^\s;"]{1,70}))', re.IGNORECASE)
_NAME = re.compile(r'\bname="([^"]*)"', re.IGNORECASE)
_FILENAME = re.compile(r'\bfilename="([^"]*)"', re.IGNORECASE)


def boundary_of(content_type: str) -> bytes:
    """The multipart boundary of a ``Content-Type`` header.

    Raises:
        BadBatchFile: not ``multipart/form-data`` with a boundary.
    """
    if not content_type.lower().startswith("multipart/form-data"):
        raise BadBatchFile(0, "send the file as multipart/form-data with the fields purpose and file")
    found = _BOUNDARY.search(content_type)
    if found is None:
        raise BadBatchFile(0, "the multipart Content-Type has no boundary")
    return (found.group(1) or found.group(2)).encode("latin-1")


class LineWriter:
    """Writes a file's bytes to ``out`` one checked line at a time (``checker`` raises on a bad one)."""

    def __init__(self, out: IO[bytes], checker: LineChecker) -> None:
        self.out = out
        self.checker = checker
        self._pending = bytearray()
        self.bytes = 0

    def feed(self, data: bytes) -> None:
        self._pending += data
        start = 0
        while (end := self._pending.find(b"\n", start)) != -1:
            self._line(bytes(self._pending[start : end + 1]))
            start = end + 1
        del self._pending[:start]
        if len(self._pending) > self.checker.max_line_bytes:
            self.checker.check(bytes(self._pending))  # too long, and not even ended: refused now

    def close(self) -> None:
        if self._pending:
            self._line(bytes(self._pending) + b"\n")
            self._pending.clear()

    def _line(self, line: bytes) -> None:
        self.checker.check(line)
        self.out.write(line)
        self.bytes += len(line)


@dataclass
class Upload:
    """What a multipart upload held: its small fields and the file part's name (its bytes went to the writer)."""

    fields: dict[str, str]
    filename: str | None = None


@dataclass
class _Position:
    """Where a multipart parse is: the unparsed bytes, the state, the current part's name and small field."""

    upload: Upload
    buffer: bytearray
    state: str = "preamble"
    name: str | None = None
    field: bytearray = dataclasses.field(default_factory=bytearray)
    parts: int = 0


class MultipartReader:
    """A ``multipart/form-data`` body parsed as it streams.

    Args:
        boundary: the body's boundary.
        file_field: the part whose bytes go to ``writer``.
        writer: where that part's bytes go.
    """

    def __init__(self, boundary: bytes, file_field: str, writer: LineWriter) -> None:
        self.delimiter = b"\r\n--" + boundary
        self.file_field = file_field
        self.writer = writer

    async def read(self, blocks: AsyncIterator[bytes]) -> Upload:
        """Parse the body's ``blocks``.

        Raises:
            BadBatchFile: the body is malformed, a field is too long, or the file has a bad line.
        """
        at = _Position(Upload({}), bytearray(b"\r\n"))  # the first boundary has no CRLF of its own before it
        steps = {"preamble": self._preamble, "after": self._after, "headers": self._headers}
        async for block in blocks:
            at.buffer += block
            while True:
                more = await self._part_data(at) if at.state == "data" else steps[at.state](at)
                if at.state == "done":
                    return self._done(at.upload)
                if not more:
                    break
        raise BadBatchFile(0, "the multipart body ended before its closing boundary: send the whole file")

    def _preamble(self, at: _Position) -> bool:
        found = at.buffer.find(self.delimiter)
        if found == -1:
            if len(at.buffer) > _HEADER_BYTES:
                raise BadBatchFile(0, "the multipart body does not start with its boundary")
            return False
        del at.buffer[: found + len(self.delimiter)]
        at.state = "after"
        return True

    @staticmethod
    def _after(at: _Position) -> bool:
        if len(at.buffer) < 2:
            return False
        if at.buffer[:2] == b"--":
            at.state = "done"
            return True
        if at.buffer[:2] != b"\r\n":
            raise BadBatchFile(0, "the multipart body is malformed after a boundary")
        del at.buffer[:2]
        at.state = "headers"
        return True

    def _headers(self, at: _Position) -> bool:
        end = at.buffer.find(b"\r\n\r\n")
        if end == -1:
            if len(at.buffer) > _HEADER_BYTES:
                raise BadBatchFile(0, "a multipart part's headers are too long")
            return False
        headers = bytes(at.buffer[:end]).decode("utf-8", "replace")
        del at.buffer[: end + 4]
        at.name, filename = self._disposition(headers)
        at.parts += 1
        if at.parts > _MAX_PARTS:
            raise BadBatchFile(0, f"the upload has more than {_MAX_PARTS} parts: send the fields purpose and file")
        if at.name == self.file_field:
            at.upload.filename = filename or "upload.jsonl"
        at.field.clear()
        at.state = "data"
        return True

    async def _part_data(self, at: _Position) -> bool:
        buffer = at.buffer
        found = buffer.find(self.delimiter)
        keep = len(buffer) if found != -1 else max(0, len(buffer) - len(self.delimiter))
        await self._data(at.name, bytes(buffer[: found if found != -1 else keep]), at.field)
        if found == -1:
            del buffer[:keep]
            return False
        del buffer[: found + len(self.delimiter)]
        if at.name in _KEPT_FIELDS:
            at.upload.fields[at.name] = at.field.decode("utf-8", "replace")
        at.state = "after"
        return True

    def _done(self, upload: Upload) -> Upload:
        if upload.filename is None:
            raise BadBatchFile(0, f"the upload has no {self.file_field!r} part: send the JSONL file as that field")
        self.writer.close()
        return upload

    async def _data(self, name: str | None, data: bytes, field: bytearray) -> None:
        if name == self.file_field:
            if data:  # checking lines is CPU work: off the event loop
                await asyncio.to_thread(self.writer.feed, data)
            return
        field += data
        if len(field) > _FIELD_BYTES:
            raise BadBatchFile(0, f"the form field {name!r} is over {_FIELD_BYTES} bytes")

    @staticmethod
    def _disposition(headers: str) -> tuple[str | None, str | None]:
        for line in headers.split("\r\n"):
            if line.lower().startswith("content-disposition:"):
                name = _NAME.search(line)
                filename = _FILENAME.search(line)
                return (name.group(1) if name else None), (filename.group(1) if filename else None)
        return None, None
