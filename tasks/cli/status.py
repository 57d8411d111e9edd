"""The ``swapless status`` and ``swapless webhooks`` commands."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any

import typer

from swapless.config.errors import QueueFull, QueueUnavailable
from swapless.tasks.cli.common import console, routes_table, settings_with

__all__ = ["register", "status", "webhooks"]


def register(app: typer.Typer) -> None:
    """Add ``status`` and ``webhooks`` to the ``swapless`` command line."""
    app.command()(status)
    app.command()(webhooks)


def status(
    watch: Annotated[bool, typer.Option("--watch", help="keep refreshing (Ctrl-C stops)")] = False,
    interval: Annotated[float, typer.Option(min=0.1, help="seconds between refreshes with --watch")] = 2.0,
    count: Annotated[int, typer.Option(min=0, help="with --watch, stop after this many refreshes (0: never)")] = 0,
    sample: Annotated[
        int, typer.Option(min=1, help="queued messages read per priority level to count jobs per model")
    ] = 200,
    queue: Annotated[str | None, typer.Option(help="queue to show [default: swapless]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the status as JSON instead of tables")] = False,
) -> None:
    """Show the queue per model and each live worker: loaded models, cache hits/misses/evictions, loads, jobs, waits."""

    from swapless.manager.registry.store import ModelStore
    from swapless.tasks.broker.connection import redis_client, translated
    from swapless.tasks.broker.sentinel import SentinelOptions
    from swapless.tasks.keyspace import Keyspace

    settings = settings_with(queue=queue)
    keyspace = Keyspace.of(settings)
    client = redis_client(settings.redis.broker_url, connect_timeout_s=settings.redis.connect_timeout_s,
                          sentinel=SentinelOptions.of(settings))
    store = ModelStore.from_file(settings.cache.models_file)
    model_ids = store.ids()

    def render() -> Any:
        return _render(client, keyspace, store, settings, sample)

    if as_json:
        from swapless.tasks.observe.status import read_status

        with translated(settings.redis.broker_url):
            payload = read_status(client, keyspace, model_ids, sample)
        sys.stdout.write(json.dumps(payload) + "\n")
        return
    view = render()  # Redis down: one error line (main)
    if not watch:
        console.print(view)
        return
    _watch(render, view, interval, count)


def _render(client: Any, keyspace: Any, store: Any, settings: Any, sample: int) -> Any:
    """The status's tables: workers and models, then routes, batches and webhooks when there are any."""
    from rich.console import Group

    from swapless.tasks.broker.connection import translated
    from swapless.tasks.cluster.members import read_heartbeats
    from swapless.tasks.cluster.view import read_placement
    from swapless.tasks.observe.batches import read_batches
    from swapless.tasks.observe.memory import read_redis_memory
    from swapless.tasks.observe.queue import read_queue_depth
    from swapless.tasks.observe.view import render_status
    from swapless.tasks.webhooks import read_webhooks

    model_ids = store.ids()
    with translated(settings.redis.broker_url):
        depth = read_queue_depth(client, keyspace, model_ids, sample)
        workers = read_heartbeats(client, keyspace)
        view = render_status(depth, workers, memory=read_redis_memory(client, keyspace, model_ids),
                             places=read_placement(client, keyspace, model_ids))
        hooks = read_webhooks(client, keyspace, limit=5)
        batches = read_batches(client, keyspace)
        parts: list[Any] = [view]
        if store.routes:
            parts.append(routes_table(store, settings))
        if batches["batches"]:
            parts.append(_batches_text(batches))
        if hooks["pending"] or hooks["failed"]:
            parts.append(_webhooks_text(hooks))
        return Group(*parts) if len(parts) > 1 else view


def _watch(render: Callable[[], Any], view: Any, interval: float, count: int) -> None:
    """Redraw ``render()`` every ``interval`` s (``count`` times; 0: until Ctrl-C); Redis errors show and retry."""
    import redis
    from rich.live import Live
    from rich.text import Text

    refreshes = 1
    with Live(view, console=console, auto_refresh=False) as live:
        try:
            while not count or refreshes < count:
                time.sleep(interval)
                try:
                    view = render()
                except (QueueUnavailable, QueueFull, redis.RedisError) as err:
                    view = Text(f"{err}; retrying every {interval:g} s")
                live.update(view, refresh=True)
                refreshes += 1
        except KeyboardInterrupt:
            pass


def _batches_text(standing: dict[str, Any]) -> Any:
    """The status's batches: those not finished, then the newest finished ones, with their progress."""
    from rich.text import Text

    lines = [f"batches: {standing['active']} not finished"]
    for b in standing["batches"]:
        done = b["completed"] + b["failed"]
        lines.append(f"  {b['id']}  {b['status']}  {done}/{b['total']} ({b['completed']} completed, "
                     f"{b['failed']} failed)")
    return Text("\n".join(lines))


def _webhooks_text(hooks: dict[str, Any]) -> Any:
    """The status's webhooks line, and the newest failed deliveries (``swapless webhooks --replay`` resends)."""
    from rich.text import Text

    lines = [f"webhooks: {hooks['pending']} waiting to be delivered, {hooks['failed']} failed after their last retry"
             + (" (swapless webhooks --replay sends them again)" if hooks["failed"] else "")]
    lines += [f"  {d['id']}  {d['url']}  {d['attempts']} attempt(s): {d['last_error']}" for d in hooks["recent_failed"]]
    return Text("\n".join(lines))


def webhooks(
    delivery_ids: Annotated[list[str] | None, typer.Argument(help="job ids of the failed deliveries to replay")] = None,
    replay: Annotated[bool, typer.Option("--replay", help="queue failed deliveries again (all, or those given)")] = (
        False),
    queue: Annotated[str | None, typer.Option(help="queue whose webhooks to show [default: swapless]")] = None,
) -> None:
    """List the webhook deliveries that failed after their last retry (one JSON line each), or replay them.

    With --replay, the failed deliveries (all, or the job ids given) are queued again with a fresh retry window;
    prints how many. A worker's sender delivers them."""
    from swapless.tasks.broker.connection import redis_client, translated
    from swapless.tasks.broker.sentinel import SentinelOptions
    from swapless.tasks.webhooks import WebhookQueue

    settings = settings_with(queue=queue)
    client = redis_client(settings.redis.broker_url, connect_timeout_s=settings.redis.connect_timeout_s,
                          sentinel=SentinelOptions.of(settings))
    hooks = WebhookQueue.of(client, settings)
    with translated(settings.redis.broker_url):
        if replay:
            sys.stdout.write(json.dumps({"replayed": hooks.replay(delivery_ids or None)}) + "\n")
            return
        _, failed = hooks.failed(limit=settings.webhooks.webhook_max_failed)
    for d in failed:
        if delivery_ids and d.id not in delivery_ids:
            continue
        sys.stdout.write(json.dumps({"id": d.id, "url": d.url, "attempts": d.attempts, "last_error": d.last_error,
                                     "failed_at": d.failed_at}) + "\n")
