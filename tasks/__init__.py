"""The queue side: nothing here knows a framework. By role, so that the path says where a file runs:

- ``protocol``: what producers and workers share (task names, priorities, headers, item ids, outcomes);
- ``keyspace``: every Redis key of one queue, in one naming scheme;
- ``app``: the Celery app factory (settings -> Celery's configuration);
- ``broker/``: the Redis and kombu internals (the queue layout, transport, acks, results, publish, connections);
- ``cluster/``: several workers as one cache (placement, claims, heartbeats);
- ``worker/``: runs in ``swapless worker`` only (its composition root, the batch task, the scheduler, chunks,
  runtime, reporting);
- ``client/``: runs in producers only (``Client``, ``Job``, chunk streams, bulk files);
- ``observe/``: accounting, heartbeats, metrics, task events, queue depth and the status view;
- ``gateway/``: the HTTP gateway (a producer); ``cli/``: the ``swapless`` command and local mode.

``celery -A swapless worker`` finds the worker's app as ``swapless.celery`` (``src/swapless/__init__.py``).
"""
