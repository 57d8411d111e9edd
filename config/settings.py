"""Process settings, read from the environment under the ``SWAPLESS_`` prefix (pydantic-settings).

Each field's description is its documentation, with its unit in its name (``_s`` seconds, ``_bytes`` bytes) or in
its description: the settings reference of the docs (``docs/reference/settings.md``) is generated from the fields,
defaults included, and a test fails on a field without one. The CLI flags of ``swapless worker`` set the same
variables.
"""

from __future__ import annotations

import difflib
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from swapless.config.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MODELS_FILE",
    "DEFAULT_REDIS_URL",
    "Settings",
    "get_settings",
    "load_settings",
    "parse_bytes",
    "unknown_variables",
]

DEFAULT_MODELS_FILE = Path(__file__).with_name("models.json")
#: Largest forward pass, in inputs, unless a model entry or SWAPLESS_MAX_BATCH_SIZE says otherwise.
DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def parse_bytes(value: str | float) -> int:
    """Parse a size such as ``4GiB``, ``512MB``, ``1.5 GiB`` or ``1048576`` into bytes.

    Raises:
        ValueError: the text is not a number followed by a known unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB).
    """
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value}")
        return int(value)
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"cannot read {value!r} as a size: write a number and a unit, like 4GiB, 512MiB or 2000000000"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


