"""Settings of the worker: the model cache, scheduling, placement and inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from swapless.config.settings.units import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MODELS_FILE, size_or

__all__ = ["CacheSettings", "InputSettings", "PlacementSettings", "WorkerSettings"]


class CacheSettings(BaseModel):
    """The model registry, the device and the model cache."""

    model_config = ConfigDict(title="Models and the model cache")

    models_file: Path = Field(DEFAULT_MODELS_FILE, description="The model registry")
    max_models: int = Field(2, ge=1, description="Local models loaded at once (count limit of the LRU cache)")
    memory_budget_bytes: int | None = Field(
        None,
        description="Bytes of loaded local models: `4GiB`, `512MB` or a plain number (unset: no byte limit)",
    )
    # The host tier (manager.cache.host); off unless given bytes: host RAM is the process's and the machine's, and
    # on a CPU-only machine it is the same memory as the "device", so no default can be safe for every machine.
    host_memory_budget_bytes: int = Field(
        0, ge=0,
        description="Bytes of models kept built in host memory once evicted from the device (the host tier): their "
        "next use is a copy back, not a load from disk; `16GiB` or a plain number; 0: evicted models are unloaded",
    )
    host_max_models: int = Field(
        16, ge=0,
        description="Most models kept in the host tier at once (with a host budget above 0; 0 turns the tier off too)",
    )
    triton_max_models: int = Field(4, ge=1, description="Triton models kept loaded on their servers")
    triton_url: str = Field("127.0.0.1:8000", description="Default Triton HTTP endpoint")
    max_adapters: int = Field(
        256, ge=1,
        description="Variants (adapters) of one base resident at once in its adapter slots, per adapter shape; their "
        "bytes count in the base's size; more in one pass run in turns",
    )
    adapter_host_bytes: int = Field(
        1 << 30, ge=0,
        description="Bytes of adapter weights per base kept in host memory once read, so that bringing a variant "
        "back is a copy; `256MB` or a plain number",
    )
    device: str = Field("auto", description="`auto` (cuda if available, else cpu), `cpu`, `cuda`, `cuda:1`")
    max_batch_size: int = Field(
        DEFAULT_MAX_BATCH_SIZE, ge=1,
        description="Largest forward pass unless the model entry says otherwise; the best size below it is measured",
    )
    plugins: str = Field("", description="Comma-separated modules imported at worker start (custom frameworks)")
    # While a group computes, load the model the next group needs (ModelManager.load_ahead); a bulk group's cold
    # model loads aside while interactive jobs keep running (tasks.worker.scheduler).
    load_ahead: bool = Field(
        True,
        description="While a group computes, load the model the next group needs when there is room (never evicting a"
        " model with work); a bulk group's cold model loads aside while interactive jobs run",
    )
    keep_interactive_s: float = Field(
        60.0, ge=0,
        description="A model that served interactive jobs stays loaded this long after: loads ahead never evict it, "
        "other loads evict it last (0: plain LRU)",
    )

    @field_validator("memory_budget_bytes", mode="before")
    @classmethod
    def _parse_budget(cls, value: object) -> int | None:
        return size_or(value, None)

    @field_validator("host_memory_budget_bytes", "adapter_host_bytes", mode="before")
    @classmethod
    def _parse_host_budget(cls, value: object) -> int | None:
        return size_or(value, 0)


class WorkerSettings(BaseModel):
    """How one worker holds, groups, times out and redelivers jobs; its warm start."""

    model_config = ConfigDict(title="Worker: scheduling, deadlines and delivery")

    prefetch: int = Field(1024, ge=1, description="Unacked jobs one worker holds: the backlog its scheduler groups")
    max_group: int = Field(256, ge=1, description="Most jobs of one model run before the scheduler decides again")
    max_wait_s: float = Field(30.0, gt=0, description="A job older than this is served next even if its model is cold")
    interactive_expires_s: float | None = Field(
        None, gt=0,
        description="An interactive job sent without its own deadline (`expires`) that has not started this long "
        "after it was sent is answered `JobExpired` and never run (unset: no deadline)",
    )
    bulk_expires_s: float | None = Field(None, gt=0, description="The same for bulk jobs (unset: no deadline)")
    max_attempts: int = Field(3, ge=1, description="A job in flight at this many worker deaths fails as a poison job")
    visibility_timeout_s: int = Field(
        60, ge=3,
        description="A dead worker's jobs are redelivered after this (plus the sweep)",
    )
    visibility_refresh_s: float = Field(
        10.0, gt=0,
        description="A live worker re-stamps the jobs it holds this often; must be ≤ timeout / 3",
    )
    # Where Celery follow-ups that name no queue go (``swapless.tasks.worker.canvas``).
    canvas_queue: str = Field(
        "celery", min_length=1,
        description="Queue of a Celery follow-up task (`link`, `link_error`, a chain's next step, a chord's body) "
        "that names none and is not Swapless's own: this worker does not know the producer's routes, and `celery` is "
        "the queue a plain Celery worker consumes by default",
    )
    warm_start: bool = Field(
        True,
        description="Warm each local model and measure its batch sizes while idle, until the first job "
        "(`--no-warm-start`)",
    )
    warm_start_budget_s: float = Field(
        30.0, gt=0,
        description="The warm start warms no more models once it has taken this long (it also ends at the first job)",
    )
    warm_before_ready_s: float = Field(
        0.0, ge=0,
        description="Seconds of the warm start done before the worker reports ready (behind a readiness probe: warm "
        "before traffic); 0: all of it while idle",
    )

    @model_validator(mode="after")
    def _check_visibility(self) -> WorkerSettings:
        # A live worker must re-stamp the jobs it holds several times per timeout, or a long wait or batch could
        # outlive the timeout and the jobs would be redelivered to another worker while this one still runs them.
        if self.visibility_refresh_s * 3 > self.visibility_timeout_s:
            raise ValueError(
                f"SWAPLESS_VISIBILITY_REFRESH_S ({self.visibility_refresh_s:g} s) must be at most a third of "
                f"SWAPLESS_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s} s): a batch could outlive the timeout "
                "and be redelivered while it runs"
            )
        return self

    @property
    def restore_sweep_s(self) -> int:
        """How often a worker looks for dead workers' jobs."""
        return max(1, round(self.visibility_refresh_s))


