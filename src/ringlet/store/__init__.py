"""Persistence on SQLAlchemy 2 async Core: a SQLite file by default, PostgreSQL for shared deployments.

    store = await Store.open("sqlite+aiosqlite:///ringlet.db")   # or postgresql+asyncpg://…
    conversation = await store.create_conversation(agent="assistant")
    await store.append_messages(conversation["id"], result.new_messages())
    event_id = await store.append_event(conversation["id"], event)

Schema migrations are versioned and run when the store opens. A message is stored once: appending one
whose id is already stored is a no-op, so retries never duplicate a transcript.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import case, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ringlet._ids import new_id, now
from ringlet.errors import ConfigError
from ringlet.messages import Message
from ringlet.store.keys import Keys
from ringlet.store.schema import conversations, events, messages, metadata, runs, schema_version

__all__ = ["DEFAULT_URL", "SCHEMA_VERSION", "Store"]

DEFAULT_URL = "sqlite+aiosqlite:///" + str(Path("~/.local/share/ringlet/ringlet.db").expanduser())
TITLE_CHARS = 60


def _v1(connection: Any) -> None:
    metadata.create_all(connection)


MIGRATIONS: list[Callable[[Any], None]] = [_v1]
"""MIGRATIONS[k] brings the schema from version k to k + 1 (run on a synchronous connection)."""
SCHEMA_VERSION = len(MIGRATIONS)


class Store:
    """Conversations, transcripts, runs and the per-conversation event log."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.keys = Keys(engine)

    @classmethod
    async def open(cls, url: str | None = None) -> Store:
        """Connect (default: `RINGLET_DB_URL`, else a SQLite file under ~/.local/share) and migrate."""
        url = url or os.environ.get("RINGLET_DB_URL") or DEFAULT_URL
        await asyncio.to_thread(_make_folder, url)
        try:
            engine = create_async_engine(url)
        except Exception as exc:  # an unknown dialect or a missing driver
            raise ConfigError(f"database URL {url!r}: {exc}; use sqlite+aiosqlite:///FILE or "
                              "postgresql+asyncpg://USER@HOST/DB") from None
        store = cls(engine)
        await store.migrate()
        return store

    async def close(self) -> None:
        await self.engine.dispose()

    async def migrate(self) -> int:
        """Apply every migration newer than the stored schema version; returns the version now."""
        async with self.engine.begin() as conn:
            await conn.run_sync(lambda c: schema_version.create(c, checkfirst=True))
            current = (await conn.execute(select(func.max(schema_version.c.version)))).scalar() or 0
            if current > SCHEMA_VERSION:
                raise ConfigError(f"the database has schema version {current}, newer than this ringlet "
                                  f"({SCHEMA_VERSION}); upgrade ringlet")
            for version in range(current, SCHEMA_VERSION):
                await conn.run_sync(MIGRATIONS[version])
                await conn.execute(insert(schema_version).values(version=version + 1, applied_at=now()))
        return SCHEMA_VERSION

    # -- conversations ---------------------------------------------------------------------------------

    async def create_conversation(self, *, agent: str, title: str = "", realm: str = "default",
                                  org_id: str | None = None, user_id: str | None = None,
                                  parent_run_id: str | None = None) -> dict[str, Any]:
        stamp = now()
        row = {"id": new_id("c"), "agent": agent, "title": title, "realm": realm, "org_id": org_id,
               "user_id": user_id, "parent_run_id": parent_run_id, "status": "idle", "in_tokens": 0,
               "out_tokens": 0, "cost_usd": None, "priced": True, "last_event_id": 0, "created_at": stamp,
               "updated_at": stamp}
        async with self.engine.begin() as conn:
            await conn.execute(insert(conversations).values(**row))
        return _conversation(row)

    async def get_conversation(self, conversation_id: str, *, realm: str | None = None) -> dict[str, Any] | None:
        """A conversation, or None when it is missing, deleted or (with `realm`) in another realm."""
        query = select(conversations).where(conversations.c.id == conversation_id,
                                            conversations.c.deleted_at.is_(None))
        if realm is not None:
            query = query.where(conversations.c.realm == realm)
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).mappings().first()
        return _conversation(dict(row)) if row else None

    async def list_conversations(self, *, realm: str | None = None, agent: str | None = None, limit: int = 50,
                                 before: str | None = None,
                                 include_sub_agents: bool = False) -> list[dict[str, Any]]:
        """Newest first; `before` is the `updated_at` cursor of the last row of the previous page."""
        query = select(conversations).where(conversations.c.deleted_at.is_(None))
        if realm is not None:
            query = query.where(conversations.c.realm == realm)
        if agent is not None:
            query = query.where(conversations.c.agent == agent)
        if not include_sub_agents:
            query = query.where(conversations.c.parent_run_id.is_(None))
        if before is not None:
            query = query.where(conversations.c.updated_at < before)
        query = query.order_by(conversations.c.updated_at.desc(), conversations.c.id.desc()).limit(limit)
        async with self.engine.connect() as conn:
            return [_conversation(dict(r)) for r in (await conn.execute(query)).mappings()]

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Soft delete; True if it existed."""
        async with self.engine.begin() as conn:
            result = await conn.execute(update(conversations).where(
                conversations.c.id == conversation_id, conversations.c.deleted_at.is_(None)).values(deleted_at=now()))
        return result.rowcount > 0

    async def set_status(self, conversation_id: str, status: str) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(update(conversations).where(conversations.c.id == conversation_id)
                               .values(status=status, updated_at=now()))

    async def add_usage(self, conversation_id: str, in_tokens: int, out_tokens: int, cost_usd: float | None) -> None:
        """Add a run's totals to the conversation in one atomic UPDATE. Once any run is unpriced, the
        conversation's cost stays null (unknown), never a partial sum."""
        c = conversations.c
        priced = c.priced if cost_usd is not None else False
        cost = case((c.priced, func.coalesce(c.cost_usd, 0.0) + cost_usd), else_=None) if cost_usd is not None else None
        async with self.engine.begin() as conn:
            await conn.execute(update(conversations).where(c.id == conversation_id).values(
                in_tokens=c.in_tokens + in_tokens, out_tokens=c.out_tokens + out_tokens, priced=priced,
                cost_usd=cost, updated_at=now()))

    # -- messages --------------------------------------------------------------------------------------

    async def append_messages(self, conversation_id: str, new: Sequence[Message]) -> int:
        """Store messages in order, each once (an id already stored is skipped); returns how many were new.
        The first user message gives an untitled conversation its title."""
        if not new:
            return 0
        async with self.engine.begin() as conn:
            stored = set((await conn.execute(select(messages.c.id).where(
                messages.c.id.in_([m.id for m in new])))).scalars())
            fresh = [m for m in new if m.id not in stored]
            if fresh:
                await conn.execute(insert(messages), [_message_row(conversation_id, m) for m in fresh])
                await self._title(conn, conversation_id, fresh)
        for m in fresh:
            m.metadata["is_persisted"] = True
        return len(fresh)

    async def _title(self, conn: AsyncConnection, conversation_id: str, fresh: Sequence[Message]) -> None:
        first_user = next((m.text for m in fresh if m.role == "user" and m.text.strip()), None)
        if first_user is None:
            return
        title = " ".join(first_user.split())[:TITLE_CHARS]
        await conn.execute(update(conversations).where(conversations.c.id == conversation_id,
                                                       conversations.c.title == "").values(title=title))

    async def load_messages(self, conversation_id: str, *, limit: int | None = None) -> list[Message]:
        """The transcript in order (the last `limit` messages when given), migrated to the current schema."""
        query = select(messages.c.body).where(messages.c.conversation_id == conversation_id)
        if limit is not None:
            inner = query.add_columns(messages.c.seq).order_by(messages.c.seq.desc()).limit(limit).subquery()
            query = select(inner.c.body).order_by(inner.c.seq)
        else:
            query = query.order_by(messages.c.seq)
        async with self.engine.connect() as conn:
            bodies = list((await conn.execute(query)).scalars())
        return [Message.validate(body) for body in bodies]

    # -- runs ------------------------------------------------------------------------------------------

    async def create_run(self, run_id: str, *, agent: str, conversation_id: str | None = None,
                         parent_run_id: str | None = None, kind: str = "loop") -> None:
        async with self.engine.begin() as conn:
            await conn.execute(insert(runs).values(id=run_id, agent=agent, conversation_id=conversation_id,
                                                   parent_run_id=parent_run_id, kind=kind, status="working",
                                                   started_at=now()))

    async def finish_run(self, run_id: str, *, status: str, finish_reason: str | None, in_tokens: int,
                         out_tokens: int, cost_usd: float | None, state: dict[str, Any] | None = None) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(update(runs).where(runs.c.id == run_id).values(
                status=status, finish_reason=finish_reason, in_tokens=in_tokens, out_tokens=out_tokens,
                cost_usd=cost_usd, state=state, ended_at=now()))

    async def get_run(self, run_id: str) -> dict[str, Any] | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(runs).where(runs.c.id == run_id))).mappings().first()
        if row is None:
            return None
        r = dict(row)
        return {"id": r["id"], "conversation_id": r["conversation_id"], "parent_run_id": r["parent_run_id"],
                "kind": r["kind"], "status": r["status"], "finish_reason": r["finish_reason"],
                "usage": {"in_tokens": r["in_tokens"], "out_tokens": r["out_tokens"], "cost_usd": r["cost_usd"]},
                "started_at": r["started_at"], "ended_at": r["ended_at"]}

    # -- the event log ---------------------------------------------------------------------------------

    async def append_event(self, conversation_id: str, event: Any) -> int:
        """Append one event (anything with `type` and `model_dump()`) and return its id: strictly increasing
        per conversation, drawn from the conversation's counter in the same transaction."""
        payload = event.model_dump()
        async with self.engine.begin() as conn:
            event_id = (await conn.execute(
                update(conversations).where(conversations.c.id == conversation_id)
                .values(last_event_id=conversations.c.last_event_id + 1)
                .returning(conversations.c.last_event_id))).scalar_one()
            await conn.execute(insert(events).values(conversation_id=conversation_id, id=event_id,
                                                     run_id=payload.get("run_id"), type=event.type,
                                                     payload=payload, created_at=now()))
        return event_id

    async def events_after(self, conversation_id: str, after: int = 0,
                           limit: int = 1000) -> list[tuple[int, str, dict[str, Any]]]:
        """Stored events with id > `after`, in order, as (id, type, payload)."""
        query = (select(events.c.id, events.c.type, events.c.payload)
                 .where(events.c.conversation_id == conversation_id, events.c.id > after)
                 .order_by(events.c.id).limit(limit))
        async with self.engine.connect() as conn:
            return [(r.id, r.type, r.payload) for r in await conn.execute(query)]


def _make_folder(url: str) -> None:
    """A SQLite file's folder is created on first use."""
    if url.startswith("sqlite") and ":///" in url and not url.endswith(":memory:"):
        Path(url.split(":///", 1)[1]).expanduser().parent.mkdir(parents=True, exist_ok=True)


def _conversation(row: dict[str, Any]) -> dict[str, Any]:
    """The API shape of a conversation row (`server-contract.md` §3)."""
    return {"id": row["id"], "agent": row["agent"], "title": row["title"], "realm": row["realm"],
            "created_at": row["created_at"], "updated_at": row["updated_at"], "status": row["status"],
            "usage": {"in_tokens": row["in_tokens"], "out_tokens": row["out_tokens"], "cost_usd": row["cost_usd"]}}


def _message_row(conversation_id: str, m: Message) -> dict[str, Any]:
    body = m.model_dump()
    body["metadata"] = {**body["metadata"], "is_persisted": True}
    body["conversation_id"] = conversation_id
    return {"id": m.id, "conversation_id": conversation_id, "run_id": m.run_id, "role": m.role,
            "created_at": m.created_at, "schema_version": m.schema_version, "body": body}
