"""The processes that execute runs (`server/durable/engine.py`, PostgreSQL only): each beats while it lives, and one
that stopped beating is dead. Times come from the database's clock, so machines whose clocks disagree still
agree on who is dead."""

from __future__ import annotations

from sqlalchemy import delete, select, text, update

from ringlet.store.engine import Db
from ringlet.store.schema import workers

CLOCK = "EXTRACT(EPOCH FROM clock_timestamp())"
BEAT = (f"INSERT INTO workers (id, role, started_at, seen_at) VALUES (%s, %s, %s, {CLOCK}) "
        "ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at WHERE workers.seen_at > 0")
"""One beat (psycopg parameters: id, role, started_at): registers the worker (again, if it was taken for dead
and forgotten), or records that it lives; one that retired stays retired."""
BEAT_AND_LOOK = (f"WITH beat AS ({BEAT}) SELECT id, id <> %s AND seen_at < {CLOCK} - %s FROM workers")
"""One beat that also looks at the others, in the same statement (psycopg parameters: id, role, started_at, id,
silent_s): every other worker, and whether it has not beaten for `silent_s` seconds (or retired), as
`Workers.silent` says; the beating worker itself is never silent (it beats)."""


class Workers:
    def __init__(self, db: Db) -> None:
        self.db = db

    async def silent(self, silent_s: float) -> dict[str, bool]:
        """Every worker, and whether it has not beaten for `silent_s` seconds (or retired): one query."""
        async with self.db.connect() as conn:
            silent = text(f"{CLOCK} - :silent").bindparams(silent=silent_s)
            rows = await conn.execute(select(workers.c.id, workers.c.seen_at < silent))
            return {worker: bool(quiet) for worker, quiet in rows}

    async def forget(self, worker_id: str) -> bool:
        """Drop a dead worker's record once its runs were handed on; whether this call dropped it (of the
        processes that handed them on together, exactly one did)."""
        async with self.db.begin() as conn:
            return (await conn.execute(delete(workers).where(workers.c.id == worker_id))).rowcount == 1

    async def retire(self, worker_id: str) -> None:
        """A worker that stops: it counts as dead at once, so a live one takes over its runs now."""
        async with self.db.begin() as conn:
            await conn.execute(update(workers).where(workers.c.id == worker_id).values(seen_at=0.0))
