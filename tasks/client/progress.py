"""Progress of a bulk job: a live rich bar on a terminal, plain periodic log lines otherwise.

Both show records done and failed, records per second (this run's records only, not those found done in the output
from an earlier run) and the time left.
"""

from __future__ import annotations

import logging
import time
from typing import IO, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

__all__ = ["BulkProgress", "LogProgress", "NullProgress", "RichProgress", "make_progress"]

logger = logging.getLogger("swapless.bulk")


class BulkProgress(Protocol):
    """What a bulk job reports as it goes."""

    def start(self, total: int, done: int, failed: int) -> None:
        """The job starts: about ``total`` records, ``done`` of them (``failed`` failed) already in the output."""

    def update(self, done: int, failed: int) -> None:
        """Records in the output now (from any run), and how many of them failed."""

    def notice(self, message: str) -> None:
        """Something the user should see (a stalled worker)."""

    def stop(self) -> None:
        """The job ended (finished or interrupted)."""


class NullProgress:
    """Reports nothing (the Python API's default)."""

    def start(self, total: int, done: int, failed: int) -> None: ...
    def update(self, done: int, failed: int) -> None: ...
    def stop(self) -> None: ...

    def notice(self, message: str) -> None:
        logger.warning("%s", message)


class _Rate:
    """Records per second and time left over this run's records."""

    def __init__(self, total: int, done: int) -> None:
        self.total = total
        self.base = done
        self.started = time.monotonic()

    def rate(self, done: int) -> float:
        elapsed = time.monotonic() - self.started
        return (done - self.base) / elapsed if elapsed > 0 else 0.0

    def eta_s(self, done: int) -> float | None:
        rate = self.rate(done)
        return max(0.0, self.total - done) / rate if rate > 0 else None


class LogProgress:
    """One plain line every ``interval_s`` seconds on ``stream`` (for logs, CI and cron mail).

    Args:
        stream: where the lines go (stderr by the CLI).
        interval_s: seconds between lines.
    """

    def __init__(self, stream: IO[str], interval_s: float = 10.0) -> None:
        self.stream = stream
        self.interval_s = interval_s
        self._rate = _Rate(0, 0)
        self._last_s = 0.0
        self._done = self._failed = 0

    def start(self, total: int, done: int, failed: int) -> None:
        self._rate = _Rate(total, done)
        self._last_s = time.monotonic()
        self._done, self._failed = done, failed
        resumed = f", resuming after {done} records already in the output" if done else ""
        self._line(f"bulk: starting, about {total} records{resumed}")

    def update(self, done: int, failed: int) -> None:
        self._done, self._failed = done, failed
        if time.monotonic() - self._last_s >= self.interval_s:
            self._last_s = time.monotonic()
            self._line(self._status())

    def notice(self, message: str) -> None:
        self._line(f"bulk: {message}")

    def stop(self) -> None:
        pass  # the CLI prints the summary

    def _status(self) -> str:
        eta = self._rate.eta_s(self._done)
        total = max(self._rate.total, self._done)
        return (
            f"bulk: {self._done}/{total} records ({self._failed} failed), {self._rate.rate(self._done):.0f} records/s, "
            f"ETA {'?' if eta is None else f'{eta:.0f} s'}"
        )

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


class RichProgress:
    """A live bar: records done of total, failed, records per second, time left."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._progress = Progress(
            TextColumn("[bold]bulk"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[red]{task.fields[failed]} failed"),
            TextColumn("{task.fields[rate]} rec/s"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None
        self._rate = _Rate(0, 0)

    def start(self, total: int, done: int, failed: int) -> None:
        self._rate = _Rate(total, done)
        self._progress.start()
        self._task = self._progress.add_task("bulk", total=max(total, done), completed=done, failed=failed, rate="-")

    def update(self, done: int, failed: int) -> None:
        if self._task is None:
            return
        total = max(self._rate.total, done)
        rate = f"{self._rate.rate(done):.0f}"
        self._progress.update(self._task, completed=done, total=total, failed=failed, rate=rate)

    def notice(self, message: str) -> None:
        self._progress.console.print(f"[yellow]{message}[/]", highlight=False)

    def stop(self) -> None:
        self._progress.stop()


def make_progress(stream: IO[str], *, interval_s: float = 10.0, force: str | None = None) -> BulkProgress:
    """A rich bar when ``stream`` is a terminal (or ``force="bar"``), plain lines otherwise (or ``force="log"``)."""
    if force == "none":
        return NullProgress()
    use_bar = force == "bar" or (force is None and stream.isatty())
    if use_bar:
        return RichProgress(Console(file=stream))
    return LogProgress(stream, interval_s)
