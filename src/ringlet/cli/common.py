"""What every `ringlet` command shares: the error line with its hint, `--var` pairs, loading an agent, who
approves a run's calls, and showing a run's stream."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from ringlet.errors import ConfigError

__all__ = ["approver", "err", "fail", "load", "print_events", "variables"]

err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, hint: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)  # messages quote code
    err.print(f"[dim]hint: {escape(hint)}[/]", markup=True)
    return typer.Exit(code)


def variables(pairs: list[str] | None) -> dict[str, str]:
    out_vars = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        if not sep:
            raise fail(f"--var {pair!r} is not name=value", "write it like --var city=Paris")
        out_vars[name] = value
    return out_vars


def load(agent: str, model: str | None, variables: dict[str, str] | None = None,
         policy: list[str] | None = None) -> Any:
    """The Agent for a name or path (behind the Rego `policy` files, if any); configuration problems
    exit with code 2."""
    from ringlet.agent.config import find
    from ringlet.graph.agent import load_agent
    from ringlet.graph.checkpoint import FileCheckpoints

    data = Path(os.environ.get("RINGLET_DATA_DIR", "~/.local/share/ringlet")).expanduser()
    try:  # graph agents keep checkpoints (for --resume); a question nobody can answer here pauses the run
        instance = load_agent(find(agent), model=model, variables=variables,
                              checkpoints=FileCheckpoints(data / "graph-runs"), on_question="pause",
                              confirm_rag=_confirm if sys.stdin.isatty() else None)
        if policy:
            from ringlet.gates import PolicyGate, PolicySet

            instance.use_gates([PolicyGate(PolicySet.load(policy))])
    except ConfigError as exc:
        raise fail(str(exc), "`ringlet agents` lists agents; `ringlet models` lists usable models") from None
    return instance


def _confirm(question: str) -> bool:
    """A yes/no question on the terminal (building a graph's missing knowledge base)."""
    return typer.confirm(question, default=True, err=True)


def approver(yes: bool) -> Any:
    """--yes approves every call; a terminal asks (y/n/note) and answers questions; otherwise calls that
    need approval pause the run (and questions get `no_human_available`)."""
    from ringlet.cli.render import TerminalApprover
    from ringlet.gates import AutoApprove

    if sys.stdin.isatty():
        return TerminalApprover(err, approve_all=yes)
    return AutoApprove("cli:--yes") if yes else None


async def print_events(stream: Any, renderer: Any, *, events: bool) -> None:
    """Consume a run's stream: each event as a JSON line (`--events`), else drawn by `renderer` (None: nothing
    shown, `--json`), which is closed at the end however the stream ends."""
    try:
        async for event in stream:
            if events:
                sys.stdout.write(event.model_dump_json() + "\n")
                sys.stdout.flush()
            elif renderer is not None:
                renderer.handle(event)
    finally:
        if renderer is not None:
            renderer.close()
