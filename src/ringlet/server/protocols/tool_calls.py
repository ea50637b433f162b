"""Direct tool calls (`server-contract.md` §5): a client runs one of a conversation's agent's tools itself.

    POST /api/v1/chat/conversations/{cid}/tool-calls   {tool, connector?, args, include_in_context?}
      200 {tool_call_id, status: "completed", result, duration_ms, policy: {decision, audit_id}}
      200 {tool_call_id, status: "error", error: {code, message, …}, duration_ms, policy}
      202 {tool_call_id, status: "pending_approval", approval_id}     → later a `tool_result` event
      403 policy_denied {policy_id, audit_id, messages} · 404 tool_not_found {closest} · 422 validation_error

The call takes the loop's path for a model's call (`ToolRunner`: route → pre_execute → policy → approval →
backend → tool_executed / post_execute), as subject channel `api`. Its events (`tool_call_start`,
`approval_required`, `tool_result`, notifications) join the conversation's event log; the call and its result
join the transcript as an assistant tool-call message and a tool message, both `source: "direct"`, and,
unless `include_in_context`, `duration: 0` (shown, never sent to the model).

A call that needs a human is stored as an approval record like a run's (so `pending.approvals`,
`GET /api/v1/approvals` and the approvals API find it), under a run record of kind `direct` that holds a
lease like any run; its continuation waits in this process. If the process dies first, whichever process
sees the lease expire closes the call (`Recovery`): the approval is cancelled, and the conversation
gets the call's `interrupted` result, so nothing is left waiting for a process that is gone.
"""

from __future__ import annotations

import asyncio
import difflib
import time
from collections.abc import Sequence
from contextlib import aclosing
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic_core import to_json

from ringlet._ids import new_id, now
from ringlet.agent import Agent
from ringlet.context import RunContext
from ringlet.errors import ToolFailure
from ringlet.events import (
    ApprovalRequiredEvent,
    BaseEvent,
    NotificationEvent,
    Progress,
    ToolCallStartEvent,
    ToolResultEvent,
)
from ringlet.gates.approval import ApprovalDecision, epoch
from ringlet.loop.tools import Outcome, Parked, Prepared, ToolRunner, undecided
from ringlet.messages import Message, ToolCall
from ringlet.server.http.auth import Principal, need
from ringlet.server.http.errors import ApiError, error_body, request_id
from ringlet.server.http.idempotency import IdempotencyKey, idempotent
from ringlet.server.http.schemas import ErrorBody
from ringlet.server.protocols import tool_calls_schemas as s
from ringlet.server.protocols.chat import ERRORS, conversation_for, runs_of
from ringlet.server.runs.service import Runs
from ringlet.store.records import Conversation
from ringlet.tools.catalog import Catalog
from ringlet.tools.registry import Registry

router = APIRouter(prefix="/api/v1")
Chat = Annotated[Principal, Depends(need("chat"))]
EXECUTE = "execute_connector_tool"
"""The catalog's meta-tool that runs a connector's tool: a call behind the catalog is routed through it."""


@router.post("/chat/conversations/{cid}/tool-calls", response_model=s.ToolCallCompleted | s.ToolCallFailed,
             responses={
                 **ERRORS,
                 200: {"description": "The call ran: `completed` with its result, or `error` (a tool error, a "
                                      "pre_execute abort, an approval rule's denial)."},
                 202: {"model": s.ToolCallPending, "description": "A human must approve the call first."},
                 403: {"model": ErrorBody, "description": "`policy_denied` (with `policy_id`, `audit_id`), "
                                                            "`access_required` (a catalog connector not granted), "
                                                            "or the key lacks the `chat` scope"},
                 404: {"model": ErrorBody, "description": "`conversation_not_found`, or `tool_not_found` with "
                                                            "the closest names"},
                 409: {"model": ErrorBody, "description": "`run_in_progress`, `graph_agent`, or the "
                                                            "Idempotency-Key is in use"}})
