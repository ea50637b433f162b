"""The native API (`/api/v1`): agents, conversations, messages with their SSE stream, the conversation
event stream with replay, cancel, context and runs (`server-contract.md` §3–4)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import asdict, replace
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse

from ringlet._ids import new_id, now
from ringlet.agent import Agent
from ringlet.errors import ConfigError
from ringlet.events import ErrorEvent
from ringlet.gates.approval import NEVER
from ringlet.messages import AudioPart, FilePart, ImagePart, Message, Part, TextPart
from ringlet.server.catalog import HostedGraph
from ringlet.server.http import sse
from ringlet.server.http.auth import Bearer, Principal, authenticate, need
from ringlet.server.http.errors import ApiError
from ringlet.server.http.idempotency import IdempotencyKey, claim_of, earlier, idempotent
from ringlet.server.http.limits import Slot, hold_stream
from ringlet.server.http.schemas import ERRORS, SSE_EVENT, ErrorBody
from ringlet.server.http.schemas import Conversation as ConversationView
from ringlet.server.protocols import chat_schemas as s
from ringlet.server.protocols import steering
from ringlet.server.protocols.access import conversation_for
from ringlet.server.protocols.access import visible_run as _visible_run
from ringlet.server.runs.service import Runs, runs_of
from ringlet.store.records import Approval, Conversation, RunRecord, RunStatus
from ringlet.store.request_records import KeyTaken

router = APIRouter(prefix="/api/v1")
Chat = Annotated[Principal, Depends(need("chat"))]
Admin = Annotated[Principal, Depends(need("admin"))]
_SSE = {"content": {"text/event-stream": {"schema": SSE_EVENT}},
        "description": "An SSE stream of run events (server-contract §4); see `x-sse-events`."}


def question_record(row: Approval) -> dict[str, Any]:
    """A stored question as the API shows it (a graph node's names its `node_id` and `default`, not a call)."""
    q, given = row.question or {}, row.answer or {}
    node = {"node_id": q["node_id"], "default": q.get("default")} if q.get("node_id") else {}
    return {"question_id": row.approval_id, "run_id": row.run_id, "conversation_id": row.conversation_id,
            "tool_call_id": None if node else row.tool_call_id, **node,
            "question": q.get("question"), "input_type": q.get("input_type"),
            "options": q.get("options") or [], "allow_freeform": q.get("allow_freeform", False),
            "status": row.status, "asked_at": row.requested_at,
            "expires_at": None if row.expires_at == NEVER else row.expires_at,
            "answer": given.get("answer"), "answered_by": row.decided_by}


async def pending(runs: Runs, **where: Any) -> dict[str, list[Any]]:
    """The pending approvals and questions of a conversation or run."""
    rows = await runs.records.approvals.list(status="pending", **where)
    return {"approvals": [asdict(r) for r in rows if r.kind == "approval"],
            "questions": [question_record(r) for r in rows if r.kind == "question"]}


@router.get("/agents", response_model=s.AgentList, responses=ERRORS)
async def list_agents(request: Request, principal: Chat) -> dict[str, Any]:
    hosted = runs_of(request).catalog.hosted.values()
    return {"data": [h.describe() for h in hosted if h.runnable_by(principal)]}


@router.get("/agents/{name}/graph", response_model=s.GraphDiagram, responses=ERRORS)
async def agent_graph(name: str, request: Request, principal: Chat) -> dict[str, Any]:
    """A graph agent's diagram as Mermaid flowchart text (what `ringlet graph show` prints)."""
    principal.check_agent(name)
    hosted = runs_of(request).catalog.get(name)
    if not isinstance(hosted, HostedGraph):
        raise ApiError(404, "agent_not_found", f"agent {name!r} is a loop agent; only graph agents have a diagram")
    return {"mermaid": hosted.mermaid()}


@router.post("/stream-tokens", response_model=s.StreamToken, responses=ERRORS)
async def stream_token(request: Request, principal: Chat) -> dict[str, Any]:
    """A one-use token for `GET …/events?stream_token=` (browsers' EventSource cannot send headers)."""
    return {"token": await runs_of(request).records.keys.create_stream_token(principal.key_id), "expires_in": 60}


@router.post("/chat/conversations", status_code=201, response_model=ConversationView, responses=ERRORS)
async def create_conversation(body: s.NewConversation, request: Request, principal: Chat) -> Conversation:
    runs = runs_of(request)
    hosted = runs.catalog.get(body.agent)
    principal.check_agent(body.agent)
    realm = hosted.realm_for(principal, body.realm)
    return await runs.records.conversations.create(agent=body.agent, title=body.title or "", realm=realm,
                                                  org_id=principal.org_id, user_id=principal.user_id)


def _cursor(stamp: str, row_id: str) -> str:
    """The opaque `next_cursor` after a row: its time and id."""
    return base64.urlsafe_b64encode(f"{stamp}|{row_id}".encode()).decode()


def _uncursor(cursor: str) -> tuple[str, str]:
    try:
        updated_at, cid = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "invalid_request", "cursor: not a cursor this API returned; pass `next_cursor` "
                       "from the previous page") from None
    return updated_at, cid


