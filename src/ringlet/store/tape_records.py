"""Runs' recordings (`run_tapes`): one tape per segment of a run (its start, then each resume), written in
the transaction that records the run's pause or end, read back by a replay (`ringlet.replay`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, select

from ringlet._ids import now
from ringlet.store import statements as hot
from ringlet.store.engine import Db
from ringlet.store.records import Json
from ringlet.store.schema import run_tapes

__all__ = ["Tapes", "add_tape"]


async def add_tape(conn: Any, run_id: str, body: Json) -> None:
    """Store `body` as the run's segment `body["segment"]` (inside the caller's transaction): a segment
    stored at a pause and again at the end keeps the later, fuller tape."""
    await conn.execute(hot.UPSERT_TAPE[conn.dialect.name], {"run_id": run_id, "segment": body.get("segment", 0),
                                                           "body": body, "created_at": now()})


class Tapes:
    """The `run_tapes` table."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def of(self, run_id: str) -> list[Json]:
        """The run's tapes in order (none: it was not recorded)."""
        t = run_tapes.c
        async with self.db.connect() as conn:
            rows = await conn.execute(select(t.body).where(t.run_id == run_id).order_by(t.segment))
            return [row.body for row in rows]

    async def prune(self, before: str) -> int:
        """Forget the recordings of runs last recorded before `before` (RFC 3339): the event log they are
        compared with is pruned by then. Returns how many tapes were deleted."""
        t = run_tapes.c
        old = select(t.run_id).group_by(t.run_id).having(func.max(t.created_at) < before)
        async with self.db.begin() as conn:
            return (await conn.execute(delete(run_tapes).where(t.run_id.in_(old)))).rowcount
