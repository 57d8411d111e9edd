"""Settings: one small model per component read from the flat variables, sizes with units, one clear line for a bad
or misspelt variable, and a description on every field, from which the docs' settings reference is generated."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import swapless.config.settings as settings_module
from swapless.config.errors import ConfigError
from swapless.config.settings import Settings, fields, get_settings, load_settings, parse_bytes
from tests.conftest import REPO


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4GiB", 4 * 1024**3), ("512MB", 512 * 1000**2), ("1.5 GiB", int(1.5 * 1024**3)), ("1048576", 1048576),
     ("100k", 100_000), (" 2 mib ", 2 * 1024**2)],
)
def test_sizes_with_units(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["4 apples", "GiB", "-1", "1e9"])
def test_a_size_without_a_known_unit_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="write a number and a unit, like 4GiB"):
        parse_bytes(text)


def test_the_memory_budget_takes_a_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPLESS_MEMORY_BUDGET_BYTES", "4GiB")
    assert Settings().cache.memory_budget_bytes == 4 * 1024**3


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SWAPLESS_MAX_MODELS", "two", "SWAPLESS_MAX_MODELS: Input should be a valid integer"),
        ("SWAPLESS_MEMORY_BUDGET_BYTES", "lots", "SWAPLESS_MEMORY_BUDGET_BYTES: cannot read 'lots' as a size"),
        ("SWAPLESS_MEMORY_BUDGET", "4GiB", ("SWAPLESS_MEMORY_BUDGET: no such setting; did you mean "
                                            "SWAPLESS_MEMORY_BUDGET_BYTES?")),
        ("SWAPLESS_MAX_MODEL", "3", "SWAPLESS_MAX_MODEL: no such setting; did you mean SWAPLESS_MAX_MODELS?"),
        ("SWAPLESS_VISIBILITY_REFRESH_S", "30", "must be at most a third of SWAPLESS_VISIBILITY_TIMEOUT_S"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch, variable: str, value: str,
                                              message: str) -> None:
    monkeypatch.setenv(variable, value)
    get_settings.cache_clear()
    try:
        with pytest.raises(ConfigError) as caught:
            get_settings()
    finally:
        get_settings.cache_clear()
    assert message in str(caught.value)
    done = subprocess.run(
        [sys.executable, "-m", "swapless", "status"],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", variable: value},
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {caught.value}"]


def test_other_tools_variables_under_the_prefix_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPLESS_TEST_REDIS_URL", "redis://elsewhere/1")
    monkeypatch.setenv("SWAPLESS_PYTHON", "/usr/bin/python3")
    get_settings.cache_clear()
    try:
        assert get_settings().cache.max_models == 2
    finally:
        get_settings.cache_clear()


def test_a_variable_that_is_no_setting_is_named_in_one_warning_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """SWAPLESS_FILES_DIR (what a user guesses) is no setting: every command names it, with the setting it most
    resembles, in one line on stderr, and goes on; other tools' variables are not named."""
    from tests.stack import run_cli

    monkeypatch.setenv("SWAPLESS_FILES_DIR", "/srv/batches")
    monkeypatch.setenv("SWAPLESS_ZEBRA", "1")
    monkeypatch.setenv("SWAPLESS_TEST_ANYTHING", "1")
    assert settings_module.unknown_variables() == ["SWAPLESS_FILES_DIR (SWAPLESS_BATCH_FILES_URL?)", "SWAPLESS_ZEBRA"]
    listed = run_cli("models", env={"SWAPLESS_FILES_DIR": "/srv/batches", "SWAPLESS_ZEBRA": "1"})
    assert listed.returncode == 0 and "model(s)" in listed.stdout
    warning = ("warning: ignoring SWAPLESS_FILES_DIR (SWAPLESS_BATCH_FILES_URL?), SWAPLESS_ZEBRA: no such setting "
               "(the settings are listed in config/settings/)")
    assert listed.stderr.splitlines() == [warning]


def test_every_setting_has_a_one_line_description() -> None:
    """The settings reference (docs/reference/settings.md) is generated from the fields: each needs a description."""
    every = {name: field for name, (_, field) in fields().items()}
    missing = [name for name, field in every.items() if not (field.description or "").strip()]
    assert not missing, f"config/settings/: give these fields a description: {', '.join(missing)}"
    assert all("\n" not in (field.description or "") for field in every.values())