async def direct_tool_call(cid: str, body: s.DirectToolCall, request: Request, principal: Chat,
                           idempotency_key: IdempotencyKey = None) -> JSONResponse:
    """Run one of the agent's tools through every gate, as channel `api`.

    A call while the conversation has a run (working, or paused for a human) gets 409 `run_in_progress`:
    the run owns the transcript until it ends, and a call stored in the middle of its tool round would split
    an assistant tool-call message from its results. A graph agent's conversation gets 409 `graph_agent`.
    With an `Idempotency-Key`, the same request again answers with the first response (403 included) and
    runs nothing; while the first is still running it gets 409 `request_in_progress`.
    """
    runs = runs_of(request)
    conversation = await conversation_for(request, cid, principal)
    call_id = new_id("tc")
    async with idempotent(runs.records.requests, principal.key_id, idempotency_key, f"tool-calls:{cid}",
                          await request.body(), {"tool_call_id": call_id, "status_code": None}) as prior:
        if prior is not None:
            if prior.get("status_code") is None:
                raise ApiError(409, "request_in_progress", "a request with this Idempotency-Key is still running; "
                               "send it again once it has answered", details={"tool_call_id": prior["tool_call_id"]})
            return JSONResponse(prior["body"], prior["status_code"])
        active = runs.active.get(cid)
        if active is not None or conversation.status != "idle":
            raise ApiError(409, "run_in_progress", f"conversation {cid} has an active or paused run; call the "
                           "tool once it has ended", details={"run_id": active.run_id} if active else None)
        status, payload = await _start(runs, conversation, principal, body, call_id)
        if idempotency_key:
            await runs.records.requests.update(principal.key_id, idempotency_key, {
                "tool_call_id": call_id, "status_code": status, "body": payload})
    return JSONResponse(payload, status)


async def _start(runs: Runs, conversation: Conversation, principal: Principal, body: s.DirectToolCall,
                 call_id: str) -> tuple[int, dict[str, Any]]:
    """Route and validate the call (404 / 422 / 403 before anything runs), then run it."""
    hosted = runs.catalog.get(conversation.agent)
    hosted.check_home(conversation.realm)  # an agent with a realm runs only there
    agent = hosted.agent()
    if agent.kind != "loop":  # only a loop agent has a tool set of its own
        raise ApiError(409, "graph_agent", f"agent {conversation.agent!r} is a graph agent: its tools belong "
                       "to its nodes, so there is no tool set to call directly")
    cid, realm = conversation.id, conversation.realm
    ctx = RunContext(run_id=new_id("r"), agent=conversation.agent, conversation_id=cid, realm=realm,
                     user_id=principal.user_id, org_id=principal.org_id, roles=principal.roles, channel="api",
                     request_id=request_id.get() or None, realms=principal.realms, humans=False,
                     schedules=runs.schedule_book(cid, conversation.agent, realm, principal.org_id,
                                                    principal.user_id, principal.key_id))
    tools = await _pipeline(agent, ctx)
    call = _route(tools.registry, body, call_id, ctx)
    prepared = tools.prepare(call)
    if isinstance(prepared, Outcome):
        raise _refused(prepared, body)
    direct = DirectCall(runs, conversation, tools, prepared, body.include_in_context)
    return await direct.run()


async def _pipeline(agent: Agent, ctx: RunContext) -> ToolRunner:
    """The gate pipeline a run of `agent` gives its calls: its tools (without the terminal tool, which only
    ends a run), hooks, step executor, gates (the server's policy first), approval rules and audit sink."""
    config = agent.loop_config
    registry = await Registry.build(config.toolsets, ctx)
    return ToolRunner(registry, config.hooks, config.steps, agent.settings, ctx=ctx, background=agent._background(),
                      gates=config.gates, approvals=config.approvals, audit=config.audit)


