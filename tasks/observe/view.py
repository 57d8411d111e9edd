"""``swapless status`` as rich renderables: the queue by model, then one table per live worker."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from swapless.config.describe import format_bytes
from swapless.tasks.cluster.members import Heartbeat
from swapless.tasks.cluster.view import ModelPlacement
from swapless.tasks.observe.memory import RedisMemory
from swapless.tasks.observe.queue import QueueDepth
from swapless.tasks.observe.scaling import RemovalCost, removal_costs
from swapless.tasks.protocol import is_urgent

__all__ = ["render_status"]


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render_placement(places: list[ModelPlacement], workers: list[Heartbeat], now: float) -> RenderableType:
    """Each model across the workers: waiting messages, held jobs, holders."""
    names = {beat.worker_id: f"{beat.hostname} (pid {beat.pid})" for beat in workers}
    active = [p for p in places if p.waiting_messages or p.held or p.holders]
    header = Text(
        f"models across workers: {sum(p.waiting_messages for p in active)} messages waiting in their lists, "
        f"{sum(p.held for p in active)} held by workers", style="bold",
    )
    if not active:
        return header
    table = Table()
    for name, justify in [("model", "left"), ("waiting (exact)", "right"), ("interactive", "right"),
                          ("bulk", "right"), ("held", "right"), ("copies", "right"), ("held by (claim)", "left")]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for p in active:
        holders = ", ".join(f"{names.get(w, w)} ({max(0.0, until - now):.0f}s)" for w, until in p.holders) or "-"
        interactive = sum(n for level, n in p.queued.items() if is_urgent(level))
        waiting = p.waiting_messages
        table.add_row(p.model_id, str(waiting), str(interactive), str(waiting - interactive), str(p.held),
                      str(len(p.holders)), holders)
    return Group(header, table)


def render_queue(depth: QueueDepth, workers: list[Heartbeat]) -> RenderableType:
    """The queue per model: messages waiting in Redis and jobs held by workers."""
    levels = ", ".join(f"priority {p}: {n}" for p, n in depth.by_priority.items() if n) or "empty"
    held: dict[str, int] = {}
    for beat in workers:
        if beat.queue != depth.queue:
            continue
        for model_id, activity in beat.models.items():
            if activity.backlog:
                held[model_id] = held.get(model_id, 0) + activity.backlog
    ingress = f"; {depth.ingress} of them in the ingress, not yet moved to their model's lists" if depth.ingress else ""
    header = Text(f"queue {depth.queue}: {depth.total} messages waiting in Redis ({levels}){ingress}", style="bold")
    if not depth.total and not held:
        return header
    table = Table()
    table.add_column("model")
    table.add_column("messages waiting in Redis", justify="right")
    table.add_column("held by workers", justify="right")
    mark = "~" if depth.sampled else ""
    for model_id in sorted(set(depth.by_model) | set(held)):
        queued = depth.by_model.get(model_id)
        table.add_row(model_id, f"{mark}{queued}" if queued else "0", str(held.get(model_id, 0)))
    if depth.unreadable:
        table.add_row("(unreadable)", f"{mark}{depth.unreadable}", "")
    parts: list[RenderableType] = [header, table]
    if depth.sampled:
        parts.append(
            Text(
                f"~ per-model counts are estimates: the ingress is read from a sample of the {depth.sample} next "
                "messages of each priority level (the totals, and each model's own lists, are exact)",
                style="dim",
            )
        )
    return Group(*parts)


def render_worker(beat: Heartbeat, now: float, removal: RemovalCost | None = None) -> RenderableType:
    """One worker: its cache and counters, then a row per model it has loaded or run."""
    cache = beat.cache
    budget = f"budget {format_bytes(cache.memory_budget_bytes)}" if cache.memory_budget_bytes else "no byte budget"
    wait = beat.queue_wait
    waits = (
        f"queue wait mean {wait.mean_s:.3f}s, p50 {wait.p50_s:.3f}s, p95 {wait.p95_s:.3f}s, max {wait.max_s:.3f}s "
        f"(last {wait.window} jobs)"
        if wait.window
        else "queue wait: no jobs yet"
    )
    title = (
        f"worker {beat.hostname} (pid {beat.pid}, queue {beat.queue}, up {_duration(now - beat.started_at)}, "
        f"heartbeat {beat.age_s(now):.1f}s ago)"
    )
    if beat.redis_problem:
        title += f" · {beat.redis_problem}: it keeps its jobs and retries"
    caption = (
        f"jobs {beat.jobs_done} done, {beat.jobs_failed} failed, {beat.backlog} held · "
        f"cache {len(beat.loaded)}/{cache.max_models} models, {format_bytes(cache.used_bytes)} ({budget}) · "
        f"hits {cache.hits}, misses {cache.misses}, evictions {cache.evictions}, load failures {cache.load_failures} · "
        f"{_host_tier(beat)}{waits}"
    )
    if removal is not None:
        caption += f" · {removal.text()}"
    table = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for name, justify in [
        ("model", "left"), ("cache", "left"), ("bytes", "right"), ("hits", "right"), ("misses", "right"),
        ("evicted", "right"), ("loads", "right"), ("last load s", "right"), ("mean load s", "right"),
        ("swap-ins", "right"),
        ("done", "right"), ("failed", "right"), ("expired", "right"), ("cancelled", "right"), ("held", "right"),
    ]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    loaded = {entry.model_id: entry for entry in [*beat.host, *beat.loaded]}
    lru_order = [entry.model_id for entry in beat.loaded]
    host_order = [entry.model_id for entry in beat.host]
    others = sorted(set(beat.models) - set(loaded))
    for model_id in [*reversed(lru_order), *reversed(host_order), *others]:  # device, then host, most recent first
        activity = beat.models.get(model_id)
        entry = loaded.get(model_id)
        state = "-" if entry is None else ("host" if entry.tier == "host" else "running" if entry.busy else "loaded")
        if entry is not None and entry.remote:
            state += " (remote)"
        if activity is not None and activity.claimed:
            state += ", claimed"
        mean_load = activity.load_s_total / activity.loads if activity and activity.loads else None
        table.add_row(
            model_id,
            state,
            format_bytes(entry.bytes) if entry else "-",
            str(activity.hits) if activity else "0",
            str(activity.misses) if activity else "0",
            str(activity.evictions) if activity else "0",
            str(activity.loads) if activity else "0",
            _seconds(activity.load_s_last if activity else None),
            _seconds(mean_load),
            str(activity.swap_ins) if activity else "0",
            str(activity.jobs_done) if activity else "0",
            str(activity.jobs_failed) if activity else "0",
            str(activity.jobs_expired) if activity else "0",
            str(activity.jobs_cancelled) if activity else "0",
            str(activity.backlog) if activity else "0",
        )
    return table


def _host_tier(beat: Heartbeat) -> str:
    """The caption's part on the host tier ("" without one)."""
    cache = beat.cache
    if not cache.host_max_models:
        return ""
    return (
        f"host tier {len(beat.host)}/{cache.host_max_models} models, {format_bytes(cache.host_used_bytes)} "
        f"(budget {format_bytes(cache.host_budget_bytes)}), swap-ins {cache.swap_ins}, moved there "
        f"{cache.swap_outs}, dropped to disk {cache.host_evictions} · "
    )


