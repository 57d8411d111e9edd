"""The ``swapless`` command line (typer); ``main`` turns any SwaplessError into one error line and exit status 2."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from swapless.config.errors import JobTimeout, QueueFull, QueueUnavailable, SwaplessError
from swapless.config.settings import parse_bytes
from swapless.tasks.cli import bulk as _bulk
from swapless.tasks.cli import fleet as _fleet
from swapless.tasks.cli import status as _status
from swapless.tasks.cli.common import (
    ModelsOption,
    columns,
    console,
    fail,
    print_error,
    routes_table,
    settings_with,
)

if TYPE_CHECKING:
    from swapless.manager.registry.store import ModelStore

__all__ = ["app", "main", "models_text"]

app = typer.Typer(
    name="swapless",
    help="Serve many models from limited GPU memory as a queue-based batch inference worker.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
@app.command()
def worker(
    models: ModelsOption = None,
    max_models: Annotated[int | None, typer.Option(help="local models loaded at once [default: 2]")] = None,
    memory_budget: Annotated[
        str | None, typer.Option(help="bytes of loaded local models, like 4GiB [default: no byte limit]")
    ] = None,
    host_memory_budget: Annotated[
        str | None,
        typer.Option(help="bytes of evicted models kept built in host memory, like 16GiB [default: 0, no host tier]"),
    ] = None,
    host_max_models: Annotated[
        int | None, typer.Option(min=0, help="models kept in host memory at once [default: 16]")
    ] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda or cuda:N [default: auto]")] = None,
    queue: Annotated[str | None, typer.Option(help="queue to consume [default: swapless]")] = None,
    prefetch: Annotated[
        int | None, typer.Option(help="unacked jobs held, the scheduler's window [default: 1024]")
    ] = None,
    task_events: Annotated[
        bool | None, typer.Option("--task-events/--no-task-events", help="Celery task events for Flower [default: off]")
    ] = None,
    warm_start: Annotated[
        bool | None,
        typer.Option("--warm-start/--no-warm-start", help="warm the local models before taking jobs [default: on]"),
    ] = None,
    loglevel: Annotated[str, typer.Option(help="celery log level")] = "INFO",
    hostname: Annotated[str | None, typer.Option(help="worker node name (celery -n)")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="serve Prometheus metrics on this port [default: off]")
    ] = None,
    metrics_host: Annotated[
        str | None, typer.Option(help="address of the metrics endpoint [default: 127.0.0.1]")
    ] = None,
) -> None:
    """Run the GPU worker: consume jobs, group them by model, run them through the model cache."""
    for size in (memory_budget, host_memory_budget):
        if size is not None:
            try:
                parse_bytes(size)
            except ValueError as err:
                fail(err)
    from swapless.tasks.app import configure
    from swapless.tasks.worker.runtime import build_runtime

    try:
        settings = settings_with(
            models_file=models, max_models=max_models, memory_budget_bytes=memory_budget, device=device,
            host_memory_budget_bytes=host_memory_budget, host_max_models=host_max_models,
            queue=queue, prefetch=prefetch, metrics_port=metrics_port, metrics_host=metrics_host,
            task_events=task_events, warm_start=warm_start,
        )
        build_runtime(settings)  # fail here, with a clear message, on a bad models file or setting
    except SwaplessError as err:
        fail(err)
    from swapless.tasks.worker.task import app as celery_app

    configure(celery_app, settings)
    argv = ["worker", "--pool=solo", "--concurrency=1", f"--loglevel={loglevel}", f"--queues={settings.jobs.queue}"]
    argv += [f"--prefetch-multiplier={settings.worker.prefetch}", "--without-gossip", "--without-mingle"]
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
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="read the input from a file (images are base64-encoded)")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="wait for the result and print it")] = False,
    timeout: Annotated[float, typer.Option(help="seconds to wait with --wait")] = 60.0,
    models: ModelsOption = None,
) -> None:
    """Queue one job; print its id (or, with --wait, its result as JSON).

    Without SWAPLESS_REDIS_URL it runs in local mode: an embedded Redis and a worker, started and stopped for this
    one job (so it always waits)."""
    settings = settings_with(models_file=models)
    if settings.redis.redis_url is None:  # local mode
        _bulk.submit_local(model, _read_input(input, file), timeout, settings)
        return
    from swapless.tasks.client import Client

    try:
        client = Client(settings=settings)
        job = client.submit(model, _read_input(input, file))
        if not wait:
            console.print(job.id, highlight=False)
            return
        result = job.get(timeout=timeout)
    except SwaplessError as err:
        fail(err)
    sys.stdout.write(json.dumps({"job_id": job.id, "result": result}) + "\n")


@app.command()
def result(
    job_id: Annotated[str, typer.Argument(help="the id `swapless submit` printed")],
    wait: Annotated[float, typer.Option(help="seconds to wait for it to finish (0: just look)")] = 0.0,
) -> None:
    """Print a job's state and result (or error) as JSON."""
    from swapless.tasks.client import Client

    job = Client(validate=False).job(job_id)
    def failed(error: object, trace_id: str | None = None) -> NoReturn:
        line = {"job_id": job_id, "state": "FAILURE", "error": str(error), "type": type(error).__name__}
        sys.stdout.write(json.dumps({**line, **({"trace_id": trace_id} if trace_id else {})}) + "\n")
        raise typer.Exit(1)

    try:
        if wait > 0:
            job.get(timeout=wait)
    except JobTimeout:
        pass  # still pending: reported as such below
    except (QueueUnavailable, QueueFull):
        raise  # Redis, not the job: one error line (main)
    except SwaplessError as err:
        failed(err, job.status().trace_id)
    stored = job.status()
    if stored.state == "SUCCESS":
        line = {"job_id": job_id, "state": "SUCCESS", "result": stored.value}
        sys.stdout.write(json.dumps({**line, **({"trace_id": stored.trace_id} if stored.trace_id else {})}) + "\n")
    elif stored.state == "FAILURE":
        failed(stored.value, stored.trace_id)
    else:
        sys.stdout.write(
            json.dumps({"job_id": job_id, "state": "PENDING", "note": "queued, running, or unknown id"}) + "\n"
        )


