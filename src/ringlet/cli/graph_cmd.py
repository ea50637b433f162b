"""`ringlet graph validate DIR` and `ringlet graph show DIR`: graph agents (graph.yaml) from the command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from ringlet.errors import ConfigError

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
DirArg = Annotated[str, typer.Argument(help="The agent directory (or its graph.yaml, or an agent name).")]


def _graph_file(ref: str) -> Path:
    """The graph.yaml an argument names: a directory, the file itself, or a discovered agent's."""
    path = Path(ref).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        from ringlet.graph.parse import agent_kind

        if agent_kind(path) != "graph":
            raise ConfigError(f"Agent '{path.name}' is a loop agent (config.yaml), not a graph agent")
        return path / "graph.yaml"
    from ringlet.agent.config import discover

    spec = discover().get(ref)
    if spec is None:
        raise ConfigError(f"no agent directory or agent named {ref!r}")
    return _graph_file(str(spec.directory))


def _load(ref: str):
    from ringlet.graph.parse import load_graph

    try:
        return load_graph(_graph_file(ref))
    except ConfigError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True)
        raise typer.Exit(2) from None


def validate(directory: DirArg) -> None:
    """Check a graph agent: print every error and warning; exit 1 when there are errors."""
    from ringlet.graph.validate import validate as check

    spec = _load(directory)
    report = check(spec)
    for issue in report.errors:
        out.print(f"[bold red]error[/] {escape(issue.describe())}", markup=True)
    for issue in report.warnings:
        out.print(f"[yellow]warning[/] {escape(issue.describe())}", markup=True)
    summary = f"{len(report.errors)} error(s), {len(report.warnings)} warning(s) in {spec.source.path}"
    if report.errors:
        err.print(f"Graph validation failed with {summary}")
        raise typer.Exit(1)
    err.print(f"ok: {summary}")


def show(directory: DirArg) -> None:
    """Print the graph as a Mermaid flowchart."""
    from ringlet.graph.mermaid import to_mermaid

    sys.stdout.write(to_mermaid(_load(directory)))


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("show")(show)