def render_memory(memory: RedisMemory) -> RenderableType:
    """One line: Redis's memory, its limit, the queue's share and the stored results."""
    share = memory.used_share
    limit = (
        f"of {format_bytes(memory.max_bytes)} ({share:.0%}, {memory.policy})" if share is not None
        else "(no maxmemory: Redis grows until the machine runs out)"
    )
    queue_share = f" ({memory.queue_bytes / memory.used_bytes:.0%})" if memory.used_bytes else ""
    line = (
        f"Redis memory {format_bytes(memory.used_bytes)} {limit} · "
        f"queue and held jobs ~{format_bytes(memory.queue_bytes)}{queue_share} · "
        f"stored results ~{memory.results} (~{format_bytes(memory.result_bytes)}) · {memory.keys} keys"
    )
    full = share is not None and share >= 0.95 and memory.policy == "noeviction"
    return Text(line + (" · FULL: producers get QueueFull" if full else ""), style="bold red" if full else "")


def render_status(
    depth: QueueDepth,
    workers: list[Heartbeat],
    now: float | None = None,
    memory: RedisMemory | None = None,
    places: list[ModelPlacement] | None = None,
) -> RenderableType:
    """The whole status: Redis's memory, the models across the workers, the queue, each live worker."""
    now = time.time() if now is None else now
    parts: list[RenderableType] = [render_memory(memory)] if memory is not None else []
    if places is not None:
        parts += [render_placement(places, workers, now)]
    parts += [render_queue(depth, workers), Text("")]
    if not workers:
        parts.append(Text("no live workers: no heartbeat in Redis (is `swapless worker` running on this queue?)"))
    removal = removal_costs(workers)
    for beat in workers:
        parts.extend([render_worker(beat, now, removal.get(beat.worker_id or beat.hostname)), Text("")])
    return Group(*parts)
