"""Every error Swapless raises, under one root.

Each error keeps the arguments it was built from in ``args`` and builds its message from them, so that it
survives Celery's JSON result backend: the backend stores ``type``, ``module`` and ``args`` and the client
rebuilds the very same error, message included.

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
    │   └── QueueUnavailable *  Redis, the queue and result store, cannot be reached (retryable)
    ├── QueueFull *             Redis refuses new jobs: it is out of memory, or the queue is at its bound
    ├── JobFailed *             the job failed with an error this process cannot rebuild
    ├── JobExpired *            the job was not started by its deadline (``expires``); it never ran
    ├── JobCancelled *          the job was cancelled before it started; it never ran
    ├── DeadlinePassed *        a bulk job's deadline passed; the rest was not computed (rerun to resume)
    ├── JobTimeout *            no result within the timeout (also a TimeoutError)
    ├── BulkFileError *         a bulk job's input or output file cannot be used; nothing was sent
    ├── LocalModeError *        local mode's embedded Redis or worker did not start, or stopped
    └── MetricsUnavailable *    the worker's metrics endpoint cannot be opened

``*``: the queue side's errors, defined in ``tasks/errors.py`` (the model side never raises them); the others here.
"""

from __future__ import annotations

from collections.abc import Iterable

from manager.describe import format_bytes

__all__ = [
    "BackendUnavailable",
    "ConfigError",
    "DuplicateFramework",
    "InputError",
    "ModelLoadError",
    "ModelTooLarge",
    "PoisonJob",
    "PredictionFailed",
    "SwaplessError",
    "UnknownFramework",
    "UnknownModel",
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
