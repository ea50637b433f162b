"""Forking a conversation (issue 44): `POST /api/v1/chat/conversations/{id}/fork` makes a new conversation
with the transcript up to a message, its own (empty) event log and its origin in `forked_from`; the original
is left as it was.

    {at_message_id}                         a copy up to and including that message; no run starts
    {at_message_id, edit: {content}}        at a user message: the copy holds what came before it, and the
                                            edited message is sent as a new one (a run starts)
    {at_message_id, tool_result: {content}} at a tool call (its result message, or the assistant message that
                                            made it): that result replaced (never run), and the model goes on
    {at_message_id, rerun: true}            the same, but the call runs again, through every gate

The copy is built by `ringlet.agent.forks.fork_at`, the library's own fork. The key must see the conversation
(else 404, as for an unknown id) and may start runs only where it could start them in a new conversation.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from ringlet.agent.forks import ForkError, fork_at
from ringlet.errors import ConfigError
from ringlet.server.http.auth import Principal, need
from ringlet.server.http.errors import ApiError
from ringlet.server.http.schemas import ERRORS, ErrorBody
from ringlet.server.protocols import forks_schemas as s
from ringlet.server.protocols.access import conversation_for
from ringlet.server.protocols.chat import pending
from ringlet.server.runs.service import runs_of
from ringlet.store.conversation_records import title_of

router = APIRouter(prefix="/api/v1")
Chat = Annotated[Principal, Depends(need("chat"))]


@router.post("/chat/conversations/{cid}/fork", status_code=201, response_model=s.Forked, responses={
    **ERRORS, 404: {"model": ErrorBody, "description": "No such conversation (or one the key may not see), "
                                                         "or no such message in it"},
    409: {"model": ErrorBody, "description": "A run of the conversation is in progress"},
    422: {"model": ErrorBody, "description": "A fork the message cannot take: `edit` of a message that is "
                                               "not a user's, `tool_result` and `rerun` together, no tool call"}})
async def fork_conversation(cid: str, body: s.ForkConversation, request: Request, principal: Chat) -> dict[str, Any]:
    """A new conversation forked from this one at `at_message_id` (see the module's table); with `edit`,
    `tool_result` or `rerun` a run starts in it (`run_id`): follow it with `GET …/{new id}/events`."""
    runs = runs_of(request)
    source = await conversation_for(request, cid, principal)
    hosted = runs.catalog.get(source.agent)  # an agent no longer hosted: 404 agent_not_found
    if source.status == "running" or cid in runs.active:
        raise ApiError(409, "run_in_progress", f"conversation {cid} has an active run; fork it once the run has "
                       "ended (or POST …/cancel)")
    graph = hosted.agent().kind == "graph"  # its transcript holds no tool calls of its own
    if graph and (body.tool_result is not None or body.rerun):
        raise ApiError(422, "validation_error", f"agent {source.agent!r} is a graph agent: its runs make no tool "
                       "calls of their own to replace or re-run; fork at a user message")
    messages = await runs.records.conversations.load_messages(cid)
    try:
        fork = fork_at(messages, body.at_message_id, edit=body.edit.content if body.edit else None,
                       tool_result=body.tool_result.content if body.tool_result else None,
                       tool_call_id=body.tool_call_id or (body.tool_result.tool_call_id if body.tool_result else None),
                       rerun=body.rerun)
    except ForkError as exc:
        if exc.code == "message_not_found":
            raise ApiError(404, "message_not_found", f"conversation {cid} has no message "
                           f"{body.at_message_id!r}") from None
        raise ApiError(422, "validation_error", exc.message, details={"reason": exc.code}) from None
    if fork.runs:  # the run it starts must be one the key may start (agent, realm, the agent's home realm)
        principal.check_agent(source.agent)
        principal.check_realm(source.realm)
        hosted.check_home(source.realm)
    retitled = fork.runs and not any(m.role == "user" for m in fork.history)  # its first user message edited
    title = "" if retitled else title_of(body.edit.content) if body.edit else None  # (None: "<source's> (fork)")
    forked = await runs.records.conversations.fork(source, body.at_message_id, fork.history,
                                                  org_id=principal.org_id, user_id=principal.user_id, title=title)
    run_id = None
    if fork.runs:
        try:  # no run (a limit, storage): no fork either, the client may try again
            run_id = (await runs.fork(forked, fork.prompt, principal=principal)).run_id
        except ConfigError as exc:
            raise ApiError(422, "validation_error", str(exc)) from None
    conversation = await runs.records.conversations.get(forked.id) or forked
    shown = await runs.records.conversations.load_messages(forked.id, limit=200)
    return {"conversation": conversation, "messages": [m.model_dump(mode="json") for m in shown],
            "pending": await pending(runs, conversation_id=forked.id), "run_id": run_id}
