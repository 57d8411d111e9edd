"""Bulk jobs: classify every record of a JSONL or CSV file into a JSONL output, resumably.

    from swapless.tasks.client.bulk import BulkJob, BulkRun
    summary = BulkRun(BulkJob("sentiment", Path("reviews.jsonl"), Path("out.jsonl")), Client()).run()

The output has one line per input record, in input order::

    {"ok":true,"key":"r-17","result":[{"label":"POSITIVE","score":0.98},...]}
    {"ok":false,"key":"r-18","error":"bad input for model 'sentiment': empty text; ...","type":"InputError"}

How a run stays flat in memory and resumes: docs/concepts/client.md.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Protocol

from swapless.config.errors import BulkFileError, DeadlinePassed, JobExpired
from swapless.tasks.client.progress import BulkProgress, NullProgress
from swapless.tasks.client.records import Record, RecordReader
from swapless.tasks.client.stream import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_MAX_IN_FLIGHT,
    ChunkEvent,
    ChunkStream,
)
from swapless.tasks.tracing import working

__all__ = ["DEFAULT_MAX_CHUNK_BYTES", "BulkJob", "BulkRun", "BulkSummary", "ChunkSource", "scan_output"]

#: A chunk is sent early once its inputs reach this many characters (image inputs: keep messages a few MiB).
DEFAULT_MAX_CHUNK_BYTES = 8 * 1024 * 1024
_FAILED_PREFIX = b'{"ok":false'


@dataclass(frozen=True)
class BulkJob:
    """What to run.

    Attributes:
        model_id: model id or alias.
        input_path: JSONL or CSV file.
        output_path: JSONL file written (appended to when resuming).
        field: JSON field / CSV column with the input.
        id_field: JSON field / CSV column with each record's key (None: the line number).
        fmt: ``jsonl``, ``csv``, ``tsv``, or None (by suffix).
        chunk_size: inputs per queue message.
        max_in_flight: chunks sent and not yet written, at most.
        max_chunk_bytes: a chunk is sent early when its inputs reach this many characters.
        restart: discard an existing output and start over.
        timeout_s: fail when a chunk has no result this long after it was sent (None: wait).
        expires: the deadline (aware datetime); the run stops at the first chunk not computed by then.
        key_field: JSON field / CSV column with each record's sticky routing key (None: the item id).
        priority: the chunks' priority.
    """

    model_id: str
    input_path: Path
    output_path: Path
    field: str = "text"
    id_field: str | None = None
    fmt: str | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    restart: bool = False
    timeout_s: float | None = None
    expires: datetime | None = None
    key_field: str | None = None
    priority: str = "bulk"

    def reader(self) -> RecordReader:
        """The input's reader (checks the file, its format and its columns; raises BulkFileError)."""
        if self.chunk_size < 1 or self.max_in_flight < 1:
            raise ValueError("chunk_size and max_in_flight must be at least 1")
        return RecordReader(self.input_path, self.model_id, field=self.field, id_field=self.id_field, fmt=self.fmt,
                            key_field=self.key_field)


@dataclass
class BulkSummary:
    """Where a bulk run stands; updated as it goes, final once ``run`` returns or raises.

    Attributes:
        records: records in the output (all runs).
        failed: how many of them failed.
        resumed_from: records already in the output when this run started.
        elapsed_s: this run's seconds.
        complete: every input record is in the output.
        max_in_flight_seen: most chunks in flight at once in this run.
        chunks_sent: chunk messages this run sent.
    """

    records: int = 0
    failed: int = 0
    resumed_from: int = 0
    elapsed_s: float = 0.0
    complete: bool = False
    max_in_flight_seen: int = 0
    chunks_sent: int = 0

    @property
    def ok(self) -> int:
        return self.records - self.failed

    @property
    def records_per_s(self) -> float:
        """This run's records per second."""
        return (self.records - self.resumed_from) / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class _Existing:
    records: int = 0
    failed: int = 0
    last_key: Any = None
    size_bytes: int = 0


