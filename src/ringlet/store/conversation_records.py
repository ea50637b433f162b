"""Conversations and their transcripts (`server-contract.md` §3).

A message is stored once: appending one whose id is already stored is a no-op, so retries never duplicate
a transcript. A conversation's status (`idle`, `running`, `input_required`) says whether a run holds it;
its usage is the sum of its runs'. A deleted conversation is kept (soft delete) until it is purged.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import and_, bindparam, delete, or_, select, update

from ringlet._ids import new_id, now
from ringlet.messages import Message
from ringlet.store import statements as hot
from ringlet.store.engine import Db, HotConn
from ringlet.store.records import Conversation, Json
from ringlet.store.schema import approvals, conversations, events, messages, run_tapes, runs, schedules

TITLE_CHARS = 60


class Conversations:
    """The `conversations` and `messages` tables."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def create(self, *, agent: str, title: str = "", realm: str = "default", org_id: str | None = None,
                     user_id: str | None = None, parent_run_id: str | None = None,
                     conversation_id: str | None = None, parent_conversation_id: str | None = None,
                     parent_tool_call_id: str | None = None, transient: bool = False,
                     client_id: str | None = None, forked_from: tuple[str, str] | None = None) -> Conversation:
        """A new conversation; one with a `parent_run_id` is a sub-agent's (hidden from default lists). A
        `transient` one (a `/v1` run's without a conversation, on the engine) is born deleted: runs run in it,
        no route lists or shows it, and `purge` removes it once its run has ended. `forked_from`: a fork's
        origin, (conversation id, message id) — `fork` makes one with its transcript."""
        stamp = now()
        row = {"id": conversation_id or new_id("c"), "agent": agent, "title": title, "realm": realm,
               "org_id": org_id, "user_id": user_id, "parent_run_id": parent_run_id,
               "parent_conversation_id": parent_conversation_id, "parent_tool_call_id": parent_tool_call_id,
               "is_sub_agent": parent_run_id is not None, "client_id": client_id, "status": "idle", "in_tokens": 0,
               "out_tokens": 0, "cost_usd": None, "priced": True, "last_event_id": 0, "created_at": stamp,
               "updated_at": stamp, "deleted_at": stamp if transient else None,
               "forked_from_conversation_id": forked_from[0] if forked_from else None,
               "forked_from_message_id": forked_from[1] if forked_from else None}
        async with self.db.hot() as conn:
            await conn.execute(hot.INSERT_CONVERSATION, row)
        return Conversation.of(row)

    async def fork(self, source: Conversation, at_message_id: str, history: Sequence[Message], *,
                   org_id: str | None, user_id: str | None, title: str | None = None) -> Conversation:
        """A new conversation forked from `source` at message `at_message_id`, holding copies of `history`
        (messages of `source`) in order, in one transaction. Each copy has a new id (ids are unique across the
        table), names its original in `copied_from` and keeps its run id; references between them (a
        compaction's `covers`, `compacted_into`) follow the new ids. Its event log starts empty. `title`: its
        title (default: the source's, marked as a fork by `fork_title`; "" takes it from the first user message
        a run stores)."""
        stamp, cid = now(), new_id("c")
        renamed = {m.id: new_id("m") for m in history}
        row = {"id": cid, "agent": source.agent, "title": fork_title(source.title) if title is None else title,
               "realm": source.realm, "org_id": org_id,
               "user_id": user_id, "parent_run_id": None, "parent_conversation_id": None,
               "parent_tool_call_id": None, "is_sub_agent": False, "client_id": None, "status": "idle",
               "in_tokens": 0, "out_tokens": 0, "cost_usd": None, "priced": True, "last_event_id": 0,
               "created_at": stamp, "updated_at": stamp, "deleted_at": None,
               "forked_from_conversation_id": source.id, "forked_from_message_id": at_message_id}
        copies = [_copied(m, cid, renamed) for m in history]
        async with self.db.begin() as conn:
            await conn.execute(hot.INSERT_CONVERSATION, row)
            if copies:
                await conn.execute(hot.INSERT_MESSAGES, [message_row(cid, m) for m in copies])
        return Conversation.of(row)

    async def get(self, conversation_id: str, *, realm: str | None = None) -> Conversation | None:
        """A conversation, or None when it is missing, deleted or (with `realm`) in another realm."""
        query = hot.CONVERSATION if realm is None else hot.CONVERSATION_IN_REALM
        async with self.db.hot_read() as conn:
            row = (await conn.execute(query, {"b_id": conversation_id, "b_realm": realm})).mappings().first()
        return Conversation.of(row) if row else None

    async def list(self, *, realms: Collection[str] | None = None, agent: str | None = None, limit: int = 50,
                   after: tuple[str, str] | None = None, include_sub_agents: bool = False,
                   agents: Collection[str] | None = None) -> list[Conversation]:
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
        query = newest_first(query, c.updated_at, c.id, after, limit)
        async with self.db.connect() as conn:
            return [Conversation.of(r) for r in (await conn.execute(query)).mappings()]

    async def delete(self, conversation_id: str) -> bool:
        """Soft delete; True if it existed."""
        async with self.db.begin() as conn:
            result = await conn.execute(update(conversations).where(
                conversations.c.id == conversation_id, conversations.c.deleted_at.is_(None)).values(deleted_at=now()))
        return result.rowcount > 0

    async def purge(self, conversation_id: str) -> None:
        """Remove a conversation for good with its sub-agents' conversations: their transcripts, event logs,
        schedules, runs' recordings and rows. Their runs' records stay (status, usage, cost) without
        conversation or state, and their approval records (an audit trail) without conversation."""
        c, ids, level = conversations.c, [conversation_id], [conversation_id]
        async with self.db.begin() as conn:
            while level := list((await conn.execute(select(c.id).where(c.parent_conversation_id.in_(level))))
                                .scalars()):
                ids += level
            for table in (events, messages, schedules):
                await conn.execute(delete(table).where(table.c.conversation_id.in_(ids)))
            await conn.execute(delete(run_tapes).where(run_tapes.c.run_id.in_(  # recordings hold the transcript
                select(runs.c.id).where(runs.c.conversation_id.in_(ids)))))
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
            await conn.execute(hot.USAGE, usage_params(conversation_id, in_tokens, out_tokens, cost_usd))

    # -- the transcript ----------------------------------------------------------------------------------

    async def append_messages(self, conversation_id: str, new: Sequence[Message]) -> int:
        """Store messages in order, each once (an id already stored is skipped); returns how many were new.
        The first user message gives an untitled conversation its title."""
        if not new:
            return 0
        async with self.db.begin() as conn:
            stored = set((await conn.execute(hot.MESSAGE_IDS, {"b_ids": [m.id for m in new]})).scalars())
            fresh = [m for m in new if m.id not in stored]
            if fresh:
                await conn.execute(hot.INSERT_MESSAGES, [message_row(conversation_id, m) for m in fresh])
                first_user = next((m.text for m in fresh if m.role == "user" and m.text.strip()), None)
                if first_user is not None:
                    await conn.execute(hot.TITLE, {"b_id": conversation_id, "b_title": title_of(first_user)})
        for m in fresh:
            m.metadata["is_persisted"] = True
        return len(fresh)

    async def update_messages(self, conversation_id: str, changed: Sequence[Message]) -> None:
        """Rewrite stored messages whose metadata changed (compaction marks them `compacted_into`)."""
        async with self.db.begin() as conn:
            for m in changed:
                await conn.execute(update(messages).where(messages.c.id == m.id,
                                                          messages.c.conversation_id == conversation_id)
                                   .values(body=message_row(conversation_id, m)["body"]))

    async def load_messages(self, conversation_id: str, *, limit: int | None = None,
                            before: str | None = None) -> list[Message]:
        """The transcript in order (the last `limit` messages when given, those before the message id
        `before` when given), migrated to the current schema."""
        async with self.db.connect() as conn:
            return await transcript_in(conn, conversation_id, limit=limit, before=before)