@router.get("/chat/conversations", response_model=s.ConversationList, responses={
    **ERRORS, 400: {"model": ErrorBody, "description": "`cursor` is not a `next_cursor` this API returned"}})
async def list_conversations(request: Request, principal: Chat, agent: str | None = None,
                             realm: str | None = None, limit: Annotated[int, Query(ge=1, le=200)] = 50,
                             cursor: Annotated[str | None, Query(description=(
                                 "`next_cursor` of the previous page, as it was returned (opaque); empty or left "
                                 "out: the first page"))] = None,
                             include_sub_agents: bool = False) -> dict[str, Any]:
    if realm is not None:
        principal.check_realm(realm)
    realms = [realm] if realm is not None else principal.realms
    rows = await runs_of(request).records.conversations.list(
        realms=realms, agent=agent, agents=principal.agents, limit=limit + 1,
        after=_uncursor(cursor) if cursor else None, include_sub_agents=include_sub_agents)
    page = rows[:limit]
    return {"data": page, "next_cursor": _cursor(page[-1].updated_at, page[-1].id) if len(rows) > limit else None}


@router.get("/chat/conversations/{cid}", response_model=s.ConversationDetail, responses=ERRORS)
async def get_conversation(cid: str, request: Request, principal: Chat,
                           messages_limit: Annotated[int, Query(ge=1, le=1000)] = 200,
                           before: str | None = None) -> dict[str, Any]:
    conversation = await conversation_for(request, cid, principal)
    messages = await runs_of(request).records.conversations.load_messages(cid, limit=messages_limit, before=before)
    return {"conversation": conversation, "messages": [m.model_dump(mode="json") for m in messages],
            "pending": await pending(runs_of(request), conversation_id=cid)}


@router.delete("/chat/conversations/{cid}", status_code=204, responses=ERRORS)
async def delete_conversation(cid: str, request: Request, principal: Chat) -> Response:
    await conversation_for(request, cid, principal)
    runs = runs_of(request)
    await runs.cancel(cid)  # a paused run ends too, its approvals cancelled
    await runs.records.conversations.delete(cid)
    return Response(status_code=204)


def _parts(body: s.SendMessage) -> str | tuple[Part, ...]:
    if not body.attachments:
        return body.content
    kinds = {"image": ImagePart, "audio": AudioPart}
    parts: list[Part] = [TextPart(text=body.content)]
    for a in body.attachments:
        kind = kinds.get(a.media_type.split("/", 1)[0])
        if a.data is None and a.url is None:
            raise ApiError(422, "validation_error", "attachments: each needs `data` (base64) or `url`")
        if kind is not None:
            parts.append(kind(url=a.url, data=a.data, media_type=a.media_type))
        else:
            parts.append(FilePart(url=a.url, data=a.data, media_type=a.media_type, filename=a.name))
    return tuple(parts)


@router.post("/chat/conversations/{cid}/messages", response_model=s.RunOutcome, responses={**ERRORS, 200: {
    "content": {"text/event-stream": _SSE["content"]["text/event-stream"]},
    "description": "The run's SSE stream (default), or with `Accept: application/json` its outcome."},
    202: {"model": s.Steered, "description": "`mode` given while a run works: steered into it, or queued"},
    409: {"model": ErrorBody, "description": "A run is in progress, or the idempotency key was reused"}})
async def send_message(cid: str, body: s.SendMessage, request: Request, principal: Chat,
                       idempotency_key: IdempotencyKey = None) -> Any:
    """Send a user message; the response follows the run it starts."""
    runs = runs_of(request)
    conversation = await conversation_for(request, cid, principal)
    slot = None if _wants_json(request) else hold_stream()  # 429 over the key's streams, before a run starts
    try:
        return await _send(request, principal, runs, conversation, body, idempotency_key, slot)
    except BaseException:
        if slot is not None:
            slot.release()
        raise