def _route(registry: Registry, body: s.DirectToolCall, call_id: str, ctx: RunContext) -> ToolCall:
    """The call to run: the tool itself when the agent lists it (owned by `connector`, if given), else the
    catalog's `execute_connector_tool` for a connector's tool behind it (then the gates judge the inner tool)."""
    found = registry.routes.get(body.tool)
    if found is not None and (body.connector is None or body.connector in _owners(*found)):
        return _call(call_id, body.tool, body.args)
    meta = registry.routes.get(EXECUTE)
    catalog = meta[0] if meta is not None and isinstance(meta[0], Catalog) else None
    if catalog is not None:
        holders = [body.connector] if body.connector else _holders(catalog, body.tool, ctx)
        if len(holders) == 1:
            return _call(call_id, EXECUTE, {"connector": holders[0], "tool": body.tool, "args": body.args})
        if holders:
            raise ApiError(422, "validation_error", f"connector: tool {body.tool!r} is in several connectors "
                           f"({', '.join(holders)}); name one in `connector`",
                           details={"errors": [{"loc": "connector", "msg": f"one of {', '.join(holders)}"}],
                                    "connectors": holders})
    where = f" in connector {body.connector!r}" if body.connector else ""
    raise ApiError(404, "tool_not_found", f"agent {ctx.agent!r} has no tool {body.tool!r}{where}",
                   details={"tool": body.tool, "connector": body.connector,
                            "closest": difflib.get_close_matches(body.tool, list(registry.routes), n=5, cutoff=0.5)})


def _owners(toolset: Any, tool: Any) -> set[str]:
    """Who owns a listed tool: its connector (the catalog's tools) or its MCP server's name."""
    return {name for name in (tool.connector, getattr(toolset, "name", None)) if isinstance(name, str)}


def _holders(catalog: Catalog, tool: str, ctx: RunContext) -> list[str]:
    """The catalog's connectors that have a tool named `tool` (granted or not)."""
    out = []
    for name in catalog.connectors:
        try:
            catalog.resolve({"connector": name, "tool": tool, "args": {}}, ctx)
        except ToolFailure as exc:
            if exc.code == "unknown_tool":
                continue
        out.append(name)
    return out


def _call(call_id: str, name: str, args: dict[str, Any]) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=args, raw_arguments=to_json(args).decode())


def _refused(outcome: Outcome, body: s.DirectToolCall) -> ApiError:
    """A call that failed routing or validation: nothing ran, so it is an error response, not a result."""
    error = outcome.error or {}
    code, message = error.get("code"), error.get("message") or "the call was refused"
    if code == "unknown_tool":
        return ApiError(404, "tool_not_found", message, details={
            "tool": body.tool, "connector": body.connector, "closest": error.get("closest") or []})
    if code == "access_required":
        return ApiError(403, "access_required", message, details={"connector": error.get("connector")})
    errors = [_field(text) for text in error.get("errors") or [message]]
    return ApiError(422, "validation_error", f"{errors[0]['loc']}: {errors[0]['msg']}", details={"errors": errors})


def _field(text: str) -> dict[str, str]:
    """A validator's `<path>: <message>` as `{loc, msg}`, the path under `args`."""
    path, sep, msg = text.partition(": ")
    if not sep:
        return {"loc": "args", "msg": text}
    return {"loc": "args" if path in ("(root)", "arguments", "") else f"args.{path}", "msg": msg}


