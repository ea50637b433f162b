"""`ringlet migrate` and `ringlet status`: upgrade a database's schema explicitly, and see what a cluster does."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from ringlet.cli.common import fail
from ringlet.errors import ConfigError

out = Console(highlight=False, soft_wrap=True)
DbOpt = Annotated[str | None, typer.Option("--db", help="Database URL (default: RINGLET_DB_URL or the SQLite file).")]


def migrate_command(db: DbOpt = None) -> None:
    """Apply the schema migrations this ringlet has and the database lacks, under the lock every process
    honours, and print what was applied. Idempotent: a current database is left as it is. Run it before
    rolling out a new version (each migration only adds: old processes keep working on the new schema)."""
    from ringlet.store import SCHEMA_VERSION, Store
    from ringlet.store.migrations import MIGRATIONS

    async def main() -> list[int]:
        store = await Store.open(db)
        await store.close()
        return store.applied

    try:
        applied = asyncio.run(main())
    except ConfigError as exc:
        raise fail(str(exc), "check --db (or RINGLET_DB_URL)", 1) from None
    if not applied:
        out.print(f"schema at version {SCHEMA_VERSION}: up to date, nothing applied")
        return
    for version in applied:
        doc = " ".join((MIGRATIONS[version - 1].__doc__ or "the first tables.").split())
        out.print(f"applied migration {version}: {doc}")
    out.print(f"schema at version {SCHEMA_VERSION} (was {applied[0] - 1})")


def status_command(db: DbOpt = None,
                   json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False) -> None:
    """What the cluster sharing this database does: live workers and their last beat, queues and their depth,
    runs in flight, the oldest waiting approval, the schema version (also `GET /api/v1/admin/status`)."""
    try:
        found = asyncio.run(_status(db))
    except ConfigError as exc:
        raise fail(str(exc), "check --db (or RINGLET_DB_URL)", 1) from None
    if json_out:
        sys.stdout.write(json.dumps(found, ensure_ascii=False) + "\n")
        return
    _print(found)


async def _status(db: str | None) -> dict[str, Any]:
    from ringlet.server.ops import status
    from ringlet.server.runs.queues import QueueDepth, queue_depths
    from ringlet.store import Store

    store = await Store.open(db)
    try:
        queues: list[QueueDepth] = []
        if store.engine.dialect.name == "postgresql":  # runs queue in DBOS (engine 'dbos' or 'auto')
            from ringlet.server.durable.pulse import engine_url

            queues = await queue_depths(os.environ.get("RINGLET_ENGINE_URL") or engine_url(store))
        return (await status.read(store, queues=queues)).as_dict()
    finally:
        await store.close()


def _print(found: dict[str, Any]) -> None:
    out.print(f"schema version {found['schema_version']}; runs in flight: {found['runs_in_flight']}; "
              f"pauses waiting: {found['pauses_waiting']}")
    if found["oldest_pause_id"] is not None:
        out.print(f"oldest waiting approval: {found['oldest_pause_id']}, waiting {found['oldest_pause_s']:.0f} s")
    workers = Table("worker", "role", "last beat (s ago)", title="live workers")
    for worker in found["workers"]:
        workers.add_row(worker["id"], worker["role"], f"{worker['last_beat_s']:.1f}")
    out.print(workers if found["workers"] else "no workers (SQLite, or no process on the engine)")
    queues = Table("queue", "depth", "oldest (s)", title="queues")
    for queue in found["queues"]:
        queues.add_row(queue["name"], str(queue["depth"]),
                       "-" if queue["oldest_s"] is None else f"{queue['oldest_s']:.1f}")
    out.print(queues if found["queues"] else "no run waits in a queue")