#: Every variable, as it was when the flat settings class became one model per component: none renamed or lost.
ENV_NAMES = frozenset({
    "SWAPLESS_ADAPTER_HOST_BYTES", "SWAPLESS_API_KEYS", "SWAPLESS_API_KEYS_FILE", "SWAPLESS_BATCH_FILES_URL",
    "SWAPLESS_BATCH_FILE_RETENTION_S", "SWAPLESS_BATCH_LEASE_S", "SWAPLESS_BATCH_MAX_ACTIVE",
    "SWAPLESS_BATCH_MAX_ACTIVE_PER_KEY", "SWAPLESS_BATCH_MAX_BATCHES_PER_KEY", "SWAPLESS_BATCH_MAX_BYTES_PER_KEY",
    "SWAPLESS_BATCH_MAX_FILES_PER_KEY", "SWAPLESS_BATCH_MAX_FILE_BYTES", "SWAPLESS_BATCH_MAX_LINES",
    "SWAPLESS_BATCH_MAX_WINDOW_S", "SWAPLESS_BATCH_RETENTION_S", "SWAPLESS_BATCH_RUNNER",
    "SWAPLESS_BATCH_UPLOAD_TIMEOUT_S", "SWAPLESS_BATCH_WEBHOOK_URL", "SWAPLESS_BATCH_WORK_DIR",
    "SWAPLESS_BULK_EXPIRES_S", "SWAPLESS_CANCEL_HOLD_S", "SWAPLESS_CANVAS_QUEUE", "SWAPLESS_CONNECT_TIMEOUT_S",
    "SWAPLESS_COPY_BACKLOG_S", "SWAPLESS_COPY_IDLE_S", "SWAPLESS_DEVICE", "SWAPLESS_EXPORTER_PORT",
    "SWAPLESS_GATEWAY_ACTIVE_PER_KEY", "SWAPLESS_GATEWAY_ALLOWED_HOSTS", "SWAPLESS_GATEWAY_ALLOWED_ORIGINS",
    "SWAPLESS_GATEWAY_BODY_TIMEOUT_S", "SWAPLESS_GATEWAY_INFLIGHT_PER_KEY", "SWAPLESS_GATEWAY_INSECURE_NO_AUTH",
    "SWAPLESS_GATEWAY_MAX_BODY_BYTES", "SWAPLESS_GATEWAY_MAX_ELEMENTS", "SWAPLESS_GATEWAY_MAX_WAITS",
    "SWAPLESS_GATEWAY_RATE_PER_KEY", "SWAPLESS_GATEWAY_TURN_WAIT_S", "SWAPLESS_HEARTBEAT_INTERVAL_S",
    "SWAPLESS_HOST_MAX_MODELS", "SWAPLESS_HOST_MEMORY_BUDGET_BYTES", "SWAPLESS_INPUT_ROOT",
    "SWAPLESS_INTERACTIVE_EXPIRES_S", "SWAPLESS_KEEP_INTERACTIVE_S", "SWAPLESS_KEY_PREFIX",
    "SWAPLESS_KUBERNETES_SERVICE_ACCOUNT_DIR", "SWAPLESS_LOAD_AHEAD", "SWAPLESS_MAX_ADAPTERS",
    "SWAPLESS_MAX_ATTEMPTS", "SWAPLESS_MAX_BATCH_SIZE", "SWAPLESS_MAX_COPIES", "SWAPLESS_MAX_GROUP",
    "SWAPLESS_MAX_IMAGE_BYTES", "SWAPLESS_MAX_IMAGE_PIXELS", "SWAPLESS_MAX_MESSAGE_BYTES", "SWAPLESS_MAX_MODELS",
    "SWAPLESS_MAX_QUEUED", "SWAPLESS_MAX_TEXT_CHARS", "SWAPLESS_MAX_WAIT_S", "SWAPLESS_MEMORY_BUDGET_BYTES",
    "SWAPLESS_METRICS_HOST", "SWAPLESS_METRICS_PORT", "SWAPLESS_MODELS_FILE", "SWAPLESS_PLACEMENT_INTERVAL_S",
    "SWAPLESS_PLUGINS", "SWAPLESS_POD_DELETION_COST", "SWAPLESS_POD_DELETION_COST_INTERVAL_S",
    "SWAPLESS_PREDICT_TIMEOUT_S", "SWAPLESS_PREFETCH", "SWAPLESS_PREFETCH_PER_MODEL", "SWAPLESS_QUEUE",
    "SWAPLESS_REDIS_FAILOVER_WAIT_S", "SWAPLESS_REDIS_MIN_REPLICAS", "SWAPLESS_REDIS_REPLICA_TIMEOUT_S",
    "SWAPLESS_REDIS_SENTINEL_MASTER", "SWAPLESS_REDIS_SENTINEL_PASSWORD", "SWAPLESS_REDIS_SENTINEL_TLS",
    "SWAPLESS_REDIS_SENTINEL_USERNAME", "SWAPLESS_REDIS_URL", "SWAPLESS_RESULT_EXPIRES_S", "SWAPLESS_ROUTING",
    "SWAPLESS_SCALE_BUSY_S", "SWAPLESS_SCALE_DRAIN_S", "SWAPLESS_SCALE_MAX_WORKERS", "SWAPLESS_SCALE_MIN_WORKERS",
    "SWAPLESS_SCALE_TARGET_UTILIZATION", "SWAPLESS_SCALE_UNKNOWN_JOB_S", "SWAPLESS_SCALE_UNKNOWN_LOAD_S",
    "SWAPLESS_SCALE_WINDOW_S", "SWAPLESS_TASK_EVENTS", "SWAPLESS_TRITON_MAX_MODELS", "SWAPLESS_TRITON_URL",
    "SWAPLESS_VISIBILITY_REFRESH_S", "SWAPLESS_VISIBILITY_TIMEOUT_S", "SWAPLESS_WARM_BEFORE_READY_S",
    "SWAPLESS_WARM_START", "SWAPLESS_WARM_START_BUDGET_S", "SWAPLESS_WEBHOOK_ALLOWED_HOSTS",
    "SWAPLESS_WEBHOOK_CONCURRENCY", "SWAPLESS_WEBHOOK_MAX_FAILED", "SWAPLESS_WEBHOOK_MAX_PENDING",
    "SWAPLESS_WEBHOOK_MAX_PENDING_PER_KEY", "SWAPLESS_WEBHOOK_RETRY_S", "SWAPLESS_WEBHOOK_SECRET",
    "SWAPLESS_WEBHOOK_TIMEOUT_S",
})


