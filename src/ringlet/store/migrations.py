"""Schema migrations: versioned, run when a store opens, under a lock every process honours.

`MIGRATIONS[k]` brings the schema from version k to k + 1 (run on a synchronous connection). Processes that
open one database together never race: on PostgreSQL `migrate` takes a transaction-scoped advisory lock,
on SQLite it runs in an exclusive transaction (waiting up to the busy timeout). The first applies what is
missing; the others find the schema current and go on (on SQLite a process first reads the version without a
lock, and takes the exclusive one only when something is missing). A schema newer than this ringlet is refused,
naming both versions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import func, insert, inspect, select, text

from ringlet._ids import now
from ringlet.errors import ConfigError
from ringlet.store.engine import Db
from ringlet.store.memory_records import create_search_index
from ringlet.store.schema import (
    access_requests,
    api_keys,
    approvals,
    audit_log,
    continuations,
    conversations,
    events,
    graph_checkpoint_steps,
    graph_checkpoints,
    idempotency,
    mcp_connections,
    mcp_tokens,
    memory_edges,
    memory_nodes,
    memory_terms,
    memory_versions,
    messages,
    metadata,
    run_tapes,
    runs,
    schedules,
    schema_version,
    stream_tokens,
    triggers,
    workers,
)

__all__ = ["MIGRATIONS", "MIGRATION_LOCK", "SCHEMA_VERSION", "migrate"]


def _v1(connection: Any) -> None:
    metadata.create_all(connection, tables=[conversations, messages, runs, events, api_keys])


def _v2(connection: Any) -> None:
    """Triggers, idempotency keys, stream tokens, and the conversations' pruned-events mark."""
    if "pruned_event_id" not in {c["name"] for c in inspect(connection).get_columns("conversations")}:
        connection.execute(text("ALTER TABLE conversations ADD COLUMN pruned_event_id INTEGER NOT NULL DEFAULT 0"))
    metadata.create_all(connection, tables=[triggers, idempotency, stream_tokens])


def _v3(connection: Any) -> None:
    """Runs record their realm (checked when a run is read without a conversation)."""
    if "realm" not in {c["name"] for c in inspect(connection).get_columns("runs")}:
        connection.execute(text("ALTER TABLE runs ADD COLUMN realm VARCHAR(200)"))


def _v4(connection: Any) -> None:
    """The append-only audit log of gate decisions."""
    metadata.create_all(connection, tables=[audit_log])


def _v5(connection: Any) -> None:
    """Durable approval records (runs paused for a human)."""
    metadata.create_all(connection, tables=[approvals])


def _v6(connection: Any) -> None:
    """Memory: nodes, their labels/tags/names, edges, realm versions, and the keyword index."""
    metadata.create_all(connection, tables=[memory_nodes, memory_terms, memory_edges, memory_versions])
    create_search_index(connection)


def _v7(connection: Any) -> None:
    """Connector access requests (the catalog's `request_connector_access`)."""
    metadata.create_all(connection, tables=[access_requests])


def _v8(connection: Any) -> None:
    """Questions share the approval records (`kind`, `question`, `answer`); sub-agent conversations name
    their parent; agents' schedules."""
    columns = {c["name"] for c in inspect(connection).get_columns("approvals")}
    for name, kind in (("kind", "VARCHAR(20) NOT NULL DEFAULT 'approval'"), ("question", "JSON"), ("answer", "JSON")):
        if name not in columns:
            connection.execute(text(f"ALTER TABLE approvals ADD COLUMN {name} {kind}"))
    columns = {c["name"] for c in inspect(connection).get_columns("conversations")}
    for name, kind in (("parent_conversation_id", "VARCHAR(40)"), ("parent_tool_call_id", "VARCHAR(100)"),
                       ("is_sub_agent", "BOOLEAN NOT NULL DEFAULT FALSE")):
        if name not in columns:
            connection.execute(text(f"ALTER TABLE conversations ADD COLUMN {name} {kind}"))
    metadata.create_all(connection, tables=[schedules])


def _v9(connection: Any) -> None:
    """Graph runs' checkpoints (the latest of each run)."""
    metadata.create_all(connection, tables=[graph_checkpoints])


def _v10(connection: Any) -> None:
    """The processes that execute runs, with their last heartbeat (durable execution)."""
    metadata.create_all(connection, tables=[workers])


def _v11(connection: Any) -> None:
    """Firing on DBOS: a schedule's pending wake-up number and last fire, a cron trigger's last fire; `/v1`
    continuations stored, so any process continues them."""
    for table, added in (("schedules", (("slot", "INTEGER NOT NULL DEFAULT 0"), ("firing", "VARCHAR(200)"))),
                         ("triggers", (("firing", "VARCHAR(200)"),))):
        columns = {c["name"] for c in inspect(connection).get_columns(table)}
        for name, kind in added:
            if name not in columns:
                connection.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} {kind}"))
    metadata.create_all(connection, tables=[continuations])


def _v12(connection: Any) -> None:
    """A conversation's client id (AG-UI threadId, A2A contextId), scoped to its realm; the key that caused a
    run, and that created a trigger or schedule (their runs count against its limits)."""
    for table, name in (("conversations", "client_id"), ("runs", "key_id"), ("triggers", "created_by_key"),
                        ("schedules", "created_by_key")):
        if name not in {c["name"] for c in inspect(connection).get_columns(table)}:
            connection.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} VARCHAR(200)"))


