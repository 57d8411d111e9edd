"""Settings: sizes with units, one clear line for a bad or misspelt variable, and a description on every field, from
which the docs' settings reference is generated (every setting listed, with its real default)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import swapless.config.settings as settings_module
from swapless.config.errors import ConfigError
from swapless.config.settings import Settings, get_settings, parse_bytes
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
    missing = [name for name, field in Settings.model_fields.items() if not (field.description or "").strip()]
    assert not missing, f"config/settings.py: give these fields a description: {', '.join(missing)}"
    assert all("\n" not in (field.description or "") for field in Settings.model_fields.values())


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
