"""Forking in the CLI (issue 44).

In `ringlet chat`, the conversation forks at any earlier message, numbered as `/history` lists them:

    /history              the messages so far, numbered
    /fork N               keep messages 1..N and go on from there (nothing runs)
    /edit N TEXT          user message N with TEXT instead, and run from there
    /result N TEXT        tool call N's result replaced by TEXT (never run); the model goes on
    /rerun N              tool call N run again (approval asked as for any call); the model goes on

(a tool call is numbered by its result message, or by the assistant message that made it).

`ringlet conversations fork CONVERSATION_ID --at MESSAGE_ID` copies a stored conversation up to a message into a
new one, as `POST …/fork` without a run does; to edit or retry from there, fork over HTTP or in the web UI.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ringlet.cli.common import err, fail
from ringlet.messages import Message

COMMANDS = ("/history", "/fork", "/edit", "/result", "/rerun")
HELP = "/history, /fork N, /edit N TEXT, /result N TEXT, /rerun N"

conversations_app = typer.Typer(help="Stored conversations (the server's store).", no_args_is_help=True)


def show_history(history: list[Message], console: Console) -> None:
    for n, m in enumerate(history, 1):
        if m.role == "tool":
            text = f"{m.name} → {m.text}"
        elif m.tool_calls:
            text = (m.text + " " if m.text else "") + ", ".join(f"{c.name}({c.raw_arguments})" for c in m.tool_calls)
        else:
            text = m.text
        short = " ".join(text.split())
        console.print(f"[dim]{n:>3}[/] [bold]{m.role}[/] {escape(short[:100] + ('…' if len(short) > 100 else ''))}",
                      markup=True, highlight=False)


def fork_command(line: str, history: list[Message]) -> tuple[list[Message], list[Message]] | None:
    """A chat's slash command other than /reset, /model, /exit: a fork, as (the history it keeps, the input to
    run — empty: nothing runs); None after `/history` or a line it cannot take (it says why)."""
    from ringlet.agent.forks import ForkError, fork_at

    command, _, rest = line.partition(" ")
    if command not in COMMANDS:
        err.print(f"[yellow]commands: /reset, /model provider:name, /exit; {HELP}[/]", markup=True)
        return None
    if command == "/history":
        show_history(history, err)
        return None
    number, _, text = rest.strip().partition(" ")
    if not number.isdigit() or not 1 <= int(number) <= len(history):
        err.print(f"[yellow]{command} takes a message number, 1 to {len(history)} (see /history)[/]", markup=True)
        return None
    if command in ("/edit", "/result") and not text.strip():
        err.print(f"[yellow]{command} N TEXT: give the new text after the number[/]", markup=True)
        return None
    options: dict[str, Any] = {"/edit": {"edit": text}, "/result": {"tool_result": text},
                               "/rerun": {"rerun": True}}.get(command, {})
    try:
        fork = fork_at(history, int(number) - 1, **options)
    except ForkError as exc:
        err.print(f"[yellow]{escape(exc.message)}[/]", markup=True)
        return None
    err.print(f"[dim]forked at message {number}; {len(fork.history)} kept[/]", markup=True)
    return fork.history, fork.prompt


DbOpt = Annotated[str | None, typer.Option("--db", help="Database URL (default: RINGLET_DB_URL or the SQLite file).")]


@conversations_app.command("fork")
def fork(conversation_id: Annotated[str, typer.Argument(help="The stored conversation's id.")],
         at: Annotated[str, typer.Option("--at", help="The message to fork at: the copy ends with it.")],
         db: DbOpt = None) -> None:
    """Copy a stored conversation up to and including a message into a new conversation (its `forked_from`
    names the origin); print the new conversation's id."""
    try:
        forked = asyncio.run(_fork(db, conversation_id, at))
    except LookupError as exc:
        raise fail(str(exc.args[0]), "`GET /api/v1/chat/conversations/{id}` lists a conversation's messages", 1) \
            from None
    typer.echo(forked)


async def _fork(db: str | None, conversation_id: str, at: str) -> str:
    from ringlet.agent.forks import ForkError, fork_at
    from ringlet.store import Store

    store = await Store.open(db)
    try:
        source = await store.conversations.get(conversation_id)
        if source is None:
            raise LookupError(f"no conversation {conversation_id!r} in the store")
        if source.status == "running":
            raise LookupError(f"conversation {conversation_id} has a run in progress; fork it once it has ended")
        try:
            kept = fork_at(await store.conversations.load_messages(conversation_id), at)
        except ForkError as exc:
            raise LookupError(exc.message) from None
        forked = await store.conversations.fork(source, at, kept.history, org_id=source.org_id,
                                                user_id=source.user_id)
        return forked.id
    finally:
        await store.close()
