"""Reading a bulk job's input file, JSON Lines or CSV, one record at a time, never the whole file.

Each record becomes a ``Record``: its key (the ``id_field`` value, else its line number) and the value to send, or
the ``InputError`` that says why it cannot be sent (it still gets its line in the output). In JSON Lines a line
that is a JSON string is the value itself; blank lines are not records. A CSV's header row names the columns.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swapless.config.describe import kind
from swapless.config.errors import BulkFileError, InputError

__all__ = ["FORMATS", "Record", "RecordReader"]

#: File suffixes by format.
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv"}
#: Largest CSV cell, in characters (base64 images in a column are far over the csv module's 128 KiB default).
_CSV_FIELD_LIMIT = 64 * 1024 * 1024
_BLOCK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Record:
    """One input record: ``key`` and the ``value`` to send, or the ``error`` that fails it without sending."""

    key: Any
    value: Any = None
    error: InputError | None = None
    #: the record's sticky routing key (``key_field``), when it has one
    route_key: str | None = None


class RecordReader:
    """Streams the records of one input file.

    Args:
        path: the input file.
        model_id: named in the per-record errors.
        field: the JSON field or CSV column holding the input.
        id_field: the JSON field or CSV column holding each record's key (None: the line number).
        key_field: the JSON field or CSV column holding each record's sticky routing key (None: none).
        fmt: ``jsonl``, ``csv`` or ``tsv``; None picks it from the suffix.

    Raises:
        BulkFileError: the file is missing, its format is unknown, or a CSV header lacks ``field``/``id_field``.
    """

    def __init__(
        self,
        path: Path,
        model_id: str,
        *,
        field: str = "text",
        id_field: str | None = None,
        fmt: str | None = None,
        key_field: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.model_id = model_id
        self.field = field
        self.id_field = id_field
        self.key_field = key_field
        if not self.path.is_file():
            raise BulkFileError(str(path), "no such input file")
        self.fmt = fmt or FORMATS.get(self.path.suffix.lower(), "")
        if self.fmt not in ("jsonl", "csv", "tsv"):
            known = ", ".join(sorted(FORMATS))
            raise BulkFileError(
                str(path), f"unknown input format {self.path.suffix!r}: use {known}, or --format jsonl|csv|tsv"
            )
        if self.fmt != "jsonl":
            with self._open_csv() as file:
                header = next(csv.reader(file, delimiter=self._delimiter), [])
            for wanted, option in ((field, "--field"), (id_field, "--id-field"), (key_field, "--key-field")):
                if wanted is not None and wanted not in header:
                    raise BulkFileError(
                        str(path), f"no column {wanted!r} ({option}); the header has: {', '.join(header) or 'nothing'}"
                    )

    @property
    def _delimiter(self) -> str:
        return "\t" if self.fmt == "tsv" else ","

    def _open_csv(self) -> Any:
        return self.path.open("r", encoding="utf-8-sig", newline="")

    def estimate(self) -> int:
        """About how many records there are (lines, less a CSV header), counted fast for progress and ETA."""
        lines = 0
        last = b"\n"
        with self.path.open("rb") as file:
            while block := file.read(_BLOCK_BYTES):
                lines += block.count(b"\n")
                last = block[-1:]
        lines += last != b"\n"
        return max(0, lines - (self.fmt != "jsonl"))

    def records(self, parse_from: int = 0) -> Iterator[Record | None]:
        """Every record in file order; the first ``parse_from`` are yielded as None, unparsed (cheap skipping)."""
        if self.fmt == "jsonl":
            return self._jsonl(parse_from)
        return self._csv(parse_from)

    def _jsonl(self, parse_from: int) -> Iterator[Record | None]:
        index = 0
        with self.path.open("rb") as file:
            for line_number, line in enumerate(file, start=1):
                if not line.strip():
                    continue
                yield self._parse_json(line, line_number) if index >= parse_from else None
                index += 1

    def _parse_json(self, line: bytes, line_number: int) -> Record:
        try:
            data = json.loads(line)
        except (ValueError, UnicodeDecodeError) as err:
            return self._bad(self._no_key(line_number), f"line {line_number} is not valid JSON ({err})")
        if isinstance(data, str) and self.id_field is None:
            return Record(line_number, data)
        if not isinstance(data, dict):
            problem = f"line {line_number} is {kind(data)}, not an object with {self.field!r}"
            return self._bad(self._no_key(line_number), problem)
        return self._from_fields(data, line_number)

    def _csv(self, parse_from: int) -> Iterator[Record | None]:
        csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
        with self._open_csv() as file:
            reader = csv.DictReader(file, delimiter=self._delimiter)
            for index, row in enumerate(reader):
                yield self._from_fields(row, reader.line_num) if index >= parse_from else None

    def _from_fields(self, data: dict[str, Any], line_number: int) -> Record:
        key: Any = line_number
        if self.id_field is not None:
            if data.get(self.id_field) is None:
                return self._bad(None, f"line {line_number} has no {self.id_field!r} (--id-field)")
            key = data[self.id_field]
        if data.get(self.field) is None:
            fields = ", ".join(str(name) for name in data) or "none"
            return self._bad(key, f"line {line_number} has no {self.field!r} (--field; it has: {fields})")
        route_key = data.get(self.key_field) if self.key_field is not None else None
        return Record(key, data[self.field], route_key=None if route_key is None else str(route_key))

    def _no_key(self, line_number: int) -> Any:
        """The key of a record whose fields cannot be read: its line number, or null when keys come from a field."""
        return line_number if self.id_field is None else None

    def _bad(self, key: Any, problem: str) -> Record:
        return Record(key, error=InputError(self.model_id, problem))
