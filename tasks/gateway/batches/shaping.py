"""A batch's output and error files, in OpenAI's shape, written from its groups' bulk outputs as they grow."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from pydantic_core import from_json

from swapless.tasks.gateway.batches.lines import error_line, output_line

__all__ = ["EXPIRED", "Shaper", "read_jsonl"]

#: The error of a request the completion window ended before.
EXPIRED = "the batch's completion window ended before this request was started"


class Shaper:
    """Writes the output and error files in OpenAI's shape from the groups' bulk outputs as they grow.

    A driver starts them afresh, so a takeover rewrites what an earlier driver shaped, never doubling a line.
    """

    def __init__(self, batch_id: str, work: Path) -> None:
        self.batch_id = batch_id
        self.out_path, self.err_path = work / "output.jsonl", work / "errors.jsonl"
        self.work = work
        self.ok = self.failed = 0
        self._read: dict[int, tuple[int, int]] = {}  # group index -> (bytes read, lines read)
        self._out: IO[bytes] | None = None
        self._err: IO[bytes] | None = None

    def start(self) -> None:
        """Open both files afresh with the lines that failed at validation."""
        self._out = self.out_path.open("wb")
        self._err = self.err_path.open("wb")
        for bulk in read_jsonl(self.work / "prefailed.jsonl"):
            self._fail(bulk["key"], bulk["type"], bulk["error"], bulk.get("status"))

    def ensure_started(self) -> None:
        if self._out is None:
            self.start()

    def catch_up(self, index: int, model: str, output_name: str) -> int:
        """Shape what group ``index`` wrote since the last call; returns the group's lines read so far."""
        self.ensure_started()
        offset, done = self._read.get(index, (0, 0))
        try:
            with (self.work / output_name).open("rb") as file:
                file.seek(offset)
                for line in file:
                    if not line.endswith(b"\n"):  # a line still being written: read again next time
                        break
                    offset += len(line)
                    done += 1
                    bulk = from_json(line)
                    if bulk["ok"]:
                        assert self._out is not None
                        self._out.write(output_line(self.batch_id, bulk["key"], model, bulk["result"]))
                        self.ok += 1
                    else:
                        self._fail(bulk["key"], bulk["type"], bulk["error"], None)
        except FileNotFoundError:
            pass
        self._read[index] = (offset, done)
        return done

    def expired(self, input_name: str, done: int) -> None:
        """Fail a group's requests that never started (the completion window ended)."""
        for index, record in enumerate(read_jsonl(self.work / input_name)):
            if index >= done:
                self._fail(record["custom_id"], "JobExpired", EXPIRED, None)

    def close(self) -> None:
        for file in (self._out, self._err):
            if file is not None:
                file.close()

    def _fail(self, custom_id: str, type_name: str, message: str, status: int | None) -> None:
        assert self._err is not None
        self._err.write(error_line(self.batch_id, custom_id, type_name, str(message), status))
        self.failed += 1


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The complete lines of a JSONL file (none if it is missing)."""
    try:
        with path.open("rb") as file:
            for line in file:
                if line.endswith(b"\n"):  # a partial last line (a crash mid-write) is not an outcome
                    yield from_json(line)
    except FileNotFoundError:
        return
