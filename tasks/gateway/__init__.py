"""The HTTP gateway (FastAPI) for web apps, composed in ``app``: the request guard (``framing``), API keys
(``keys``, ``auth``) and each key's turns at the work (``turns``), what every route does with jobs (``plane``, with
``quotas`` and ``ledger``), one error map (``errors``, ``http``), REST (``rest``, ``schema``), the Open Inference
Protocol (``v2``, ``signature``, ``tensors``) and the status page (``status_page``).

A producer: it submits through ``swapless.tasks.client`` and reads the observers' views; it never imports the worker.
Run it with ``swapless serve``, or ``uvicorn --factory swapless.tasks.gateway:create_app``.
"""

from swapless.tasks.gateway.app import create_app

__all__ = ["create_app"]
