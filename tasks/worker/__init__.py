"""The worker: the batch task, its scheduler thread, chunk assembly, the process's runtime and its reporting.

- ``task``: the Celery app with ``swapless.predict`` and ``swapless.predict_chunk``, and the worker's start-up
  and shutdown (``celery -A swapless worker`` and ``swapless worker`` run it);
- ``scheduler``: ``BatchScheduler``, the backlog and the thread that runs it;
- ``chunks``: chunk messages expanded into jobs and assembled back;
- ``runtime``: the settings, registry and model cache, built once per process;
- ``reporting``: the heartbeat, metrics and task events of one worker.

Only worker processes import it: producers (``swapless.tasks.client``, the gateway) never do, and it never imports them.
"""
