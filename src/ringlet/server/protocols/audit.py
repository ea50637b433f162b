"""`GET /api/v1/audit`: the policy and approval audit log, for admins (`server-contract.md` §8)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from ringlet.server.http.auth import Principal, need
from ringlet.server.http.schemas import ERRORS
from ringlet.server.runs.service import runs_of

router = APIRouter(prefix="/api/v1")
Admin = Annotated[Principal, Depends(need("admin"))]


class AuditPage(BaseModel):
    data: list[dict[str, Any]]
    next_cursor: str | None


@router.get("/audit", response_model=AuditPage, responses=ERRORS)
async def list_audit(request: Request, principal: Admin, run_id: str | None = None, tool: str | None = None,
                     decision: str | None = None, since: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=500)] = 100,
                     cursor: Annotated[str | None, Query(pattern=r"^[0-9]{0,18}$", description=(
                         "`next_cursor` of the previous page; empty or left out: the first page"))] = None,
                     ) -> dict[str, Any]:
    """Gate decisions, oldest first, of the key's organisation, realms and agents."""
    local = request.app.state.ringlet.settings.auth_mode == "none"
    rows = await runs_of(request).records.audit.list(
        run_id=run_id, tool=tool, decision=decision, since=since, realms=principal.realms, limit=limit + 1,
        after=int(cursor) if cursor else None, org_id=None if local else principal.org_id)
    page = rows[:limit]
    records = [entry.record for entry in page if principal.may_use(entry.record.get("agent") or "")]
    return {"data": records, "next_cursor": str(page[-1].position) if len(rows) > limit else None}


class AccessRequestList(BaseModel):
    data: list[dict[str, Any]]


@router.get("/access-requests", response_model=AccessRequestList, responses=ERRORS)
async def list_access_requests(request: Request, principal: Admin,
                               status: str | None = "pending") -> dict[str, Any]:
    """Connector access requests made through `request_connector_access` (pending ones by default)."""
    found = await runs_of(request).records.audit.access_requests(status=status, realms=principal.realms)
    return {"data": [asdict(r) for r in found]}
