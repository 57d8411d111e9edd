"""The queue side: the Celery app (``celery -A tasks worker`` finds ``app`` here), the batch task, the producer
client and the CLI. Nothing here knows a framework."""

from tasks.app import app

__all__ = ["app"]
