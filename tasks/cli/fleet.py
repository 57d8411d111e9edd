"""The ``swapless exporter`` and ``swapless drain`` commands."""

from __future__ import annotations

import socket
import time
from typing import Annotated

import typer

from swapless.tasks.cli.common import ModelsOption, console, fail, settings_with

__all__ = ["drain", "exporter", "register"]


def register(app: typer.Typer) -> None:
    """Add ``exporter`` and ``drain`` to the ``swapless`` command line."""
    app.command()(exporter)
    app.command()(drain)


def exporter(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="port to listen on [default: SWAPLESS_EXPORTER_PORT, 9808]")
    ] = None,
    models: ModelsOption = None,
    queue: Annotated[str | None, typer.Option(help="queue to read [default: swapless]")] = None,
) -> None:
    """Serve the cluster-wide autoscaling signals (swapless_workers_desired, swapless_backlog_seconds, ...) at
    /metrics, read from Redis at each scrape: what `swapless serve` serves at its /metrics, for deployments without
    the gateway. No authentication: keep it on a private network."""
    import signal
    import threading

    from prometheus_client import start_http_server

    from swapless.config.errors import SwaplessError
    from swapless.manager.registry.store import ModelStore
    from swapless.tasks.broker.connection import redis_client
    from swapless.tasks.broker.sentinel import SentinelOptions
    from swapless.tasks.observe.scaling import ScalingSignals, signals_registry

    try:
        settings = settings_with(models_file=models, queue=queue, exporter_port=port)
        store = ModelStore.from_file(settings.cache.models_file)
    except SwaplessError as err:
        fail(err)
    client = redis_client(settings.redis.broker_url, connect_timeout_s=settings.redis.connect_timeout_s,
                          sentinel=SentinelOptions.of(settings))
    registry = signals_registry(ScalingSignals(client, settings, store.ids()))
    try:
        server, thread = start_http_server(settings.observe.exporter_port, addr=host, registry=registry)
    except OSError as err:
        fail(f"cannot listen on {host}:{settings.observe.exporter_port} ({err.strerror or err}): pass a free --port")
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    console.print(f"swapless exporter: the autoscaling signals of queue {settings.jobs.queue} on "
                  f"http://{host}:{settings.observe.exporter_port}/metrics; Ctrl-C to stop")
    stopping.wait()
    server.shutdown()
    server.server_close()
    thread.join(5)


def drain(
    workers: Annotated[
        list[str] | None,
        typer.Argument(help="workers to drain: node names (celery@host), worker ids (celery@host:pid) or machine "
                       "names, as `swapless status` shows them"),
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="drain every live worker of the queue")] = False,
    here: Annotated[
        bool, typer.Option("--here", help="drain the workers running on this machine (a Kubernetes preStop hook)")
    ] = False,
    timeout: Annotated[float, typer.Option(min=0, help="seconds to wait for them to stop (0: do not wait)")] = 60.0,
    queue: Annotated[str | None, typer.Option(help="queue of the workers [default: swapless]")] = None,
) -> None:
    """Stop workers the way SIGTERM does, from anywhere: each gives up its claims (the other workers take its models
    over at once), finishes and acks the group in hand, hands the jobs it fetched back to their lists, and exits.
    Waits until their heartbeats are gone; exits 1 if one still runs after --timeout."""
    from swapless.config.errors import SwaplessError
    from swapless.tasks.app import make_app
    from swapless.tasks.broker.connection import redis_client, translated
    from swapless.tasks.broker.sentinel import SentinelOptions
    from swapless.tasks.cluster.members import read_heartbeats
    from swapless.tasks.keyspace import Keyspace

    if not workers and not every and not here:
        fail("name the workers to drain (as `swapless status` shows them), or pass --all or --here")
    try:
        settings = settings_with(queue=queue)
    except SwaplessError as err:
        fail(err)
    keyspace = Keyspace.of(settings)
    client = redis_client(settings.redis.broker_url, connect_timeout_s=settings.redis.connect_timeout_s,
                          sentinel=SentinelOptions.of(settings))
    machine = socket.gethostname()
    names = set(workers or ())
    with translated(settings.redis.broker_url):
        live = [beat for beat in read_heartbeats(client, keyspace) if beat.queue == keyspace.queue]
    chosen = [beat for beat in live if every or (here and beat.machine == machine)
              or names & {beat.hostname, beat.worker_id, beat.machine}]
    unknown = names - {n for beat in live for n in (beat.hostname, beat.worker_id, beat.machine)}
    if unknown:
        fail(f"no live worker of queue {keyspace.queue} is named {', '.join(sorted(unknown))}: "
             "`swapless status` lists them")
    if not chosen:
        console.print(f"no live worker of queue {keyspace.queue} to drain")
        return
    ids = {beat.worker_id for beat in chosen}
    app = make_app(settings)
    with translated(settings.redis.broker_url):  # by worker id: workers may share a node name
        app.control.broadcast("swapless_drain", arguments={"worker_id": sorted(ids)}, reply=False)
    console.print(f"draining {len(ids)} worker(s): {', '.join(sorted(ids))}")
    if not timeout:
        return
    started = time.monotonic()
    remaining = set(ids)
    while remaining and time.monotonic() - started < timeout:
        time.sleep(0.2)
        with translated(settings.redis.broker_url):
            remaining &= {beat.worker_id for beat in read_heartbeats(client, keyspace)}
    took = time.monotonic() - started
    if remaining:
        fail(f"{', '.join(sorted(remaining))} still running after {timeout:g} s (finishing its group in hand?): "
             "wait longer with --timeout, or stop it with SIGKILL (its jobs come back to the queue after its "
             "heartbeat expires)", code=1)
    console.print(f"drained {len(ids)} worker(s) in {took:.1f} s")
