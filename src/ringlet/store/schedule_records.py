"""Agents' schedules (`builtin-tools-and-subagents.md` §4), stored so they survive restarts.

Each schedule belongs to `(org_id, realm, conversation_id)` and keeps `next_run_at`, and `slot`: the number
of its pending wake-up. The server wakes a schedule with one durable workflow per slot
(`server/firing/schedules.py`, told by `wake` whenever a schedule's timing changes); a wake-up claims its slot by
moving `slot` on in one conditional UPDATE (`advance`, a compare-and-set), so exactly one fires each slot
and a wake-up made stale by a change fires nothing. `ConversationSchedules` is the book one run's tools
use: it sees and changes only its own conversation's schedules.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.sql import ColumnElement

from ringlet._ids import new_id, now
from ringlet.errors import ToolFailure
from ringlet.store.engine import Db
from ringlet.store.records import Json, Schedule
from ringlet.store.schema import conversations, schedules

DEFAULT_MAX_ACTIVE = 20
Wake = Callable[[str, int, str | None], Awaitable[None]]
"""`wake(schedule_id, slot, next_run_at)`: the schedule's pending wake-up is now number `slot`, at `next_run_at`
(None: it has none); every earlier one is void."""


@dataclass(frozen=True, slots=True)
class KeyQuota:
    """The API key a schedule is made under: its fires count against that key, which may have at most `most`
    active schedules (0: no limit) repeating no more often than every `min_interval_s` seconds."""

    key_id: str
    most: int = 0
    min_interval_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Scope:
    """Whose schedules: one conversation of one realm of one org (None matches an org-less record)."""

    conversation_id: str
    realm: str
    org_id: str | None

    def where(self) -> list[ColumnElement[bool]]:
        c = schedules.c
        org = c.org_id.is_(None) if self.org_id is None else c.org_id == self.org_id
        return [c.conversation_id == self.conversation_id, c.realm == self.realm, org]


class Schedules:
    """The `schedules` table: the tools' reads and writes (always within a `Scope`) and the wake-ups'
    `advance`."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.wake: Wake | None = None
        """Told after every change of a schedule's timing (the server's firing, `server/firing/schedules.py`);
        None: nothing wakes schedules (a library caller's book)."""

    async def _woken(self, schedule_id: str, slot: int, next_run_at: str | None) -> None:
        if self.wake is not None:
            await self.wake(schedule_id, slot, next_run_at)

    async def create(self, scope: Scope, *, agent: str, kind: str, spec: Json, message: str,
                     next_run_at: str, created_by: str | None, max_active: int = DEFAULT_MAX_ACTIVE,
                     key: KeyQuota | None = None) -> Schedule | None:
        """Store an active schedule; None when the conversation has `max_active` active ones already, and
        ToolFailure when `key` (the API key creating it) has its most. The counts and the insert share a
        transaction that holds the conversation's row (PostgreSQL) or this process's write turn (SQLite), so
        concurrent calls of one conversation cannot pass a limit together."""
        stamp = now()
        row = {"schedule_id": new_id("sch"), "org_id": scope.org_id, "realm": scope.realm,
               "conversation_id": scope.conversation_id, "agent": agent, "kind": kind, "spec": spec,
               "message": message, "next_run_at": next_run_at, "runs": 0, "status": "active", "slot": 0,
               "firing": None, "created_by": created_by, "created_by_key": key.key_id if key else None,
               "created_at": stamp, "updated_at": stamp}
        async with self.db.begin() as conn:
            await conn.execute(select(conversations.c.id).where(conversations.c.id == scope.conversation_id)
                               .with_for_update())
            active = (await conn.execute(select(func.count()).select_from(schedules).where(
                schedules.c.conversation_id == scope.conversation_id, schedules.c.status == "active"))).scalar_one()
            if active >= max_active:
                return None
            if key is not None and key.most:
                mine = (await conn.execute(select(func.count()).select_from(schedules).where(
                    schedules.c.created_by_key == key.key_id, schedules.c.status == "active"))).scalar_one()
                if mine >= key.most:
                    raise ToolFailure("invalid_arguments", f"the API key of this conversation already has {mine} "
                                      "active schedules, the most one key may have (server setting "
                                      "max_schedules_per_key); remove one with remove_schedule first")
            await conn.execute(insert(schedules).values(**row))
        await self._woken(row["schedule_id"], 0, next_run_at)
        return Schedule.of(row)

    async def get(self, schedule_id: str, scope: Scope | None = None) -> Schedule | None:
        """A schedule, or None when it is missing or (with `scope`) another conversation's."""
        query = select(schedules).where(schedules.c.schedule_id == schedule_id, *(scope.where() if scope else ()))
        async with self.db.connect() as conn:
            row = (await conn.execute(query)).mappings().first()
        return Schedule.of(row) if row else None

    async def list(self, *, scope: Scope | None = None, status: str | None = None) -> list[Schedule]:
        """Schedules oldest first: one conversation's (`scope`), or every one."""
        query = select(schedules).where(*(scope.where() if scope else ()))
        if status is not None:
            query = query.where(schedules.c.status == status)
        async with self.db.connect() as conn:
            rows = await conn.execute(query.order_by(schedules.c.created_at, schedules.c.schedule_id))
            return [Schedule.of(r) for r in rows.mappings()]

    async def update(self, schedule_id: str, changes: Mapping[str, Any],
                     scope: Scope | None = None) -> Schedule | None:
        """Apply `changes`; None when the schedule is missing (or outside `scope`). A new `next_run_at`
        takes a new wake-up slot (the pending one is void)."""
        values: dict[str, Any] = {**changes, "updated_at": now()}
        if "next_run_at" in changes:
            values["slot"] = schedules.c.slot + 1
        async with self.db.begin() as conn:
            result = await conn.execute(update(schedules).where(
                schedules.c.schedule_id == schedule_id, *(scope.where() if scope else ())).values(**values))
        updated = await self.get(schedule_id) if result.rowcount else None
        if updated is not None and "next_run_at" in changes:
            await self._woken(schedule_id, updated.slot, updated.next_run_at if updated.status == "active" else None)
        return updated

    async def remove(self, schedule_id: str, scope: Scope | None = None) -> bool:
        where = (schedules.c.schedule_id == schedule_id, *(scope.where() if scope else ()))
        async with self.db.begin() as conn:
            slot = (await conn.execute(select(schedules.c.slot).where(*where))).scalar()
            result = await conn.execute(delete(schedules).where(*where))
        if result.rowcount and slot is not None:
            await self._woken(schedule_id, slot + 1, None)  # its pending wake-up is void
        return result.rowcount > 0

    async def remove_conversation(self, conversation_id: str) -> int:
        """Delete every schedule of a conversation (it was deleted); how many there were."""
        async with self.db.begin() as conn:
            result = await conn.execute(delete(schedules).where(schedules.c.conversation_id == conversation_id))
        return result.rowcount

    async def count_active(self, conversation_id: str) -> int:
        async with self.db.connect() as conn:
            return (await conn.execute(select(func.count()).select_from(schedules).where(
                schedules.c.conversation_id == conversation_id, schedules.c.status == "active"))).scalar_one()

    async def advance(self, schedule_id: str, slot: int, next_run_at: str | None, *,
                      fired_by: str | None) -> bool:
        """Claim wake-up `slot` of an active schedule: move it to slot + 1 due at `next_run_at` (None: the
        schedule is done), counting a run when `fired_by` (the fire's workflow id, kept as the schedule's
        last fire). True only for the one caller that moved it: False when the slot is stale (another
        wake-up claimed it, or the schedule changed, ended or went meanwhile)."""
        values: dict[str, Any] = {"next_run_at": next_run_at, "slot": slot + 1, "updated_at": now()}
        if fired_by is not None:
            values.update(runs=schedules.c.runs + 1, firing=fired_by)
        if next_run_at is None:
            values["status"] = "done"
        async with self.db.begin() as conn:
            result = await conn.execute(update(schedules).where(
                schedules.c.schedule_id == schedule_id, schedules.c.status == "active",
                schedules.c.slot == slot).values(**values))
        return result.rowcount > 0

    def book(self, conversation_id: str, *, agent: str, realm: str = "default", org_id: str | None = None,
             created_by: str | None = None, max_active: int = DEFAULT_MAX_ACTIVE, key: KeyQuota | None = None,
             timezone: str = "UTC", clock: Callable[[], float] = time.time) -> ConversationSchedules:
        """The schedule book of one conversation, for `Agent.stream(schedules=...)`; `clock` decides what
        is in the past; `key`: the API key the schedules are made under, and its limits."""
        return ConversationSchedules(self, Scope(conversation_id, realm, org_id), agent=agent,
                                     created_by=created_by, max_active=max_active, key=key, timezone=timezone,
                                     clock=clock)


