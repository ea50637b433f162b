"""The reference pages, generated from the code every time the site is built (a MkDocs hook).

Nothing here is a copy: each page reads what it documents (the settings model, the Typer app, the
OpenAPI document, `ringlet.events`, the config and graph models, the error codes, the example graphs)
at build time, so a page cannot drift from the code. `tests/test_docs.py` imports this module to check
that everything documented has its description.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import inspect
import itertools
import json
import re
import textwrap
import typing
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

OTHER_VARIABLES: dict[str, str] = {
    "RINGLET_DATA_DIR": "Where the CLI keeps its data: its SQLite store, graph runs and checkpoints "
                        "(`graph-runs/`), and `ringlet eval --durable`'s records. Default `~/.local/share/ringlet`.",
    "RINGLET_CACHE_DIR": "Where the embedded model keeps its prompt-prefix snapshots (the first answer on a new "
                         "machine writes them). Empty: nowhere. Default: the user's cache directory.",
    "RINGLET_MCP_CONFIG": "An `mcp.json` file whose servers agents may name in `mcp_servers:` (looked up after "
                          "the agent's and the agents folder's, before `~/.config/ringlet/mcp.json` and Loki's).",
    "RINGLET_MCP_TOKEN_KEY": "The key MCP OAuth tokens are encrypted with at rest (a Fernet key; several, "
                             "comma-separated, to rotate: the first encrypts). Needed by an MCP server with "
                             "`oauth` settings; every server process on one database needs the same one. "
                             "Make one: `python -c \"from ringlet.mcp.tokens import new_key; print(new_key())\"`.",
    "RINGLET_LOKI_DIR": "Loki's configuration directory (its `functions/` tools, `mcp.json` and clients). Default: "
                        "`LOKI_CONFIG_DIR`, else `$XDG_CONFIG_HOME/loki`, else `~/.config/loki`.",
    "RINGLET_SKILLS_DIR": "Where skills (`<name>/SKILL.md`) are installed. Default `~/.config/ringlet/skills`, "
                          "then Loki's.",
    "RINGLET_GRAPH_PYTHON": "The Python interpreter that runs a graph's `.py` script nodes. Default `python3`.",
    "RINGLET_AGENT_DIR": "Set by ringlet for a graph's script node: the agent's directory.",
    "RINGLET_RUN_ID": "Set by ringlet for a graph's script node: the run's id.",
    "RINGLET_NODE_ID": "Set by ringlet for a graph's script node: the node's id.",
    "RINGLET_ARGC_EVAL": "Set by ringlet for a bash tool (`tools.sh`): the argument parsing it runs in place "
                         "of the `argc` program. Not meant to be set by hand.",
    "RINGLET_TEST_CRASH_AT": "A test hook, never set in production: the crash tests make a process kill itself "
                             "at that point (`after_record`: a run stored, its workflow not yet enqueued).",
}
"""Environment variables read outside the server settings (each setting is `RINGLET_<NAME>` too)."""


# ---------------------------------------------------------------------------------------------- helpers

def attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings written under a class's attributes (`x: int = 1` then `\"\"\"What x is.\"\"\"`), its
    bases' included."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ in ("builtins", "typing") or klass.__module__.startswith("pydantic"):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in itertools.pairwise(body):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                    and isinstance(after.value.value, str):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def one_line(text: str | None) -> str:
    """`text` for a table cell: one line, a `|` outside code escaped (inside code, Markdown keeps it)."""
    parts = re.sub(r"\s+", " ", text or "").strip().split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def code(text: str) -> str:
    """`text` as inline code in a table cell: a `|` inside backticks would end the cell (or show its escape)."""
    escaped = html.escape(re.sub(r"\s+", " ", text).strip()).replace("|", "&#124;")
    return f"<code>{escaped}</code>"


def type_name(annotation: Any) -> str:
    plain = isinstance(annotation, type) and not typing.get_args(annotation)
    text = annotation.__name__ if plain else str(annotation)
    text = str(text).replace("typing.", "").replace("pathlib.", "").replace("NoneType", "None")
    return re.sub(r"\b(?:ringlet|collections\.abc)\.[\w.]*\.(\w+)", r"\1", text)


def shown(value: Any) -> str:
    if value is None:
        return "—"
    return code(str(value) if isinstance(value, Path) else json.dumps(value, default=str))


# ---------------------------------------------------------------------------------------------- settings

def settings_rows() -> list[dict[str, str]]:
    """Every server setting: its name, environment variable, type, default and description."""
    from pydantic_core import PydanticUndefined

    from ringlet.server import ServerSettings

    docs = attribute_docs(ServerSettings)
    rows: list[dict[str, str]] = []
    for name, field in ServerSettings.model_fields.items():
        default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
        rows.append({"name": name, "variable": f"RINGLET_{name.upper()}", "type": type_name(field.annotation),
                     "default": "—" if default is PydanticUndefined else shown(default),
                     "description": docs.get(name, "")})
    return rows


def settings_page() -> str:
    lines = ["# Settings and environment variables", "",
             "Every setting of `ringlet serve` (and `ringlet worker`) is a flag where one exists, and an environment "
             "variable `RINGLET_<NAME>` always; a flag wins over the variable. A list is comma-separated "
             "(`RINGLET_MODEL_DIRS=/models,/srv/models`). Generated from `ringlet.server.ServerSettings`.", "",
             "| variable | type | default | description |", "|---|---|---|---|"]
    lines += [f"| `{row['variable']}` | {code(row['type'])} | {row['default']} | "
              f"{one_line(row['description'])} |" for row in settings_rows()]
    lines += ["", "## Other environment variables", "", "| variable | description |", "|---|---|"]
    lines += [f"| `{name}` | {one_line(text)} |" for name, text in sorted(OTHER_VARIABLES.items())]
    lines += ["", "Model providers read their own: `OPENAI_API_KEY`, `OPENAI_BASE_URL`, `ANTHROPIC_API_KEY`, "
              "`GEMINI_API_KEY`, `OLLAMA_HOST` (see [Models and fallback](../concepts/models.md))."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- CLI

def cli_commands() -> Iterator[tuple[str, Any]]:
    """(`ringlet …` path, click command) for every command and subcommand."""
    import typer.main

    from ringlet.cli import app

    def walk(path: str, command: Any) -> Iterator[tuple[str, Any]]:
        yield path, command
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not getattr(sub, "hidden", False):
                yield from walk(f"{path} {name}", sub)

    yield from walk("ringlet", typer.main.get_command(app))


def cli_params(command: Any) -> list[dict[str, str]]:
    rows = []
    for param in command.params:
        if param.name == "help":
            continue
        argument = param.param_type_name == "argument"
        names = param.name.upper() if argument else ", ".join([*param.opts, *param.secondary_opts])
        default = param.default
        rows.append({"name": param.name, "names": names, "kind": "argument" if argument else "option",
                     "required": "yes" if param.required else "",
                     "default": "" if default in (None, False, ()) or callable(default) else shown(default),
                     "help": getattr(param, "help", None) or ""})
    return rows


def cli_page() -> str:
    lines = ["# The `ringlet` command", "",
             "Every command and option, generated from the Typer app (`ringlet.cli.app`). Exit codes: 0 success, "
             "1 the run failed, 2 a usage or configuration error, 3 the run paused for an approval with no "
             "terminal to ask.", ""]
    for path, command in cli_commands():
        if path == "ringlet":
            continue
        lines += [f"## `{path}`", "", inspect.cleandoc(command.help or ""), ""]
        params = cli_params(command)
        if params:
            lines += ["| argument or option | required | default | description |", "|---|---|---|---|"]
            lines += [f"| `{one_line(p['names'])}` | {p['required']} | {p['default']} | {one_line(p['help'])} |"
                      for p in params]
            lines.append("")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- HTTP API

@cache
def openapi_document() -> dict[str, Any]:
    """The server's OpenAPI document, as `/openapi.json` serves it (an app with no agents, never started)."""
    from ringlet.server import ServerSettings, create_app

    app = create_app(ServerSettings(auth_mode="none", db_url="sqlite+aiosqlite:///:memory:"), agents=[])
    return app.openapi()


