"""The processes that execute runs (`server/engine.py`): each beats while it lives, and one that stopped
beating is dead. Times come from the database's clock, so machines whose clocks disagree still agree on
who is dead."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select, text, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ringlet._ids import now
from ringlet.store.engine import Db
from ringlet.store.schema import workers

_CLOCK = {"postgresql": "EXTRACT(EPOCH FROM clock_timestamp())", "sqlite": "unixepoch('subsec')"}


class Workers:
    def __init__(self, db: Db) -> None:
        self.db = db

    def _clock(self, dialect: str) -> str:
        return _CLOCK.get(dialect, _CLOCK["postgresql"])

    async def beat(self, worker_id: str, role: str) -> None:
        """Record that `worker_id` is alive now (registering it on its first beat)."""
        async with self.db.begin() as conn:
            clock = text(self._clock(conn.dialect.name))
            dialect_insert = sqlite_insert if conn.dialect.name == "sqlite" else postgresql_insert
            row = dialect_insert(workers).values(id=worker_id, role=role, started_at=now(), seen_at=clock)
            await conn.execute(row.on_conflict_do_update(index_elements=["id"], set_={"seen_at": clock}))

    async def dead(self, silent_s: float) -> list[str]:
        """Workers that have not beaten for `silent_s` seconds."""
        async with self.db.connect() as conn:
            clock = text(f"({self._clock(conn.dialect.name)}) - :silent").bindparams(silent=silent_s)
            return list((await conn.execute(select(workers.c.id).where(workers.c.seen_at < clock))).scalars())

    async def alive(self, silent_s: float) -> list[dict[str, Any]]:
        """Workers that have beaten within `silent_s` seconds, oldest first."""
        async with self.db.connect() as conn:
            clock = text(f"({self._clock(conn.dialect.name)}) - :silent").bindparams(silent=silent_s)
            rows = await conn.execute(select(workers).where(workers.c.seen_at >= clock)
                                      .order_by(workers.c.started_at))
            return [dict(r) for r in rows.mappings()]

    async def forget(self, worker_id: str, *, unless_seen_since: float | None = None) -> bool:
        """Drop a worker's record (it is dead and its runs were handed on); False when it beat meanwhile."""
        async with self.db.begin() as conn:
            query = delete(workers).where(workers.c.id == worker_id)
            if unless_seen_since is not None:
                clock = text(f"({self._clock(conn.dialect.name)}) - :silent").bindparams(silent=unless_seen_since)
                query = query.where(workers.c.seen_at < clock)
            return (await conn.execute(query)).rowcount > 0

    async def retire(self, worker_id: str) -> None:
        """A worker that stops: it counts as dead at once, so a live one takes over its runs now."""
        async with self.db.begin() as conn:
            await conn.execute(update(workers).where(workers.c.id == worker_id).values(seen_at=0.0))
