"""The queue side's errors: reaching Redis, waiting for results, bulk files, local mode, the metrics endpoint.

They sit under the one root, ``manager.errors.SwaplessError``, whose module docstring draws the whole tree.
Like the model side's, each keeps what it was built from in ``args`` and builds its message from them, so it
survives the JSON result backend, and each message says what to do.
"""

from __future__ import annotations

from manager.errors import BackendUnavailable, SwaplessError

__all__ = [
    "BulkFileError",
    "DeadlinePassed",
    "JobCancelled",
    "JobExpired",
    "JobFailed",
    "JobTimeout",
    "LocalModeError",
    "MetricsUnavailable",
    "QueueFull",
    "QueueUnavailable",
]


class QueueUnavailable(BackendUnavailable):
    """Redis (the broker and result store) cannot be reached, or will not take writes (a read-only replica).

    ``url`` never carries a password (``tasks.broker.connection.redact``).
    """

    @property
    def message(self) -> str:
        return f"cannot reach Redis at {self.url}: {self.problem}"


class QueueFull(SwaplessError):
    """Redis refuses new jobs: it is out of memory (``maxmemory``), or the queue holds ``SWAPLESS_MAX_QUEUED`` jobs.

    Nothing of the refused job was queued; send it again later. ``queued``: the ids of a call's other jobs that were
    queued nonetheless (``submit_jobs`` over several models, one of them at its bound).
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(where, reason)
        self.where = where
        self.reason = reason
        self.queued: list[str] = []

    @property
    def message(self) -> str:
        return f"the queue at {self.where} refused the job: {self.reason}"


class JobFailed(SwaplessError):
    """The job failed with an error type this process cannot rebuild (``error_type`` names it)."""

    def __init__(self, job_id: str, error_type: str, detail: str) -> None:
        super().__init__(job_id, error_type, detail)
        self.job_id = job_id
        self.error_type = error_type
        self.detail = detail

    @property
    def message(self) -> str:
        return f"job {self.job_id} failed: {self.error_type}: {self.detail}"


class JobExpired(SwaplessError):
    """The job was not started by its deadline (``expires``), so it was never run."""

    def __init__(self, model_id: str, deadline: str) -> None:
        super().__init__(model_id, deadline)
        self.model_id = model_id
        self.deadline = deadline

    @property
    def message(self) -> str:
        return (
            f"this job for model {self.model_id!r} was not started by its deadline ({self.deadline}) and was not "
            "run; send it again, with a later deadline (expires), if it is still wanted"
        )


class DeadlinePassed(SwaplessError):
    """A stream of chunks (``swapless bulk --expires``, ``Client.stream(expires=)``) reached its deadline: what
    was not sent or not started by then is not computed. The output holds every record before the first such
    chunk, so a rerun resumes there."""

    def __init__(self, deadline: str) -> None:
        super().__init__(deadline)
        self.deadline = deadline

    @property
    def message(self) -> str:
        return (
            f"the deadline ({self.deadline}) has passed: the records not started by then were not computed; "
            "rerun with a later --expires (or none) to resume"
        )


class JobCancelled(SwaplessError):
    """The job was cancelled before it started (``Client.cancel``, ``swapless cancel``, ``DELETE /jobs/{id}``,
    Celery's ``revoke``), so it was never run."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id

    @property
    def message(self) -> str:
        return f"job {self.job_id} was cancelled before it started and was not run; send it again if it is wanted"


class JobTimeout(SwaplessError, TimeoutError):
    """The job had no final result within the timeout. It may still finish later."""

    def __init__(self, job_id: str, timeout_s: float, state: str) -> None:
        super().__init__(job_id, timeout_s, state)
        self.job_id = job_id
        self.timeout_s = timeout_s
        self.state = state

    @property
    def message(self) -> str:
        return (
            f"job {self.job_id} has no result after {self.timeout_s:g} s (state {self.state}); "
            "it may still finish: look it up later with Client().job(job_id)"
        )


class BulkFileError(SwaplessError):
    """A bulk job's input or output file cannot be used at all (missing, unknown format, no such column, an
    output that does not continue this input). Nothing is sent; the message says what to fix."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path = path
        self.problem = problem

    @property
    def message(self) -> str:
        return f"{self.path}: {self.problem}"


class LocalModeError(SwaplessError):
    """The embedded Redis or the local worker could not start, or the worker stopped; ``log`` is its log's end."""

    def __init__(self, what: str, log: str = "") -> None:
        super().__init__(what, log)
        self.what = what
        self.log = log

    @property
    def message(self) -> str:
        return f"local mode: {self.what}" + (f"\n--- log ---\n{self.log}" if self.log else "")


class MetricsUnavailable(SwaplessError):
    """The metrics endpoint could not be opened (port in use, bad address)."""

    def __init__(self, host: str, port: int, problem: str) -> None:
        super().__init__(host, port, problem)
        self.host = host
        self.port = port
        self.problem = problem

    @property
    def message(self) -> str:
        return (
            f"cannot serve metrics on {self.host}:{self.port}: {self.problem}; "
            "pick another --metrics-port (SWAPLESS_METRICS_PORT)"
        )