@app.command()
def cancel(
    job_ids: Annotated[list[str], typer.Argument(help="ids `swapless submit` printed (or any job ids)")],
) -> None:
    """Cancel jobs that have not started: they are answered JobCancelled and never run.

    Prints one JSON line per job: "cancelled", or "running" (too late: it has started, runs to its end and keeps
    its result) or "done" (it has a result already). Exit status 1 when some job could not be cancelled."""
    from swapless.tasks.client import Client

    answers = Client(validate=False).cancel(job_ids)
    for job_id in job_ids:
        sys.stdout.write(json.dumps({"job_id": job_id, "status": answers[job_id]}) + "\n")
    if any(status != "cancelled" for status in answers.values()):
        raise typer.Exit(1)


def models_text(store: ModelStore, width: int | None = None) -> str:
    """``swapless models``' listing of ``store``: a count, then one line per model (see ``columns``)."""
    kept = any(spec.keep_loaded for spec in store)  # the column only where the file keeps some model loaded
    variants = store.variants()
    headers = ("id", "aliases", "type", "framework", "name", "version", *(["base"] if variants else []),
               *(["kept"] if kept else []), "description")
    rows = ((spec.id, ",".join(spec.aliases), spec.type.value, spec.framework, spec.name, spec.version,
             *([spec.base or ""] if variants else []), *(["yes" if spec.keep_loaded else ""] if kept else []),
             " ".join(spec.description.split()))
            for spec in [*store, *variants])
    counted = f"{len(store)} model(s)" + (f", {len(variants)} variant(s) (adapters over a base)" if variants else "")
    return counted + "\n" + columns(headers, rows, width)


@app.command()
def models(
    models: ModelsOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per model, one per line")] = False,
) -> None:
    """List the models in the registry: one line each (any size of registry), then the routes."""
    from swapless.manager.frameworks.engine import ModelEngine
    from swapless.manager.registry.store import ModelStore
    from swapless.tasks.worker.runtime import load_plugins

    try:
        settings = settings_with(models_file=models)
        load_plugins(settings.cache)  # their frameworks are known frameworks
        store = ModelStore.from_file(settings.cache.models_file, ModelEngine().frameworks)
    except SwaplessError as err:
        fail(err)
    if as_json:
        sys.stdout.write("".join(json.dumps(spec.model_dump(mode="json")) + "\n"
                                 for spec in [*store, *store.variants()]))
        return
    sys.stdout.write(models_text(store, console.width if console.is_terminal else None))
    if store.routes:
        console.print(routes_table(store, settings))


@app.command()
def reload(models: ModelsOption = None) -> None:
    """Apply the models file's route weights to every running producer and worker (within a second, no restart).

    The file is checked first: if it has an error, nothing changes and the error is printed. Weights set with
    `swapless route` are replaced by the file's."""
    from swapless.manager.registry.store import ModelStore
    from swapless.tasks.broker.connection import redis_client
    from swapless.tasks.broker.sentinel import SentinelOptions
    from swapless.tasks.keyspace import Keyspace
    from swapless.tasks.routing import RouteOverrides

    settings = settings_with(models_file=models)
    try:
        store = ModelStore.from_file(settings.cache.models_file)
    except SwaplessError as err:
        fail(f"{err}; nothing was reloaded: the running routes stay as they were")
    overrides = RouteOverrides(redis_client(settings.redis.broker_url,
                                            connect_timeout_s=settings.redis.connect_timeout_s,
                                            sentinel=SentinelOptions.of(settings)),
                               Keyspace.of(settings))
    overrides.reload(store)
    console.print(routes_table(store, settings))