async def _send(request: Request, principal: Principal, runs: Runs, conversation: Conversation,
                body: s.SendMessage, idempotency_key: str | None, slot: Slot | None) -> Any:
    cid, run_id, raw = conversation.id, new_id("r"), await request.body()
    claim = claim_of(principal.key_id, idempotency_key, f"messages:{cid}", raw, {"run_id": run_id,
                                                                                  "conversation_id": cid})
    if (prior := await earlier(runs.records.requests, claim)) is not None:  # a retry: the first one's answer
        return await _again(request, principal, runs, cid, prior, slot)
    if conversation.status == "input_required" and (asked := await _open_question(runs, cid)):
        async with idempotent(runs.records.requests, principal.key_id, idempotency_key, f"messages:{cid}", raw,
                              {"run_id": asked.run_id, "conversation_id": cid}) as prior:
            if prior is None:  # the message answers it: follow the resumed run
                mark, _ = await runs.records.events.marks(cid)
                await runs.answer(asked, body.content, answered_by=principal.user_id)
                return await _follow_run(request, principal, runs, cid, asked.run_id, after=mark, slot=slot)
        return await _follow_run(request, principal, runs, cid, prior["run_id"], slot=slot)
    prompt = Message.user(_parts(body), source="chat")
    if body.metadata:  # the client's metadata, under ringlet's own markers
        prompt = replace(prompt, metadata={**body.metadata, **prompt.metadata})
    overrides = body.overrides.model_dump(exclude_none=True) if body.overrides else {}
    if body.variables is not None:  # a graph agent's variables (graph-workflows.md §2)
        overrides["variables"] = body.variables
    if body.mode is not None and (sent := await steering.send(  # a queued message is a DBOS workflow
            runs, conversation, principal, prompt, body.mode, overrides,
            up=request.app.state.ringlet.firing.up)) is not None:
        if claim is not None:  # a retry with its key gets this answer, and nothing is sent twice
            await runs.records.requests.remember(claim.principal, claim.key, claim.route, claim.body_hash, sent)
        return _steered(sent, slot)
    try:  # the key is stored with the run: a retry finds both, or neither and starts it
        await runs.start(conversation, prompt, principal=principal, overrides=overrides, run_id=run_id, claim=claim)
    except ConfigError as exc:
        raise ApiError(422, "validation_error", str(exc)) from None
    except (KeyTaken, ApiError) as exc:  # the same request, sent at the same time, started it: follow that
        if claim is None or (isinstance(exc, ApiError) and exc.code != "run_in_progress") or \
                (prior := await earlier(runs.records.requests, claim)) is None:
            raise
        return await _follow_run(request, principal, runs, cid, prior["run_id"], slot=slot)
    return await _follow_run(request, principal, runs, cid, run_id, slot=slot)


async def _again(request: Request, principal: Principal, runs: Runs, cid: str, prior: dict[str, Any],
                 slot: Slot | None) -> Any:
    """A retry with the key of a message sent before: the same 202 when that one was steered or queued, else
    the run it started, followed."""
    if "mode" in prior:
        return _steered(prior, slot)
    return await _follow_run(request, principal, runs, cid, prior["run_id"], slot=slot)


def _steered(sent: dict[str, Any], slot: Slot | None) -> JSONResponse:
    """A steered or queued message's 202, answered at once: the conversation's event stream shows the rest."""
    if slot is not None:
        slot.release()
    return JSONResponse(sent, status_code=202)


async def _open_question(runs: Runs, cid: str) -> Approval | None:
    """The paused run's question a chat message may answer (`allow_freeform`), if there is one."""
    rows = await runs.records.approvals.list(conversation_id=cid, status="pending", kind="question")
    return next((r for r in rows if (r.question or {}).get("allow_freeform")), None)


def _wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "text/event-stream" not in accept


async def _follow_run(request: Request, principal: Principal, runs: Runs, cid: str, run_id: str, *,
                      after: int = 0, slot: Slot | None = None) -> Any:
    if runs.backlog(cid, run_id) is None and await runs.records.runs.get(run_id) is None:
        raise ApiError(404, "run_not_found", f"run {run_id} never started; send the message again with a new "
                       "Idempotency-Key")
    if _wants_json(request):
        active = runs.active.get(cid)
        if active is not None and active.run_id == run_id:
            await active.done.wait()
        return await _outcome(runs, cid, run_id)

    async def events() -> AsyncIterator[bytes]:
        with runs.subscribe(cid) as subscriber:
            async for item in runs.follow(subscriber, cid, after=after, run_id=run_id):
                yield item

    return _authorized_stream(request, principal, events(), slot)


