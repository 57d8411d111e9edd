"""Every Swapless error, under one root; each builds its message from its ``args`` (what a result backend keeps).

    SwaplessError
    ├── ConfigError, UnknownModel (KeyError), UnknownFramework (KeyError), DuplicateFramework
    ├── InputError (ValueError), PredictionFailed, PoisonJob
    ├── ModelLoadError
    │   └── ModelTooLarge
    ├── BackendUnavailable
    │   └── QueueUnavailable
    ├── QueueFull, JobFailed, JobExpired, JobCancelled, DeadlinePassed, JobTimeout (TimeoutError)
    └── BulkFileError, LocalModeError, MetricsUnavailable, WebhookRefused (ValueError)

The gateway adds its own (``swapless.tasks.gateway.errors``).
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
    """Root of every Swapless error; ``str(err)`` is its message."""

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.__class__.__name__

    def __str__(self) -> str:
        return self.message


class ConfigError(SwaplessError):
    """The models file or a setting is invalid."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(where, problem)
        self.where = where
        self.problem = problem

    @property
    def message(self) -> str:
        return f"{self.where}: {self.problem}"


class UnknownModel(SwaplessError, KeyError):
    """A model id the registry does not have."""

    def __init__(self, model_id: str, known: Iterable[str] = ()) -> None:
        known_list = sorted(known)
        super().__init__(model_id, known_list)
        self.model_id = model_id
        self.known = known_list

    @property
    def message(self) -> str:
        return f"unknown model {self.model_id!r} (known: {', '.join(self.known) or 'none'})"


class UnknownFramework(SwaplessError, KeyError):
    """A framework no worker class is registered for."""

    def __init__(self, framework: str, known: Iterable[str] = ()) -> None:
        known_list = sorted(known)
        super().__init__(framework, known_list)
        self.framework = framework
        self.known = known_list

    @property
    def message(self) -> str:
        return f"unknown framework {self.framework!r} (known: {', '.join(self.known) or 'none'})"


class DuplicateFramework(SwaplessError):
    """Two worker classes register one framework name."""

    def __init__(self, framework: str, existing: str) -> None:
        super().__init__(framework, existing)
        self.framework = framework
        self.existing = existing

    @property
    def message(self) -> str:
        return f"framework {self.framework!r} is already registered by {self.existing}"


class InputError(SwaplessError, ValueError):
    """One job's input cannot be used; that job fails alone."""

    def __init__(self, model_id: str, problem: str) -> None:
        super().__init__(model_id, problem)
        self.model_id = model_id
        self.problem = problem

    @property
    def message(self) -> str:
        return f"bad input for model {self.model_id!r}: {self.problem}"


class ModelLoadError(SwaplessError):
    """A model could not be loaded."""

    def __init__(self, model_id: str, problem: str) -> None:
        super().__init__(model_id, problem)
        self.model_id = model_id
        self.problem = problem

    @property
    def message(self) -> str:
        return f"could not load model {self.model_id!r}: {self.problem}"


class ModelTooLarge(ModelLoadError):
    """A model is larger than the whole memory budget."""

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
    """The model raised on this job's input."""

    def __init__(self, model_id: str, problem: str) -> None:
        super().__init__(model_id, problem)
        self.model_id = model_id
        self.problem = problem

    @property
    def message(self) -> str:
        return f"model {self.model_id!r} failed on this input: {self.problem}"


class PoisonJob(SwaplessError):
    """The job was running each time its worker died."""

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
    """A remote inference server (Triton) did not answer."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(url, problem)
        self.url = url
        self.problem = problem

    @property
    def message(self) -> str:
        return f"inference server at {self.url} is unavailable: {self.problem}"


class QueueUnavailable(BackendUnavailable):
    """Redis cannot be reached or will not take writes."""

    @property
    def message(self) -> str:
        return f"cannot reach Redis at {self.url}: {self.problem}"


class QueueFull(SwaplessError):
    """Redis refuses new jobs; ``queued`` holds the call's other jobs that were queued."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(where, reason)
        self.where = where
        self.reason = reason
        self.queued: list[str] = []

    @property
    def message(self) -> str:
        return f"the queue at {self.where} refused the job: {self.reason}"


class JobFailed(SwaplessError):
    """The job failed with an error this process cannot rebuild."""

    def __init__(self, job_id: str, error_type: str, detail: str) -> None:
        super().__init__(job_id, error_type, detail)
        self.job_id = job_id
        self.error_type = error_type
        self.detail = detail

    @property
    def message(self) -> str:
        return f"job {self.job_id} failed: {self.error_type}: {self.detail}"


class JobExpired(SwaplessError):
    """The job was not started by its deadline; it never ran."""

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
    """A bulk job's deadline passed; a rerun resumes."""

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
    """The job was cancelled before it started; it never ran."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id

    @property
    def message(self) -> str:
        return f"job {self.job_id} was cancelled before it started and was not run; send it again if it is wanted"


class JobTimeout(SwaplessError, TimeoutError):
    """No result within the timeout; the job may still finish."""

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
    """A bulk job's input or output file cannot be used; nothing was sent."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path = path
        self.problem = problem

    @property
    def message(self) -> str:
        return f"{self.path}: {self.problem}"


class LocalModeError(SwaplessError):
    """Local mode's Redis or worker did not start, or stopped."""

    def __init__(self, what: str, log: str = "") -> None:
        super().__init__(what, log)
        self.what = what
        self.log = log

    @property
    def message(self) -> str:
        return f"local mode: {self.what}" + (f"\n--- log ---\n{self.log}" if self.log else "")


class MetricsUnavailable(SwaplessError):
    """The metrics endpoint could not be opened."""

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
    """A ``callback_url`` this deployment does not call back."""

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
