"""Redis and kombu internals: the transport (``transport``, ``held``, ``queues``), acks, results, publishing,
Sentinel, connections, and ``kombu_private``, the one module naming kombu's and Celery's private members.
Producers and workers both use it; it imports nothing of either.
"""
