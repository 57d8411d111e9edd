"""MkDocs hooks: the reference pages, generated from the code at build time (one source each).

- ``reference/settings.md``: every field of each component of ``swapless.config.settings.Settings``, its
  variable, default and description;
- ``reference/cli.md``: every ``swapless`` command from the typer app, its arguments and options;
- ``reference/http-api.md``: every route of the gateway from its OpenAPI schema (the app is built, never served:
  no Redis is needed), and the schema itself as ``reference/openapi.json``;
- ``benchmarks/<name>.md``: each ``bench/*.md`` as it is, in the navigation under Benchmarks (``on_config``).

The Python API page is written by hand as mkdocstrings directives (``reference/python-api.md``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]

def _markdown(text: str) -> str:
    """Docstring text as Markdown: RST's double backquotes become single ones."""
    return re.sub(r"``([^`]+)``", r"`\1`", text.strip())


def _cell(text: str) -> str:
    return _markdown(text).replace("|", "\\|").replace("\n", " ")


def _size(value: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size and value % size == 0:
            return f"{value} ({value // size} {unit})"
    return str(value)


def _seconds(value: float) -> str:
    shown = f"{value:g} s"
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if value >= size and value % size == 0 and value > 60:
            return f"{shown} ({value / size:g} {unit})"
    return shown


def setting_default(name: str, default: Any) -> str:
    """A field's default as the reference shows it: its unit from the name's suffix, paths inside the package
    relative to it."""
    if default is None or default == "":
        return "unset"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, Path):
        config = REPO / "config"
        return f"config/{default.name}" if default.parent == config or default.parent.name == "config" else str(default)
    if isinstance(default, (int, float)) and name.endswith("_bytes"):
        return _size(int(default))
    if isinstance(default, (int, float)) and name.endswith("_s"):
        return _seconds(default)
    return str(default)


