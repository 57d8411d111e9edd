"""The batch API (``/v1/files``, ``/v1/batches``, in the shape of OpenAI's) on the bulk machinery."""

from swapless.tasks.gateway.batches.routes import batch_router
from swapless.tasks.gateway.batches.runner import BatchRunner

__all__ = ["BatchRunner", "batch_router"]
