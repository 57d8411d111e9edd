"""The HTTP gateway (FastAPI): REST, the Open Inference Protocol, the batch API and the status page.

Composed in ``app``; docs/concepts/gateway.md describes how the parts fit. Run it with ``swapless serve``.
"""

from swapless.tasks.gateway.app import create_app

__all__ = ["create_app"]
