"""The producer side: ``Client`` and ``Job``, chunk streams, bulk files, their records and progress.

- ``client``: ``Client`` (submit, submit_jobs, submit_many, map, fetch, gather) and ``Job`` (get, aget);
- ``waiting``: reading results and waiting on their publish (shared with the gateway);
- ``stream``: ``ChunkStream``, a bounded window of chunk messages read back in order;
- ``bulk``, ``records``, ``progress``: ``BulkRun`` over a JSONL/CSV file, resumable, with its progress display.

Producers never import the worker (``tasks.worker``), and the worker never imports this package.
"""

from tasks.client.client import Client, Job

__all__ = ["Client", "Job"]
