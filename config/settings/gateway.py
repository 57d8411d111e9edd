"""Settings of the HTTP gateway, webhooks and the batch API."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

__all__ = ["BatchSettings", "GatewaySettings", "WebhookSettings"]


class GatewaySettings(BaseModel):
    """The HTTP gateway's limits, hosts and API keys."""

    model_config = ConfigDict(title="HTTP gateway")

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

    @field_validator("api_keys_file", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value


class WebhookSettings(BaseModel):
    """Signing, allowed hosts and retries of webhook deliveries."""

    model_config = ConfigDict(title="Webhooks")

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


class BatchSettings(BaseModel):
    """Files, quotas and drivers of the batch API."""

    model_config = ConfigDict(title="Batch API")

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

    @field_validator("batch_work_dir", "batch_files_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value