def _authorized_stream(request: Request, principal: Principal, frames: AsyncIterator[bytes],
                       slot: Slot | None = None) -> sse.Stream:
    """The SSE response of `frames` while the stream's key stays valid: every `auth_recheck_s` the key is
    read again (from the store, so a revocation in any process counts), and once it is revoked or expired
    the stream sends `error {code: "unauthorized"}` and ends."""
    gone = ErrorEvent(run_id="", ts=now(), code="unauthorized", retryable=False,
                      message="the API key of this stream was revoked or has expired")
    runs = runs_of(request)
    return sse.response(frames, slot, **sse.keyed(runs.settings, runs.records.keys, principal.key_id,
                                                  sse.encode("error", gone.model_dump_json())))


async def _outcome(runs: Runs, cid: str, run_id: str) -> dict[str, Any]:
    outcome = await runs.outcome(cid, run_id)
    record, answer = outcome.record, outcome.answer
    return {"run_id": run_id, "status": record.status, "finish_reason": record.finish_reason,
            "message": answer.model_dump(mode="json") if answer else None, "usage": record.usage,
            "pending": await pending(runs, run_id=run_id) if record.status == "input_required" else None}


@router.get("/chat/conversations/{cid}/events", responses={**ERRORS, 200: _SSE})
async def conversation_events(cid: str, request: Request, credentials: Bearer,
                              last_event_id_header: Annotated[str | None, Header(
                                  alias="Last-Event-ID", pattern=r"^[0-9]{1,18}$")] = None,
                              last_event_id: Annotated[int | None, Query(ge=0, le=(1 << 63) - 1)] = None,
                              stream_token: str | None = None) -> Any:
    """Follow the conversation across runs: replay after `Last-Event-ID`, then live events."""
    principal = await authenticate(request, credentials, stream_token=stream_token)
    principal.check_scope("chat")
    await conversation_for(request, cid, principal)
    runs = runs_of(request)
    after = last_event_id if last_event_id_header is None else int(last_event_id_header)  # digits (its pattern)

    async def events() -> AsyncIterator[bytes]:
        with runs.subscribe(cid) as subscriber:
            last, pruned = await runs.records.events.marks(cid)
            start, backlog = last, False
            if after is not None and after < pruned:
                gone = ErrorEvent(run_id="", ts=now(), code="replay_unavailable", retryable=False,
                                  message=f"events up to {pruned} are past retention; reload the transcript")
                yield sse.encode("error", gone.model_dump_json(), retry=sse.RETRY_MS)
            elif after is not None:
                start, backlog = after, True
            elif (active := runs.active.get(cid)) is not None:  # join the active run at its start
                held = runs.backlog(cid, active.run_id)
                if held is None:  # it executes in another process: its start is in the store
                    first = await runs.records.events.after(cid, 0, limit=1, run_id=active.run_id)
                    start, backlog = (first[0][0] - 1, True) if first else (last, True)
                else:
                    start, backlog = (held[0].id - 1, True) if held else (last, False)
            async for item in runs.follow(subscriber, cid, after=start, backlog=backlog):
                yield item

    return _authorized_stream(request, principal, events())


@router.post("/chat/conversations/{cid}/cancel", status_code=202, response_model=s.CancelResult,
             responses={**ERRORS, 409: {"model": ErrorBody, "description": "No run is active"}})
async def cancel(cid: str, request: Request, principal: Chat) -> dict[str, Any]:
    await conversation_for(request, cid, principal)
    runs = runs_of(request)
    run_id = await runs.cancel(cid)
    if run_id is None:
        raise ApiError(409, "run_not_active", f"conversation {cid} has no active run to cancel")
    return {"run_id": run_id}


@router.get("/chat/conversations/{cid}/context", response_model=s.ContextReport, responses={
    **ERRORS, 409: {"model": ErrorBody, "description": "A graph agent keeps no prompt context"}})
async def context(cid: str, request: Request, principal: Chat) -> dict[str, Any]:
    """The TokenBreakdown of the prompt the next message would send, with the window and budget."""
    conversation = await conversation_for(request, cid, principal)
    runs = runs_of(request)
    agent = _loop_agent(runs, conversation.agent)
    messages = await runs.records.conversations.load_messages(cid)
    report = await agent.context(messages, realm=conversation.realm)
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None)
    usage = messages[last].metadata.get("usage") if last is not None else None
    if isinstance(usage, dict) and not usage.get("estimated") and usage.get("in_tokens"):  # the model counted
        sent = await agent.context(messages[:last], realm=conversation.realm)  # the prompt of that request
        report["last_request"] = {"in_tokens": usage["in_tokens"], "estimated": sent["total"],
                                  "cache_read_tokens": usage.get("cache_read_tokens")}
    return report


