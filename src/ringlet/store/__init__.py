"""Persistence on SQLAlchemy 2 async Core: a SQLite file by default, PostgreSQL for shared deployments.

    store = await Store.open("sqlite:///ringlet.db")   # or postgresql://… (aiosqlite / asyncpg)
    conversation = await store.create_conversation(agent="assistant")
    await store.append_messages(conversation["id"], result.new_messages())
    event_id = await store.append_event(conversation["id"], event)

Schema migrations are versioned and run when the store opens. A message is stored once: appending one
whose id is already stored is a no-op, so retries never duplicate a transcript.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from collections import Counter
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import and_, bindparam, case, delete, event, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ringlet._ids import new_id, now
from ringlet.errors import ConfigError, ConversationBusy
from ringlet.messages import Message
from ringlet.store import statements as hot
from ringlet.store.approval_records import Approvals
from ringlet.store.audit_records import Audit
from ringlet.store.checkpoint_records import Checkpoints
from ringlet.store.continuation_records import Continuations
from ringlet.store.conversation_records import Conversations
from ringlet.store.engine import Conn, Db, Inline, sqlite_pragmas
from ringlet.store.event_records import EventLog
from ringlet.store.keys import Keys
from ringlet.store.memory_records import MemoryRecords
from ringlet.store.migrations import SCHEMA_VERSION, migrate
from ringlet.store.request_records import Requests
from ringlet.store.run_records import Runs
from ringlet.store.schedule_records import Schedules
from ringlet.store.schema import (
    access_requests,
    approvals,
    audit_log,
    conversations,
    events,
    idempotency,
    messages,
    runs,
    schedules,
    stream_tokens,
)
from ringlet.store.trigger_records import Triggers
from ringlet.store.urls import database_url, make_folder, shown

__all__ = ["DEFAULT_URL", "EVENTS_CHANNEL", "SCHEMA_VERSION", "Store", "database_url"]

DEFAULT_URL = "sqlite+aiosqlite:///" + str(Path("~/.local/share/ringlet/ringlet.db").expanduser())
TITLE_CHARS = 60
EVENTS_CHANNEL = "ringlet_events"
"""On PostgreSQL, every transaction that appends events notifies this channel at commit, once per
conversation, with `{"c": conversation id, "i": its last event id in the batch, "n": how many of the
batch's events are its, "o": the writing store's origin}`: the events `i-n+1 … i` are stored. The other
server processes' live feeds listen (`ringlet.server.runs.feed`)."""


IDLE_TRANSACTION_MS = 5000
"""On PostgreSQL, a session idle inside a transaction this long is ended by the server: a process that stops
mid-transaction (a machine gone from the network, a frozen process) holds its locks no longer than that."""


def _engine_options(url: Any) -> dict[str, Any]:
    if url.drivername != "postgresql+asyncpg":
        return {}
    return {"connect_args": {"server_settings": {"idle_in_transaction_session_timeout": str(IDLE_TRANSACTION_MS)}}}


