"""Persistence on SQLAlchemy 2 async Core: a SQLite file by default, PostgreSQL for shared deployments.

    store = await Store.open("sqlite:///ringlet.db")   # or postgresql://… (aiosqlite / asyncpg)
    conversation = await store.conversations.create(agent="assistant")
    await store.conversations.append_messages(conversation.id, result.new_messages())
    event_id = await store.events.append(conversation.id, event)

`Store` opens the database (schema migrations, versioned, run when it opens) and the repositories, one per
aggregate, each handing out typed records (`records.py`):

    conversations  conversations and their transcripts           conversation_records.py
    runs           runs, their leases and pauses                  run_records.py
    events         each conversation's event log                  event_records.py
    approvals      approvals and questions                        approval_records.py
    audit          gate decisions, connector access requests     audit_records.py
    requests       idempotent requests                            request_records.py
    keys, triggers, schedules, memory, checkpoints, continuations (their modules)
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ringlet._ids import new_id
from ringlet.errors import ConfigError
from ringlet.store.approval_records import Approvals
from ringlet.store.audit_records import Audit
from ringlet.store.checkpoint_records import Checkpoints
from ringlet.store.connection_records import PendingConnections
from ringlet.store.continuation_records import Continuations
from ringlet.store.conversation_records import Conversations
from ringlet.store.engine import Db, sqlite_pragmas
from ringlet.store.event_records import EVENTS_CHANNEL, EventLog
from ringlet.store.keys import Keys
from ringlet.store.memory_records import MemoryRecords
from ringlet.store.migrations import SCHEMA_VERSION, migrate
from ringlet.store.request_records import Requests
from ringlet.store.run_records import Runs
from ringlet.store.schedule_records import Schedules
from ringlet.store.tape_records import Tapes
from ringlet.store.token_records import StoredTokens
from ringlet.store.trigger_records import Triggers
from ringlet.store.urls import database_url, make_folder, shown

__all__ = ["DEFAULT_URL", "EVENTS_CHANNEL", "SCHEMA_VERSION", "Store", "database_url"]

DEFAULT_URL = "sqlite+aiosqlite:///" + str(Path("~/.local/share/ringlet/ringlet.db").expanduser())


IDLE_TRANSACTION_MS = 5000
"""On PostgreSQL, a session idle inside a transaction this long is ended by the server: a process that stops
mid-transaction (a machine gone from the network, a frozen process) holds its locks no longer than that."""


def _engine_options(url: Any) -> dict[str, Any]:
    if url.drivername != "postgresql+asyncpg":
        return {}
    # a pool that keeps every connection it opens, as DBOS's own does: an overflow connection is closed on
    # return, and a new one costs a handshake and preparing each statement again (at 20 + 10 overflow, a
    # burst of 100 conversations opened ~100 connections and prepared ~1,000 statements); a request that
    # finds all 30 in use waits for one
    return {"connect_args": {"server_settings": {"idle_in_transaction_session_timeout": str(IDLE_TRANSACTION_MS)}},
            "pool_size": 30, "max_overflow": 0}


class Store:
    """One database, and the repositories of what ringlet keeps in it."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.db = Db(engine)
        self.keys = Keys(self.db)
        self.triggers = Triggers(self.db)
        self.schedules = Schedules(self.db)
        self.memory = MemoryRecords(self.db)
        self.checkpoints = Checkpoints(self.db)
        self.continuations = Continuations(self.db)
        """`/v1` runs stopped on client tool calls: their transcripts until the results come."""
        self.applied: list[int] = []
        """The schema versions the last `migrate()` applied (none when another process had)."""
        self.origin = new_id("o")
        """This store's token in its `EVENTS_CHANNEL` notifications: a process's feed skips its own."""
        self.conversations = Conversations(self.db)
        self.runs = Runs(self.db, self.origin)
        self.events = EventLog(self.db, self.origin)
        self.approvals = Approvals(self.db)
        self.audit = Audit(self.db)
        self.requests = Requests(self.db)
        self.tapes = Tapes(self.db)
        """Runs' recordings, for replay."""
        self.mcp_tokens = StoredTokens(self.db)
        """MCP OAuth tokens, sealed (the server's `TokenVault`)."""
        self.mcp_connections = PendingConnections(self.db)
        """MCP OAuth connections waiting for their users (the callback may reach any process)."""

    @classmethod
    async def open(cls, url: str | None = None) -> Store:
        """Connect (default: `RINGLET_DB_URL`, else a SQLite file under ~/.local/share) and migrate.
        `sqlite:///FILE` and `postgresql://…` (or `postgres://…`) take the async drivers (`database_url`)."""
        parsed = database_url(url or os.environ.get("RINGLET_DB_URL") or DEFAULT_URL)
        await asyncio.to_thread(make_folder, parsed)
        try:
            engine = create_async_engine(parsed, **_engine_options(parsed))
        except ModuleNotFoundError as exc:  # the driver's package is missing
            extra = " (pip install 'ringlet[postgres]')" if exc.name == "asyncpg" else ""
            raise ConfigError(f"database URL {shown(parsed)!r} needs the {exc.name} package{extra}") from None
        except Exception as exc:  # a driver SQLAlchemy does not know, or one that is not async
            raise ConfigError(f"database URL {shown(parsed)!r}: {exc}; use sqlite:///FILE or "
                              "postgresql://USER@HOST/DB") from None
        if engine.dialect.name == "sqlite":
            event.listen(engine.sync_engine, "connect", sqlite_pragmas)
        store = cls(engine)
        await store.migrate()
        return store

    async def close(self) -> None:
        await self.db.close()
        await self.engine.dispose()

    async def migrate(self) -> int:
        """Apply every migration newer than the stored schema version, under a lock every process honours
        (`migrations.migrate`); returns the version now. The versions this call applied are in `applied`."""
        self.applied = await migrate(self.db)
        return SCHEMA_VERSION
