"""Triggers (`server-contract.md` §6): webhooks and cron schedules, stored so schedules survive restarts.

A cron trigger keeps `next_fire_at`. A scheduler claims a due fire by moving `next_fire_at` forward in one
conditional UPDATE, so exactly one process (and one fire at a time) wins it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, insert, select, update

from ringlet._ids import new_id, now
from ringlet.store.engine import Db
from ringlet.store.schema import triggers

FIELDS = ("name", "agent", "kind", "cron", "timezone", "message_template", "conversation_id", "realm", "secret",
          "enabled")


def _record(row: Any) -> dict[str, Any]:
    r = dict(row)
    r["has_secret"] = r.pop("secret") is not None
    r.pop("created_by", None)
    return r


class Triggers:
    def __init__(self, db: Db) -> None:
        self.db = db

    async def create(self, fields: dict[str, Any], *, next_fire_at: str | None, created_by: str) -> dict[str, Any]:
        stamp = now()
        row = {"id": new_id("tr"), **{k: fields.get(k) for k in FIELDS}, "next_fire_at": next_fire_at,
               "last_fired_at": None, "created_by": created_by, "created_at": stamp, "updated_at": stamp}
        async with self.db.begin() as conn:
            await conn.execute(insert(triggers).values(**row))
        return _record(row)

    async def get(self, trigger_id: str, *, with_secret: bool = False) -> dict[str, Any] | None:
        async with self.db.connect() as conn:
            row = (await conn.execute(select(triggers).where(triggers.c.id == trigger_id))).mappings().first()
        if row is None:
            return None
        return {**_record(row), "secret": row["secret"]} if with_secret else _record(row)

    async def list(self) -> list[dict[str, Any]]:
        async with self.db.connect() as conn:
            rows = (await conn.execute(select(triggers).order_by(triggers.c.created_at))).mappings()
            return [_record(r) for r in rows]

    async def update(self, trigger_id: str, changes: dict[str, Any]) -> dict[str, Any] | None:
        async with self.db.begin() as conn:
            result = await conn.execute(update(triggers).where(triggers.c.id == trigger_id)
                                        .values(**changes, updated_at=now()))
        return await self.get(trigger_id) if result.rowcount else None

    async def delete(self, trigger_id: str) -> bool:
        async with self.db.begin() as conn:
            return (await conn.execute(delete(triggers).where(triggers.c.id == trigger_id))).rowcount > 0

    async def due(self, at: str) -> list[dict[str, Any]]:
        """Enabled cron triggers whose next fire time has come."""
        async with self.db.connect() as conn:
            rows = (await conn.execute(select(triggers).where(
                triggers.c.kind == "cron", triggers.c.enabled.is_(True), triggers.c.next_fire_at <= at))).mappings()
            return [{**_record(r), "secret": None} for r in rows]

    async def claim(self, trigger_id: str, expected_next: str, new_next: str | None, *, fired: bool) -> bool:
        """Move a due trigger's `next_fire_at` from `expected_next` to `new_next`; True for the one winner."""
        values: dict[str, Any] = {"next_fire_at": new_next}
        if fired:
            values["last_fired_at"] = now()
        async with self.db.begin() as conn:
            result = await conn.execute(update(triggers).where(
                triggers.c.id == trigger_id, triggers.c.next_fire_at == expected_next).values(**values))
        return result.rowcount > 0
