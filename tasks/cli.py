"""The ``swapless`` command line (typer): worker, submit, result, models."""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from config.settings import get_settings, parse_bytes
from manager.errors import SwaplessError

__all__ = ["app", "main"]

app = typer.Typer(
    name="swapless",
    help="Serve many models from limited GPU memory as a queue-based batch inference worker.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

ModelsOption = Annotated[
    Path | None, typer.Option("--models", help="models file (default: SWAPLESS_MODELS_FILE, else config/models.json)")
]


def _set_env(**values: Any) -> None:
    """Turn flags into SWAPLESS_ variables so every part of the process (and Celery) reads the same settings."""
    for name, value in values.items():
        if value is not None:
            os.environ[f"SWAPLESS_{name.upper()}"] = str(value)
    get_settings.cache_clear()


def _fail(err: Exception) -> None:
    err_console.print(f"[bold red]error:[/] {err}", highlight=False)
    raise typer.Exit(2)


@app.command()
def worker(
    models: ModelsOption = None,
    max_models: Annotated[int | None, typer.Option(help="local models loaded at once [default: 2]")] = None,
    memory_budget: Annotated[str | None, typer.Option(help="bytes of loaded local models, like 4GiB")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda or cuda:N [default: auto]")] = None,
    queue: Annotated[str | None, typer.Option(help="queue to consume [default: swapless]")] = None,
    prefetch: Annotated[int | None, typer.Option(help="unacked jobs held, the scheduler's window [default: 1024]")] = None,
    loglevel: Annotated[str, typer.Option(help="celery log level")] = "INFO",
    hostname: Annotated[str | None, typer.Option(help="worker node name (celery -n)")] = None,
) -> None:
    """Run the GPU worker: consume jobs, group them by model, run them through the model cache."""
    if memory_budget is not None:
        try:
            parse_bytes(memory_budget)
        except ValueError as err:
            _fail(err)
    _set_env(
        models_file=models, max_models=max_models, memory_budget=memory_budget, device=device, queue=queue,
        prefetch=prefetch,
    )
    from tasks.app import app as celery_app
    from tasks.app import configure

    settings = get_settings()
    try:
        from tasks.batch import build_runtime

        build_runtime(settings)  # fail here, with a clear message, on a bad models file or setting
    except SwaplessError as err:
        _fail(err)
    configure(celery_app, settings)
    argv = ["worker", "--pool=solo", "--concurrency=1", f"--loglevel={loglevel}", f"--queues={settings.queue}"]
    argv += [f"--prefetch-multiplier={settings.prefetch}", "--without-gossip", "--without-mingle"]
    if hostname:
        argv.append(f"--hostname={hostname}")
    celery_app.worker_main(argv)


def _read_input(value: str, file: Path | None) -> str:
    if file is None:
        return value
    data = file.read_bytes()
    try:
        text = data.decode("utf-8")
        if file.suffix.lower() in {".txt", ".md", ""}:
            return text
    except UnicodeDecodeError:
        pass
    return base64.b64encode(data).decode("ascii")


@app.command()
def submit(
    model: Annotated[str, typer.Argument(help="model id or alias (see `swapless models`)")],
    input: Annotated[str, typer.Argument(help="the text; for image models a base64 string (or use --file)")] = "",
    file: Annotated[Path | None, typer.Option("--file", "-f", help="read the input from a file (images are base64-encoded)")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="wait for the result and print it")] = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait with --wait")] = 60.0,
    models: ModelsOption = None,
) -> None:
    """Queue one job; print its id (or, with --wait, its result as JSON)."""
    _set_env(models_file=models)
    from tasks.client import Client

    try:
        client = Client()
        job = client.submit(model, _read_input(input, file))
        if not wait:
            console.print(job.id, highlight=False)
            return
        result = job.get(timeout=timeout)
    except SwaplessError as err:
        _fail(err)
    sys.stdout.write(json.dumps({"job_id": job.id, "result": result}) + "\n")


@app.command()
def result(
    job_id: Annotated[str, typer.Argument(help="the id `swapless submit` printed")],
    wait: Annotated[float, typer.Option(help="seconds to wait for it to finish (0: just look)")] = 0.0,
) -> None:
    """Print a job's state and result (or error) as JSON."""
    from tasks.client import Client

    job = Client(validate=False).job(job_id)
    try:
        value = job.get(timeout=wait) if wait > 0 else None
        stored = job.status()
    except SwaplessError as err:
        sys.stdout.write(json.dumps({"job_id": job_id, "state": "FAILURE", "error": str(err), "type": type(err).__name__}) + "\n")
        raise typer.Exit(1) from None
    if stored.state == "SUCCESS":
        value = stored.value
        sys.stdout.write(json.dumps({"job_id": job_id, "state": "SUCCESS", "result": value}) + "\n")
    elif stored.state == "FAILURE":
        err = stored.value
        sys.stdout.write(json.dumps({"job_id": job_id, "state": "FAILURE", "error": str(err), "type": type(err).__name__}) + "\n")
        raise typer.Exit(1)
    else:
        sys.stdout.write(json.dumps({"job_id": job_id, "state": "PENDING", "note": "queued, running, or unknown id"}) + "\n")


@app.command()
def models(models: ModelsOption = None) -> None:
    """List the models in the registry."""
    from manager.engine import ModelEngine
    from manager.store import ModelStore

    try:
        store = ModelStore.from_file(models or get_settings().models_file, ModelEngine().frameworks)
    except SwaplessError as err:
        _fail(err)
    table = Table(title=f"{len(store)} models")
    for column in ("id", "aliases", "type", "framework", "name", "version", "description"):
        table.add_column(column, overflow="fold")
    for spec in store:
        table.add_row(spec.id, ", ".join(spec.aliases), spec.type.value, spec.framework, spec.name, spec.version, spec.description)
    console.print(table)


def main() -> None:
    """Entry point of the ``swapless`` script."""
    app()


if __name__ == "__main__":
    main()
