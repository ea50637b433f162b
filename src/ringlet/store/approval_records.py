"""Approvals and questions (`gates.md` §4): a record per call that waits for a human's decision, or per
question that waits for an answer. The first decision wins (a compare-and-set on `pending`); an approved
call moves to `executing` before it runs, so it runs at most once, and back to `approved` once it ran."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import insert, select, update

from ringlet._ids import now
from ringlet.store.engine import Conn, Db
from ringlet.store.records import Approval, Json
from ringlet.store.schema import approvals

_FIELDS = ("approval_id", "run_id", "conversation_id", "tool_call_id", "tool", "connector", "args", "effect", "reason",
           "requested_at", "expires_at", "timeout_s", "status", "decided_by", "decided_at", "note", "question")


class Approvals:
    """The `approvals` table."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def add(self, run_id: str, requests: Sequence[Json], *, agent: str | None = None,
                  realm: str | None = None) -> None:
        """Store approval records, each an `ApprovalRequest` as a dict (those already stored are left as
        they are)."""
        async with self.db.begin() as conn:
            await add_in(conn, run_id, requests, agent, realm)

    async def get(self, approval_id: str) -> Approval | None:
        async with self.db.connect() as conn:
            found = (await conn.execute(select(approvals).where(approvals.c.approval_id == approval_id))) \
                .mappings().first()
        return Approval.of(found) if found else None

    async def list(self, *, run_id: str | None = None, conversation_id: str | None = None, status: str | None = None,
                   realms: Collection[str] | None = None, agents: Collection[str] | None = None,
                   agent: str | None = None, kind: str | None = None, limit: int = 200) -> list[Approval]:
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
            return [Approval.of(r) for r in (await conn.execute(query)).mappings()]

    async def decide(self, approval_id: str, *, status: str, decided_by: str, note: str | None, when: str,
                     answer: Any = None) -> bool:
        """Decide a pending approval (or answer a question) that has not expired at `when` (compare-and-set:
        the first decision wins). False when it was not pending, or has expired."""
        a = approvals.c
        async with self.db.begin() as conn:
            result = await conn.execute(update(approvals).where(
                a.approval_id == approval_id, a.status == "pending", a.expires_at > when)
                .values(status=status, decided_by=decided_by, decided_at=when, note=note, answer=answer))
        return result.rowcount > 0

    async def expire(self, when: str, *, run_id: str | None = None) -> list[Approval]:
        """Mark every pending approval past its `expires_at` expired (decider `system:timeout`), or only those
        of `run_id`; returns them."""
        a = approvals.c
        async with self.db.begin() as conn:
            due = [Approval.of(r) for r in (await conn.execute(select(approvals).where(
                a.status == "pending", a.expires_at <= when, *([a.run_id == run_id] if run_id else [])))).mappings()]
            if due:
                await conn.execute(update(approvals).where(
                    a.approval_id.in_([r.approval_id for r in due]), a.status == "pending")
                    .values(status="expired", decided_by="system:timeout", decided_at=when))
        return due

    async def cancel(self, run_id: str) -> int:
        """Cancel a run's pending approvals and questions; how many."""
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


async def add_in(conn: Conn, run_id: str, requests: Sequence[Json], agent: str | None, realm: str | None) -> None:
    """`Approvals.add` inside the caller's transaction."""
    known = {row[0] for row in await conn.execute(select(approvals.c.approval_id).where(approvals.c.run_id == run_id))}
    fresh = [r for r in requests if r["approval_id"] not in known]
    if fresh:
        await conn.execute(insert(approvals), [{**{k: r.get(k) for k in _FIELDS}, "agent": agent, "realm": realm,
                                                "kind": "question" if r.get("question") else "approval"}
                                               for r in fresh])
