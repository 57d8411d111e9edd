"""The ``swapless bulk``, ``demo`` and ``demo-models`` commands, and local mode for ``swapless submit``.

``swapless.tasks.cli.main`` calls ``register(app)``. Exit status of ``bulk`` and ``demo``:

| status | meaning |
|--------|---------|
| 0      | every record succeeded (or some failed and ``--allow-failures`` was given) |
| 1      | some records failed (their lines in the output say why) |
| 2      | nothing was run: bad arguments, unreadable input, unknown model, an output that belongs to another input |
| 3      | stopped by an error midway (Redis went away, the local worker died, ``--timeout``): rerun to resume |
| 130    | interrupted (Ctrl-C, SIGTERM): rerun the same command to resume |
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from swapless.config.errors import JobTimeout, SwaplessError
from swapless.config.settings import Settings
from swapless.tasks.broker.connection import translate
from swapless.tasks.cli.common import ModelsOption, err_console, fail, print_error, settings_with
from swapless.tasks.client.stream import DEFAULT_CHUNK_SIZE, DEFAULT_MAX_IN_FLIGHT

if TYPE_CHECKING:
    from swapless.tasks.client.bulk import BulkJob, BulkSummary

__all__ = ["bulk", "demo", "demo_models", "register", "submit_local"]



def register(app: typer.Typer) -> None:
    """Add ``bulk``, ``demo`` and ``demo-models`` to the ``swapless`` command line."""
    app.command()(bulk)
    app.command()(demo)
    app.command("demo-models")(demo_models)


def _default_demo_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "swapless" / "demo-models"


def parse_deadline(text: str) -> datetime:
    """``--expires``: seconds from now, or an ISO date-time (without a zone: this machine's local time).

    Raises:
        ValueError: neither, or not in the future; the message says what to give.
    """
    now = datetime.now(UTC)
    try:
        when = now + timedelta(seconds=float(text))
    except ValueError:
        try:
            when = datetime.fromisoformat(text).astimezone(UTC)  # a naive time is local time
        except ValueError:
            raise ValueError(
                f"--expires must be seconds from now or a date-time like 2026-12-02T06:00, not {text!r}"
            ) from None
    if when <= now:
        raise ValueError(f"--expires {text!r} is not in the future ({when.isoformat(timespec='seconds')})")
    return when


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops a bulk job the way Ctrl-C does: cleanly, resumable


def _local_env(input_path: Path | None) -> dict[str, str]:
    """Worker environment in local mode: image paths may be read from the input file's directory by default."""
    if os.environ.get("SWAPLESS_INPUT_ROOT") or input_path is None:
        return {}
    return {"SWAPLESS_INPUT_ROOT": str(input_path.resolve().parent)}


@dataclass
class _Outcome:
    """How a bulk run ended: its summary (None: it never started), what stopped it, the Redis it used."""

    redis_url: str
    summary: BulkSummary | None = None
    stopped_by: BaseException | None = None


def _run_bulk(
    job: BulkJob, settings: Settings, *, local: bool, progress: str | None, log_every_s: float, allow_failures: bool,
    callback_url: str | None = None,
) -> None:
    """Run a BulkJob from the command line and exit with its status; ``callback_url``: queue the run's webhook."""
    try:
        job.reader()  # a bad file, format or column fails here, before anything starts
    except (SwaplessError, ValueError) as err:
        fail(err)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    outcome = _Outcome(settings.redis.broker_url)
    try:
        _run_session(job, settings, outcome, local=local, progress=progress, log_every_s=log_every_s,
                     callback_url=callback_url)
    except typer.Exit:
        raise
    except KeyboardInterrupt as err:
        outcome.stopped_by = err
    except Exception as err:  # noqa: BLE001 - Redis gone, local worker died, timeout: the output stays resumable
        outcome.stopped_by = err
    finally:
        signal.signal(signal.SIGTERM, previous)
    _exit_with(job, outcome, allow_failures)


def _run_session(
    job: BulkJob, settings: Settings, outcome: _Outcome, *, local: bool, progress: str | None, log_every_s: float,
    callback_url: str | None,
) -> None:
    """The run itself, its client (and local stack) closed at the end; fills in ``outcome``."""
    from swapless.config.errors import BulkFileError, ConfigError, UnknownModel
    from swapless.tasks import tracing
    from swapless.tasks.cli.local import LocalSwapless
    from swapless.tasks.client import Client
    from swapless.tasks.client.bulk import BulkRun
    from swapless.tasks.client.progress import make_progress

    with ExitStack() as stack:
        stack.callback(tracing.shutdown, tracing.configure("swapless-bulk"))  # the run's spans out before exit
        watchdog = None
        if local:
            why = "SWAPLESS_REDIS_URL is unset" if settings.redis.redis_url is None else "--local"
            err_console.print(f"local mode: starting an embedded Redis and a worker ({why})")
            embedded = stack.enter_context(LocalSwapless(settings, env=_local_env(job.input_path)))
            client = Client(settings=embedded.settings)
            watchdog = embedded.check
        else:
            client = Client(settings=settings)
        outcome.redis_url = client.settings.redis.broker_url
        stack.callback(client.close)
        reporter = make_progress(sys.stderr, interval_s=log_every_s, force=progress)
        runner = BulkRun(job, client, progress=reporter, watchdog=watchdog)
        try:
            outcome.summary = runner.run()
        except (BulkFileError, ConfigError, UnknownModel) as err:
            fail(err)  # nothing was sent
        except (KeyboardInterrupt, Exception) as err:  # noqa: BLE001 - reported below, after the webhook
            outcome.stopped_by = err
        finally:
            outcome.summary = runner.summary
        if callback_url is not None and outcome.summary is not None:
            _send_run_webhook(client, callback_url, job, outcome.summary, outcome.stopped_by, local=local)


def _exit_with(job: BulkJob, outcome: _Outcome, allow_failures: bool) -> None:
    """Print the run's summary and exit with its status (130 interrupted, 3 an error, 1 failed records)."""
    summary, stopped_by = outcome.summary, outcome.stopped_by
    if isinstance(stopped_by, KeyboardInterrupt):
        _print_summary(job, summary, stopped="interrupted")
        raise typer.Exit(130)
    if stopped_by is not None:
        print_error(translate(stopped_by, outcome.redis_url))  # Redis gone: one line naming it
        _print_summary(job, summary, stopped="stopped by an error")
        raise typer.Exit(3)
    _print_summary(job, summary)
    if summary is not None and summary.failed and not allow_failures:
        raise typer.Exit(1)


def _send_run_webhook(
    client: Any, url: str, job: BulkJob, summary: BulkSummary, stopped_by: BaseException | None, *, local: bool
) -> None:
    from swapless.tasks.cli.run_webhook import queue_run_webhook

    stopped = None
    if isinstance(stopped_by, KeyboardInterrupt):
        stopped = "interrupted"
    elif stopped_by is not None:
        stopped = f"stopped by an error: {translate(stopped_by, client.settings.redis.broker_url)}"
    try:
        err_console.print(queue_run_webhook(client, url, job, summary, stopped, local=local), highlight=False)
    except Exception as err:  # noqa: BLE001 - Redis gone: the run's own outcome is reported next
        err_console.print(f"bulk: the run's webhook to {url} could not be queued: "
                          f"{translate(err, client.settings.redis.broker_url)}", highlight=False)


def _print_summary(job: BulkJob, summary: BulkSummary | None, stopped: str | None = None) -> None:
    if summary is None or (stopped and not summary.chunks_sent and summary.records == summary.resumed_from):
        err_console.print(f"bulk: {stopped} before starting; rerun the same command to resume", highlight=False)
        return
    this_run = summary.records - summary.resumed_from
    earlier = f", {summary.resumed_from} of them from an earlier run" if summary.resumed_from else ""
    line = (
        f"bulk: {summary.records} records in {job.output_path} ({summary.ok} ok, {summary.failed} failed{earlier}); "
        f"this run: {this_run} records in {summary.elapsed_s:.1f} s, {summary.records_per_s:.0f} records/s"
    )
    if stopped:
        line += f"\nbulk: {stopped}; rerun the same command to resume"
    err_console.print(line, highlight=False)


def bulk(
    model: Annotated[str, typer.Argument(help="model id or alias (see `swapless models`)")],
    input: Annotated[Path, typer.Argument(help="JSONL or CSV file, one record per line/row")],
    output: Annotated[Path, typer.Option("--output", "-o", help="JSONL output, one line per record; rerun to resume")],
    field: Annotated[
        str, typer.Option(help="JSON field / CSV column with the input (text, base64 image, image path)")
    ] = "text",
    id_field: Annotated[
        str | None, typer.Option(help="JSON field / CSV column with each record's key [default: line number]")
    ] = None,
    key_field: Annotated[
        str | None,
        typer.Option(
            help="JSON field / CSV column with a sticky routing key (a user id): a route sends all of a key's records "
            "to one version"
        ),
    ] = None,
    fmt: Annotated[str | None, typer.Option("--format", help="jsonl, csv or tsv [default: from the suffix]")] = None,
    chunk_size: Annotated[int, typer.Option(min=1, help="inputs per queue message")] = DEFAULT_CHUNK_SIZE,
    max_in_flight: Annotated[int, typer.Option(min=1, help="chunks queued or running at once")] = DEFAULT_MAX_IN_FLIGHT,
    allow_failures: Annotated[
        bool, typer.Option("--allow-failures", help="exit 0 even if some records failed")
    ] = False,
    restart: Annotated[bool, typer.Option("--restart", help="overwrite the output instead of resuming it")] = False,
    timeout: Annotated[
        float | None, typer.Option(help="give up when a chunk has no result after this many seconds")
    ] = None,
    expires: Annotated[
        str | None,
        typer.Option(
            help="deadline: seconds from now, or a local date-time (2026-12-02T06:00); records not started by then "
            "are not computed and the run stops, resumable"
        ),
    ] = None,
    local: Annotated[
        bool | None,
        typer.Option(
            "--local/--no-local", help="embedded Redis and worker [default: when SWAPLESS_REDIS_URL is unset]"
        ),
    ] = None,
    progress: Annotated[
        str, typer.Option(help="auto (a bar on a terminal, else log lines), bar, log or none")
    ] = "auto",
    log_every: Annotated[
        float, typer.Option(min=0.1, help="seconds between progress lines when not on a terminal")
    ] = 10.0,
    callback_url: Annotated[
        str | None,
        typer.Option(help="a URL that gets one signed webhook when the run ends (see SWAPLESS_WEBHOOK_SECRET)"),
    ] = None,
    models: ModelsOption = None,
) -> None:
    """Classify every record of a JSONL/CSV file into a JSONL file, in input order; rerun to resume."""
    from swapless.tasks.cli.run_webhook import check_callback_url
    from swapless.tasks.client.bulk import BulkJob

    settings = settings_with(models_file=models)
    if progress not in ("auto", "bar", "log", "none"):
        fail(ValueError(f"--progress must be auto, bar, log or none, not {progress!r}"))
    if callback_url is not None:
        try:
            check_callback_url(callback_url, settings.webhooks.webhook_allowed_hosts)
        except SwaplessError as err:
            fail(err)
    try:
        deadline = parse_deadline(expires) if expires is not None else None
    except ValueError as err:
        fail(err)
    job = BulkJob(
        model, input, output, field=field, id_field=id_field, fmt=fmt, chunk_size=chunk_size,
        max_in_flight=max_in_flight, restart=restart, timeout_s=timeout, expires=deadline, key_field=key_field,
    )
    use_local = local if local is not None else settings.redis.redis_url is None
    _run_bulk(job, settings, local=use_local, progress=None if progress == "auto" else progress,
              log_every_s=log_every, allow_failures=allow_failures, callback_url=callback_url)


def _ensure_demo_models(directory: Path) -> Path:
    """The demo models' ``models.json`` in ``directory``, built there first if missing or stale."""
    models_file = directory / "models.json"
    from swapless.manager.demo.models import DEMO_VARIANTS

    stale = not models_file.exists() or "trained" not in _description(models_file, "sentiment") or any(
        not _description(models_file, variant) for variant in DEMO_VARIANTS)  # built before the demo had variants
    if stale:
        from swapless.manager.demo.models import build_demo_models

        err_console.print(
            f"building the demo models (tiny, offline; sentiment trained on the sample) in {directory} ..."
        )
        build_demo_models(directory, trained=True)
    return models_file


def _description(models_file: Path, model_id: str) -> str:
    try:
        entries = json.loads(models_file.read_text())["models"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return next((str(e.get("description", "")) for e in entries if isinstance(e, dict) and e.get("id") == model_id), "")


def demo_models(
    directory: Annotated[Path, typer.Argument(help="where to build them (created if missing)")],
    image: Annotated[bool, typer.Option(help="also build the image model (mobilenet_v2)")] = True,
    train: Annotated[bool, typer.Option(help="train the sentiment model on the demo sample (a few seconds)")] = True,
) -> None:
    """Build small models offline and a models.json listing them (random weights; sentiment trained on the sample)."""
    from swapless.manager.demo.models import build_demo_models

    models_file = build_demo_models(directory, image=image, trained=train)
    err_console.print(f"built; use them with:  export SWAPLESS_MODELS_FILE={models_file.resolve()}")


def demo(
    output: Annotated[Path, typer.Option("--output", "-o", help="JSONL output")] = Path("out-demo.jsonl"),
    input: Annotated[
        Path | None, typer.Option("--input", help="JSONL file with a 'text' field [default: the shipped sample]")
    ] = None,
    models_dir: Annotated[
        Path | None, typer.Option(help="demo models (built if missing) [default: ~/.cache/swapless/demo-models]")
    ] = None,
    model: Annotated[
        str, typer.Option(help="demo model: sentiment, spam, topic, or sentiment-stars (an adapter over sentiment)")
    ] = "sentiment",
) -> None:
    """Run a bulk job on the sample reviews with no Redis and no downloads.

    Builds tiny demo models (once, into a cache dir; the sentiment model learns the sample's labels in a few
    seconds), starts an embedded Redis and a worker, classifies the shipped sample of 300 reviews and stops both."""
    from swapless.manager.demo.sample import SAMPLE_PATH
    from swapless.tasks.client.bulk import BulkJob

    source = input or SAMPLE_PATH
    models_file = _ensure_demo_models(models_dir or _default_demo_dir())
    settings = settings_with(models_file=models_file)
    err_console.print(f"model {model}: {_description(models_file, model)}", highlight=False)
    job = BulkJob(model, source, output, id_field="id", restart=True)
    started = time.monotonic()
    try:
        _run_bulk(job, settings, local=True, progress=None, log_every_s=10.0, allow_failures=False)
    finally:
        if output.exists() and output.stat().st_size:
            with output.open(encoding="utf-8") as lines:
                head = [next(lines, "").rstrip("\n") for _ in range(3)]
            err_console.print(
                "first lines of the output:\n  " + "\n  ".join(line for line in head if line), highlight=False
            )
            err_console.print(
                f"demo done in {time.monotonic() - started:.1f} s: {source} classified into {output}. "
                f"Next: swapless bulk {model} {source} -o out.jsonl  (with your own models.json and Redis)",
                highlight=False,
            )


def submit_local(model: str, value: str, timeout_s: float, settings: Settings) -> None:
    """``swapless submit`` without SWAPLESS_REDIS_URL: start an embedded Redis and a worker, run the job, print
    ``{"job_id", "result"}`` and stop both (there is no queue to leave a job in, so this always waits)."""
    from swapless.tasks.cli.local import LocalSwapless
    from swapless.tasks.client import Client

    err_console.print("local mode: starting an embedded Redis and a worker (SWAPLESS_REDIS_URL is unset)")
    try:
        with LocalSwapless(settings) as embedded:
            client = Client(settings=embedded.settings)
            try:
                job = client.submit(model, value)
                deadline = time.monotonic() + timeout_s
                while True:
                    try:
                        result = job.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
                        break
                    except JobTimeout:
                        embedded.check()
                        if time.monotonic() >= deadline:
                            raise
            finally:
                client.close()
    except SwaplessError as err:
        fail(err)
    sys.stdout.write(json.dumps({"job_id": job.id, "result": result}) + "\n")