@router.post("/chat/conversations/{cid}/compact", response_model=s.CompactResult,
             responses={**ERRORS, 409: {"model": ErrorBody, "description": "A run is active, or a graph agent"}})
async def compact(cid: str, request: Request, principal: Chat) -> dict[str, Any]:
    """Compact the conversation's oldest turns into one `<compacted>` note now (the messages stay stored)."""
    conversation = await conversation_for(request, cid, principal)
    runs = runs_of(request)
    if cid in runs.active or conversation.status != "idle":
        raise ApiError(409, "run_in_progress", f"conversation {cid} has an active run; compact it afterwards")
    agent = _loop_agent(runs, conversation.agent)
    try:
        transcript = await runs.records.conversations.load_messages(cid)
        changed, event = await agent.compact(transcript, realm=conversation.realm, conversation_id=cid)
    except ConfigError as exc:
        raise ApiError(409, "compaction_disabled", str(exc)) from None
    if event is None:
        return {"compacted": False, "event": None}
    note_id = event.summary_message_id  # type: ignore[union-attr]
    await runs.records.conversations.update_messages(cid, [m for m in changed if m.id != note_id])
    await runs.records.conversations.append_messages(cid, [m for m in changed if m.id == note_id])
    await runs.emit(cid, event)
    return {"compacted": True, "event": event.model_dump()}


def _loop_agent(runs: Runs, name: str) -> Agent:
    """An agent with a prompt context: a graph agent has none (each message starts a fresh graph run)."""
    agent = runs.catalog.get(name).agent()
    if agent.kind != "loop":  # only a loop run keeps a transcript as its prompt
        raise ApiError(409, "graph_agent", f"agent {name!r} is a graph agent: each message starts a fresh graph "
                       "run, so it keeps no prompt context to report or compact")
    return agent


@router.get("/runs", response_model=s.RunList, responses={
    **ERRORS, 400: {"model": ErrorBody, "description": "`cursor` is not a `next_cursor` this API returned"}})
async def list_runs(request: Request, principal: Chat, agent: str | None = None, realm: str | None = None,
                    status: RunStatus | None = None, conversation_id: str | None = None,
                    limit: Annotated[int, Query(ge=1, le=200)] = 50,
                    cursor: Annotated[str | None, Query(description=(
                        "`next_cursor` of the previous page, as it was returned (opaque); empty or left out: the "
                        "first page"))] = None, include_sub_agents: bool = False) -> dict[str, Any]:
    """The runs the key may see (its realms and agents, as `GET /api/v1/runs/{id}`), newest first: their ids
    for `ringlet replay`, `…/replay`, `…/checkpoints`. A sub-agent's runs only with `include_sub_agents`."""
    if realm is not None:
        principal.check_realm(realm)
    rows = await runs_of(request).records.runs.list(
        realms=[realm] if realm is not None else principal.realms, agents=principal.agents, agent=agent,
        status=status, conversation_id=conversation_id, include_sub_agents=include_sub_agents,
        after=_uncursor(cursor) if cursor else None, limit=limit + 1)
    page = rows[:limit]
    return {"data": page, "next_cursor": _cursor(page[-1].started_at, page[-1].id) if len(rows) > limit else None}


@router.get("/runs/{run_id}", response_model=s.RunRecord, responses=ERRORS)
async def get_run(run_id: str, request: Request, principal: Chat) -> RunRecord:
    """`status: queued`: a run that waits for a slot (a concurrency limit holds it; a durable run also while
    no worker is free), `working` once it executes."""
    runs = runs_of(request)
    record = await _visible_run(runs, run_id, principal)
    if record.status == "working" and await runs.queued(run_id):
        record = replace(record, status=cast(Any, "queued"))
    return record


@router.post("/runs/{run_id}/resume", status_code=202, response_model=s.Resumed, responses={
    **ERRORS, 409: {"model": ErrorBody, "description": "Not a graph run, not interrupted, or its graph changed"}})
async def resume_run(run_id: str, request: Request, principal: Admin,
                     body: s.ResumeRun | None = None) -> dict[str, Any]:
    """Resume an interrupted graph run from its last checkpoint (its interrupted step runs again); its
    events join the conversation's event log (`graph-workflows.md` §10.4)."""
    runs = runs_of(request)
    record = await _visible_run(runs, run_id, principal)
    return await runs.resume_graph(record, force=bool(body and body.force))
