"""Triggers (`server-contract.md` §6): webhooks and cron schedules, stored so schedules survive restarts.

A cron trigger keeps `next_fire_at` (shown by the API) and `firing`, its last fire that ran (a workflow id,
`server/firing/triggers.py`). A fire claims its trigger by replacing `firing` in one conditional UPDATE
(compare-and-set on the value it read), so of two fires that both see the previous one finished, one runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, insert, select, update

from ringlet._ids import new_id, now
from ringlet.store.engine import Db
from ringlet.store.records import Trigger
from ringlet.store.schema import triggers

FIELDS = ("name", "agent", "kind", "cron", "timezone", "message_template", "conversation_id", "realm", "secret",
          "enabled")
"""What a new trigger is made of (`Triggers.create`)."""


class Triggers:
    """The `triggers` table."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def create(self, fields: Mapping[str, Any], *, next_fire_at: str | None, created_by: str,
                     created_by_key: str | None = None) -> Trigger:
        """A new trigger of `fields` (`FIELDS`); `created_by_key`: the API key that made it (its fires count
        against that key)."""
        stamp = now()
        row = {"id": new_id("tr"), **{k: fields.get(k) for k in FIELDS}, "next_fire_at": next_fire_at,
               "last_fired_at": None, "firing": None, "created_by": created_by, "created_by_key": created_by_key,
               "created_at": stamp, "updated_at": stamp}
        async with self.db.begin() as conn:
            await conn.execute(insert(triggers).values(**row))
        return Trigger.of(row)

    async def get(self, trigger_id: str, *, with_secret: bool = False) -> Trigger | None:
        """A trigger; its secret too `with_secret` (to check a webhook's signature)."""
        async with self.db.connect() as conn:
            row = (await conn.execute(select(triggers).where(triggers.c.id == trigger_id))).mappings().first()
        return None if row is None else Trigger.of(row, with_secret=with_secret)

    async def list(self) -> list[Trigger]:
        async with self.db.connect() as conn:
            rows = (await conn.execute(select(triggers).order_by(triggers.c.created_at))).mappings()
            return [Trigger.of(r) for r in rows]

    async def update(self, trigger_id: str, changes: Mapping[str, Any]) -> Trigger | None:
        """Change columns of a trigger; the trigger as it now is, or None when it is gone."""
        async with self.db.begin() as conn:
            result = await conn.execute(update(triggers).where(triggers.c.id == trigger_id)
                                        .values(**changes, updated_at=now()))
        return await self.get(trigger_id) if result.rowcount else None

    async def delete(self, trigger_id: str) -> bool:
        async with self.db.begin() as conn:
            return (await conn.execute(delete(triggers).where(triggers.c.id == trigger_id))).rowcount > 0

    async def claim(self, trigger_id: str, previous: str | None, firing: str, changes: Mapping[str, Any]) -> bool:
        """Make `firing` the trigger's fire (with `changes`) if its fire is still `previous`; True for the one
        caller that did."""
        c = triggers.c
        async with self.db.begin() as conn:
            result = await conn.execute(update(triggers).where(
                c.id == trigger_id, c.firing.is_(None) if previous is None else c.firing == previous)
                .values(firing=firing, **changes, updated_at=now()))
        return result.rowcount > 0
