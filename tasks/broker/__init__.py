"""The Redis and kombu internals: the one place that touches kombu's private APIs.

- ``transport``: kombu's Redis transport with an atomic bulk fetch (no job lost between BRPOP and its record);
- ``acks``: bulk acks on the consumer thread, and the visibility refresh of held messages;
- ``results``: pipelined, first-wins results in Celery's result-backend format;
- ``failover``: Celery's result backend and the transport over Redis Sentinel; ``sentinel``: Sentinel URLs and clients;
- ``publish``: Celery messages built directly and pushed in one pipeline;
- ``connection``: redis-py clients with bounded timeouts (through Redis Sentinel for ``sentinel://`` URLs), URLs
  safe to print, Redis failures as Swapless errors.

Producers and workers both use it; it imports nothing of either.
"""