@app.command()
def route(
    route_id: Annotated[str, typer.Argument(help="a weighted route of the models file")],
    weights: Annotated[list[str] | None, typer.Argument(help="VERSION=WEIGHT ... (any positive numbers)")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="back to the models file's weights")] = False,
    models: ModelsOption = None,
) -> None:
    """Set a route's split at run time (kept in Redis): producers and workers follow within a second, no restart.

    `swapless route sentiment sentiment-v1=50 sentiment-v2=50`; `swapless route sentiment --clear`."""
    from swapless.manager.registry.store import ModelStore
    from swapless.tasks.broker.connection import redis_client
    from swapless.tasks.broker.sentinel import SentinelOptions
    from swapless.tasks.keyspace import Keyspace
    from swapless.tasks.routing import RouteOverrides

    settings = settings_with(models_file=models)
    store = ModelStore.from_file(settings.cache.models_file)
    parsed: dict[str, float] = {}
    for item in weights or []:
        target, sep, number = item.partition("=")
        try:
            parsed[target] = float(number) if sep else float("nan")
        except ValueError:
            parsed[target] = float("nan")
        if not sep or parsed[target] != parsed[target]:
            fail(ValueError(f"{item!r}: write each version as VERSION=WEIGHT, e.g. {target or 'v2'}=10"))
    if clear == bool(parsed):
        fail(ValueError("give VERSION=WEIGHT pairs, or --clear (not both)"))
    overrides = RouteOverrides(redis_client(settings.redis.broker_url,
                                            connect_timeout_s=settings.redis.connect_timeout_s,
                                            sentinel=SentinelOptions.of(settings)),
                               Keyspace.of(settings))
    if clear:
        overrides.clear(route_id)
    else:
        overrides.set(store, route_id, parsed)
    console.print(routes_table(store, settings))


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) is reachable from this machine only."""
    import ipaddress

    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another name: it may resolve to any address


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="port to listen on")] = 8000,
    models: ModelsOption = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
    insecure_no_auth: Annotated[
        bool | None,
        typer.Option(
            "--insecure-no-auth",
            help="listen on a non-loopback --host with no API key configured: anyone who reaches it may submit "
            "jobs [default: SWAPLESS_GATEWAY_INSECURE_NO_AUTH, false]",
        ),
    ] = None,
) -> None:
    """Run the HTTP gateway: POST /jobs, GET /jobs/{id}, POST /predict, GET /models, GET /status, GET /healthz, /docs.

    With API keys (SWAPLESS_API_KEYS, SWAPLESS_API_KEYS_FILE) every request but the health checks and the docs needs
    one; with none, the gateway listens on a loopback address only, unless --insecure-no-auth."""
    try:
        import uvicorn

        from swapless.tasks.gateway import create_app
    except ImportError as err:
        fail(f"the gateway needs {err.name}, which is not installed: pip install 'swapless' installs it")
    try:
        settings = settings_with(models_file=models, gateway_insecure_no_auth=insecure_no_auth)
        gateway = create_app(settings)
    except SwaplessError as err:
        fail(err)
    if not gateway.state.api_keys_required and not _is_loopback(host) and not settings.gateway.gateway_insecure_no_auth:
        fail(f"no API key is configured, so the gateway listens on a loopback address only, not {host}: set "
             "SWAPLESS_API_KEYS (or SWAPLESS_API_KEYS_FILE), or pass --insecure-no-auth to serve it open")
    _large_buffers_back_to_the_os()
    uvicorn.run(gateway, host=host, port=port, log_level=log_level.lower())


@app.command()
def batches(models: ModelsOption = None) -> None:
    """Drive the batch API's batches (POST /v1/batches) without serving HTTP: any number of these and of `swapless
    serve` may run on one Redis, each batch driven by one of them at a time (a lease); stop it with Ctrl-C or
    SIGTERM, and its batches go on in the others, from where it left them."""
    import signal
    import threading

    from swapless.manager.registry.store import ModelStore
    from swapless.tasks.gateway.batches import BatchRunner

    try:
        settings = settings_with(models_file=models)
        runner = BatchRunner(settings, ModelStore.from_file(settings.cache.models_file))
    except SwaplessError as err:
        fail(err)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    runner.start()
    console.print(f"swapless batches: driving batches as {runner.runner_id}; Ctrl-C to stop")
    stopping.wait()
    runner.stop()


def _large_buffers_back_to_the_os() -> None:
    """Have glibc map each buffer of 1 MiB or more on its own, so a freed request body goes back to the system.

    Otherwise the threshold grows to the largest buffer freed, and each arena keeps that much for good.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, 1024 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


_bulk.register(app)
_status.register(app)
_fleet.register(app)


def main() -> None:
    """Entry point of the ``swapless`` script: a SwaplessError anywhere is one clear line and exit status 2."""
    try:
        app()
    except SwaplessError as err:
        print_error(err)
        raise SystemExit(2) from None