class Store:
    """Conversations, transcripts, runs and the per-conversation event log."""

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

    # -- conversations ---------------------------------------------------------------------------------

    async def create_conversation(self, *, agent: str, title: str = "", realm: str = "default",
                                  org_id: str | None = None, user_id: str | None = None,
                                  parent_run_id: str | None = None, conversation_id: str | None = None,
                                  parent_conversation_id: str | None = None,
                                  parent_tool_call_id: str | None = None, transient: bool = False,
                                  client_id: str | None = None) -> dict[str, Any]:
        """A new conversation; one with a `parent_run_id` is a sub-agent's (hidden from default lists). A
        `transient` one (a `/v1` run's without a conversation, on the engine) is born deleted: runs run in it,
        no route lists or shows it, and `purge_conversation` removes it once its run has ended."""
        stamp = now()
        row = {"id": conversation_id or new_id("c"), "agent": agent, "title": title, "realm": realm,
               "org_id": org_id, "user_id": user_id, "parent_run_id": parent_run_id,
               "parent_conversation_id": parent_conversation_id, "parent_tool_call_id": parent_tool_call_id,
               "is_sub_agent": parent_run_id is not None, "client_id": client_id, "status": "idle", "in_tokens": 0,
               "out_tokens": 0, "cost_usd": None, "priced": True, "last_event_id": 0, "created_at": stamp,
               "updated_at": stamp, "deleted_at": stamp if transient else None}
        async with self.db.begin() as conn:
            await conn.execute(hot.INSERT_CONVERSATION, row)
        return _conversation(row)

    async def get_conversation(self, conversation_id: str, *, realm: str | None = None) -> dict[str, Any] | None:
        """A conversation, or None when it is missing, deleted or (with `realm`) in another realm."""
        query = hot.CONVERSATION if realm is None else hot.CONVERSATION_IN_REALM
        async with self.db.connect() as conn:
            row = (await conn.execute(query, {"b_id": conversation_id, "b_realm": realm})).mappings().first()
        return _conversation(dict(row)) if row else None

    async def list_conversations(self, *, realms: Collection[str] | None = None, agent: str | None = None,
                                 limit: int = 50, after: tuple[str, str] | None = None,
                                 include_sub_agents: bool = False,
                                 agents: Collection[str] | None = None) -> list[dict[str, Any]]:
        """Newest first. `realms` limits the realms (None: all); `after` is the (updated_at, id) of the last
        row of the previous page."""
        c = conversations.c
        query = select(conversations).where(c.deleted_at.is_(None))
        if realms is not None:
            query = query.where(c.realm.in_(list(realms)))
        if agent is not None:
            query = query.where(c.agent == agent)
        if agents is not None:
            query = query.where(c.agent.in_(list(agents)))
        if not include_sub_agents:
            query = query.where(c.parent_run_id.is_(None))
        if after is not None:
            query = query.where(or_(c.updated_at < after[0], and_(c.updated_at == after[0], c.id < after[1])))
        query = query.order_by(c.updated_at.desc(), c.id.desc()).limit(limit)
        async with self.db.connect() as conn:
            return [_conversation(dict(r)) for r in (await conn.execute(query)).mappings()]

    async def delete_conversation(self, conversation_id: str) -> bool:
        """Soft delete; True if it existed."""
        async with self.db.begin() as conn:
            result = await conn.execute(update(conversations).where(
                conversations.c.id == conversation_id, conversations.c.deleted_at.is_(None)).values(deleted_at=now()))
        return result.rowcount > 0

    async def purge_conversation(self, conversation_id: str) -> None:
        """Remove a conversation for good with its sub-agents' conversations: their transcripts, event logs,
        schedules and rows. Their runs' records stay (status, usage, cost) without conversation or state, and
        their approval records (an audit trail) without conversation."""
        c, ids, level = conversations.c, [conversation_id], [conversation_id]
        async with self.db.begin() as conn:
            while level := list((await conn.execute(select(c.id).where(c.parent_conversation_id.in_(level))))
                                .scalars()):
                ids += level
            for table in (events, messages, schedules):
                await conn.execute(delete(table).where(table.c.conversation_id.in_(ids)))
            await conn.execute(update(runs).where(runs.c.conversation_id.in_(ids))
                               .values(conversation_id=None, state=None))
            await conn.execute(update(approvals).where(approvals.c.conversation_id.in_(ids))
                               .values(conversation_id=None))
            await conn.execute(delete(conversations).where(c.id.in_(ids)))

    async def transient_leftovers(self, before: str) -> list[str]:
        """Transient conversations made before `before`, idle: their API process died before it purged them."""
        c = conversations.c
        async with self.db.connect() as conn:
            return list((await conn.execute(select(c.id).where(
                c.deleted_at == c.created_at, c.status == "idle", c.created_at < before))).scalars())

    async def set_status(self, conversation_id: str, status: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(update(conversations).where(conversations.c.id == conversation_id)
                               .values(status=status, updated_at=now()))

    async def add_usage(self, conversation_id: str, in_tokens: int, out_tokens: int, cost_usd: float | None) -> None:
        """Add a run's totals to the conversation in one atomic UPDATE. Once any run is unpriced, the
        conversation's cost stays null (unknown), never a partial sum."""
        async with self.db.begin() as conn:
            await conn.execute(hot.USAGE, _usage(conversation_id, in_tokens, out_tokens, cost_usd))

    # -- messages --------------------------------------------------------------------------------------

    async def append_messages(self, conversation_id: str, new: Sequence[Message]) -> int:
        """Store messages in order, each once (an id already stored is skipped); returns how many were new.
        The first user message gives an untitled conversation its title."""
        if not new:
            return 0
        async with self.db.begin() as conn:
            return await self._insert_messages(conn, conversation_id, new)

    async def _insert_messages(self, conn: Conn, conversation_id: str, new: Sequence[Message]) -> int:
        if not new:
            return 0
        stored = set((await conn.execute(hot.MESSAGE_IDS, {"b_ids": [m.id for m in new]})).scalars())
        fresh = [m for m in new if m.id not in stored]
        if fresh:
            await conn.execute(hot.INSERT_MESSAGES, [_message_row(conversation_id, m) for m in fresh])
            await self._title(conn, conversation_id, fresh)
        for m in fresh:
            m.metadata["is_persisted"] = True
        return len(fresh)

    @staticmethod
    async def _insert_new(conn: Conn, conversation_id: str, new: Sequence[Message]) -> None:
        """Insert a run's own messages in one statement; an id already stored is left as it is."""
        if not new:
            return
        statement = hot.INSERT_NEW_MESSAGES["sqlite" if conn.dialect.name == "sqlite" else "postgresql"]
        await conn.execute(statement, [_message_row(conversation_id, m) for m in new])
        for m in new:
            m.metadata["is_persisted"] = True

    async def _title(self, conn: Conn, conversation_id: str, fresh: Sequence[Message]) -> None:
        first_user = next((m.text for m in fresh if m.role == "user" and m.text.strip()), None)
        if first_user is None:
            return
        await conn.execute(hot.TITLE, {"b_id": conversation_id, "b_title": " ".join(first_user.split())[:TITLE_CHARS]})

    async def update_messages(self, conversation_id: str, changed: Sequence[Message]) -> None:
        """Rewrite stored messages whose metadata changed (compaction marks them `compacted_into`)."""
        async with self.db.begin() as conn:
            for m in changed:
                await conn.execute(update(messages).where(messages.c.id == m.id,
                                                          messages.c.conversation_id == conversation_id)
                                   .values(body=_message_row(conversation_id, m)["body"]))

    async def load_messages(self, conversation_id: str, *, limit: int | None = None,
                            before: str | None = None) -> list[Message]:
        """The transcript in order (the last `limit` messages when given, those before the message id
        `before` when given), migrated to the current schema."""
        m = messages.c
        query: Any = hot.TRANSCRIPT  # the whole transcript: what every run reads, built once
        if before is not None or limit is not None:
            query = select(m.body, m.seq).where(m.conversation_id == bindparam("b_id"))
            if before is not None:
                query = query.where(m.seq < select(m.seq).where(m.id == before).scalar_subquery())
            query = query.order_by(m.seq)
            if limit is not None:
                inner = query.order_by(None).order_by(m.seq.desc()).limit(limit).subquery()
                query = select(inner.c.body, inner.c.seq).order_by(inner.c.seq)
        async with self.db.connect() as conn:
            bodies = [row[0] for row in await conn.execute(query, {"b_id": conversation_id})]
        return [Message.validate(body) for body in bodies]

    # -- runs ------------------------------------------------------------------------------------------

    async def create_run(self, run_id: str, *, agent: str, conversation_id: str | None = None,
                         parent_run_id: str | None = None, kind: str = "loop", lease_owner: str | None = None,
                         lease_expires_at: str | None = None, incoming: Sequence[Message] = (),
                         realm: str | None = None, key_id: str | None = None) -> None:
        """Record a new `working` run. With `conversation_id` and `incoming` (the run's input), in the same
        transaction: claim the conversation (`ConversationBusy` when it already has a working run, in any
        process) and store the input."""
        async with self.db.begin() as conn:
            if conversation_id is not None and incoming:
                first_user = next((m.text for m in incoming if m.role == "user" and m.text.strip()), None)
                title = " ".join(first_user.split())[:TITLE_CHARS] if first_user else None
                claimed = await conn.execute(hot.CLAIM, {"b_id": conversation_id, "b_stamp": now(), "b_title": title})
                if claimed.rowcount == 0:  # working, or paused
                    raise ConversationBusy(f"conversation {conversation_id} already has a working run")
            await conn.execute(hot.INSERT_RUN, {
                "id": run_id, "agent": agent, "conversation_id": conversation_id, "parent_run_id": parent_run_id,
                "kind": kind, "status": "working", "lease_owner": lease_owner, "lease_expires_at": lease_expires_at,
                "started_at": now(), "realm": realm, "key_id": key_id})
            if conversation_id is not None and incoming:
                await self._insert_new(conn, conversation_id, incoming)

    async def finish_run(self, run_id: str, *, status: str, finish_reason: str | None, in_tokens: int,
                         out_tokens: int, cost_usd: float | None, state: dict[str, Any] | None = None,
                         conversation_id: str | None = None, new: Sequence[Message] = (),
                         conversation_status: str | None = None, add_usage: bool = True,
                         events: Sequence[tuple[str, str, dict[str, Any]]] | None = None) -> list[int]:
        """Record how a run ended. With `conversation_id`, in the same transaction: store the run's last
        messages, add its usage to the conversation (unless not `add_usage`) and set the conversation's status.
        With `events` (its
        closing events, `message_end` last, as `append_events` takes them), append them too and return their
        ids: the record never says the run ended without its end in the log. Without `events` the run keeps
        its lease owner until `end_logged()`: if that process dies first, `unlogged_ends()` finds the run."""
        ended: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None} if events is not None else {}
        async with self.db.begin() as conn:
            await conn.execute(hot.UPDATE_RUN, {
                "b_id": run_id, "status": status, "finish_reason": finish_reason, "in_tokens": in_tokens,
                "out_tokens": out_tokens, "cost_usd": cost_usd, "state": state, "ended_at": now(), **ended})
            if conversation_id is not None:
                await self._insert_new(conn, conversation_id, new)
                if add_usage:
                    await conn.execute(hot.USAGE, _usage(conversation_id, in_tokens, out_tokens, cost_usd,
                                                         conversation_status))
                elif conversation_status is not None:
                    await conn.execute(update(conversations).where(conversations.c.id == conversation_id)
                                       .values(status=conversation_status, updated_at=now()))
            return await _append_in(conn, events, now(), self.origin) if events else []

    async def end_logged(self, run_id: str) -> None:
        """The end of a run recorded without its events (`finish_run`) is now in the log."""
        async with self.db.begin() as conn:
            await conn.execute(update(runs).where(runs.c.id == run_id, runs.c.ended_at.is_not(None))
                               .values(lease_owner=None, lease_expires_at=None))

    async def unlogged_ends(self) -> list[dict[str, Any]]:
        """Ended runs of conversations whose end may be missing from the log: recorded by a process that
        had not written their last events yet (`finish_run` without `events`)."""
        r = runs.c
        async with self.db.connect() as conn:
            rows = (await conn.execute(select(runs).where(
                r.ended_at.is_not(None), r.lease_owner.is_not(None), r.conversation_id.is_not(None),
                r.kind.in_(["loop", "graph"]), r.status.in_(["completed", "failed", "canceled"])))).mappings()
            return [dict(row) for row in rows]

    async def log_end(self, run_id: str, owner: str,
                      events: Sequence[tuple[str, str, dict[str, Any]]]) -> list[int] | None:
        """Append the missing last events of an ended run still marked with `owner` (compare-and-set: one
        process writes them) and clear the mark, in one transaction; their ids, or None when taken."""
        async with self.db.begin() as conn:
            taken = await conn.execute(update(runs).where(runs.c.id == run_id, runs.c.lease_owner == owner,
                                                          runs.c.ended_at.is_not(None))
                                       .values(lease_owner=None, lease_expires_at=None))
            if taken.rowcount == 0:
                return None
            return await _append_in(conn, events, now(), self.origin) if events else []

    async def run_state(self, run_id: str) -> dict[str, Any] | None:
        """The run's stored state: its continuation while paused, its final state once ended."""
        async with self.db.connect() as conn:
            return (await conn.execute(select(runs.c.state).where(runs.c.id == run_id))).scalar()

    async def run_key(self, run_id: str) -> str | None:
        """The API key that caused the run (its runs count against that key's limit)."""
        async with self.db.connect() as conn:
            return (await conn.execute(select(runs.c.key_id).where(runs.c.id == run_id))).scalar()

    async def get_run(self, run_id: str) -> dict[str, Any] | None:
        async with self.db.connect() as conn:
            row = (await conn.execute(select(runs).where(runs.c.id == run_id))).mappings().first()
        if row is None:
            return None
        r = dict(row)
        return {"id": r["id"], "agent": r["agent"], "realm": r["realm"], "conversation_id": r["conversation_id"],
                "parent_run_id": r["parent_run_id"],
                "kind": r["kind"], "status": r["status"], "finish_reason": r["finish_reason"],
                "usage": {"in_tokens": r["in_tokens"], "out_tokens": r["out_tokens"], "cost_usd": r["cost_usd"]},
                "started_at": r["started_at"], "ended_at": r["ended_at"]}

    # -- the event log ---------------------------------------------------------------------------------

    async def append_event(self, conversation_id: str, event: Any) -> int:
        """Append one event (anything with `type` and `model_dump()`) and return its id."""
        return (await self.append_events([(conversation_id, event.type, event.model_dump())]))[0]

    async def append_events(self, batch: Sequence[tuple[str, str, dict[str, Any]]]) -> list[int]:
        """Append (conversation_id, type, payload) events in one transaction; returns their ids in order.
        Ids are strictly increasing per conversation, drawn from the conversations' counters by a single
        UPDATE … RETURNING for the whole batch."""
        counts = Counter(cid for cid, _, _ in batch)
        stamp = now()
        if self.db.sqlite_file is not None:
            return await self.db.write_sqlite(lambda conn: _append_sqlite(conn, batch, counts, stamp))
        async with self.db.begin() as conn:
            return await _append_in(conn, batch, stamp, self.origin)

    async def events_after(self, conversation_id: str, after: int = 0, limit: int = 1000,
                           run_id: str | None = None) -> list[tuple[int, str, dict[str, Any]]]:
        """Stored events with id > `after` (of one run when `run_id` is given), in order, as (id, type, payload)."""
        query = hot.EVENTS_AFTER if run_id is None else hot.EVENTS_OF_RUN_AFTER
        params = {"b_id": conversation_id, "b_after": after, "b_limit": limit, "b_run": run_id}
        async with self.db.connect() as conn:
            return [(r.id, r.type, r.payload) for r in await conn.execute(query, params)]

    async def event_marks(self, conversation_id: str) -> tuple[int, int]:
        """(last event id, last pruned event id) of a conversation."""
        async with self.db.connect() as conn:
            row = (await conn.execute(hot.EVENT_MARKS, {"b_id": conversation_id})).first()
        return (row[0], row[1]) if row else (0, 0)

    async def prune_events(self, before: str) -> int:
        """Delete events created before `before` (RFC 3339), remembering per conversation how far the log
        was pruned so a replay from an older id can say it is unavailable. Returns how many were deleted."""
        c = conversations.c
        async with self.db.begin() as conn:
            marks = (await conn.execute(select(events.c.conversation_id, func.max(events.c.id))
                                        .where(events.c.created_at < before)
                                        .group_by(events.c.conversation_id))).all()
            deleted = 0
            for cid, upto in marks:
                await conn.execute(update(conversations).where(c.id == cid, c.pruned_event_id < upto)
                                   .values(pruned_event_id=upto))
                deleted += (await conn.execute(delete(events).where(events.c.conversation_id == cid,
                                                                    events.c.id <= upto))).rowcount
        return deleted

    # -- the audit log (append-only) -----------------------------------------------------------------

    async def append_audit(self, record: dict[str, Any]) -> None:
        """Append one gate decision (`gates.md` §3); records are never updated or deleted."""
        async with self.db.begin() as conn:
            await conn.execute(insert(audit_log).values(
                audit_id=record["audit_id"], at=record["at"], run_id=record.get("run_id"),
                conversation_id=record.get("conversation_id"), org_id=record.get("org_id"),
                realm=record.get("realm"), action=record.get("action", "tool.execute"), tool=record.get("tool"),
                decision=record["decision"], record=record))

    async def list_audit(self, *, run_id: str | None = None, tool: str | None = None, decision: str | None = None,
                         since: str | None = None, realms: Collection[str] | None = None, limit: int = 100,
                         after: int | None = None, org_id: str | None = None) -> list[tuple[int, dict[str, Any]]]:
        """Audit records, oldest first, as (position, record); `after` is the position of the last one seen."""
        a = audit_log.c
        query = select(a.seq, a.record).order_by(a.seq).limit(limit)
        for column, value in ((a.run_id, run_id), (a.tool, tool), (a.decision, decision), (a.org_id, org_id)):
            if value is not None:
                query = query.where(column == value)
        if since is not None:
            query = query.where(a.at >= since)
        if realms is not None:
            query = query.where(a.realm.in_(list(realms)))
        if after is not None:
            query = query.where(a.seq > after)
        async with self.db.connect() as conn:
            return [(row[0], row[1]) for row in await conn.execute(query)]

    # -- leases: a run belongs to the process that holds its lease -------------------------------------

    async def renew_leases(self, owner: str, until: str) -> None:
        """Extend the leases of `owner`'s working runs to `until` (never shortening one: a lease taken
        after `until` was computed stays as it is)."""
        r = runs.c
        async with self.db.begin() as conn:
            await conn.execute(update(runs).where(r.lease_owner == owner, r.status == "working")
                               .values(lease_expires_at=case((r.lease_expires_at < until, until),
                                                             else_=r.lease_expires_at)))

    async def expired_runs(self, at: str) -> list[dict[str, Any]]:
        """Runs still `working` whose lease expired before `at`: their process died."""
        async with self.db.connect() as conn:
            rows = (await conn.execute(select(runs).where(runs.c.status == "working",
                                                          runs.c.lease_expires_at < at))).mappings()
            return [dict(r) for r in rows]

    async def claim_run(self, run_id: str, owner: str, until: str, *, expired_before: str,
                        held_by: str | None = None) -> bool:
        """Take over a working run's lease (one process wins): one that expired before `expired_before`, or
        one still held by `held_by` (a process known to be dead)."""
        r = runs.c
        taken = r.lease_expires_at < expired_before if held_by is None else \
            or_(r.lease_expires_at < expired_before, r.lease_owner == held_by)
        async with self.db.begin() as conn:
            result = await conn.execute(update(runs).where(r.id == run_id, r.status == "working", taken)
                                        .values(lease_owner=owner, lease_expires_at=until))
        return result.rowcount > 0

    async def working_runs(self) -> list[dict[str, Any]]:
        """Every run still `working`, with its lease owner."""
        async with self.db.connect() as conn:
            return [dict(r) for r in (await conn.execute(select(runs).where(runs.c.status == "working"))).mappings()]

    # -- runs paused for a human (gates.md §4.6) -------------------------------------------------------

    async def pause_run(self, run_id: str, *, state: dict[str, Any], requests: Sequence[dict[str, Any]],
                        conversation_id: str | None, new: Sequence[Message] = (), in_tokens: int = 0,
                        out_tokens: int = 0, cost_usd: float | None = None, agent: str | None = None,
                        realm: str | None = None) -> None:
        """Record a run paused for approvals, in one transaction: its continuation (`state`), its new
        approval records, its new messages; the run becomes `input_required` with no lease (any process
        may resume it), and so does its conversation."""
        async with self.db.begin() as conn:
            await conn.execute(update(runs).where(runs.c.id == run_id).values(
                status="input_required", state=state, lease_owner=None, lease_expires_at=None,
                in_tokens=in_tokens, out_tokens=out_tokens, cost_usd=cost_usd))
            await self._add_approvals(conn, run_id, requests, agent, realm)
            if conversation_id is not None:
                await self._insert_new(conn, conversation_id, new)
                await conn.execute(update(conversations).where(conversations.c.id == conversation_id)
                                   .values(status="input_required", updated_at=now()))

    async def add_approvals(self, run_id: str, requests: Sequence[dict[str, Any]], *, agent: str | None = None,
                            realm: str | None = None) -> None:
        """Store approval records (those already stored are left as they are)."""
        async with self.db.begin() as conn:
            await self._add_approvals(conn, run_id, requests, agent, realm)

    @staticmethod
    async def _add_approvals(conn: Conn, run_id: str, requests: Sequence[dict[str, Any]],
                             agent: str | None, realm: str | None) -> None:
        known = {row[0] for row in await conn.execute(
            select(approvals.c.approval_id).where(approvals.c.run_id == run_id))}
        fresh = [r for r in requests if r["approval_id"] not in known]
        if fresh:
            await conn.execute(insert(approvals), [{**{k: r.get(k) for k in _APPROVAL_FIELDS}, "agent": agent,
                                                    "realm": realm,
                                                    "kind": "question" if r.get("question") else "approval"}
                                                   for r in fresh])

    async def paused_run_of(self, conversation_id: str) -> str | None:
        async with self.db.connect() as conn:
            return (await conn.execute(select(runs.c.id).where(
                runs.c.conversation_id == conversation_id, runs.c.status == "input_required",
                runs.c.ended_at.is_(None)))).scalar()

    async def take_paused_run(self, run_id: str, owner: str, until: str) -> dict[str, Any] | None:
        """Take a paused run's lease to resume it (compare-and-set: one process wins); its row, or None."""
        async with self.db.begin() as conn:
            taken = await conn.execute(update(runs).where(runs.c.id == run_id, runs.c.status == "input_required",
                                                          runs.c.ended_at.is_(None))
                                       .values(status="working", lease_owner=owner, lease_expires_at=until))
            if taken.rowcount == 0:
                return None
            return dict((await conn.execute(select(runs).where(runs.c.id == run_id))).mappings().one())

    async def pause_again(self, run_id: str) -> None:
        """Give back a run taken to resume that had nothing to resume with (its conversation stayed
        `input_required` meanwhile, so no message could start another run)."""
        async with self.db.begin() as conn:
            await conn.execute(update(runs).where(runs.c.id == run_id).values(
                status="input_required", lease_owner=None, lease_expires_at=None))

    async def paused_runs(self) -> list[str]:
        async with self.db.connect() as conn:
            return [row[0] for row in await conn.execute(select(runs.c.id).where(
                runs.c.status == "input_required", runs.c.ended_at.is_(None)))]

    async def get_approval(self, approval_id: str) -> dict[str, Any] | None:
        async with self.db.connect() as conn:
            row = (await conn.execute(select(approvals).where(approvals.c.approval_id == approval_id))).mappings()
            found = row.first()
        return dict(found) if found else None

    async def list_approvals(self, *, run_id: str | None = None, conversation_id: str | None = None,
                             status: str | None = None, realms: Collection[str] | None = None,
                             agents: Collection[str] | None = None, agent: str | None = None,
                             kind: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
        """Approval records (and questions: `kind`), oldest first."""
        a = approvals.c
        query = select(approvals).order_by(a.requested_at, a.approval_id).limit(limit)
        for column, value in ((a.run_id, run_id), (a.conversation_id, conversation_id), (a.status, status),
                              (a.agent, agent), (a.kind, kind)):
            if value is not None:
                query = query.where(column == value)
        if realms is not None:
            query = query.where(a.realm.in_(list(realms)))
        if agents is not None:
            query = query.where(a.agent.in_(list(agents)))
        async with self.db.connect() as conn:
            return [dict(r) for r in (await conn.execute(query)).mappings()]

    async def decide_approval(self, approval_id: str, *, status: str, decided_by: str, note: str | None,
                              when: str, answer: Any = None) -> bool:
        """Decide a pending approval (or answer a question) that has not expired at `when` (compare-and-set:
        the first decision wins). False when it was not pending, or has expired."""
        a = approvals.c
        async with self.db.begin() as conn:
            result = await conn.execute(update(approvals).where(
                a.approval_id == approval_id, a.status == "pending", a.expires_at > when)
                .values(status=status, decided_by=decided_by, decided_at=when, note=note, answer=answer))
        return result.rowcount > 0

    async def expire_approvals(self, when: str) -> list[dict[str, Any]]:
        """Mark every pending approval past its `expires_at` expired (decider `system:timeout`); returns them."""
        a = approvals.c
        async with self.db.begin() as conn:
            due = [dict(r) for r in (await conn.execute(select(approvals).where(
                a.status == "pending", a.expires_at <= when))).mappings()]
            if due:
                await conn.execute(update(approvals).where(
                    a.approval_id.in_([r["approval_id"] for r in due]), a.status == "pending")
                    .values(status="expired", decided_by="system:timeout", decided_at=when))
        return due

    async def cancel_approvals(self, run_id: str) -> int:
        a = approvals.c
        async with self.db.begin() as conn:
            result = await conn.execute(update(approvals).where(a.run_id == run_id, a.status == "pending")
                                        .values(status="cancelled", decided_by="system:cancel", decided_at=now()))
        return result.rowcount

    async def mark_executing(self, approval_ids: Collection[str]) -> set[str]:
        """Move approved approvals to `executing` before their calls run (at most once): the ids moved."""
        if not approval_ids:
            return set()
        a, moved = approvals.c, set()
        async with self.db.begin() as conn:
            for approval_id in approval_ids:  # compare-and-set, one by one: each moves in one process only
                result = await conn.execute(update(approvals).where(a.approval_id == approval_id,
                                                                    a.status == "approved").values(status="executing"))
                if result.rowcount:
                    moved.add(approval_id)
        return moved

    async def executed(self, run_id: str, tool_call_ids: Collection[str]) -> None:
        """Calls that ran to a result: their approvals go back from `executing` to `approved`."""
        if not tool_call_ids:
            return
        a = approvals.c
        async with self.db.begin() as conn:
            await conn.execute(update(approvals).where(a.run_id == run_id, a.status == "executing",
                                                       a.tool_call_id.in_(list(tool_call_ids)))
                               .values(status="approved"))

    # -- connector access requests --------------------------------------------------------------------

    async def add_access_request(self, record: dict[str, Any]) -> dict[str, Any]:
        """Store a pending access request, or return the pending one for the same connector, realm and org."""
        a = access_requests.c
        async with self.db.begin() as conn:
            found = (await conn.execute(select(access_requests).where(
                a.status == "pending", a.connector == record["connector"], a.realm == record["realm"],
                a.org_id == record.get("org_id")))).mappings().first()
            if found is not None:
                return dict(found)
            await conn.execute(insert(access_requests).values(**{c.name: record.get(c.name)
                                                                 for c in access_requests.c}))
        return record

    async def list_access_requests(self, *, status: str | None = None, realms: Collection[str] | None = None,
                                   limit: int = 200) -> list[dict[str, Any]]:
        a = access_requests.c
        query = select(access_requests).order_by(a.created_at.desc()).limit(limit)
        if status is not None:
            query = query.where(a.status == status)
        if realms is not None:
            query = query.where(a.realm.in_(list(realms)))
        async with self.db.connect() as conn:
            return [dict(r) for r in (await conn.execute(query)).mappings()]

    # -- idempotency keys --------------------------------------------------------------------------------

    async def remember_request(self, principal: str, key: str, route: str, body_hash: str,
                               response: dict[str, Any]) -> dict[str, Any] | None:
        """Record the response of an idempotent request. Returns None when it was recorded, or the earlier
        record `{route, body_hash, response}` when the key was used before."""
        row = {"principal": principal, "key": key, "route": route, "body_hash": body_hash, "response": response,
               "created_at": now()}
        try:
            async with self.db.begin() as conn:
                await conn.execute(insert(idempotency).values(**row))
        except IntegrityError:
            return await self.recall_request(principal, key)
        return None

    async def update_request(self, principal: str, key: str, response: dict[str, Any]) -> None:
        async with self.db.begin() as conn:
            await conn.execute(update(idempotency).where(idempotency.c.principal == principal,
                                                         idempotency.c.key == key).values(response=response))

    async def forget_request(self, principal: str, key: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(delete(idempotency).where(idempotency.c.principal == principal,
                                                         idempotency.c.key == key))

    async def recall_request(self, principal: str, key: str) -> dict[str, Any] | None:
        async with self.db.connect() as conn:
            found = (await conn.execute(select(idempotency).where(
                idempotency.c.principal == principal, idempotency.c.key == key))).mappings().first()
        return {"route": found["route"], "body_hash": found["body_hash"], "response": found["response"],
                "created_at": found["created_at"]} if found else None

    async def prune_requests(self, before: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(delete(idempotency).where(idempotency.c.created_at < before))
            await conn.execute(delete(stream_tokens).where(stream_tokens.c.expires_at < now()))


_APPROVAL_FIELDS = ("approval_id", "run_id", "conversation_id", "tool_call_id", "tool", "connector", "args", "effect",
                    "reason", "requested_at", "expires_at", "timeout_s", "status", "decided_by", "decided_at", "note",
                    "question")


def _number(batch: Sequence[tuple[str, str, dict[str, Any]]], counts: Counter[str],
            reserved: dict[str, int]) -> list[int]:
    """The ids of a batch's events, in order, from each conversation's counter after the reservation
    (`reserved[cid]` is the counter's new value). A KeyError means a conversation that does not exist."""
    next_id = {cid: reserved[cid] - n + 1 for cid, n in counts.items()}
    ids = []
    for cid, _, _ in batch:
        ids.append(next_id[cid])
        next_id[cid] += 1
    return ids


async def _append_in(conn: Conn, batch: Sequence[tuple[str, str, dict[str, Any]]], stamp: str,
                     origin: str = "") -> list[int]:
    """`Store.append_events` inside a transaction of SQLAlchemy's: one statement reserves the ids of every
    conversation of the batch, one inserts the events. On PostgreSQL the reserving statement also queues
    the batch's `EVENTS_CHANNEL` notifications (sent at commit, dropped on rollback): no extra round trip."""
    counts = Counter(cid for cid, _, _ in batch)
    if isinstance(conn, Inline):  # a SQLite file's: its plain sqlite3 connection, in the same transaction
        return _append_sqlite(conn.sqlite, batch, counts, stamp)
    cids = sorted(counts)
    if conn.dialect.name == "postgresql":  # RETURNING sees the new last_event_id: the batch's last id
        rows = await conn.execute(hot.RESERVE_EVENTS, {"b_ids": cids, "b_counts": [counts[cid] for cid in cids],
                                                       "b_channel": EVENTS_CHANNEL, "b_origin": json.dumps(origin)})
    else:
        c = conversations.c
        rows = await conn.execute(update(conversations).where(c.id.in_(cids)).values(
            last_event_id=c.last_event_id + case(counts, value=c.id)).returning(c.id, c.last_event_id))
    reserved = {row[0]: row[1] for row in rows}
    ids = _number(batch, counts, reserved)
    await conn.execute(hot.INSERT_EVENTS, [
        {"conversation_id": cid, "id": i, "run_id": payload.get("run_id"), "type": kind, "payload": payload,
         "created_at": stamp} for i, (cid, kind, payload) in zip(ids, batch, strict=True)])
    return ids


def _append_sqlite(conn: sqlite3.Connection, batch: Sequence[tuple[str, str, dict[str, Any]]],
                   counts: Counter[str], stamp: str) -> list[int]:
    """`Store.append_events` as plain sqlite3 statements, run on the SQLite writer thread."""
    cids = sorted(counts)
    cases = " ".join("WHEN ? THEN ?" for _ in cids)
    marks = ",".join("?" for _ in cids)
    params = [v for cid in cids for v in (cid, counts[cid])] + cids
    reserved = dict(conn.execute(f"UPDATE conversations SET last_event_id = last_event_id + CASE id {cases} END "
                                 f"WHERE id IN ({marks}) RETURNING id, last_event_id", params).fetchall())
    ids = _number(batch, counts, reserved)
    rows = [(cid, i, payload.get("run_id"), kind, json.dumps(payload, ensure_ascii=False), stamp)
            for i, (cid, kind, payload) in zip(ids, batch, strict=True)]
    conn.executemany("INSERT INTO events (conversation_id, id, run_id, type, payload, created_at) "
                     "VALUES (?, ?, ?, ?, ?, ?)", rows)
    return ids


def _usage(conversation_id: str, in_tokens: int, out_tokens: int, cost_usd: float | None,
           status: str | None = None) -> dict[str, Any]:
    """The parameters of `statements.USAGE`."""
    return {"b_id": conversation_id, "b_in": in_tokens, "b_out": out_tokens, "b_cost": cost_usd,
            "b_status": status, "b_stamp": now()}


def _conversation(row: dict[str, Any]) -> dict[str, Any]:
    """The API shape of a conversation row (`server-contract.md` §3)."""
    return {"id": row["id"], "agent": row["agent"], "title": row["title"], "realm": row["realm"],
            "created_at": row["created_at"], "updated_at": row["updated_at"], "status": row["status"],
            "usage": {"in_tokens": row["in_tokens"], "out_tokens": row["out_tokens"], "cost_usd": row["cost_usd"]},
            **({"client_id": row["client_id"]} if row.get("client_id") else {}),
            **({"is_sub_agent": True, "parent_conversation_id": row.get("parent_conversation_id"),
                "parent_run_id": row["parent_run_id"], "parent_tool_call_id": row.get("parent_tool_call_id")}
               if row.get("is_sub_agent") else {})}


def _message_row(conversation_id: str, m: Message) -> dict[str, Any]:
    body = m.model_dump()
    body["metadata"] = {**body["metadata"], "is_persisted": True}
    body["conversation_id"] = conversation_id
    return {"id": m.id, "conversation_id": conversation_id, "run_id": m.run_id, "role": m.role,
            "created_at": m.created_at, "schema_version": m.schema_version, "body": body}