@dataclass(eq=False)
class ConversationSchedules:
    """A `ringlet.tools.builtin.schedules.ScheduleBook` over the store: one conversation's schedules. Created by
    the run's user (`created_by`), whom the schedule's fires then run as."""

    records: Schedules
    scope: Scope
    agent: str
    created_by: str | None = None
    max_active: int = DEFAULT_MAX_ACTIVE
    key: KeyQuota | None = None
    timezone: str = "UTC"
    clock: Callable[[], float] = field(default_factory=lambda: time.time)

    @property
    def min_interval_s(self) -> float:
        """A repeating schedule fires no more often than this (the key's limit)."""
        return self.key.min_interval_s if self.key is not None else 0.0

    def now(self) -> float:
        return self.clock()

    async def create(self, kind: str, spec: Json, message: str, next_run_at: str) -> Schedule | None:
        return await self.records.create(self.scope, agent=self.agent, kind=kind, spec=spec, message=message,
                                         next_run_at=next_run_at, created_by=self.created_by,
                                         max_active=self.max_active, key=self.key)

    async def get(self, schedule_id: str) -> Schedule | None:
        return await self.records.get(schedule_id, self.scope)

    async def list(self) -> list[Schedule]:
        return await self.records.list(scope=self.scope)

    async def update(self, schedule_id: str, changes: Mapping[str, Any]) -> Schedule | None:
        return await self.records.update(schedule_id, changes, self.scope)

    async def remove(self, schedule_id: str) -> bool:
        return await self.records.remove(schedule_id, self.scope)

    async def count_active(self) -> int:
        return await self.records.count_active(self.scope.conversation_id)
