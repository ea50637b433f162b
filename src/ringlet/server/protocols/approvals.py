"""Approvals and questions over HTTP (`server-contract.md` §5, `gates.md` §4.4): list, decide one, decide
a batch, answer a question.

Deciding needs the `approve` scope; the decider is the key's principal, never a field of the body. A
decision resumes the paused run in this process (whichever process paused it), and its events join the
conversation's event log.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request

from ringlet.server.http.auth import Principal, need
from ringlet.server.http.errors import ApiError
from ringlet.server.http.schemas import ERRORS, ErrorBody
from ringlet.server.protocols import approvals_schemas as s
from ringlet.server.protocols.access import conversation_for
from ringlet.server.runs.service import runs_of
from ringlet.store.records import Approval

router = APIRouter(prefix="/api/v1")
Chat = Annotated[Principal, Depends(need("chat"))]
Approve = Annotated[Principal, Depends(need("approve"))]
Status = Literal["pending", "approved", "denied", "expired", "cancelled", "executing"]
_CONFLICT: dict[int | str, dict[str, Any]] = {
    **ERRORS, 409: {"model": ErrorBody, "description": "`approval_already_decided` or `approval_expired`"}}


@router.get("/chat/conversations/{cid}/approvals", response_model=s.ApprovalList, responses=ERRORS)
async def conversation_approvals(cid: str, request: Request, principal: Chat,
                                 status: Status | None = None) -> dict[str, Any]:
    await conversation_for(request, cid, principal)
    return {"data": await runs_of(request).records.approvals.list(conversation_id=cid, status=status,
                                                                  kind="approval")}


@router.get("/approvals", response_model=s.ApprovalList, responses=ERRORS)
async def all_approvals(request: Request, principal: Chat, status: Status | None = "pending",
                        agent: str | None = None, realm: str | None = None) -> dict[str, Any]:
    """Approvals visible to the key (its realms and agents), pending ones by default."""
    if realm is not None:
        principal.check_realm(realm)
    realms = [realm] if realm is not None else principal.realms
    return {"data": await runs_of(request).records.approvals.list(status=status, realms=realms, kind="approval",
                                                                  agents=principal.agents, agent=agent)}


@router.post("/chat/conversations/{cid}/approvals/{approval_id}", response_model=s.Decided,
             responses=_CONFLICT)
async def decide(cid: str, approval_id: str, body: s.Decide, request: Request,
                 principal: Approve) -> dict[str, Any]:
    """Approve or deny one call; the run resumes with it."""
    await conversation_for(request, cid, principal)
    runs = runs_of(request)
    record = await runs.records.approvals.get(approval_id)
    if record is None or record.kind != "approval" or record.conversation_id != cid:
        raise ApiError(404, "approval_not_found", f"no approval {approval_id!r} in conversation {cid}")
    return await runs.decide(record, approved=body.approved, note=body.note, decided_by=principal.user_id)


@router.post("/chat/conversations/{cid}/approvals", response_model=s.BatchResults, responses=ERRORS)
async def decide_batch(cid: str, body: s.DecideBatch, request: Request, principal: Approve) -> dict[str, Any]:
    """Decide several calls at once, each by `approval_id` or `tool_call_id`; errors are per item."""
    await conversation_for(request, cid, principal)
    runs = runs_of(request)
    records = await runs.records.approvals.list(conversation_id=cid, kind="approval", limit=1000)
    by_id = {r.approval_id: r for r in records}
    by_call: dict[str, Approval] = {}
    for r in records:  # a call's pending record, else its latest
        if r.tool_call_id not in by_call or r.status == "pending":
            by_call[r.tool_call_id] = r
    results, woken = [], set[str]()
    for d in body.decisions:
        key = {"approval_id": d.approval_id} if d.approval_id else {"tool_call_id": d.tool_call_id}
        record = by_id.get(d.approval_id) if d.approval_id else by_call.get(d.tool_call_id or "")
        if d.approval_id is None and d.tool_call_id is None:
            results.append({**key, "error": {"code": "validation_error",
                                             "message": "each decision needs approval_id or tool_call_id"}})
            continue
        if record is None:
            results.append({**key, "error": {"code": "approval_not_found",
                                             "message": f"no approval {next(iter(key.values()))!r} in "
                                                        f"conversation {cid}"}})
            continue
        try:
            decided = await runs.decide(record, approved=d.approved, note=d.note, decided_by=principal.user_id,
                                          resume=False)
            woken.add(record.run_id)
        except ApiError as exc:
            results.append({**key, "approval_id": record.approval_id,
                            "error": {"code": exc.code, "message": exc.message, "details": exc.details}})
            continue
        results.append({**key, "tool_call_id": record.tool_call_id, **decided})
    for run_id in woken:  # all decided first, so the run resumes once with every decision
        await runs.resume(run_id)
    return {"results": results}


@router.post("/approvals/{approval_id}", response_model=s.Decided, responses=_CONFLICT)
async def decide_any(approval_id: str, body: s.Decide, request: Request, principal: Approve) -> dict[str, Any]:
    """Decide an approval by its id alone: also those of runs without a conversation (the /v1 API)."""
    runs = runs_of(request)
    record = await runs.records.approvals.get(approval_id)
    visible = record is not None and record.kind == "approval" and \
        principal.sees(record.realm or "default") and principal.may_use(record.agent or "")
    if record is None or not visible:
        raise ApiError(404, "approval_not_found", f"no approval {approval_id!r}")
    return await runs.decide(record, approved=body.approved, note=body.note, decided_by=principal.user_id)


@router.post("/chat/conversations/{cid}/questions/{question_id}", response_model=s.Answered, responses={
    **ERRORS, 409: {"model": ErrorBody, "description": "`question_already_answered`"}})
async def answer(cid: str, question_id: str, body: s.Answer, request: Request, principal: Chat) -> dict[str, Any]:
    """Answer a question (`ask_question`); the run resumes with the answer as the call's result."""
    await conversation_for(request, cid, principal)
    runs = runs_of(request)
    record = await runs.records.approvals.get(question_id)
    if record is None or record.kind != "question" or record.conversation_id != cid:
        raise ApiError(404, "question_not_found", f"no question {question_id!r} in conversation {cid}")
    return await runs.answer(record, body.answer, answered_by=principal.user_id)

