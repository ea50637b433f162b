"""The route, `POST /ai-sdk/{agent}`: a chat request starts a run on its new user message, or with the
approval responses its last assistant message carries decides the paused run's approvals and questions and
resumes it; it is answered with the run's UI message stream."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from ringlet.server.http.auth import Principal, need
from ringlet.server.http.errors import ApiError
from ringlet.server.http.limits import hold_stream
from ringlet.server.http.schemas import ERRORS, SSE_EVENT, ErrorBody
from ringlet.server.protocols.access import named_conversation
from ringlet.server.protocols.aisdk import runs
from ringlet.server.protocols.aisdk.inputs import approval_responses, documented_input, new_messages, parsed
from ringlet.server.protocols.aisdk.stream import Followed, idle, response
from ringlet.server.runs.service import Runs, runs_of
from ringlet.store.records import Approval

router = APIRouter(prefix="/ai-sdk")
Chat = Annotated[Principal, Depends(need("chat"))]
_STREAM = {"content": {"text/event-stream": {"schema": SSE_EVENT}},
           "description": "The AI SDK's UI message stream (header `x-vercel-ai-ui-message-stream: v1`): each chunk "
                          "one `data:` line of its JSON, `data: [DONE]` at the end; `: ping` comments keep it "
                          "open."}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERRORS, 200: _STREAM,
    400: {"model": ErrorBody, "description": "The chat id names a conversation of another agent"},
    409: {"model": ErrorBody, "description": "The conversation waits on approvals, or one was decided already"}}
_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": documented_input()}}}}


@router.post("/{agent}/", responses=_RESPONSES, openapi_extra=_BODY)
@router.post("/{agent}", responses=_RESPONSES, openapi_extra=_BODY)
async def chat(agent: str, request: Request, principal: Chat) -> Any:
    """Run `agent` on the chat's new user message, or on its approval responses; stream UI message chunks."""
    service = runs_of(request)
    hosted = service.catalog.get(agent)  # 404 agent_not_found
    principal.check_agent(agent)
    body = parsed(await request.body())
    conversation = await named_conversation(service, principal, hosted, body.id)
    assert conversation is not None
    responses = await _responded(service, conversation.id, approval_responses(body))
    incoming = [] if responses else new_messages(body, await service.records.conversations.load_messages(
        conversation.id))
    slot = hold_stream()  # 429 over the key's streams, before a run starts or resumes
    run_id, after = None, 0
    try:
        if responses:
            run_id, after = await runs.decide(service, principal, conversation, responses)
        elif incoming:
            run_id = await runs.start(service, principal, conversation, incoming)
    except BaseException:
        if slot is not None:
            slot.release()
        raise
    if run_id is None:  # nothing new to run (a client reconnecting)
        return response(request, principal, idle(conversation.id), slot)
    followed = Followed(service, conversation.id, run_id, after)
    return response(request, principal, followed.frames(), slot, followed)


async def _responded(service: Runs, cid: str, found: list[tuple[str, bool, str | None]]
                     ) -> list[tuple[Approval, bool, str | None]]:
    """The approval responses that answer this conversation's pending approvals and questions (those
    decided already are history); 404 for an approval id the conversation does not have."""
    out = []
    for approval_id, approved, reason in found:
        record = await service.records.approvals.get(approval_id)
        if record is None or record.conversation_id != cid:
            raise ApiError(404, "approval_not_found", f"no approval {approval_id!r} in conversation {cid}")
        if record.status == "pending":
            out.append((record, approved, reason))
    return out


