"""The HTTP gateway (FastAPI) for web apps: ``app`` (the routes), ``schema`` (bodies, the input check), ``limits``.

A producer: it submits through ``tasks.client`` and reads the observers' views; it never imports the worker.
Run it with ``swapless serve``, or ``uvicorn --factory tasks.gateway:create_app``.
"""

from tasks.gateway.app import create_app

__all__ = ["create_app"]