def scan_output(path: Path) -> _Existing:
    """Count the complete lines of an earlier run's output, and cut a partial last line off (a crash mid-write).

    Raises:
        BulkFileError: a complete line is not one of ours (not JSON with a key).
    """
    if not path.exists():
        return _Existing()
    records = failed = 0
    end = 0
    last = b""
    with path.open("rb+") as file:
        for line in file:
            if not line.endswith(b"\n"):
                break  # a partial line: cut below
            records += 1
            failed += line.startswith(_FAILED_PREFIX)
            end += len(line)
            last = line
        if file.tell() != end or os.fstat(file.fileno()).st_size != end:
            file.truncate(end)
            file.flush()
            os.fsync(file.fileno())
    if not records:
        return _Existing(size_bytes=end)
    try:
        last_key = json.loads(last)["key"]
    except (ValueError, KeyError, TypeError):
        raise BulkFileError(
            str(path), f"line {records} is not a bulk output line; use another --output, or --restart to overwrite"
        ) from None
    return _Existing(records, failed, last_key, end)


def _line(key: Any, ok: bool, value: Any) -> str:
    if ok:
        return json.dumps({"ok": True, "key": key, "result": value}, separators=(",", ":"), ensure_ascii=False) + "\n"
    return json.dumps(
        {"ok": False, "key": key, "error": str(value), "type": type(value).__name__},
        separators=(",", ":"),
        ensure_ascii=False,
    ) + "\n"


class ChunkSource(Protocol):
    """What a bulk run needs of a producer: a ``ChunkStream`` for a model, and the queue's name (``Client``)."""

    @property
    def queue(self) -> str: ...

    def stream(self, model_id: str, priority: str = "bulk", **options: Any) -> ChunkStream: ...


