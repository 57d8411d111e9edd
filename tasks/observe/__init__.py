"""Seeing what the queue and the workers do: per-group accounting, heartbeats, Prometheus metrics, Celery task
events, the queue's depth, and the status view.

- worker side (fed by ``swapless.tasks.worker.reporting``): ``accounting``, ``heartbeat`` (publishing),
  ``metrics``, ``events``;
- reader side (``swapless status``, the gateway): ``heartbeat`` (reading), ``queue``, ``view``.

It imports nothing of the worker, the client or the gateway: what it reads of a worker is handed to it.
"""
