"""The producer side: ``Client`` and ``Job``, waiting on results, chunk streams, bulk files, their records and
progress.

- ``client``: ``Client``, the facade (submit, submit_jobs, submit_many, map, fetch, gather, cancel), composed of:
- ``job``: ``Job``, the handle on one job (get, aget, status, cancel);
- ``publisher``: ``Publisher``, routing jobs (``Routed``) and publishing their messages;
- ``consumer``: ``ResultConsumer``, every wait of a client (``Job.get``, ``gather``, chunk streams) on one pub/sub
  connection; ``aconsumer``: ``AsyncResultConsumer``, the same for asyncio (the gateway's); ``subscriptions``: the
  bookkeeping both keep; ``reading``: reading results now (batched MGETs, chunk items);
- ``stream``: ``ChunkStream``, a bounded window of chunk messages read back in order;
- ``bulk``, ``records``, ``progress``: ``BulkRun`` over a JSONL/CSV file, resumable, with its progress display.

Producers never import the worker (``swapless.tasks.worker``), and the worker never imports this package.
"""

from swapless.tasks.client.client import Client
from swapless.tasks.client.job import Job
from swapless.tasks.client.publisher import Routed

__all__ = ["Client", "Job", "Routed"]