class BulkRun:
    """Runs one ``BulkJob`` through a ``Client``; ``summary`` stays right even when ``run`` is interrupted.

    Args:
        job: what to run.
        client: the producer client (any ``ChunkSource``).
        progress: progress display; none by default.
        on_event: told about every chunk sent and read.
        watchdog: called while waiting for results; raise from it to stop.
    """

    def __init__(
        self,
        job: BulkJob,
        client: ChunkSource,
        *,
        progress: BulkProgress | None = None,
        on_event: Callable[[ChunkEvent], None] | None = None,
        watchdog: Callable[[], None] | None = None,
    ) -> None:
        self.job = job
        self.client = client
        self.progress = progress or NullProgress()
        self.on_event = on_event
        self.watchdog = watchdog
        self.summary = BulkSummary()

    def run(self, traceparent: str | None = None) -> BulkSummary:
        """Resume or start the job and run it to the end, in one trace when the process exports traces.

        Raises:
            BulkFileError: the input cannot be read, or the output does not continue this input.
            UnknownModel: the model is not in the registry.
            KeyboardInterrupt: Ctrl-C; the chunks in flight are cancelled, and a rerun resumes.
            DeadlinePassed: ``expires`` passed; the output holds every chunk before the first not computed.
        """
        attributes = {"swapless.model.id": self.job.model_id, "swapless.priority": self.job.priority}
        with working(f"bulk {self.job.model_id}", attributes, traceparent):
            return self._run()

    def _run(self) -> BulkSummary:
        job = self.job
        reader = job.reader()
        if job.expires is not None and job.expires <= datetime.now(UTC):
            raise DeadlinePassed(job.expires.isoformat(timespec="seconds"))
        stream = self.client.stream(  # checks the model id: fail before touching the output
            job.model_id, job.priority, expires=job.expires, max_in_flight=job.max_in_flight, timeout_s=job.timeout_s,
            on_event=self._event, watchdog=self.watchdog,
        )
        if job.restart and job.output_path.exists():
            job.output_path.unlink()
        existing = scan_output(job.output_path)
        summary = self.summary
        summary.records = summary.resumed_from = existing.records
        summary.failed = existing.failed
        records = self._resume(reader, existing)
        started = time.monotonic()
        self.progress.start(max(reader.estimate(), existing.records), summary.records, summary.failed)
        try:
            with job.output_path.open("ab") as output:
                for keyed, outcomes in stream.run(self._chunks(records)):
                    if any(not ok and isinstance(value, JobExpired) for ok, value in outcomes):
                        # not written: the output ends before this chunk, so a rerun resumes here
                        raise DeadlinePassed(job.expires.isoformat(timespec="seconds") if job.expires else "expires")
                    self._write(output, keyed, iter(outcomes))
                    summary.elapsed_s = time.monotonic() - started
                    self.progress.update(summary.records, summary.failed)
            summary.complete = True
        finally:
            summary.elapsed_s = time.monotonic() - started
            self.progress.stop()
        return summary

    def _resume(self, reader: RecordReader, existing: _Existing) -> Iterator[Record]:
        """The records after those already in the output, checking that the output continues this input."""
        parsed = reader.records(parse_from=max(0, existing.records - 1))
        if existing.records:
            last: Record | None = None
            count = 0
            for last in itertools.islice(parsed, existing.records):  # noqa: B007 - the last one read is kept
                count += 1
            if count < existing.records:
                last = None
            if last is None or last.key != existing.last_key:
                found = "has fewer records" if last is None else f"has key {last.key!r} at record {existing.records}"
                raise BulkFileError(
                    str(self.job.output_path),
                    f"does not continue {self.job.input_path}: its last line (record {existing.records}) has key "
                    f"{existing.last_key!r} but the input {found}; use another --output, or --restart to overwrite",
                )
        return (record for record in parsed if record is not None)

    def _chunks(
        self, records: Iterator[Record]
    ) -> Iterator[tuple[list[tuple[Any, Any]], list[Any], list[str | None] | None]]:
        """``(keys and pre-failures, inputs, routing keys)`` per chunk, cut at ``chunk_size`` or ``max_chunk_bytes``."""
        keyed: list[tuple[Any, Any]] = []
        inputs: list[Any] = []
        route_keys: list[str | None] = []
        size = 0
        for record in records:
            keyed.append((record.key, record.error))
            if record.error is None:
                inputs.append(record.value)
                route_keys.append(record.route_key)
                size += len(record.value) if isinstance(record.value, str) else 16
            if len(keyed) >= self.job.chunk_size or size >= self.job.max_chunk_bytes:
                yield keyed, inputs, route_keys if self.job.key_field else None
                keyed, inputs, route_keys, size = [], [], [], 0
        if keyed:
            yield keyed, inputs, route_keys if self.job.key_field else None

    def _write(self, output: IO[bytes], keyed: list[tuple[Any, Any]], outcomes: Iterator[tuple[bool, Any]]) -> None:
        lines = []
        failed = 0
        for key, error in keyed:
            ok, value = (False, error) if error is not None else next(outcomes)
            failed += not ok
            lines.append(_line(key, ok, value))
        output.write("".join(lines).encode("utf-8"))
        output.flush()
        os.fsync(output.fileno())  # the output's complete lines are what a rerun resumes from
        self.summary.records += len(keyed)
        self.summary.failed += failed

    def _event(self, event: ChunkEvent) -> None:
        if event.kind == "sent":
            self.summary.chunks_sent += 1
            self.summary.max_in_flight_seen = max(self.summary.max_in_flight_seen, event.in_flight)
        elif event.kind == "refused":
            self.progress.notice(f"{event.detail}; sending the chunk again ({event.waited_s:.0f} s so far)")
        elif event.kind == "waiting":
            self.progress.notice(
                f"no result for chunk {event.chunk_id} after {event.waited_s:.0f} s: is a worker consuming queue "
                f"{self.client.queue!r} on this Redis, with this model?"
            )
        if self.on_event is not None:
            self.on_event(event)