def _v13(connection: Any) -> None:
    """Forks: a conversation's origin (the conversation and message it was forked from); every checkpoint of
    a graph run, not only the latest; runs' recordings for replay."""
    columns = {c["name"] for c in inspect(connection).get_columns("conversations")}
    for name in ("forked_from_conversation_id", "forked_from_message_id"):
        if name not in columns:
            connection.execute(text(f"ALTER TABLE conversations ADD COLUMN {name} VARCHAR(40)"))
    metadata.create_all(connection, tables=[graph_checkpoint_steps, run_tapes])


def _v14(connection: Any) -> None:
    """An index on the key that caused each run and its status: a new run counts its key's working runs
    (across every process on PostgreSQL, `Runs.create`). The oldest schema that still reads the database,
    kept with each version: an older ringlet opens a newer database that only expanded (a rolling upgrade)."""
    if "ix_runs_key" not in {i["name"] for i in inspect(connection).get_indexes("runs")}:
        next(i for i in runs.indexes if i.name == "ix_runs_key").create(connection)
    if "oldest_reader" not in {c["name"] for c in inspect(connection).get_columns("ringlet_schema")}:
        connection.execute(text("ALTER TABLE ringlet_schema ADD COLUMN oldest_reader INTEGER"))


def _v15(connection: Any) -> None:
    """MCP OAuth tokens, sealed, shared by every process of a server (`ringlet.mcp.tokens`); connections
    waiting for their users, so the OAuth callback may reach any process."""
    metadata.create_all(connection, tables=[mcp_tokens, mcp_connections])


MIGRATIONS: list[Callable[[Any], None]] = [_v1, _v2, _v3, _v4, _v5, _v6, _v7, _v8, _v9, _v10, _v11, _v12, _v13,
                                           _v14, _v15]
"""MIGRATIONS[k] brings the schema from version k to k + 1 (run on a synchronous connection)."""
SCHEMA_VERSION = len(MIGRATIONS)
CONTRACTS: frozenset[int] = frozenset()
"""The versions whose migration contracts the schema (drops, renames or retypes what older code reads): a
ringlet of an older schema refuses a database at or past one. Every other migration only expands, so the
release before it runs on beside it (`docs/operations/upgrades.md`)."""
READERS_SINCE = 14
"""The first version that records `oldest_reader`."""
MIGRATION_LOCK = 0x72696E676C6574  # "ringlet": the PostgreSQL advisory lock every migrating process takes
MIGRATION_WAIT_MS = 120_000
"""How long a process waits for SQLite's migration lock."""


async def migrate(db: Db) -> list[int]:
    """Apply every migration newer than the stored schema version, under the lock; the versions applied
    (none when another process had)."""
    applied: list[int] = []
    if db.engine.dialect.name == "sqlite" and await _current(db) == SCHEMA_VERSION:
        return applied  # the usual case: no exclusive lock, so processes opening together do not queue for it
    async with db.begin() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        elif conn.dialect.name == "sqlite":  # DDL included: sqlite3 would otherwise run it outside any
            # transaction. The lock is waited for longer than a write's 10 s: on a loaded machine the first
            # process's migration, then each other's check, can hold it that long for the last in line.
            await conn.exec_driver_sql(f"PRAGMA busy_timeout={MIGRATION_WAIT_MS}")
            await conn.exec_driver_sql("BEGIN EXCLUSIVE")
        await conn.run_sync(lambda c: schema_version.create(c, checkfirst=True))
        current = (await conn.execute(select(func.max(schema_version.c.version)))).scalar() or 0
        if current > SCHEMA_VERSION:
            oldest = await conn.run_sync(_oldest_reader)
            if oldest is None or oldest > SCHEMA_VERSION:
                raise ConfigError(f"the database has schema version {current}, newer than this ringlet's "
                                  f"{SCHEMA_VERSION} (ringlet {_version()}), and needs schema {oldest or current} "
                                  "or later to be read: upgrade ringlet to open it, or point it at another "
                                  "database")
            return applied  # newer, but only expanded since this ringlet's schema: it reads it as it is
        for version in range(current, SCHEMA_VERSION):
            await conn.run_sync(MIGRATIONS[version])
            row: dict[str, Any] = {"version": version + 1, "applied_at": now()}
            if version + 1 >= READERS_SINCE:
                row["oldest_reader"] = version + 1 if version + 1 in CONTRACTS else \
                    max((v for v in CONTRACTS if v <= version), default=1)
            await conn.execute(insert(schema_version).values(**row))
            applied.append(version + 1)
        if conn.dialect.name == "sqlite":
            await conn.exec_driver_sql("PRAGMA busy_timeout=10000")  # the connection's own again (pooled)
    return applied


def _oldest_reader(connection: Any) -> int | None:
    """The oldest schema version that reads the database as it is; None when the database does not say."""
    if "oldest_reader" not in {c["name"] for c in inspect(connection).get_columns(schema_version.name)}:
        return None
    return connection.execute(select(func.max(schema_version.c.oldest_reader))).scalar()


async def _current(db: Db) -> int | None:
    """The stored schema version, read without a lock (None before any migration)."""
    async with db.connect() as conn:
        if not await conn.run_sync(lambda c: inspect(c).has_table(schema_version.name)):
            return None
        return (await conn.execute(select(func.max(schema_version.c.version)))).scalar()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ringlet")
    except PackageNotFoundError:
        return "unknown"
