"""Every error Swapless raises, under one root, in one module that both sides reach (the model side, ``manager/``,
and the queue side, ``tasks/``) without importing each other.

Each error keeps the arguments it was built from in ``args`` and builds its message from them, so that it
survives Celery's JSON result backend: the backend stores ``type``, ``module`` and ``args`` and the client
rebuilds the very same error, message included. Each message says what to do.

    SwaplessError
    ├── ConfigError             the models file or a setting is wrong (start-up)
    ├── UnknownModel            a job names a model id that is not in the registry (also a KeyError)
    ├── UnknownFramework        a models entry names a framework no worker is registered for (also a KeyError)
    ├── DuplicateFramework      two worker classes register the same framework name
    ├── InputError              one job's input is unusable; that job fails alone (also a ValueError)
    ├── ModelLoadError          a model could not be loaded
    │   └── ModelTooLarge       a model does not fit the memory budget even with everything else evicted
    ├── PredictionFailed        the model raised on this job's input
    ├── PoisonJob               the job was in flight each time its worker died; not retried again
    ├── BackendUnavailable      a remote inference server did not answer (retryable)
    │   └── QueueUnavailable    Redis, the queue and result store, cannot be reached (retryable)
    ├── QueueFull               Redis refuses new jobs: it is out of memory, or the queue is at its bound
    ├── JobFailed               the job failed with an error this process cannot rebuild
    ├── JobExpired              the job was not started by its deadline (``expires``); it never ran
    ├── JobCancelled            the job was cancelled before it started; it never ran
    ├── DeadlinePassed          a bulk job's deadline passed; the rest was not computed (rerun to resume)
    ├── JobTimeout              no result within the timeout (also a TimeoutError)
    ├── BulkFileError           a bulk job's input or output file cannot be used; nothing was sent
    ├── LocalModeError          local mode's embedded Redis or worker did not start, or stopped
    ├── MetricsUnavailable      the worker's metrics endpoint cannot be opened
    └── WebhookRefused          a ``callback_url`` is not http(s), or its host is not allowed (also a ValueError)

The HTTP gateway adds its own, for what only a network caller can do wrong (``swapless.tasks.gateway.errors``).
"""

from __future__ import annotations

from collections.abc import Iterable

from swapless.config.describe import format_bytes

__all__ = [
    "BackendUnavailable",
    "BulkFileError",
    "ConfigError",
    "DeadlinePassed",
    "DuplicateFramework",
    "InputError",
    "JobCancelled",
    "JobExpired",
    "JobFailed",
    "JobTimeout",
    "LocalModeError",
    "MetricsUnavailable",
    "ModelLoadError",
    "ModelTooLarge",
    "PoisonJob",
    "PredictionFailed",
    "QueueFull",
    "QueueUnavailable",
    "SwaplessError",
    "UnknownFramework",
    "UnknownModel",
    "WebhookRefused",
]


class SwaplessError(Exception):
    """Root of every Swapless error. ``str(err)`` is the message; ``args`` are what it was built from."""

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__

    def __str__(self) -> str:
        return self.message


class ConfigError(SwaplessError):
    """The models file or a setting is invalid. ``where`` names the file/entry/field, ``problem`` what to fix."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(where, problem)
        self.where = where
        self.problem = problem

    @property
    def message(self) -> str:
        return f"{self.where}: {self.problem}"


class UnknownModel(SwaplessError, KeyError):
    """A job addressed a model id the registry does not have."""

    def __init__(self, model_id: str, known: Iterable[str] = ()) -> None:
        known_list = sorted(known)
        super().__init__(model_id, known_list)
        self.model_id = model_id
        self.known = known_list

    @property
    def message(self) -> str:
        return f"unknown model {self.model_id!r} (known: {', '.join(self.known) or 'none'})"


class UnknownFramework(SwaplessError, KeyError):
    """No worker class is registered for a framework name."""

    def __init__(self, framework: str, known: Iterable[str] = ()) -> None:
        known_list = sorted(known)
        super().__init__(framework, known_list)
        self.framework = framework
        self.known = known_list

    @property
    def message(self) -> str:
        return f"unknown framework {self.framework!r} (known: {', '.join(self.known) or 'none'})"


class DuplicateFramework(SwaplessError):
    """Two worker classes tried to register under the same framework name."""

    def __init__(self, framework: str, existing: str) -> None:
        super().__init__(framework, existing)
        self.framework = framework
        self.existing = existing

    @property
    def message(self) -> str:
        return f"framework {self.framework!r} is already registered by {self.existing}"


class InputError(SwaplessError, ValueError):
    """One job's input cannot be used. Only that job fails."""

    def __init__(self, model_id: str, problem: str) -> None:
        super().__init__(model_id, problem)
        self.model_id = model_id
        self.problem = problem

    @property
    def message(self) -> str:
        return f"bad input for model {self.model_id!r}: {self.problem}"