@dataclass(eq=False)
class DirectCall:
    """One direct call from its start to its stored result, through a human's decision if it needs one."""

    runs: Runs
    conversation: Conversation
    tools: ToolRunner
    prepared: Prepared
    include_in_context: bool
    parked: Parked | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    @property
    def call(self) -> ToolCall:
        return self.prepared.call

    @property
    def ctx(self) -> RunContext:
        return self.tools.ctx

    async def run(self) -> tuple[int, dict[str, Any]]:
        """Run the call; its response (a pending approval: 202, the result arrives as an event)."""
        call = self.call
        await self.emit(ToolCallStartEvent, tool_call_id=call.id, name=call.name, index=0,
                        connector=self.prepared.tool.connector)
        got = await self.settle([self.prepared])
        if isinstance(got, Parked):
            return 202, await self.park(got)
        await self.finish(got)
        return _response(got)

    async def settle(self, items: Sequence[Prepared]) -> Outcome | Parked:
        """The call through the runs (its own timeout, the batch's bound), events a tool emits forwarded."""
        settled: Outcome | Parked | None = None
        async with aclosing(self.tools.run_batch(items)) as results:
            async for item in results:
                if isinstance(item, Outcome | Parked):
                    settled = item
                else:
                    await self.runs.emit(self.conversation.id, item)
        await self.notices()
        assert settled is not None, "run_batch settles every call"
        if isinstance(settled, Parked) and settled.request.question is not None:  # no one answers a direct call
            return await self.tools.finish(undecided(settled, ApprovalDecision("no_human", "system")))
        return settled

    async def park(self, parked: Parked) -> dict[str, Any]:
        """Store the approval record (durably, like a run's), wait for its decision in this process, announce
        it; the 202 body."""
        runs, request, self.parked = self.runs, parked.request, parked
        runs.here.held.add(request.run_id)
        await runs.records.runs.create(request.run_id, agent=self.conversation.agent, kind="direct",
                                      conversation_id=self.conversation.id, lease_owner=runs.here.owner,
                                      lease_expires_at=runs.here.lease_until(), realm=self.conversation.realm)
        await runs.records.approvals.add(request.run_id, [asdict(request)], agent=self.conversation.agent,
                                         realm=self.conversation.realm)
        loop = asyncio.get_running_loop()
        decided = loop.create_future()
        # `Runs.decide` hands a decision to the future waiting under the approval id (the way runs that are
        # not stored wait); registered before the 202 is sent, so no decision can arrive before it
        runs.here.waiters[request.approval_id] = decided
        decided.add_done_callback(self._decided)
        self.timer = loop.call_later(max(0.0, epoch(request.expires_at) - time.time()) + 0.01, self._expired)
        await self.emit(ApprovalRequiredEvent, approval_id=request.approval_id, tool_call_id=request.tool_call_id,
                        tool=request.tool, args=request.args, effect=request.effect, reason=request.reason,
                        expires_at=request.expires_at)
        return {"tool_call_id": self.call.id, "status": "pending_approval", "approval_id": request.approval_id}

    def _decided(self, decided: asyncio.Future[ApprovalDecision]) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if not decided.cancelled():
            self.runs.spawn(self.resume(decided.result()))

    def _expired(self) -> None:
        """Its deadline passed with no decision here: no later decision can reach this call."""
        assert self.parked is not None
        waiter = self.runs.here.waiters.pop(self.parked.request.approval_id, None)
        if waiter is not None and not waiter.done() and not self.runs.closing:  # (closing: upkeep expires it)
            waiter.remove_done_callback(self._decided)
            self.runs.spawn(self.expire())

    async def expire(self) -> None:
        """Expire the record (deciding it is then 409 `approval_expired`) and settle the call: as timed out,
        or as decided, if a decision was stored meanwhile (by another process)."""
        assert self.parked is not None
        runs, approval_id = self.runs, self.parked.request.approval_id
        await runs.expire_due()
        record = await runs.records.approvals.get(approval_id)
        if record is not None and record.status in ("approved", "denied"):
            decision = ApprovalDecision(cast(Any, record.status), record.decided_by or "system", record.note,
                                        record.decided_at or now())
        else:
            decision = ApprovalDecision("expired", "system:timeout")
        await self.resume(decision)

    async def resume(self, decision: ApprovalDecision) -> None:
        """Apply a human's decision (audited, like a run's): an approved call passes the policy re-check and
        runs, at most once; any other gets its error result."""
        parked, store = self.parked, self.runs.records
        assert parked is not None
        request = parked.request
        await self.tools.record(self.call, request.tool, decision.status, decision.decided_by, decision.note,
                                approval_id=request.approval_id)
        moved = await store.approvals.mark_executing([request.approval_id]) if decision.status == "approved" else ()
        if request.approval_id in moved:
            approved = Prepared(self.call, self.prepared.toolset, self.prepared.tool, parked.args, approved=decision)
            outcome = await self.settle([approved])
            await store.approvals.executed(request.run_id, [self.call.id])
        else:
            refused = undecided(parked, decision if decision.status != "approved" else
                                ApprovalDecision("cancelled", "system"))
            refused.policy = parked.policy
            outcome = await self.tools.finish(refused)
        assert isinstance(outcome, Outcome)
        await self.finish(outcome)

    async def finish(self, outcome: Outcome) -> None:
        """Tell the streams the result, then store the call and its result in the transcript."""
        await self.emit(ToolResultEvent, tool_call_id=self.call.id, name=self.call.name,
                        result=None if outcome.is_error else outcome.content, error=outcome.error,
                        is_error=outcome.is_error, duration_ms=round(outcome.duration_ms, 3),
                        truncated=outcome.truncated, policy=outcome.policy)
        if self.parked is not None:  # its run record (kept while it waited for a human) ends here
            self.runs.here.held.discard(self.ctx.run_id)
            await self.runs.records.runs.finish(self.ctx.run_id, status="failed" if outcome.is_error else "completed",
                                               finish_reason="error" if outcome.is_error else "end_turn",
                                               in_tokens=0, out_tokens=0, cost_usd=None)
        if self.conversation.id in self.runs.active:  # a run started meanwhile: store after it
            self.runs.spawn(self.store(outcome))
        else:
            await self.store(outcome)

    async def store(self, outcome: Outcome) -> None:
        """The assistant tool-call message and its result, stored together once no run of this process is
        working in the conversation. `duration: 0` keeps them out of every prompt, unless `include_in_context`;
        a run paused in its tool round would have them split its call from its results, so there they are
        kept out too (`context_dropped`)."""
        runs, cid = self.runs, self.conversation.id
        while (active := runs.active.get(cid)) is not None:
            await active.done.wait()
        meta: dict[str, Any] = {"source": "direct"}
        if not self.include_in_context:
            meta["duration"] = 0
        elif await runs.records.runs.paused_of(cid) is not None:
            meta |= {"duration": 0, "context_dropped": "stored while a run was paused in its tool round"}
        ctx, stamp = self.ctx, now()
        calling = Message(id=new_id("m"), role="assistant", tool_calls=(self.call,), run_id=ctx.run_id,
                          conversation_id=cid, created_at=stamp, metadata={**meta, "user_id": ctx.user_id})
        result = Message(id=new_id("m"), role="tool", content=outcome.content, tool_call_id=self.call.id,
                         name=self.call.name, run_id=ctx.run_id, conversation_id=cid, created_at=stamp,
                         metadata={**outcome.metadata, "is_tool_result": True, "is_error": outcome.is_error,
                                   "duration_ms": round(outcome.duration_ms, 3), **meta})
        await runs.records.conversations.append_messages(cid, [calling, result])

    async def notices(self) -> None:
        """Notifications the tool queued (`ctx.notify`), as `notification` events."""
        notices = self.ctx.notices
        for n in notices:
            await self.emit(NotificationEvent, level=n.level, title=n.title, message=n.message, source=n.source,
                            progress=Progress(current=n.progress[0], total=n.progress[1]) if n.progress else None)
        notices.clear()

    async def emit(self, kind: type[BaseEvent], **fields: Any) -> None:
        event: Any = kind(run_id=self.ctx.run_id, ts=now(), **fields)
        await self.runs.emit(self.conversation.id, event)


def _response(outcome: Outcome) -> tuple[int, dict[str, Any]]:
    """A settled call's response: 403 for a policy denial, else 200 `completed` or `error`."""
    call_id, error = outcome.call.id, outcome.error or {}
    if error.get("code") == "policy_denied":
        return 403, error_body(403, "policy_denied", error.get("message") or "denied by policy", {
            "policy_id": error.get("policy_id"), "audit_id": error.get("audit_id"), "messages": error.get("messages"),
            "tool_call_id": call_id})
    timing = {"duration_ms": round(outcome.duration_ms, 3), "policy": outcome.policy}
    if outcome.is_error:
        return 200, {"tool_call_id": call_id, "status": "error", "error": error, **timing}
    return 200, {"tool_call_id": call_id, "status": "completed", "result": outcome.content, **timing}
