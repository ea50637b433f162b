"""`Sampler`: how a run answers its MCP servers' `sampling/createMessage` (`ringlet.mcp.sampling`).

Each request, in order:
1. the run's limit for that server (`sampling.max_per_run` in mcp.json, counted in the run's state, so a
   paused and resumed run keeps its count): beyond it, declined;
2. the gates, as for a tool call but with `input.action == "mcp.sampling"`, `input.resource.connector` the
   server, `input.resource.tool` `sampling/createMessage` and the prompt in `input.args`: `deny` declines it,
   `require_approval` asks a human;
3. approval (a policy's `require_approval`, or `sampling.approval: confirm`): the run's approver for in-call
   waits (`RunContext.child_approver`, as an elicitation), shown the whole prompt; no human, or a denial,
   declines it;
4. the model: `sampling.model` when the server has one, else the agent's own; the request's usage and cost
   are added to the run's (`message_end.usage`, the conversation's totals), as a compaction summary's are.
The request runs inside the tool call that caused it, so a durable run records it with that call.
"""

from __future__ import annotations

import inspect
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from ringlet.context import RunContext
from ringlet.events import ApprovalRequiredEvent, StatusEvent
from ringlet.gates import Deny, GateCall, NeedsApproval
from ringlet.gates.approval import NEVER, ApprovalRequest
from ringlet.loop.response import ResponseBuilder
from ringlet.mcp.sampling import Sampled, SampleRequest, SamplingDeclined
from ringlet.models.base import Model, ModelRequest, ModelSettings
from ringlet.models.providers import resolve_model
from ringlet.models.tokens import prompt_tokens

if TYPE_CHECKING:
    from ringlet._ids import Seam
    from ringlet.loop.config import LoopConfig
    from ringlet.usage import RequestUsage


class Run(Protocol):
    """What a sampler needs of its run (`ringlet.loop.run.Run`)."""

    config: LoopConfig
    seam: Seam

    def new_call_id(self) -> str: ...

    def record_usage(self, builder: ResponseBuilder, prompt_size: int, latency_ms: float,
                     model_name: str | None = None) -> RequestUsage: ...

COUNTS = "mcp_sampling"
"""`plugin_data` key of the run's sampling counts per server (saved with the run)."""
TOOL = "sampling/createMessage"