async def transcript_in(conn: HotConn, conversation_id: str, *, limit: int | None = None,
                        before: str | None = None) -> list[Message]:
    """`Conversations.load_messages` inside the caller's transaction."""
    m = messages.c
    query: Any = hot.TRANSCRIPT  # the whole transcript: what every run reads, built once
    params = {"b_id": conversation_id, "b_before": before}
    if limit is None and before is not None:  # a run's history before its prompt: built once too
        query = hot.TRANSCRIPT_BEFORE
    elif limit is not None:  # the last `limit` of them
        query = select(m.body, m.seq).where(m.conversation_id == bindparam("b_id"))
        if before is not None:
            query = query.where(m.seq < select(m.seq).where(m.id == bindparam("b_before")).scalar_subquery())
        inner = query.order_by(m.seq.desc()).limit(limit).subquery()
        query = select(inner.c.body, inner.c.seq).order_by(inner.c.seq)
    bodies = [row[0] for row in await conn.execute(query, params)]
    return [Message.validate(body) for body in bodies]


async def insert_new(conn: HotConn, conversation_id: str, new: Sequence[Message]) -> None:
    """Insert a run's own messages in one statement, inside the caller's transaction; an id already stored is
    left as it is."""
    if not new:
        return
    statement = hot.INSERT_NEW_MESSAGES["sqlite" if conn.dialect.name == "sqlite" else "postgresql"]
    await conn.execute(statement, [message_row(conversation_id, m) for m in new])
    for m in new:
        m.metadata["is_persisted"] = True