def settings_page() -> str:
    """The settings reference, from each component's model."""
    from pydantic import BaseModel

    from swapless.config.settings import Settings

    lines = [
        "# Settings",
        "",
        "Every setting is an environment variable under the `SWAPLESS_` prefix, read by every command and process",
        "(pydantic-settings). A bad value stops the command with one line naming the variable, and so does a variable",
        "that looks like a setting misspelt (`SWAPLESS_MAX_MODEL`: \"did you mean SWAPLESS_MAX_MODELS?\"); any other",
        "`SWAPLESS_*` variable that is no setting is named in one warning line. Sizes take units (`4GiB`, `512MB`);",
        "names ending in `_s` are seconds, `_bytes` bytes. The flags of `swapless worker` set the same values.",
        "Celery's own settings keep Celery's names (`swapless.tasks.app`).",
        "",
        "This page is generated from the settings models (`config/settings/`) when the site is built, one",
        "section per component.",
    ]
    for component, info in Settings.model_fields.items():
        model = info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        title = model.model_config.get("title") or model.__name__
        summary = f"`settings.{component}` (`{model.__name__}`): {_markdown(model.__doc__ or '')}"
        lines += ["", f"## {title}", "", summary, "", "| variable | default | meaning |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            default = setting_default(name, field.default)
            lines.append(f"| `SWAPLESS_{name.upper()}` | {_cell(default)} | {_cell(field.description or '')} |")
    return "\n".join(lines) + "\n"


def _option_line(param: Any) -> str:
    names = ", ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
    if param.param_type_name == "argument":
        names = f"`{param.name.upper()}`" + ("..." if param.nargs == -1 else "")
    help_text = _cell(getattr(param, "help", None) or "")
    default = param.default
    shown = ""
    if param.param_type_name == "option" and not param.required and default not in (None, False, (), []):
        shown = f" [default: {default}]" if "[default:" not in help_text else ""
    required = " (required)" if param.required and param.param_type_name == "option" else ""
    return f"| {names} | {help_text}{shown}{required} |"


def cli_page() -> str:
    """The command line reference, from the typer app's commands."""
    import typer

    from swapless.tasks.cli.main import app

    group = typer.main.get_command(app)
    lines = [
        "# Command line",
        "",
        f"`swapless` (also `python -m swapless`): {_markdown(group.help or '')}",
        "Every command reads the settings (environment variables, see [Settings](settings.md)); a Swapless error",
        "is one line on stderr and exit status 2.",
        "",
        "This page is generated from the command definitions (`swapless.tasks.cli`) when the site is built;",
        "`swapless COMMAND --help` prints the same.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    commands = getattr(group, "commands", {})
    for name, command in commands.items():
        summary = _cell((command.help or "").split("\n\n")[0])
        lines.append(f"| [`swapless {name}`](#swapless-{name}) | {summary} |")
    for name, command in commands.items():
        lines += ["", f"## swapless {name}", "", _markdown(command.help or ""), ""]
        params = [p for p in command.params if p.name != "help"]
        if params:
            lines += ["| argument or option | meaning |", "|---|---|"]
            lines += [_option_line(param) for param in params]
    return "\n".join(lines) + "\n"


def openapi_schema() -> dict[str, Any]:
    """The gateway's OpenAPI schema, from the app built with the default settings (no Redis is reached)."""
    from swapless.config.settings import Settings
    from swapless.tasks.gateway.app import create_app

    return create_app(Settings(batch_runner=False)).openapi()


def _schema_name(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref") or schema.get("items", {}).get("$ref", "")
    return ref.rsplit("/", 1)[-1]


def _body_fields(schema: dict[str, Any], components: dict[str, Any]) -> list[str]:
    model = components.get(_schema_name(schema), {})
    required = set(model.get("required", ()))
    rows = []
    for field, spec in model.get("properties", {}).items():
        kind = spec.get("type") or " or ".join(s.get("type", _schema_name(s)) for s in spec.get("anyOf", [])) or ""
        need = "required" if field in required else "optional"
        rows.append(f"| `{field}` | {kind} | {need} | {_cell(spec.get('description', ''))} |")
    return rows


def http_page(schema: dict[str, Any]) -> str:
    """The HTTP API reference, from the gateway's OpenAPI schema."""
    components = schema.get("components", {}).get("schemas", {})
    lines = [
        "# HTTP API",
        "",
        "`swapless serve` (or `uvicorn --factory swapless.tasks.gateway:create_app`) serves these routes; a running",
        "gateway shows the same at `/docs`, and the schema is at `/openapi.json` ([this build's](openapi.json)).",
        "With API keys set, every route but the health checks, `/v2` metadata and the docs takes",
        "`Authorization: Bearer <key>` ([security](../operations/security.md)).",
        "",
        "This page is generated from the gateway's OpenAPI schema when the site is built.",
    ]
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            lines += ["", f"## `{method.upper()} {path}`", "", _markdown(operation.get("description")
                                                                     or operation.get("summary", "")), ""]
            params = operation.get("parameters", [])
            if params:
                lines += ["| parameter | in | required | meaning |", "|---|---|---|---|"]
                for param in params:
                    need = "required" if param.get("required") else "optional"
                    text = param.get("description") or param.get("schema", {}).get("description", "")
                    lines.append(f"| `{param['name']}` | {param['in']} | {need} | {_cell(text)} |")
                lines.append("")
            body = operation.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                name = _schema_name(content.get("schema", {}))
                lines.append(f"Body ({media})" + (f": `{name}`" if name else "") + "")
                rows = _body_fields(content.get("schema", {}), components)
                if rows:
                    lines += ["", "| field | type | | meaning |", "|---|---|---|---|", *rows]
                lines.append("")
            responses = operation.get("responses", {})
            answers = ", ".join(f"`{code}` {_cell(reply.get('description', ''))}" for code, reply in responses.items())
            lines.append(f"Answers: {answers}.")
    return "\n".join(lines) + "\n"


def bench_pages() -> dict[str, str]:
    """``benchmarks/<name>.md`` for each ``bench/*.md``, as it is."""
    return {f"benchmarks/{path.stem.lower()}.md": path.read_text() for path in sorted((REPO / "bench").glob("*.md"))}


def _title(page: str) -> str:
    first = next((line for line in page.splitlines() if line.startswith("# ")), "# Benchmark")
    return first.removeprefix("# ").strip()


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Every bench page in the navigation, under Benchmarks after its index, titled by its first heading: a new
    ``bench/*.md`` joins the site without an edit here."""
    for section in config.nav or []:
        if isinstance(section, dict) and "Benchmarks" in section:
            pages = [{_title(text): path} for path, text in bench_pages().items()]
            section["Benchmarks"] = [*section["Benchmarks"], *pages]
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated pages to the site."""
    pages = {
        "reference/settings.md": settings_page(),
        "reference/cli.md": cli_page(),
        **bench_pages(),
    }
    schema = openapi_schema()
    pages["reference/http-api.md"] = http_page(schema)
    pages["reference/openapi.json"] = json.dumps(schema, indent=2)
    for path, content in pages.items():
        files.append(File.generated(config, path, content=content))
    return files
