"""The audit log of gate decisions (`gates.md` §3), append-only, and connectors' access requests."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import insert, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ringlet.store.engine import Db
from ringlet.store.records import AccessRequest, AuditEntry, Json
from ringlet.store.schema import access_requests, audit_log


class Audit:
    """The `audit_log` and `access_requests` tables."""

    def __init__(self, db: Db) -> None:
        self.db = db

    async def append(self, record: Json) -> None:
        """Append one gate decision; records are never updated or deleted. A record appended again (the
        same `audit_id`: a durable run's step executed again after its worker died) is kept once."""
        async with self.db.begin() as conn:
            dialect_insert = sqlite_insert if conn.dialect.name == "sqlite" else postgresql_insert
            await conn.execute(dialect_insert(audit_log).values(
                audit_id=record["audit_id"], at=record["at"], run_id=record.get("run_id"),
                conversation_id=record.get("conversation_id"), org_id=record.get("org_id"),
                realm=record.get("realm"), action=record.get("action", "tool.execute"), tool=record.get("tool"),
                decision=record["decision"], record=record).on_conflict_do_nothing(index_elements=["audit_id"]))

    async def list(self, *, run_id: str | None = None, tool: str | None = None, decision: str | None = None,
                   since: str | None = None, realms: Collection[str] | None = None, limit: int = 100,
                   after: int | None = None, org_id: str | None = None) -> list[AuditEntry]:
        """Audit records, oldest first; `after` is the position of the last one seen."""
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
            return [AuditEntry(row[0], row[1]) for row in await conn.execute(query)]

    # -- connector access requests ------------------------------------------------------------------------

    async def request_access(self, request: AccessRequest) -> AccessRequest:
        """Store a pending access request, or return the pending one for the same connector, realm and org."""
        a = access_requests.c
        async with self.db.begin() as conn:
            found = (await conn.execute(select(access_requests).where(
                a.status == "pending", a.connector == request.connector, a.realm == request.realm,
                a.org_id == request.org_id))).mappings().first()
            if found is not None:
                return AccessRequest.of(found)
            await conn.execute(insert(access_requests).values(
                request_id=request.request_id, connector=request.connector, reason=request.reason,
                requested_by=request.requested_by, org_id=request.org_id, realm=request.realm,
                status=request.status, created_at=request.created_at))
        return request

    async def access_requests(self, *, status: str | None = None, realms: Collection[str] | None = None,
                              limit: int = 200) -> list[AccessRequest]:
        a = access_requests.c
        query = select(access_requests).order_by(a.created_at.desc()).limit(limit)
        if status is not None:
            query = query.where(a.status == status)
        if realms is not None:
            query = query.where(a.realm.in_(list(realms)))
        async with self.db.connect() as conn:
            return [AccessRequest.of(r) for r in (await conn.execute(query)).mappings()]