def _copied(m: Message, conversation_id: str, renamed: dict[str, str]) -> Message:
    """A fork's copy of `m`: its new id, its references to the fork's other copies renamed alike."""
    meta = {k: v for k, v in m.metadata.items() if k != "is_persisted"}
    meta["copied_from"] = meta.get("copied_from", m.id)
    if isinstance(meta.get("compacted_into"), str):
        meta["compacted_into"] = renamed.get(meta["compacted_into"], meta["compacted_into"])
    if isinstance(meta.get("covers"), list):
        meta["covers"] = [renamed.get(i, i) for i in meta["covers"]]
    return replace(m, id=renamed[m.id], conversation_id=conversation_id, metadata=meta)


def title_of(first_user: str) -> str:
    """A conversation's title from its first user message."""
    return " ".join(first_user.split())[:TITLE_CHARS]


def fork_title(title: str) -> str:
    """A fork's title, told apart from its source's in a list: `X` → `X (fork)`, `X (fork)` → `X (fork 2)`,
    `X (fork 2)` → `X (fork 3)`; an untitled source's fork stays untitled (a run's first message names it)."""
    if not title:
        return ""
    marked = re.fullmatch(r"(.*) \(fork(?: (\d+))?\)", title, re.DOTALL)
    return f"{title} (fork)" if marked is None else f"{marked[1]} (fork {int(marked[2] or 1) + 1})"


def usage_params(conversation_id: str, in_tokens: int, out_tokens: int, cost_usd: float | None,
                 status: str | None = None) -> Json:
    """The parameters of `statements.USAGE`."""
    return {"b_id": conversation_id, "b_in": in_tokens, "b_out": out_tokens, "b_cost": cost_usd,
            "b_status": status, "b_stamp": now()}


def message_row(conversation_id: str, m: Message) -> Json:
    body = m.model_dump()
    body["metadata"] = {**body["metadata"], "is_persisted": True}
    body["conversation_id"] = conversation_id
    return {"id": m.id, "conversation_id": conversation_id, "run_id": m.run_id, "role": m.role,
            "created_at": m.created_at, "schema_version": m.schema_version, "body": body}


def newest_first(query: Any, when: Any, key: Any, after: tuple[Any, str] | None, limit: int) -> Any:
    """`query`'s rows newest first by `when` (ties by `key`), a page of `limit` after the cursor `after`
    (the last row's `(when, key)`; None: from the newest)."""
    if after is not None:
        query = query.where(or_(when < after[0], and_(when == after[0], key < after[1])))
    return query.order_by(when.desc(), key.desc()).limit(limit)

