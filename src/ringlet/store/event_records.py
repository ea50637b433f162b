"""Each conversation's event log (`server-contract.md` §4): ids strictly increasing per conversation, drawn
from the conversation's counter (`last_event_id`) by one UPDATE … RETURNING for a whole batch, and pruned
after the retention (`pruned_event_id` remembers how far, so a replay from an older id can say so).

On PostgreSQL, every transaction that appends events notifies `EVENTS_CHANNEL` at commit, once per
conversation, with `{"c": conversation id, "i": its last event id in the batch, "n": how many of the batch's
events are its, "o": the writing store's origin, "e": those events}`: the events `i-n+1 … i` are stored, and
`e` holds them in order as `[type, payload]` pairs when their JSON is at most `INLINE_BYTES` long (else the
key is absent: read them with `spans`). The other server processes' live feeds listen
(`ringlet.server.durable.feed`).
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlalchemy import case, delete, func, select, text, update

from ringlet._ids import now
from ringlet.store import statements as hot
from ringlet.store.driven import Driven
from ringlet.store.engine import Db, HotConn, Inline
from ringlet.store.records import Json
from ringlet.store.schema import conversations, events

EVENTS_CHANNEL = "ringlet_events"
INLINE_BYTES = 7000
"""The most JSON of a conversation's events a notification carries: PostgreSQL takes payloads under 8000
bytes, and the rest of the notification (ids, origin) is small."""
_SPANS = text(
    "SELECT e.conversation_id, e.id, e.type, e.payload FROM unnest(CAST(:b_ids AS VARCHAR[]), "
    "CAST(:b_after AS BIGINT[]), CAST(:b_upto AS BIGINT[])) AS s(id, a, u) "
    "JOIN events AS e ON e.conversation_id = s.id AND e.id > s.a AND e.id <= s.u ORDER BY e.conversation_id, e.id")
_LAST_IDS = text("SELECT id, last_event_id FROM conversations WHERE id = ANY(CAST(:b_ids AS VARCHAR[]))")
Batch = Sequence[tuple[str, str, Json]]
"""Events to append: (conversation id, type, payload)."""


class EventLog:
    """The `events` table."""

    def __init__(self, db: Db, origin: str) -> None:
        self.db, self.origin = db, origin

    async def append(self, conversation_id: str, event: Any) -> int:
        """Append one event (anything with `type` and `model_dump()`) and return its id."""
        return (await self.append_batch([(conversation_id, event.type, event.model_dump())]))[0]

    async def append_batch(self, batch: Batch) -> list[int]:
        """Append (conversation_id, type, payload) events in one transaction; returns their ids in order."""
        counts = Counter(cid for cid, _, _ in batch)
        stamp = now()
        if self.db.sqlite_file is not None:
            return await self.db.write_sqlite(lambda conn: _append_sqlite(conn, batch, counts, stamp))
        async with self.db.hot() as conn:
            return await append_in(conn, batch, stamp, self.origin)

    async def after(self, conversation_id: str, after: int = 0, limit: int = 1000,
                    run_id: str | None = None) -> list[tuple[int, str, Json]]:
        """Stored events with id > `after` (of one run when `run_id` is given), in order, as (id, type, payload)."""
        query = hot.EVENTS_AFTER if run_id is None else hot.EVENTS_OF_RUN_AFTER
        params = {"b_id": conversation_id, "b_after": after, "b_limit": limit, "b_run": run_id}
        async with self.db.hot_read() as conn:
            return [(r[0], r[1], r[2]) for r in await conn.execute(query, params)]

    async def spans(self, spans: Sequence[tuple[str, int, int]]) -> list[tuple[str, int, str, Json]]:
        """PostgreSQL: the stored events of several conversations in one query, each (conversation id, after,
        upto) giving the ids after `after` up to `upto`, in order per conversation, as (conversation id, id,
        type, payload)."""
        params = {"b_ids": [s[0] for s in spans], "b_after": [s[1] for s in spans], "b_upto": [s[2] for s in spans]}
        async with self.db.hot_read() as conn:
            return [(r[0], r[1], r[2], r[3]) for r in await conn.execute(_SPANS, params)]

    async def last_ids(self, conversation_ids: Sequence[str]) -> dict[str, int]:
        """PostgreSQL: the last event id of several conversations, in one query (a missing one: absent)."""
        async with self.db.hot_read() as conn:
            return {r[0]: r[1] for r in await conn.execute(_LAST_IDS, {"b_ids": list(conversation_ids)})}

    async def marks(self, conversation_id: str) -> tuple[int, int]:
        """(last event id, last pruned event id) of a conversation."""
        async with self.db.hot_read() as conn:
            row = (await conn.execute(hot.EVENT_MARKS, {"b_id": conversation_id})).first()
        return (row[0], row[1]) if row else (0, 0)

    async def prune(self, before: str) -> int:
        """Delete events created before `before` (RFC 3339), remembering per conversation how far the log
        was pruned. Returns how many were deleted."""
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


def _number(batch: Batch, counts: Counter[str], reserved: dict[str, int]) -> list[int]:
    """The ids of a batch's events, in order, from each conversation's counter after the reservation
    (`reserved[cid]` is the counter's new value). A KeyError means a conversation that does not exist."""
    next_id = {cid: reserved[cid] - n + 1 for cid, n in counts.items()}
    ids = []
    for cid, _, _ in batch:
        ids.append(next_id[cid])
        next_id[cid] += 1
    return ids


async def append_in(conn: HotConn, batch: Batch, stamp: str, origin: str = "") -> list[int]:
    """`EventLog.append_batch` inside the caller's transaction: one statement reserves the ids of every
    conversation of the batch, one inserts the events. On PostgreSQL the reserving statement also queues the
    batch's `EVENTS_CHANNEL` notifications (sent at commit, dropped on rollback): no extra round trip."""
    counts = Counter(cid for cid, _, _ in batch)
    if isinstance(conn, Inline):  # a SQLite file's: its plain sqlite3 connection, in the same transaction
        return _append_sqlite(conn.sqlite, batch, counts, stamp)
    if isinstance(conn, Driven):  # PostgreSQL's, on the driver: the events in one statement
        return await _append_pg(conn, batch, counts, stamp, origin)
    cids = sorted(counts)
    if conn.dialect.name == "postgresql":  # RETURNING sees the new last_event_id: the batch's last id
        rows = await conn.execute(hot.RESERVE_EVENTS, {"b_ids": cids, "b_counts": [counts[cid] for cid in cids],
                                                       "b_events": _inline(batch, cids), "b_channel": EVENTS_CHANNEL,
                                                       "b_origin": json.dumps(origin)})
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


def _inline(batch: Batch, cids: list[str]) -> list[str | None]:
    """Per conversation of `cids`, the JSON of its events in the batch as `[[type, payload], …]`, or None
    when it is longer than `INLINE_BYTES` (ASCII: its length is its size)."""
    mine: dict[str, list[tuple[str, Json]]] = {cid: [] for cid in cids}
    for cid, kind, payload in batch:
        mine[cid].append((kind, payload))
    texts = [json.dumps(mine[cid], separators=(",", ":")) for cid in cids]
    return [t if len(t) <= INLINE_BYTES else None for t in texts]


async def _append_pg(conn: Driven, batch: Batch, counts: Counter[str], stamp: str, origin: str) -> list[int]:
    """`append_in` on the driver: the same reservation and notifications, then the events inserted as one
    array per column (one statement, where SQLAlchemy's insert would be one per event)."""
    cids = sorted(counts)
    rows = await conn.execute(hot.RESERVE_EVENTS, {
        "b_ids": cids, "b_counts": [counts[cid] for cid in cids], "b_events": _inline(batch, cids),
        "b_channel": EVENTS_CHANNEL, "b_origin": json.dumps(origin)})
    ids = _number(batch, counts, {row[0]: row[1] for row in rows})
    await conn.pg.execute(hot.INSERT_EVENTS_PG, [cid for cid, _, _ in batch], ids,
                          [p.get("run_id") for _, _, p in batch], [kind for _, kind, _ in batch],
                          [json.dumps(p) for _, _, p in batch], [stamp] * len(batch))
    return ids


def _append_sqlite(conn: sqlite3.Connection, batch: Batch, counts: Counter[str], stamp: str) -> list[int]:
    """`EventLog.append_batch` as plain sqlite3 statements, run on the SQLite writer thread."""
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
