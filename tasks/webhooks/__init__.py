"""Webhooks in Redis: the delivery queue a worker's sender reads (``queue``) and the targets a ``callback_url`` may
name (``targets``). Producers, the gateway, the worker and the CLI share them; the sender is the worker's."""

from swapless.tasks.webhooks.queue import WebhookDelivery, WebhookQueue, read_webhooks
from swapless.tasks.webhooks.targets import allowed_hosts, check_target, connect_address, pinned, resolve_host

__all__ = ["WebhookDelivery", "WebhookQueue", "allowed_hosts", "check_target", "connect_address", "pinned",
           "read_webhooks", "resolve_host"]
