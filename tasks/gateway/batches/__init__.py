"""The batch API (``/v1/files``, ``/v1/batches``, in the shape of OpenAI's) on the bulk machinery: ``routes`` (the
HTTP side), ``upload`` (a multipart body checked as it streams), ``lines`` (input, output and error lines; pure),
``files`` (the file store: a directory or an fsspec URL), ``state`` (each batch's state and its driver's lease, in
Redis), ``driver`` (one batch from validating to its end, as bulk runs) and ``runner`` (which process drives which
batch: in ``swapless serve``, or ``swapless batches``).
"""

from swapless.tasks.gateway.batches.routes import batch_router
from swapless.tasks.gateway.batches.runner import BatchRunner

__all__ = ["BatchRunner", "batch_router"]