class Settings(BaseSettings):
    """Process settings: one field per ``SWAPLESS_`` variable, each with its default and description."""

    model_config = SettingsConfigDict(env_prefix="SWAPLESS_", extra="ignore")

    redis_url: str | None = Field(
        None,
        description="Broker and result backend. Unset: the worker uses redis://127.0.0.1:6379/0; `swapless "
        "submit`/`bulk` start an embedded Redis (local mode)",
    )
    connect_timeout_s: float = Field(
        3.0, gt=0,
        description="Producers (client, CLI, gateway) give up connecting to Redis after this, once retried",
    )
    redis_sentinel_master: str | None = Field(
        None,
        description="The master name Redis Sentinel knows the primary by; required with a "
        "`sentinel://host:26379;sentinel://host:26380` SWAPLESS_REDIS_URL (Celery's form; the primary's own user and "
        "password go in the first sentinel's URL)",
    )
    redis_sentinel_username: str | None = Field(
        None,
        description="The ACL user the sentinels themselves ask for (unset: none, or the default user)",
    )
    # A secret, so never shown in a repr.
    redis_sentinel_password: SecretStr | None = Field(
        None,
        description="The sentinels' own password (`requirepass` of the sentinels; unset: none)",
    )
    redis_sentinel_tls: bool = Field(False, description="Reach the sentinels, the primary and its replicas over TLS")
    redis_failover_wait_s: float = Field(
        15.0, ge=0,
        description="With Sentinel: how long a wait for results (`Job.get`, `gather`, the gateway's) rides out a "
        "primary that cannot be reached (a failover) before it fails `QueueUnavailable`",
    )
    redis_min_replicas: int = Field(
        0, ge=0,
        description="A submit returns, and a worker acks a job, only once this many replicas hold the job or its "
        "result (`WAIT`); 0: Redis's asynchronous replication, nothing waited for",
    )
    redis_replica_timeout_s: float = Field(
        1.0, gt=0,
        description="The longest a write waits for SWAPLESS_REDIS_MIN_REPLICAS replicas: then a submit fails "
        "`QueueUnavailable` (retryable) and a worker stores the result again before it acks",
    )
    models_file: Path = Field(DEFAULT_MODELS_FILE, description="The model registry")
    queue: str = Field("swapless", description="Celery queue the jobs go through")
    key_prefix: str | None = Field(
        None,
        description="Prefix for every Redis key (queues and results), to share one Redis",
    )
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
    max_queued: int | None = Field(
        100_000, ge=1,
        description="Most messages one model's lists (or the shared lists) may hold, a chunk counting once: producers"
        " get `QueueFull` beyond it, before Redis is full",
    )
    max_message_bytes: int = Field(
        64 * 1024 * 1024, ge=1024,
        description="Largest queue message a producer sends (one job, or one chunk of a bulk job): a larger one is "
        "refused with `InputError` before anything is queued",
    )
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
    prefetch: int = Field(1024, ge=1, description="Unacked jobs one worker holds: the backlog its scheduler groups")
    max_group: int = Field(256, ge=1, description="Most jobs of one model run before the scheduler decides again")
    max_wait_s: float = Field(30.0, gt=0, description="A job older than this is served next even if its model is cold")
    interactive_expires_s: float | None = Field(
        None, gt=0,
        description="An interactive job sent without its own deadline (`expires`) that has not started this long "
        "after it was sent is answered `JobExpired` and never run (unset: no deadline)",
    )
    bulk_expires_s: float | None = Field(None, gt=0, description="The same for bulk jobs (unset: no deadline)")
    result_expires_s: int = Field(
        3600, ge=1,
        description="How long an unread result stays in Redis (`forget=True` deletes one once read)",
    )
    cancel_hold_s: int = Field(
        7 * 24 * 3600, ge=1,
        description="How long a job without a deadline may still wait in the queue, as far as a cancellation (kept "
        "that long) and the gateway's record of a job go",
    )
    max_attempts: int = Field(3, ge=1, description="A job in flight at this many worker deaths fails as a poison job")
    task_events: bool = Field(
        False,
        description="Celery task events per job (Flower); they cost 10-25 % of single-model throughput",
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
    plugins: str = Field("", description="Comma-separated modules imported at worker start (custom frameworks)")
    visibility_timeout_s: int = Field(
        60, ge=3,
        description="A dead worker's jobs are redelivered after this (plus the sweep)",
    )
    visibility_refresh_s: float = Field(
        10.0, gt=0,
        description="A live worker re-stamps the jobs it holds this often; must be ≤ timeout / 3",
    )
    triton_url: str = Field("127.0.0.1:8000", description="Default Triton HTTP endpoint")
    input_root: Path | None = Field(
        None,
        description="Directory image file paths must stay under (unset: the worker reads no image files and refuses "
        "paths)",
    )
    max_text_chars: int = Field(100_000, ge=1, description="Longer text inputs fail their job")
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1, description="Larger encoded images fail their job")
    max_image_pixels: int = Field(89_478_485, ge=1, description="Pillow's decompression-bomb limit")
    heartbeat_interval_s: float = Field(
        2.0, gt=0,
        description="How often a worker publishes its status; the key expires after 3 intervals",
    )
    metrics_port: int | None = Field(
        None, ge=1, le=65535,
        description="Port of the worker's Prometheus endpoint (`/metrics`); unset: no metrics server, no port opened",
    )
    metrics_host: str = Field("127.0.0.1", description="Address the Prometheus endpoint binds to")
    scale_drain_s: float = Field(
        300.0, gt=0,
        description="Autoscaling: the time a backlog should take to drain; `swapless_workers_desired` asks for "
        "backlog seconds / this many workers on top of the demand",
    )
    scale_target_utilization: float = Field(
        0.8, gt=0, le=1,
        description="Autoscaling: the share of each worker's device time the work arriving may fill",
    )
    scale_window_s: float = Field(60.0, gt=0, description="Autoscaling: the window the work arriving is measured over")
    scale_min_workers: int = Field(
        0, ge=0,
        description="Autoscaling: `swapless_workers_desired` never asks for fewer (0: scale to zero when idle)",
    )
    scale_max_workers: int = Field(16, ge=1, description="Autoscaling: `swapless_workers_desired` never asks for more")
    scale_unknown_job_s: float = Field(
        0.05, ge=0,
        description="Autoscaling: device seconds per job of a model no worker has measured on the fleet's kind of "
        "device",
    )
    scale_unknown_load_s: float = Field(10.0, ge=0, description="Autoscaling: load seconds of a model never measured")
    scale_busy_s: float = Field(
        1.0, gt=0,
        description="Autoscaling: a worker with this many device seconds of work of its own (jobs it holds, its share"
        " of those waiting for the models it claims) is busy; `swapless_workers_desired` never asks for fewer workers"
        " than are busy",
    )
    # In Kubernetes, keep the pod's controller.kubernetes.io/pod-deletion-cost current (tasks.observe.podcost).
    pod_deletion_cost: bool = Field(
        False,
        description="In Kubernetes, keep the pod's `controller.kubernetes.io/pod-deletion-cost` annotation at the "
        "worker's removal cost (needs POD_NAME, POD_NAMESPACE and `patch` on pods)",
    )
    pod_deletion_cost_interval_s: float = Field(
        10.0, gt=0,
        description="The pod-deletion cost is written at most this often (each write is a pod update)",
    )
    kubernetes_service_account_dir: Path = Field(
        Path("/var/run/secrets/kubernetes.io/serviceaccount"),
        description="Where the pod's service account token and CA are mounted",
    )
    exporter_port: int = Field(
        9808, ge=1, le=65535,
        description="Port of `swapless exporter`'s `/metrics` (the autoscaling signals, for deployments without the "
        "gateway)",
    )
    gateway_max_body_bytes: int = Field(
        32 * 1024 * 1024, ge=1,
        description="Larger request bodies get 413 from the HTTP gateway (counted as they arrive, and again once "
        "decompressed)",
    )
    gateway_body_timeout_s: float = Field(30.0, gt=0, description="A request body that takes longer to arrive gets 408")
    gateway_max_elements: int = Field(
        1024, ge=1,
        description="Most elements (jobs) of one Open Inference Protocol request, checked from the declared shapes: "
        "more get 413",
    )
    gateway_rate_per_key: float = Field(
        1000.0, gt=0,
        description="Jobs one API key (without keys: one client address) may submit per second, in bursts of twice "
        "that; more get 429; kept in Redis, shared by every gateway process",
    )
    gateway_inflight_per_key: int = Field(
        2048, ge=1,
        description="Jobs one API key (or client address) may have submitted and not yet finished; more get 429",
    )
    gateway_max_waits: int = Field(
        1000, ge=1,
        description="`POST /predict` and `/v2` infer requests one gateway process holds waiting for results; more get"
        " 503",
    )
    gateway_active_per_key: int = Field(
        4, ge=1,
        description="Requests of one caller (key, or address without keys) one gateway process reads, parses and "
        "queues at once; the rest wait their turn (waiting for results does not count)",
    )
    gateway_turn_wait_s: float = Field(
        10.0, gt=0,
        description="The longest a request waits for its caller's turn; then 429 with `Retry-After`",
    )
    gateway_allowed_hosts: str | None = Field(
        None,
        description="`Host` names the gateway answers to, comma-separated (`*`: any). Default: with no API key and no"
        " `--insecure-no-auth`, loopback names only (`localhost`, `127.0.0.1`, `[::1]`: a web page cannot reach a "
        "loopback gateway through a DNS rebinding); else any",
    )
    gateway_allowed_origins: str = Field(
        "",
        description="Web origins (`https://app.example`) whose pages may call the gateway from a browser, "
        "comma-separated; a request from any other `Origin` gets 403 (unset: same origin only)",
    )
    predict_timeout_s: float = Field(
        30.0, gt=0,
        description="How long `POST /predict` waits before answering 504 with the job id",
    )
    # The gateway's API keys (``swapless.tasks.gateway.auth`` parses and hashes them); a secret, so never shown in a
    # repr.
    api_keys: SecretStr | None = Field(
        None,
        description="API keys of the HTTP gateway, comma-separated; an entry `KEY:MODELS` may call only those models "
        "(the syntax: `swapless.tasks.gateway.auth`). No keys at all: the gateway asks for none (unset: no keys)",
    )
    api_keys_file: Path | None = Field(
        None,
        description="A file of more API keys, one entry per line in the same syntax, `#` starting a comment",
    )
    gateway_insecure_no_auth: bool = Field(
        False,
        description="Let `swapless serve` listen on a non-loopback address with no API key configured "
        "(`--insecure-no-auth`)",
    )
    # Where Celery follow-ups that name no queue go (``swapless.tasks.worker.canvas``).
    canvas_queue: str = Field(
        "celery", min_length=1,
        description="Queue of a Celery follow-up task (`link`, `link_error`, a chain's next step, a chord's body) "
        "that names none and is not Swapless's own: this worker does not know the producer's routes, and `celery` is "
        "the queue a plain Celery worker consumes by default",
    )
    # The Standard Webhooks signing secret; a secret, so never shown in a repr.
    webhook_secret: SecretStr | None = Field(
        None,
        description="The Standard Webhooks signing secret (`whsec_` and base64): every webhook is signed with it; "
        "without it a worker keeps the deliveries it cannot sign as failed (replay them once it is set); unset: "
        "webhooks are not signed, so not sent",
    )
    webhook_allowed_hosts: str = Field(
        "",
        description="Hosts a `callback_url` may name, comma-separated (`*.example.com` covers subdomains); a listed "
        "host may resolve to any address. Unset: any host that resolves only to public addresses (never loopback, "
        "private, link-local or reserved ones)",
    )
    webhook_retry_s: float = Field(
        24 * 3600.0, gt=0,
        description="How long a webhook delivery is retried (backoff from 1 s doubling to 10 minutes) before it is "
        "kept as failed",
    )
    webhook_timeout_s: float = Field(
        10.0, gt=0,
        description="How long one delivery attempt waits for the receiver's answer (a 2xx delivers it)",
    )
    webhook_concurrency: int = Field(8, ge=1, description="Webhook requests one worker's sender has in flight at once")
    webhook_max_pending: int = Field(
        100_000, ge=1,
        description="Most deliveries waiting in one queue's delivery queue: beyond it a delivery is kept as failed at"
        " once (`swapless webhooks replay`)",
    )
    webhook_max_pending_per_key: int = Field(
        10_000, ge=1,
        description="Webhook deliveries waiting for one API key's jobs; past it, its new ones are kept as failed at "
        "once",
    )
    webhook_max_failed: int = Field(
        10_000, ge=1,
        description="Most failed deliveries kept (the oldest go first); each is kept SWAPLESS_WEBHOOK_RETRY_S after "
        "it failed",
    )
    batch_files_url: str | None = Field(
        None,
        description="Where the batch API (`/v1/files`, `/v1/batches`) keeps its files: a directory, or any fsspec URL"
        " (`s3://bucket/swapless`, `gs://...`; the filesystem's own package must be installed); unset: "
        "~/.local/share/swapless/files",
    )
    batch_work_dir: Path | None = Field(
        None,
        description="A local directory for the files a batch's driver writes while it runs (per-model inputs and "
        "outputs, fsynced per chunk: what a takeover resumes from); default: `work/` under a local "
        "SWAPLESS_BATCH_FILES_URL, else ~/.cache/swapless/batch-work. Share it between gateway hosts for a takeover "
        "on another host to resume rather than start the batch over",
    )
    batch_file_retention_s: int = Field(
        30 * 24 * 3600, ge=1,
        description="A batch file (input, output, errors) is deleted this long after it was written",
    )
    batch_retention_s: int = Field(
        30 * 24 * 3600, ge=1,
        description="A batch's record (status, counts, metadata) is deleted this long after it ended",
    )
    batch_max_files_per_key: int = Field(
        1000, ge=1,
        description="Files one API key may keep (uploads and results); one more is refused 429",
    )
    batch_max_bytes_per_key: int = Field(
        10 * 1024**3, ge=1024,
        description="Bytes of files one API key may keep; an upload past it is refused 413",
    )
    batch_max_batches_per_key: int = Field(
        1000, ge=1,
        description="Batch records one API key may have (within their retention); one more is refused 429",
    )
    batch_max_active_per_key: int = Field(
        20, ge=1,
        description="Batches of one API key not finished at once; one more is refused 429",
    )
    batch_max_file_bytes: int = Field(
        200 * 1024 * 1024, ge=1024,
        description="Larger uploads to `POST /v1/files` get 413 (counted as they arrive)",
    )
    batch_upload_timeout_s: float = Field(
        600.0, gt=0,
        description="An upload to `POST /v1/files` that takes longer to arrive gets 408 (in place of "
        "SWAPLESS_GATEWAY_BODY_TIMEOUT_S)",
    )
    batch_max_lines: int = Field(
        100_000, ge=1,
        description="Most requests one batch input file may hold; more get 400 naming the line",
    )
    batch_max_window_s: int = Field(
        24 * 3600, ge=1,
        description="The longest `completion_window` a batch may ask for (`24h`, `90m`, `30s`); lines not started by "
        "its end are answered expired",
    )
    batch_runner: bool = Field(
        True,
        description="`swapless serve` drives batches itself (a runner thread); false: only `swapless batches` "
        "processes do",
    )
    batch_max_active: int = Field(
        4, ge=1,
        description="Batches one process drives at once; more wait for a free slot, in any process",
    )
    batch_lease_s: float = Field(
        30.0, ge=1.0,
        description="A driver's lease on a batch, renewed every third of it; a driver gone this long (killed) has its"
        " batch taken over by another runner, resuming from what it wrote",
    )
    batch_webhook_url: str | None = Field(
        None,
        description="Where every batch's end is posted (`batch.completed`, `batch.failed`, `batch.expired`, "
        "`batch.cancelled`), signed as job webhooks are, unless the batch names its own `callback_url`",
    )

    @field_validator("memory_budget_bytes", mode="before")
    @classmethod
    def _parse_budget(cls, value: object) -> int | None:
        if value is None or value == "":
            return None
        if isinstance(value, (str, int, float)):
            return parse_bytes(value)
        raise ValueError(f"cannot read {value!r} as a size")

    @field_validator("host_memory_budget_bytes", "adapter_host_bytes", mode="before")
    @classmethod
    def _parse_host_budget(cls, value: object) -> int:
        if value is None or value == "":
            return 0
        if isinstance(value, (str, int, float)):
            return parse_bytes(value)
        raise ValueError(f"cannot read {value!r} as a size")

    @field_validator("api_keys_file", "input_root", "batch_work_dir", "batch_files_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @model_validator(mode="after")
    def _check_visibility(self) -> Settings:
        # A live worker must re-stamp the jobs it holds several times per timeout, or a long wait or batch could
        # outlive the timeout and the jobs would be redelivered to another worker while this one still runs them.
        if self.visibility_refresh_s * 3 > self.visibility_timeout_s:
            raise ValueError(
                f"SWAPLESS_VISIBILITY_REFRESH_S ({self.visibility_refresh_s:g} s) must be at most a third of "
                f"SWAPLESS_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s} s): a batch could outlive the timeout "
                "and be redelivered while it runs"
            )
        return self

    @model_validator(mode="after")
    def _check_scale(self) -> Settings:
        if self.scale_min_workers > self.scale_max_workers:
            raise ValueError(
                f"SWAPLESS_SCALE_MIN_WORKERS ({self.scale_min_workers}) is above SWAPLESS_SCALE_MAX_WORKERS "
                f"({self.scale_max_workers}): lower the first or raise the second"
            )
        return self

    @model_validator(mode="after")
    def _check_sentinel(self) -> Settings:
        if self.redis_url and self.redis_url.lower().startswith("sentinel://") and not self.redis_sentinel_master:
            raise ValueError(
                "SWAPLESS_REDIS_URL names sentinels (sentinel://...): set SWAPLESS_REDIS_SENTINEL_MASTER to the name "
                "they know the primary by (the name in their `sentinel monitor` line)"
            )
        return self

    @property
    def restore_sweep_s(self) -> int:
        """How often a worker looks for dead workers' jobs (kombu's unacked restore sweep)."""
        return max(1, round(self.visibility_refresh_s))

    @property
    def failover_wait_s(self) -> float:
        """How long a wait rides out an unreachable primary: ``redis_failover_wait_s`` with Sentinel, else 0."""
        sentinel = (self.redis_url or "").lower().startswith("sentinel://")
        return self.redis_failover_wait_s if sentinel else 0.0

    @property
    def broker_url(self) -> str:
        """The Redis URL the worker connects to: the configured one, else the local default."""
        return self.redis_url or DEFAULT_REDIS_URL


_PREFIX = "SWAPLESS_"


def _misspelt_variable() -> ConfigError | None:
    """An environment variable that looks like a setting but is none (``SWAPLESS_MEMORY_BUDGET``): it would be
    ignored silently. Variables of other tools under the prefix (``SWAPLESS_TEST_...``) do not look like one."""
    known = [name.upper() for name in Settings.model_fields]
    for variable in sorted(os.environ):
        if not variable.startswith(_PREFIX) or variable[len(_PREFIX) :] in known:
            continue
        name = variable[len(_PREFIX) :]
        close = [k for k in known if k.startswith(name + "_")] or difflib.get_close_matches(name, known, 1, 0.85)
        if close:
            return ConfigError(variable, f"no such setting; did you mean {_PREFIX}{close[0]}? (see config/settings.py)")
    return None


#: Variables under the prefix that belong to other tools (the test suite, the benchmarks, CI), not to settings.
_OTHER_TOOLS = ("SWAPLESS_TEST_", "SWAPLESS_BENCH_", "SWAPLESS_FAULTS_", "SWAPLESS_PYTHON")


def unknown_variables() -> list[str]:
    """The environment's ``SWAPLESS_*`` variables that are no setting (and no other tool's): each ignored, each
    named with the setting it most resembles, if any (``SWAPLESS_FILES_DIR (SWAPLESS_BATCH_FILES_URL?)``)."""
    known = [name.upper() for name in Settings.model_fields]
    found = []
    for variable in sorted(os.environ):
        name = variable[len(_PREFIX) :]
        if not variable.startswith(_PREFIX) or name in known or variable.startswith(_OTHER_TOOLS):
            continue
        close = difflib.get_close_matches(name, known, 1, 0.5)
        found.append(f"{variable} ({_PREFIX}{close[0]}?)" if close else variable)
    return found


def load_settings(**overrides: object) -> Settings:
    """The environment's settings with ``overrides`` on top (a command's flags, by field name; None: not given).

    Raises:
        ConfigError: a variable or an override is invalid, or a variable looks like a setting's name misspelt; the
            message names it and what is wrong.
    """
    misspelt = _misspelt_variable()
    if misspelt is not None:
        raise misspelt
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return Settings(**given)  # type: ignore[arg-type]  # pydantic validates each value
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        where = f"SWAPLESS_{field.upper()}" if field else "settings"
        raise ConfigError(where, first["msg"].removeprefix("Value error, ")) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The environment's settings, read once per process (``load_settings`` with no overrides).

    Raises:
        ConfigError: as ``load_settings``.
    """
    return load_settings()
