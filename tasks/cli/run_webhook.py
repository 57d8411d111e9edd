"""``swapless bulk --callback-url``: one signed webhook when a run ends, sent by the workers.

Its body: ``{"type": "bulk.completed" | "bulk.stopped", "timestamp", "data": {...}}`` (``run_payload``).
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from swapless.tasks.webhooks import WebhookDelivery, WebhookQueue, allowed_hosts, check_target

if TYPE_CHECKING:
    from swapless.tasks.client import Client
    from swapless.tasks.client.bulk import BulkJob, BulkSummary

__all__ = ["LOCAL_WAIT_S", "check_callback_url", "queue_run_webhook", "run_payload"]

#: Seconds a local run waits for its webhook to be delivered (or kept as failed) before the embedded worker stops.
LOCAL_WAIT_S = 30.0


def check_callback_url(url: str, allowed_setting: str) -> None:
    """Refuse a ``--callback-url`` the workers would refuse, before anything runs.

    Raises:
        WebhookRefused: as ``check_target``.
    """
    check_target(url, allowed_hosts(allowed_setting))


def run_payload(run_id: str, job: BulkJob, summary: BulkSummary, stopped: str | None) -> str:
    """The webhook body of one ended run (see the module docstring)."""
    data = {
        "run_id": run_id,
        "model": job.model_id,
        "input": str(job.input_path),
        "output": str(job.output_path),
        "records": summary.records,
        "ok": summary.ok,
        "failed": summary.failed,
        "resumed_from": summary.resumed_from,
        "this_run": summary.records - summary.resumed_from,
        "elapsed_s": round(summary.elapsed_s, 3),
        "complete": summary.complete,
        "stopped": stopped,
    }
    kind = "bulk.stopped" if stopped else "bulk.completed"
    return json.dumps({"type": kind, "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds"), "data": data})


def queue_run_webhook(
    client: Client, url: str, job: BulkJob, summary: BulkSummary, stopped: str | None, *, local: bool
) -> str:
    """Queue the run's webhook; in local mode wait for the embedded worker to settle it. Returns the line to print."""
    queue = WebhookQueue.of(client.redis, client.settings)
    run_id = f"bulk-{uuid.uuid4().hex}"
    _, full = queue.enqueue([WebhookDelivery(run_id, url, run_payload(run_id, job, summary, stopped))])
    if full:
        return (f"bulk: the run's webhook to {url} was kept as failed: the delivery queue is full "
                "(SWAPLESS_WEBHOOK_MAX_PENDING); swapless webhooks --replay sends it once there is room")
    if not local:
        return f"bulk: the run's webhook ({run_id}) is queued for {url}; the workers send it"
    deadline = time.monotonic() + LOCAL_WAIT_S
    while queue.pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    if queue.pending():
        return (f"bulk: the run's webhook to {url} was not delivered within {LOCAL_WAIT_S:.0f} s; "
                "it is lost with the embedded Redis (run against a Redis to have it retried)")
    failed = next((d for d in queue.failed(limit=100)[1] if d.id == run_id), None)
    if failed is not None:
        return f"bulk: the run's webhook to {url} failed: {failed.last_error}"
    return f"bulk: the run's webhook ({run_id}) was delivered to {url}"