def _first_sentence(op: dict[str, Any]) -> str:
    """What a route does: the first paragraph of its description (its docstring), else its summary."""
    text = (op.get("description") or "").split("\n\n")[0]
    return one_line(text) or op.get("summary", "")


def http_page() -> str:
    doc = openapi_document()
    lines = ["# HTTP API", "",
             f"`ringlet serve` speaks OpenAPI {doc['openapi']}: the running server serves this document at "
             "`/openapi.json` and an interactive reference at `/docs`. Every route below, generated from that "
             "document; the protocols are described on [Protocols](../concepts/protocols.md). Errors share one "
             "shape, `{\"error\": {\"code\", \"message\", \"details\"?, \"request_id\"}}`, with the codes listed on "
             "[Error codes](errors.md).", ""]
    tags: dict[str, list[str]] = {}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            tag = (op.get("tags") or ["other"])[0]
            responses = ", ".join(sorted(op.get("responses", {})))
            tags.setdefault(tag, []).append(
                f"| `{method.upper()}` | `{path}` | {one_line(_first_sentence(op))} | "
                f"{responses} |")
    for tag in sorted(tags):
        lines += [f"## {tag}", "", "| method | path | what it does | responses |", "|---|---|---|---|", *tags[tag], ""]
    schemas = doc.get("components", {}).get("schemas", {})
    lines += ["## Schemas", "", "| schema | fields |", "|---|---|"]
    for name in sorted(schemas):
        fields = ", ".join(f"`{f}`" for f in schemas[name].get("properties", {}))
        lines.append(f"| `{name}` | {fields} |")
    lines += ["", "The whole document, as the server serves it: [openapi.json](openapi.json).", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- events

def event_classes() -> list[type]:
    from ringlet import events

    union = typing.get_args(events.Event)[0]
    return list(typing.get_args(union))


def event_rows() -> list[dict[str, Any]]:
    from ringlet.events import BaseEvent

    base = {f.name for f in dataclasses.fields(BaseEvent)}
    hints_of = typing.get_type_hints
    rows = []
    for cls in event_classes():
        hints = hints_of(cls, include_extras=False)
        fields = [(f.name, type_name(hints.get(f.name, f.type))) for f in dataclasses.fields(cls)
                  if f.name not in base and f.name != "type"]
        kind = typing.get_args(hints["type"])[0]
        own = cls.__doc__ or ""  # a dataclass without a docstring gets its signature as one
        doc = "" if own.startswith(f"{cls.__name__}(") else inspect.cleandoc(own)
        rows.append({"type": kind, "class": cls.__name__, "doc": doc, "fields": fields})
    return rows


def events_page() -> str:
    from ringlet.events import BaseEvent

    base_docs = attribute_docs(BaseEvent)
    lines = ["# Events", "",
             "Every run streams these events: the library's `agent.stream()`, the native SSE API (one `event:` "
             "and `data:` per event), the CLI's `--events` and the event log all carry them as they are; "
             "`/v1`, AG-UI and A2A encode them in their own protocols. Generated from `ringlet.events`.", "",
             "## Fields of every event", "", "| field | type | description |", "|---|---|---|"]
    hints = typing.get_type_hints(BaseEvent)
    lines += [f"| `{field.name}` | {code(type_name(hints[field.name]))} | "
              f"{one_line(base_docs.get(field.name, ''))} |" for field in dataclasses.fields(BaseEvent)]
    for row in event_rows():
        lines += ["", f"## `{row['type']}`", "", row["doc"], "", f"`ringlet.events.{row['class']}`", ""]
        if row["fields"]:
            lines += ["| field | type |", "|---|---|"]
            lines += [f"| `{name}` | {code(kind)} |" for name, kind in row["fields"]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- config

def model_rows(model: type) -> list[dict[str, str]]:
    from pydantic_core import PydanticUndefined

    docs = attribute_docs(model)
    rows = []
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        key = field.alias or name
        if field.default_factory is not None:
            try:
                default = shown(field.default_factory())  # type: ignore[call-arg]
            except TypeError:
                default = ""
        else:
            default = "required" if field.default is PydanticUndefined else shown(field.default)
        if default.startswith("<code>{") and len(default) > 70:
            default = "see below"
        rows.append({"key": key, "type": type_name(field.annotation), "default": default,
                     "description": field.description or docs.get(name, "")})
    return rows


def _models_under(model: type) -> list[type]:
    """`model` and every pydantic model its fields name, each once, in the order met."""
    from pydantic import BaseModel

    seen: list[type] = []

    def visit(kind: Any) -> None:
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            if kind in seen:
                return
            seen.append(kind)
            for field in kind.model_fields.values():
                visit(field.annotation)
        for arg in typing.get_args(kind):
            visit(arg)

    visit(model)
    return seen


def _model_section(model: type, level: str) -> list[str]:
    lines = [f"{level} `{model.__name__}`", "", inspect.cleandoc(model.__dict__.get("__doc__") or ""), "",
             "| key | type | default | description |", "|---|---|---|---|"]
    lines += [f"| `{r['key']}` | {code(r['type'])} | {r['default']} | {one_line(r['description'])} |"
              for r in model_rows(model)]
    return [*lines, ""]


def config_page() -> str:
    from ringlet.agent.config import AgentConfig
    from ringlet.graph.spec import GraphSpec

    lines = ["# config.yaml and graph.yaml", "",
             "Every key of an agent's `config.yaml` and of a graph agent's `graph.yaml`, generated from the "
             "pydantic models that read them. An unknown key is an error with `file:line:column` and a "
             "did-you-mean.", "", "## config.yaml", ""]
    for model in _models_under(AgentConfig):
        lines += _model_section(model, "###")
    lines += ["## graph.yaml", ""]
    for model in _models_under(GraphSpec):
        lines += _model_section(model, "###")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- errors

def errors_page() -> str:
    from ringlet.error_codes import CODES

    lines = ["# Error codes", "",
             "Every error code ringlet reports: in an HTTP error body (`error.code`), in a run's `error` event, "
             "in a tool's error result the model reads (`{\"error\": {\"code\", \"message\", …}}`), and in "
             "`result.error`. Generated from `ringlet.error_codes`.", ""]
    for where, codes in CODES.items():
        lines += [f"## {where}", "", "| code | meaning |", "|---|---|"]
        lines += [f"| `{code}` | {one_line(text)} |" for code, text in sorted(codes.items())]
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- graphs

def graphs_page() -> str:
    from typer.testing import CliRunner

    from ringlet.cli import app
    from ringlet.graph.parse import load_graph

    lines = ["# Example graphs", "",
             "The graph agents of `examples/graphs/`, each drawn by `ringlet graph show` (a Mermaid flowchart) "
             "from its `graph.yaml` when this site is built. How graphs run: [Graphs](../concepts/graphs.md).", ""]
    for folder in sorted(p.parent for p in (ROOT / "examples" / "graphs").glob("*/graph.yaml")):
        shown_graph = CliRunner().invoke(app, ["graph", "show", str(folder)])
        if shown_graph.exit_code != 0:
            raise RuntimeError(f"ringlet graph show {folder}: {shown_graph.output}")
        spec = load_graph(folder / "graph.yaml")
        lines += [f"## {folder.name}", "", one_line(getattr(spec, "description", "") or ""), "",
                  f"`.venv/bin/ringlet graph show examples/graphs/{folder.name}`", "",
                  "```mermaid", shown_graph.stdout.rstrip(), "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- metrics

def metrics_page() -> str:
    """Every metric of `/metrics`, read from `ringlet.server.ops.METRICS` (what the code registers)."""
    from ringlet.server.ops import METRICS

    lines = ["# Metrics", "",
             "What `/metrics` exports, in Prometheus's text format (see [Metrics](../operations/metrics.md) for "
             "where to scrape and how to aggregate). A histogram adds `_bucket`, `_sum` and `_count` to its name. "
             "*Scraped*: read from the store and DBOS at each scrape, a fact of the whole cluster (the same in "
             "every process: aggregate with `max`); the others count what happened in the process that reports "
             "them. Generated from `ringlet.server.ops.METRICS`.", "",
             "| metric | kind | labels | description |", "|---|---|---|---|"]
    lines += [f"| `{m.name}` | {m.kind}{' (scraped)' if m.scraped else ''} | "
              f"{', '.join(f'`{label}`' for label in m.labels) or '—'} | {one_line(m.help)} |" for m in METRICS]
    return "\n".join(lines) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "reference/settings.md": settings_page,
    "reference/cli.md": cli_page,
    "reference/http-api.md": http_page,
    "reference/events.md": events_page,
    "reference/config.md": config_page,
    "reference/errors.md": errors_page,
    "reference/graphs.md": graphs_page,
    "reference/metrics.md": metrics_page,
}


# ---------------------------------------------------------------------------------------------- the hook

def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site (MkDocs hook)."""
    from mkdocs.structure.files import File

    for path, page in PAGES.items():
        files.append(File.generated(config, path, content=page()))
    files.append(File.generated(config, "reference/openapi.json", content=json.dumps(openapi_document(), indent=1)))
    return files