def test_the_variables_keep_their_names() -> None:
    assert frozenset(f"SWAPLESS_{name.upper()}" for name in fields()) == ENV_NAMES


def test_no_settings_class_has_more_than_40_fields() -> None:
    models = [Settings, *(info.annotation for info in Settings.model_fields.values())]
    sizes = {model.__name__: len(model.model_fields) for model in models}
    assert max(sizes.values()) <= 40, sizes


def test_each_component_reads_its_flat_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SWAPLESS_PREFETCH`` sets ``settings.worker.prefetch``; a field given by its own name is set over it."""
    monkeypatch.setenv("SWAPLESS_PREFETCH", "7")
    monkeypatch.setenv("SWAPLESS_MAX_GROUP", "5")
    monkeypatch.setenv("SWAPLESS_WEBHOOK_SECRET", "whsec_c2VjcmV0")
    monkeypatch.setenv("SWAPLESS_WORKER__PREFETCH", "9")  # no such setting: the variables carry no component
    settings = Settings(prefetch=8, redis_url="redis://elsewhere:6379/2")
    assert (settings.worker.prefetch, settings.worker.max_group) == (8, 5)
    assert Settings().worker.prefetch == 7
    assert settings.redis.broker_url == "redis://elsewhere:6379/2"
    assert settings.webhooks.webhook_secret is not None and "c2VjcmV0" not in repr(settings)
    copied = settings.model_copy(update={"queue": "other", "max_group": 3})
    assert (copied.jobs.queue, copied.worker.max_group, copied.worker.prefetch) == ("other", 3, 8)
    assert (settings.jobs.queue, settings.worker.max_group) == ("swapless", 5)
    assert load_settings(prefetch=None).worker.prefetch == 7  # None: the flag was not given


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"prefetch": 0}, "SWAPLESS_PREFETCH: Input should be greater than or equal to 1"),
     ({"scale_min_workers": 9, "scale_max_workers": 2}, "settings: SWAPLESS_SCALE_MIN_WORKERS (9) is above"),
     ({"redis_url": "sentinel://127.0.0.1:26379"}, "settings: SWAPLESS_REDIS_URL names sentinels")],
)
def test_a_bad_override_names_its_variable(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(**overrides)
    assert str(caught.value).startswith(message)


def test_the_settings_reference_lists_every_variable_with_its_default() -> None:
    """The generated page names every variable once, with the field's real default in its unit."""
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    sys.path.insert(0, str(REPO / "docs" / "hooks"))
    try:
        import reference
    finally:
        sys.path.pop(0)
    page = reference.settings_page()
    rows = re.findall(r"^\| `SWAPLESS_([A-Z_]+)` \| ([^|]+?) \|", page, re.MULTILINE)
    assert sorted(name.lower() for name, _ in rows) == sorted(fields())
    shown = {name.lower(): default for name, default in rows}
    assert shown["max_models"] == "2" and shown["redis_url"] == "unset" and shown["task_events"] == "false"
    assert shown["gateway_max_body_bytes"] == "33554432 (32 MiB)" and shown["cancel_hold_s"] == "604800 s (7 days)"
    assert shown["models_file"] == "config/models.json"
    sections = re.split(r"^## ", page, flags=re.MULTILINE)[1:]
    assert len(sections) == len(Settings.model_fields)
    for section, component in zip(sections, Settings.model_fields, strict=True):
        listed = re.findall(r"^\| `SWAPLESS_([A-Z_]+)` \|", section, re.MULTILINE)
        assert f"`settings.{component}`" in section
        assert [name.lower() for name in listed] == [n for n, (c, _) in fields().items() if c == component]
