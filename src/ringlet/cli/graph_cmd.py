"""`ringlet graph validate DIR` and `ringlet graph show DIR`: graph agents (graph.yaml) from the command line.
`ringlet graph checkpoints [RUN_ID]` lists the graph runs `ringlet run` kept (or one run's checkpoints, one
per super-step), and `ringlet graph fork AGENT RUN_ID --checkpoint N --set key=JSON` starts a new run at one
of them, its state edited (`ringlet.graph.fork`)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ringlet.cli.common import approver, fail, load, print_events
from ringlet.cli.common import variables as _variables
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


def _runs_dir() -> Path:
    """Where `ringlet run` keeps graph runs' checkpoints (`cli.common.load`)."""
    return Path(os.environ.get("RINGLET_DATA_DIR", "~/.local/share/ringlet")).expanduser() / "graph-runs"


def _kept_runs(directory: Path) -> list[Any]:
    from ringlet.graph.checkpoint import Checkpoint

    found = []
    for path in directory.glob("*.json"):
        try:
            found.append(Checkpoint.from_json(path.read_bytes()))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(found, key=lambda c: c.updated_at, reverse=True)


def checkpoints(
        run_id: Annotated[str | None, typer.Argument(help="A graph run's id (none: list the runs kept).")] = None,
        step: Annotated[int | None, typer.Option("--step", help="Print this checkpoint's state as JSON.")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the checkpoints as JSON lines.")] = False) -> None:
    """List the graph runs `ringlet run` kept, or one run's checkpoints (one per super-step): what
    `ringlet graph fork` starts from."""
    from ringlet.graph.checkpoint import FileCheckpoints

    store = FileCheckpoints(_runs_dir())
    if run_id is None:
        table = Table("run", "agent", "status", "steps", box=None)
        for cp in _kept_runs(_runs_dir())[:50]:
            table.add_row(cp.run_id, cp.agent, cp.status, str(cp.step))
        out.print(table)
        return
    history = asyncio.run(store.history(run_id))
    if not history:
        raise fail(f"no checkpoints kept for run {run_id!r}", "`ringlet graph checkpoints` lists the runs kept")
    if step is not None:
        chosen = next((cp for cp in history if cp.step == step), None)
        if chosen is None:
            raise fail(f"run {run_id} has no checkpoint at step {step}",
                       f"its steps are {', '.join(str(cp.step) for cp in history)}")
        sys.stdout.write(json.dumps(chosen.state, ensure_ascii=False, indent=2) + "\n")
        return
    if json_out:
        for cp in history:
            sys.stdout.write(json.dumps({"step": cp.step, "status": cp.status, "frontier": cp.frontier,
                                         "state": cp.state}, ensure_ascii=False) + "\n")
        return
    table = Table("step", "status", "next", "state keys", box=None)
    for cp in history:
        table.add_row(str(cp.step), cp.status, ", ".join(cp.frontier) or "(end)", ", ".join(cp.state))
    out.print(table)
    err.print(escape(f"fork: ringlet graph fork {_agent_ref(history[0])} {run_id} --checkpoint STEP "
                     "[--set key=JSON]"))


def _agent_ref(cp: Any) -> str:
    """How `ringlet graph fork` finds the agent a checkpoint belongs to: its name, when the name finds that
    agent; else the directory it ran from (a graph run with `ringlet run path/to/dir`)."""
    from ringlet.agent.config import find

    directory = cp.run.get("directory")
    try:
        named = find(cp.agent).directory.resolve() if cp.agent else None
    except ConfigError:
        named = None
    if named is not None and (directory is None or named == Path(directory)):
        return cp.agent
    return shlex.quote(directory) if directory else "AGENT"


def _patch(pairs: list[str] | None) -> dict[str, Any]:
    """`--set key=JSON` pairs; a value that is not JSON is taken as a string."""
    patch: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise fail(f"--set {pair!r} is not key=value", 'write it like --set city=\'"Oslo"\' or --set n=3')
        try:
            patch[key] = json.loads(value)
        except ValueError:
            patch[key] = value
    return patch


async def _fork(agent: Any, run_id: str, step: int, patch: dict[str, Any], *, force: bool, yes: bool,
                events: bool) -> Any:
    from ringlet.agent.settings import RunSettings
    from ringlet.cli.render import Renderer
    from ringlet.context import Caller

    stream = agent.fork_stream(run_id, step, patch, force=force, caller=Caller(channel="cli"),
                               settings=RunSettings(approver=approver(yes)))
    err.print(escape(f"fork of {run_id} at step {step}: run {stream.run_id}"))
    renderer = None if events else Renderer(out, err)
    try:
        await print_events(stream, renderer, events=events)
    finally:
        await agent.aclose()
    return stream.result


def fork(  # noqa: PLR0917 - Typer maps parameters to arguments and options
        agent: Annotated[str, typer.Argument(help="The graph agent (name or directory) the run belongs to.")],
        run_id: Annotated[str, typer.Argument(help="The run to fork (`ringlet graph checkpoints` lists them).")],
        checkpoint: Annotated[int, typer.Option("--checkpoint", "-c", help="The step to start from.", min=0)],
        set_: Annotated[list[str] | None, typer.Option("--set", help="Replace a state key: key=JSON (repeatable; "
                                                       "a value that is not JSON is a string).")] = None,
        force: Annotated[bool, typer.Option("--force", help="Fork even though graph.yaml changed since.")] = False,
        events: Annotated[bool, typer.Option("--events", help="Print the event stream as JSON lines.")] = False,
        var: Annotated[list[str] | None, typer.Option("--var", help="A variable, name=value (default: the "
                                                      "run's).")] = None,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="Approve every tool call that needs approval.")] = False,
        model: Annotated[str | None, typer.Option("--model", "-m", help="Override the model.")] = None) -> None:
    """Start a new run at one of a graph run's checkpoints, its state edited with --set: the nodes before
    that step do not run again, and the original run is not touched."""
    from ringlet.graph.fork import ForkError, StatePatchError

    instance = load(agent, model, _variables(var))
    if instance.kind != "graph":  # only a graph run keeps checkpoints to fork from
        raise fail(f"{instance.name!r} is a loop agent", "only graph runs fork from checkpoints")
    try:
        result = asyncio.run(_fork(instance, run_id, checkpoint, _patch(set_), force=force, yes=yes, events=events))
    except StatePatchError as exc:
        for key, problem in exc.problems:
            err.print(f"[bold red]error:[/] {escape(f'--set {key}: {problem}')}", markup=True)
        raise typer.Exit(2) from None
    except ForkError as exc:
        hint = f"ringlet graph checkpoints {run_id} lists its checkpoints" if exc.code != "graph_changed" else \
            "pass --force to fork it with the new graph.yaml"
        raise fail(str(exc), hint) from None
    if result.status == "failed":
        raise typer.Exit(1)
    if result.pending_question is not None:
        err.print(escape(f"paused: {result.pending_question.question}; resume: ringlet run {agent} --resume "
                         f"{result.run_id} --answer ANSWER"))
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("show")(show)
    app.command("checkpoints")(checkpoints)
    app.command("fork")(fork)