class Sampler:
    """Answers the MCP servers' sampling requests of one run (`RunContext.sampler`)."""

    def __init__(self, run: Run) -> None:
        self._run = weakref.ref(run)  # no cycle run → ctx → sampler → run: runs are freed when they end
        self._models: dict[str, Model] = {}

    @property
    def run(self) -> Run:
        run = self._run()
        if run is None:
            raise SamplingDeclined("the run is over")
        return run

    async def sample(self, ctx: RunContext, request: SampleRequest) -> Sampled:
        """The model's answer to `request`, through the limit, the gates and approval; SamplingDeclined says
        why not."""
        counts = ctx.plugin_data.setdefault(COUNTS, {})
        used = counts.get(request.server, 0)
        if used >= request.config.max_per_run:
            raise SamplingDeclined(f"this run has made its {request.config.max_per_run} sampling requests for "
                                   f"MCP server {request.server!r} (sampling.max_per_run)")
        counts[request.server] = used + 1
        asks = await self._gates(ctx, request, granted=False)
        if request.config.approval == "confirm" or asks:
            reason = "; ".join(asks) or f"MCP server {request.server} asks the model for a completion"
            await self._approval(ctx, request, reason)
            await self._gates(ctx, request, granted=True)  # rules or roles may have changed while it waited
        return await self._complete(request)

    async def _gates(self, ctx: RunContext, request: SampleRequest, *, granted: bool) -> list[str]:
        """Each gate's decision: a denial declines; returns what requires approval."""
        call = GateCall(TOOL, "read", request.policy_args(), ctx, request.server, approval_granted=granted,
                        action="mcp.sampling")
        asks: list[str] = []
        for gate in self.run.config.gates:
            decision = await gate.check(call)
            if isinstance(decision, Deny):
                raise SamplingDeclined(f"denied by policy: {decision.message}")
            if isinstance(decision, NeedsApproval) and not granted:
                asks += decision.messages
        return asks

    async def _approval(self, ctx: RunContext, request: SampleRequest, reason: str) -> None:
        """A human approves the request, shown its prompt; declined when no one can, or they deny it."""
        approver, seam, rules = ctx.child_approver, self.run.seam, self.run.config.approvals
        if not ctx.humans or approver is None:
            raise SamplingDeclined("it needs a human's approval and no one can approve it")
        now = seam.now()
        limit = rules.timeout_s if rules is not None else 0.0
        approval_id = seam.new_id("ap")
        args = {"server": request.server, "prompt": request.prompt, "max_tokens": request.max_tokens,
                "model": request.config.model or self.run.config.model.name}
        record = ApprovalRequest(
            approval_id=approval_id, run_id=ctx.run_id, conversation_id=ctx.conversation_id,
            tool_call_id=ctx.tool_call_id or approval_id, tool=TOOL, connector=request.server, args=args,
            effect="read", reason=f"{reason}\n\n{request.prompt}"[:4000], requested_at=seam.stamp(now),
            expires_at=seam.stamp(now + limit) if limit else NEVER, timeout_s=limit)

        def announce() -> None:
            if ctx.emit is not None:
                ctx.emit(ApprovalRequiredEvent(run_id=ctx.run_id, ts=seam.stamp(), approval_id=approval_id,
                                               tool_call_id=record.tool_call_id, tool=TOOL, args=args,
                                               effect="read", reason=record.reason, expires_at=record.expires_at))
                ctx.emit(StatusEvent(run_id=ctx.run_id, ts=seam.stamp(), state="input_required"))

        try:
            if getattr(approver, "announces", False):  # it stores the record first, then calls announce
                decisions = await approver.wait([record], announce=announce)
            else:
                announce()
                decisions = await approver.wait([record])
        finally:
            if ctx.emit is not None:
                ctx.emit(StatusEvent(run_id=ctx.run_id, ts=seam.stamp(), state="working"))
        decision = decisions.get(record.tool_call_id)
        await self._audit(ctx, request, approval_id, decision)
        if decision is None or not decision.approved:
            note = f": {decision.note}" if decision is not None and decision.note else ""
            raise SamplingDeclined(f"not approved ({decision.status if decision else 'expired'}){note}")

    async def _audit(self, ctx: RunContext, request: SampleRequest, approval_id: str, decision: Any) -> None:
        audit = self.run.config.audit
        if audit is None:
            return
        written = audit({
            "audit_id": self.run.seam.new_id("au"), "at": self.run.seam.stamp(), "action": "approval.decide",
            "approval_id": approval_id, "tool_call_id": ctx.tool_call_id, "tool": TOOL,
            "connector": request.server, "decision": decision.status if decision else "expired",
            "decided_by": decision.decided_by if decision else "timeout", "note": decision.note if decision else None,
            "run_id": ctx.run_id, "conversation_id": ctx.conversation_id, "org_id": ctx.org_id, "realm": ctx.realm,
            "request_id": ctx.request_id, "subject": {"user_id": ctx.user_id, "org_id": ctx.org_id,
                                                      "roles": list(ctx.roles), "channel": ctx.channel}})
        if inspect.isawaitable(written):
            await written

    async def _complete(self, request: SampleRequest) -> Sampled:
        """One model request, no tools; its usage is the run's."""
        run = self.run
        model = self._model(request.config.model)
        asked = ModelRequest(request.messages, request.system, (),
                             ModelSettings(request.temperature, None, request.max_tokens))
        builder, clock = ResponseBuilder(run.new_call_id), run.seam.monotonic
        started = clock()
        try:
            async for chunk in model.stream(asked):
                builder.feed(chunk)
        except Exception as exc:  # the model failed: the server is told, the run goes on
            raise SamplingDeclined(f"the model failed: {type(exc).__name__}: {exc}") from exc
        run.record_usage(builder, prompt_tokens(asked.instructions, asked.messages, 0, {}),
                         (clock() - started) * 1000, model.name)
        stop = "maxTokens" if builder.finish_reason in ("length", "max_tokens") else "endTurn"
        return Sampled(builder.content, model.name, stop)

    def _model(self, name: str | None) -> Model:
        if name is None:
            return self.run.config.model
        if name not in self._models:
            self._models[name] = resolve_model(name)
        return self._models[name]