class ModelLoadError(SwaplessError):
    """A model could not be loaded; every job waiting for it fails with this message."""

    def __init__(self, model_id: str, problem: str) -> None:
        super().__init__(model_id, problem)
        self.model_id = model_id
        self.problem = problem

    @property
    def message(self) -> str:
        return f"could not load model {self.model_id!r}: {self.problem}"


class ModelTooLarge(ModelLoadError):
    """A model needs more memory than the whole budget."""

    def __init__(self, model_id: str, size_bytes: int, budget_bytes: int) -> None:
        SwaplessError.__init__(self, model_id, size_bytes, budget_bytes)
        self.model_id = model_id
        self.size_bytes = size_bytes
        self.budget_bytes = budget_bytes
        self.problem = self.message

    @property
    def message(self) -> str:
        return (
            f"model {self.model_id!r} needs {format_bytes(self.size_bytes)}, more than the whole memory budget "
            f"of {format_bytes(self.budget_bytes)}; raise --memory-budget (SWAPLESS_MEMORY_BUDGET_BYTES)"
        )


class PredictionFailed(SwaplessError):
    """The model raised while computing this job."""

    def __init__(self, model_id: str, problem: str) -> None:
        super().__init__(model_id, problem)
        self.model_id = model_id
        self.problem = problem

    @property
    def message(self) -> str:
        return f"model {self.model_id!r} failed on this input: {self.problem}"


class PoisonJob(SwaplessError):
    """The job was running each time its worker process died (a crash in native code, the OOM killer)."""

    def __init__(self, model_id: str, attempts: int) -> None:
        super().__init__(model_id, attempts)
        self.model_id = model_id
        self.attempts = attempts

    @property
    def message(self) -> str:
        return (
            f"this job was running on model {self.model_id!r} each of the {self.attempts} times its worker died; "
            "it is not retried again (its input may crash the model: check the worker's logs)"
        )


class BackendUnavailable(SwaplessError):
    """A remote inference server (Triton) did not answer. Retried with backoff before the job fails."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(url, problem)
        self.url = url
        self.problem = problem

    @property
    def message(self) -> str:
        return f"inference server at {self.url} is unavailable: {self.problem}"


class QueueUnavailable(BackendUnavailable):
    """Redis (the broker and result store) cannot be reached, or will not take writes (a read-only replica).

    ``url`` never carries a password (``swapless.tasks.broker.connection.redact``).
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


class WebhookRefused(SwaplessError, ValueError):
    """A ``callback_url`` this deployment does not call back (``swapless.tasks.webhooks.check_target``)."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(url, problem)
        self.url = url
        self.problem = problem

    @property
    def message(self) -> str:
        return f"callback_url {self.url!r} refused: {self.problem}"


#: The module every error is stored under and reached from: the public ``swapless``. A stored failure names its
#: class by this stable name (Celery's result backend stores ``exc_module``), not by where the class is defined.
PUBLIC_MODULE = "swapless"
#: Where errors were stored from before they had a stable name; read as ``PUBLIC_MODULE``.
FORMER_MODULES = frozenset({"config.errors", __name__})

for _name in __all__:
    globals()[_name].__module__ = PUBLIC_MODULE
del _name
