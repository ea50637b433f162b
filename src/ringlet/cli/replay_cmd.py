"""`ringlet replay RUN_ID`: run a stored run again on its recording, without calling the model or any tool,
with the agent as it is configured now (built as the server builds it), and show whether its events come out
as stored or where they first differ (`ringlet.replay`; the same replay as `POST /api/v1/runs/{id}/replay`).
Exit status: 0 the same, 1 a divergence, 2 the run cannot be replayed. `ringlet runs` lists the stored runs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ringlet.cli.common import fail

out = Console(highlight=False)


def replay_command(
    run_id: Annotated[str, typer.Argument(help="The run's id (r_…), as the API and the web UI show it.")],
    db: Annotated[str | None, typer.Option("--db", help="Database URL (default: RINGLET_DB_URL or the SQLite "
                                                        "file).")] = None,
    agents_dir: Annotated[Path | None, typer.Option("--agents", help="Where the server's agents are "
                                                    "(default: RINGLET_AGENTS_DIR, else ./agents).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Replay a finished or paused run exactly from its recording: nothing is called, run or stored."""
    report = asyncio.run(_replay(run_id, db, agents_dir))
    if json_out:
        print(json.dumps(report, ensure_ascii=False, indent=2))
    elif report["same"]:
        out.print(f"[green]same[/]: {report['events']} events, byte for byte as recorded")
    else:
        first = report["divergence"]
        out.print(f"[red]diverged[/]: {escape(first['message'])}")
        if first.get("expected") is not None or first.get("actual") is not None:
            out.print(f"  recorded: {escape(json.dumps(first.get('expected'), ensure_ascii=False)[:400])}")
            out.print(f"  replay:   {escape(json.dumps(first.get('actual'), ensure_ascii=False)[:400])}")
        out.print(f"({report['events']} events replayed, {report['recorded_events']} recorded; "
                  f"{len(report['divergences'])} divergences)")
    raise typer.Exit(0 if report["same"] else 1)


async def _replay(run_id: str, db: str | None, agents_dir: Path | None) -> dict[str, Any]:
    from ringlet.errors import ConfigError
    from ringlet.gates import PolicySet
    from ringlet.server import ServerSettings
    from ringlet.server.catalog import Catalog
    from ringlet.server.http.errors import ApiError
    from ringlet.server.runs.replays import NotReplayable, replay_stored
    from ringlet.store import Store

    try:
        settings = ServerSettings.from_env(**({"db_url": db} if db else {}),
                                           **({"agents_dir": agents_dir} if agents_dir else {}))
        policies = PolicySet.load(settings.policy_paths)
    except ConfigError as exc:
        raise fail(str(exc), "see `ringlet replay --help`") from None
    store = await Store.open(settings.db_url)
    try:
        record = await store.runs.get(run_id)
        if record is None:
            raise fail(f"no run {run_id!r} in {settings.db_url or 'the default database'}",
                       "give the database it ran on with --db; `ringlet runs` lists its runs")
        catalog = Catalog.from_dir(settings.agents_dir)
        catalog.serve_on(store, settings, policies)  # the agent as the server built it (nothing is audited:
        try:  # a replay's audit records go to logs of its own)
            return (await replay_stored(store, catalog, run_id)).as_dict()
        except ApiError as exc:
            raise fail(f"agent {record.agent!r}: {exc.message}", "give the folder its agents are in with "
                       "--agents") from None
        except NotReplayable as exc:
            raise fail(str(exc), "replay a loop run that has ended or paused") from None
        finally:
            await catalog.aclose()
    finally:
        await store.close()


def runs_command(
    db: Annotated[str | None, typer.Option("--db", help="Database URL (default: RINGLET_DB_URL or the SQLite "
                                                        "file).")] = None,
    agent: Annotated[str | None, typer.Option("--agent", help="Only this agent's runs.")] = None,
    status: Annotated[str | None, typer.Option("--status", help="Only runs with this status (working, "
                                               "input_required, completed, failed, canceled).")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="How many, newest first.", min=1, max=1000)] = 20,
    json_out: Annotated[bool, typer.Option("--json", help="Print the runs as JSON lines.")] = False,
) -> None:
    """List the server's runs, newest first: the ids `ringlet replay` takes (as `GET /api/v1/runs`)."""
    rows = asyncio.run(_runs(db, agent, status, limit))
    if json_out:
        for r in rows:
            print(json.dumps({"id": r.id, "agent": r.agent, "kind": r.kind, "status": r.status,
                              "finish_reason": r.finish_reason, "conversation_id": r.conversation_id,
                              "realm": r.realm, "started_at": r.started_at, "ended_at": r.ended_at,
                              "usage": r.usage.summary()}, ensure_ascii=False))
        return
    from rich.table import Table

    table = Table("run", "agent", "kind", "status", "finish", "started", "conversation", box=None)
    for r in rows:
        table.add_row(r.id, escape(r.agent), r.kind, r.status, r.finish_reason or "-", r.started_at,
                      r.conversation_id or "-")
    out.print(table)
    if not rows:
        out.print("[dim]no runs[/]")


async def _runs(db: str | None, agent: str | None, status: str | None, limit: int) -> list[Any]:
    from ringlet.errors import ConfigError
    from ringlet.server import ServerSettings
    from ringlet.store import Store

    try:
        settings = ServerSettings.from_env(**({"db_url": db} if db else {}))
    except ConfigError as exc:
        raise fail(str(exc), "see `ringlet runs --help`") from None
    store = await Store.open(settings.db_url)
    try:
        return await store.runs.list(agent=agent, status=status, limit=limit)
    finally:
        await store.close()