class PlacementSettings(BaseModel):
    """How models are placed on workers and copied across them."""

    model_config = ConfigDict(title="Placement and copies")

    routing: Literal["placement", "shared"] = Field(
        "placement",
        description="`placement`: each model's jobs go to the workers that claimed it, one cache across workers; "
        "`shared`: any worker takes any job (one worker, or the baseline)",
    )
    prefetch_per_model: int = Field(
        512, ge=1,
        description="Most jobs of one model a worker holds, a chunk counting its inputs (two groups: one running, the"
        " next fetched meanwhile); with other workers live, also at most about SWAPLESS_COPY_BACKLOG_S of its work, "
        "so the rest waits in Redis for whichever copy is free",
    )
    copy_backlog_s: float = Field(
        2.0, gt=0,
        description="A model gets one more copy (on another worker) when its waiting work per copy passes this many "
        "seconds",
    )
    max_copies: int | None = Field(
        None, ge=1,
        description="Most workers that hold one model at once (unset: as many as there are workers)",
    )
    copy_idle_s: float = Field(10.0, gt=0, description="An extra copy whose model had no work for this long is dropped")
    placement_interval_s: float = Field(
        0.2, gt=0,
        description="How often a worker reads the cluster's queues and claims and places models",
    )


class InputSettings(BaseModel):
    """Limits on the inputs a worker reads."""

    model_config = ConfigDict(title="Inputs")

    input_root: Path | None = Field(
        None,
        description="Directory image file paths must stay under (unset: the worker reads no image files and refuses "
        "paths)",
    )
    max_text_chars: int = Field(100_000, ge=1, description="Longer text inputs fail their job")
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1, description="Larger encoded images fail their job")
    max_image_pixels: int = Field(89_478_485, ge=1, description="Pillow's decompression-bomb limit")

    @field_validator("input_root", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value
