"""Executing a batch of tool calls (`loop-and-hooks.md` §2): resolve, validate, hooks, backend, result.

All calls settle: every call gets exactly one outcome, whatever happens to the others. Outcomes are
yielded as calls finish; the loop appends them to the transcript in call order.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Coroutine, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from pydantic_core import to_jsonable_python

from ringlet import telemetry
from ringlet._ids import SYSTEM
from ringlet.context import RunContext
from ringlet.errors import ToolFailure
from ringlet.events import Event
from ringlet.gates import Deny, Gate, GateCall, NeedsApproval
from ringlet.gates.approval import NEVER, ApprovalDecision, ApprovalRequest, ApprovalRules, Ask
from ringlet.guardrails.check import GuardRun
from ringlet.hooks.dispatch import BackgroundQueue, Hooks, post_execute_job
from ringlet.hooks.plugin import PostExecuteContext, PreExecuteContext, ToolExecutedContext
from ringlet.loop.fields import new_dict
from ringlet.loop.response import parse_arguments
from ringlet.loop.settings import LoopSettings
from ringlet.loop.steps import LANE, StepExecutor
from ringlet.messages import ToolCall
from ringlet.tools.base import ArgumentsInvalid, Returned, Tool, Toolset, encode_result, truncate
from ringlet.tools.builtin.question import Question
from ringlet.tools.registry import Registry

log = logging.getLogger("ringlet.tools")


@dataclass(slots=True)
class Outcome:
    """The one result of one call."""

    call: ToolCall
    content: str
    is_error: bool = False
    error: dict[str, Any] | None = None
    duration_ms: float = 0.0
    truncated: bool = False
    metadata: dict[str, Any] = field(default_factory=new_dict)
    params: dict[str, Any] = field(default_factory=new_dict)
    policy: dict[str, Any] | None = None
    """The gates' decision and audit id (`tool_result.policy`), when gates are configured."""


def decision_for(decisions: Mapping[str, ApprovalDecision], request: ApprovalRequest, *, cancelled: bool,
              now: float) -> ApprovalDecision | None:
    """The decision on a request (by tool-call or approval id); a cancelled run cancels the rest, and one
    past its deadline has expired. None: it keeps waiting."""
    decision = decisions.get(request.tool_call_id) or decisions.get(request.approval_id)
    if decision is not None:
        return decision
    if cancelled:
        return ApprovalDecision("cancelled", "system:cancel")
    return ApprovalDecision("expired", "system:timeout") if request.expired(now) else None


def undecided(parked: Parked, decision: ApprovalDecision) -> Outcome:
    """The result of a parked call that will not run: denied, expired, cancelled or interrupted, or a
    question's answer (or its lack)."""
    call, request = parked.call, parked.request
    if request.question is not None:
        return answered(parked, decision)
    if decision.status == "denied":
        by = decision.decided_by
        return error_outcome(call, "approval_denied", f"denied by {by}: {decision.note}" if decision.note
                             else f"denied by {by}", decided_by=by, note=decision.note)
    if decision.status == "expired":
        return error_outcome(call, "approval_timeout", f"no decision within {request.timeout_s:g} s",
                             approval_id=request.approval_id, expires_at=request.expires_at)
    if decision.status == "executing":
        return error_outcome(call, "tool_error", "interrupted by restart; not retried")
    return error_outcome(call, "cancelled")


def answered(parked: Parked, decision: ApprovalDecision) -> Outcome:
    """A question's result: `{question_id, answer, freeform, answered_by}`, or why there is none."""
    call, request = parked.call, parked.request
    if decision.status == "answered":
        given: dict[str, Any] = decision.answer or {}
        result = {"question_id": request.approval_id, "answer": given.get("answer"),
                  "freeform": bool(given.get("freeform")), "answered_by": decision.decided_by}
        return Outcome(call, json.dumps(result, ensure_ascii=False), params=parked.args)
    if decision.status == "expired":
        return error_outcome(call, "question_timeout", f"no answer within {request.timeout_s:g} s",
                             question_id=request.approval_id)
    if decision.status == "no_human":
        return error_outcome(call, "no_human_available", "no one can answer questions in this run")
    return error_outcome(call, "cancelled")


def error_outcome(call: ToolCall, code: str, message: str | None = None, **extra: Any) -> Outcome:
    error = {"code": code, **({"message": message} if message is not None else {}), **extra}
    return Outcome(call, json.dumps({"error": error}, ensure_ascii=False), True, error)


@dataclass(slots=True)
class Prepared:
    """A call that passed resolution and validation (or, with `approved`, every gate up to a human's
    approval: only the policy re-check and the backend remain)."""

    call: ToolCall
    toolset: Toolset
    tool: Tool
    args: dict[str, Any]
    approved: ApprovalDecision | None = None


@dataclass(slots=True)
class Parked:
    """A call waiting for a human: its approval request, its arguments after `pre_execute`, and the
    policy's decision so far. Part of the run state while the run is paused."""

    call: ToolCall
    request: ApprovalRequest
    args: dict[str, Any]
    policy: dict[str, Any] | None = None


_DEFAULT_RULES = ApprovalRules()


async def _next(finished: asyncio.Queue[tuple[int, Outcome | Parked | Event | BaseException]],
                left: float) -> tuple[int, Outcome | Parked | Event] | None:
    """The next finished call, or None once the `left` seconds of the batch have passed; a call's crash is
    re-raised."""
    try:
        async with asyncio.timeout(left):
            i, outcome = await finished.get()
    except TimeoutError:
        return None
    if isinstance(outcome, BaseException):
        raise outcome
    return i, outcome


async def _cancel(tasks: Iterable[asyncio.Task[None]]) -> None:
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def _handed_over(queue: asyncio.Queue[tuple[int, Outcome | Parked | Event | BaseException]], event: Event) -> None:
    """An event a tool emits while its batch runs (`ctx.emit`: a sub-agent's), queued with the outcomes."""
    queue.put_nowait((-1, event))


class _Expired(Exception):
    """The call's own deadline passed (a TimeoutError raised by the tool itself is a tool error)."""


async def _with_timeout(work: Awaitable[Any], seconds: float) -> Any:
    """Await `work` within `seconds`, arming the timer only if a coroutine actually suspends.

    The first step runs at once; a tool that finishes without waiting on anything (most trivial tools)
    never pays for a timer. Otherwise the rest runs under `asyncio.timeout`, exactly like a plain await.
    """
    when = asyncio.get_running_loop().time() + seconds
    if not isinstance(work, Coroutine):  # a future or another awaitable: a plain timed await
        deadline = asyncio.timeout_at(when)
        try:
            async with deadline:
                return await work
        except TimeoutError:
            if deadline.expired():
                raise _Expired from None
            raise
    coro = cast("Coroutine[Any, Any, Any]", work)
    try:
        pending = coro.send(None)
    except StopIteration as done:
        return done.value
    deadline = asyncio.timeout_at(when)
    try:
        async with deadline:
            return await _Resume(coro, pending)
    except TimeoutError:
        if deadline.expired():
            raise _Expired from None
        raise


class _Resume:
    """Awaitable that continues a coroutine already started with `send(None)` (a `yield from` resumed)."""

    __slots__ = ("coro", "pending")

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self.coro, self.pending = coro, pending

    def __await__(self) -> Generator[Any, Any, Any]:
        pending, coro = self.pending, self.coro
        while True:
            try:
                yield pending
            except BaseException as exc:  # cancellation or timeout: hand it to the coroutine
                try:
                    pending = coro.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    pending = coro.send(None)
                except StopIteration as done:
                    return done.value


class ToolRunner:
    """Runs the batches of one run."""

    def __init__(self, registry: Registry, hooks: Hooks, steps: StepExecutor, settings: LoopSettings, *,
                 ctx: RunContext, background: BackgroundQueue | None, span_parent: Any = None,
                 gates: Sequence[Gate] = (), approvals: ApprovalRules | None = None,
                 audit: Any = None, guard: GuardRun | None = None) -> None:
        self.gates, self.approvals, self.audit = gates, approvals, audit
        self.guard = guard if guard is not None and guard.has_tools else None
        self.registry, self.hooks, self.steps, self.settings = registry, hooks, steps, settings
        self.ctx, self.background, self.span_parent = ctx, background, span_parent
        self.seam = steps.seam
        self.leftover: list[Event] = []

    def prepare(self, call: ToolCall) -> Prepared | Outcome:
        """Route and validate one call; a failure is an error outcome for the model."""
        route = self.registry.routes.get(call.name)
        if route is None:
            return error_outcome(call, "unknown_tool", self.registry.unknown_message(call.name),
                                 available=sorted(self.registry.routes)[:50])
        toolset, tool = route
        try:  # arguments were parsed when the response was assembled; re-parse only to report the error
            args = dict(call.arguments) if call.arguments else parse_arguments(call.raw_arguments)
        except ValueError as exc:
            return error_outcome(call, "invalid_arguments", f"invalid arguments for {call.name!r}: {exc}",
                                 errors=[str(exc)])
        try:
            args = tool.validate(args)
        except ArgumentsInvalid as exc:
            return error_outcome(call, "invalid_arguments",
                                 f"invalid arguments for {call.name!r}: {'; '.join(exc.errors)}",
                                 errors=exc.errors)
        if tool.resolve is not None:  # a meta-tool: the inner tool is the one the gates judge and run
            try:
                toolset, tool, args = tool.resolve(args, self.ctx)
            except ToolFailure as exc:
                return error_outcome(call, exc.code, exc.message, **exc.extra)
        return Prepared(call, toolset, tool, args)

    async def execute(self, item: Prepared) -> Outcome | Parked:
        """pre_execute hooks, the tool's own check, policy, approval, then the backend under the call's
        timeout. A call that needs a human is `Parked`; an approved one (`item.approved`) passes the policy
        re-check only."""
        call, tool, args = item.call, item.tool, item.args
        if item.approved is not None:
            return await self._approved(item)
        args, stopped = await self._before_gates(call, tool, args)
        if stopped is not None:
            return stopped
        policy, required = None, ()
        for gate in self.gates:  # policy: a Deny is the call's result
            decision = await gate.check(GateCall(tool.name, tool.effect, args, self.ctx, tool.connector))
            policy = {"decision": decision.decision, "audit_id": decision.audit_id}
            if isinstance(decision, Deny):
                return self._denied(call, decision, policy)
            if isinstance(decision, NeedsApproval):
                required = decision.messages
        stopped = await self._approval(item, args, required, policy)
        if stopped is not None:
            return stopped
        outcome = await self._backend(item, args)
        outcome.policy = policy
        return outcome

    async def _before_gates(self, call: ToolCall, tool: Tool, args: dict[str, Any]) -> tuple[dict[str, Any],
                                                                                            Outcome | None]:
        """pre_execute hooks (their arguments validated again), then the tool's own check (`Tool.check`):
        the arguments the gates judge, or the call's result when a hook aborts or the tool refuses them, so
        nobody is asked to approve a call that could never run."""
        if self.hooks.has("pre_execute"):
            pre = PreExecuteContext(self.ctx, call=call, tool=tool.name, params=dict(args))
            args, abort, plugin = await self.hooks.pre_execute(pre)
            if abort is not None:
                return args, error_outcome(call, "aborted", abort, plugin=plugin)
            try:
                args = tool.validate(args)
            except ArgumentsInvalid as exc:
                return args, error_outcome(call, "invalid_arguments",
                                           f"invalid arguments for {call.name!r}: {'; '.join(exc.errors)}",
                                           errors=exc.errors)
        if tool.check is not None:
            try:
                await tool.check(args)
            except ToolFailure as exc:
                return args, error_outcome(call, exc.code, exc.message, **exc.extra)
        if self.guard is not None and self.guard.has("tool_args"):  # a block ends the run
            args = await self.guard.arguments(args, tool.name, call.id)
        return args, None

    async def _approval(self, item: Prepared, args: dict[str, Any], required: Sequence[str],
                        policy: dict[str, Any] | None) -> Outcome | Parked | None:
        """The approval rules: None lets the call run, a denial is its result, a question parks it."""
        rules = self.approvals or (_DEFAULT_RULES if required else None)
        if rules is None:
            return None
        verdict = rules.judge(item.tool.name, item.tool.effect, args, required, declared=item.tool.approval)
        if isinstance(verdict, Ask):
            return Parked(item.call, self._request(item, args, verdict), args, policy)
        if verdict.allowed:
            return None
        await self.record(item.call, item.tool.name, "denied", verdict.decided_by, None)
        denied = error_outcome(item.call, "approval_denied", verdict.message, decided_by=verdict.decided_by,
                               note=None)
        denied.policy = policy
        return denied

    async def _approved(self, item: Prepared) -> Outcome | Parked:
        """A human approved the call: the policy is asked again (rules or roles may have changed while it
        waited), then the backend runs."""
        call, tool, args, policy = item.call, item.tool, item.args, None
        for gate in self.gates:
            decision = await gate.check(GateCall(tool.name, tool.effect, args, self.ctx, tool.connector,
                                                 approval_granted=True))
            policy = {"decision": decision.decision, "audit_id": decision.audit_id}
            if isinstance(decision, Deny):
                return self._denied(call, decision, policy)
        outcome = await self._backend(item, args)
        outcome.policy = policy
        return outcome

    @staticmethod
    def _denied(call: ToolCall, decision: Deny, policy: dict[str, Any]) -> Outcome:
        denied = error_outcome(call, decision.code, decision.message, **decision.extra)
        denied.policy = policy
        return denied

    def _request(self, item: Prepared, args: dict[str, Any], ask: Ask) -> ApprovalRequest:
        ctx, seam = self.ctx, self.seam
        now = seam.now()
        return ApprovalRequest(
            approval_id=seam.new_id("ap"), run_id=ctx.run_id, conversation_id=ctx.conversation_id,
            tool_call_id=item.call.id, tool=item.tool.name, connector=item.tool.connector,
            args=to_jsonable_python(args, fallback=str), effect=item.tool.effect, reason=ask.reason,
            requested_at=seam.stamp(now), expires_at=seam.stamp(now + ask.timeout_s), timeout_s=ask.timeout_s)

    async def record(self, call: ToolCall, tool: str, decision: str, decided_by: str, note: str | None, *,
                     approval_id: str | None = None) -> None:
        """Append an approval decision to the audit log (`gates.md` §4.6)."""
        if self.audit is None:
            return
        ctx = self.ctx
        written = self.audit({
            "audit_id": self.seam.new_id("au"), "at": self.seam.stamp(), "action": "approval.decide",
            "approval_id": approval_id, "tool_call_id": call.id, "tool": tool, "decision": decision,
            "decided_by": decided_by, "note": note, "run_id": ctx.run_id, "conversation_id": ctx.conversation_id,
            "org_id": ctx.org_id, "realm": ctx.realm, "request_id": ctx.request_id,
            "subject": {"user_id": ctx.user_id, "org_id": ctx.org_id, "roles": list(ctx.roles),
                        "channel": ctx.channel}})
        if inspect.isawaitable(written):
            await written

    def _question(self, item: Prepared, args: dict[str, Any], question: Question) -> Parked:
        ctx, seam, limit = self.ctx, self.seam, self.settings.question_timeout_s
        now = seam.now()
        request = ApprovalRequest(
            approval_id=seam.new_id("q"), run_id=ctx.run_id, conversation_id=ctx.conversation_id,
            tool_call_id=item.call.id, tool=item.tool.name, connector=item.tool.connector,
            args=to_jsonable_python(args, fallback=str), effect=item.tool.effect, reason=question.question,
            requested_at=seam.stamp(now), expires_at=seam.stamp(now + limit) if limit else NEVER, timeout_s=limit or 0,
            question=question.as_dict())
        return Parked(item.call, request, args)

    async def _backend(self, item: Prepared, args: dict[str, Any]) -> Outcome | Parked:
        call, tool = item.call, item.tool
        call_ctx = self.ctx.for_call(call.id, tool.name) if tool.takes_context else self.ctx
        timeout = tool.timeout_s or self.batch_timeout([item])
        try:
            value = await _with_timeout(self.steps.call_tool(item.toolset, tool, args, call_ctx, call.id), timeout)
        except _Expired:
            call_ctx.cancelled.set()
            if not tool.timeout_s:  # no timeout of its own: the batch's bounded it
                return self._batch_expired(item)
            return error_outcome(call, "tool_timeout", f"tool {tool.name!r} timed out after {timeout:g} s")
        except asyncio.CancelledError:
            call_ctx.cancelled.set()
            raise
        except ToolFailure as exc:  # a coded failure the tool chose to report
            return error_outcome(call, exc.code, exc.message, **exc.extra)
        except Exception as exc:
            log.exception("tool %r failed", tool.name)
            return error_outcome(call, "tool_error", f"{type(exc).__name__}: {exc}")
        if isinstance(value, Question):  # a human answers it: the call waits, like one for approval
            return self._question(item, args, value)
        extra = {}
        if isinstance(value, Returned):
            value, extra = value.value, value.metadata
        content, cut = truncate(encode_result(value), tool.max_chars or self.settings.tool_result_max_chars)
        if self.guard is not None and self.guard.has("tool_result"):  # before the model sees it
            content = await self.guard.check("tool_result", content, tool=tool.name, tool_call_id=call.id)
        metadata = {**extra, "truncated": True} if cut else dict(extra)
        if tool.durable:
            metadata["durable"] = True
        return Outcome(call, content, truncated=cut, metadata=metadata, params=args)

    async def settle(self, item: Prepared | Outcome) -> Outcome | Parked:
        """One call from start to its final outcome (or parked for a human), hooks and telemetry included."""
        clock = self.seam.monotonic
        started = clock()
        call = item.call
        if telemetry.active():
            # the system's clock, not the run's seam: read only while something listens, it must not shift the
            # seam's recorded readings (a replay, with no listener, would read one fewer)
            telemetry.emit("ringlet.agent.tool_call.start", {"system_time": int(SYSTEM.now() * 1e9)},
                           {"tool_name": call.name, "call_id": call.id})
        with telemetry.span(lambda: (f"execute_tool {call.name}", {
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.id}), self.span_parent):
            outcome = item if isinstance(item, Outcome) else await self.execute(item)
        if isinstance(outcome, Parked):
            return outcome
        outcome.duration_ms = (clock() - started) * 1000
        if isinstance(item, Prepared) and not outcome.params:
            outcome.params = item.args
        return await self.finish(outcome)

    async def finish(self, outcome: Outcome) -> Outcome:
        """tool_executed inline, post_execute queued, telemetry stop."""
        call = outcome.call
        if self.hooks.has("tool_executed"):
            await self.hooks.fire("tool_executed", ToolExecutedContext(
                self.ctx, call=call, tool=call.name, result=outcome.content, is_error=outcome.is_error,
                metadata=outcome.metadata))
        if self.background is not None and self.hooks.has("post_execute"):
            code = (outcome.error or {}).get("code")
            cancelled = code in ("cancelled", "tool_timeout")
            self.background.submit(post_execute_job(self.hooks, PostExecuteContext(
                self.ctx, tool=call.name, params=outcome.params, result=outcome.content,
                success=not outcome.is_error, error=outcome.error, duration_ms=outcome.duration_ms,
                was_cancelled=cancelled,
                cancellation={"reason": code, "by": "timeout" if code == "tool_timeout" else "user",
                              "phase": "execute"} if cancelled else None)))
        if telemetry.active():
            telemetry.emit("ringlet.agent.tool_call.stop", {"duration_us": outcome.duration_ms * 1000},
                           {"tool_name": call.name, "call_id": call.id, "success": not outcome.is_error})
        return outcome

    def take_leftover(self) -> list[Event]:
        """Events tools emitted while their batch was being cancelled (a sub-agent's closing events)."""
        out, self.leftover = self.leftover, []
        return out

    def batch_timeout(self, items: Sequence[Prepared | Outcome]) -> float:
        longest = max((i.tool.timeout_s for i in items if isinstance(i, Prepared)), default=0.0)
        return max(self.settings.batch_timeout_s, longest)

    def _batch_expired(self, item: Prepared | Outcome) -> Outcome:
        return error_outcome(item.call, "tool_timeout",
                             f"tool {item.call.name!r} did not finish within the batch timeout of "
                             f"{self.batch_timeout([item]):g} s")

    async def run_batch(self, calls: Sequence[ToolCall | Prepared]) -> AsyncGenerator[Outcome | Parked | Event, None]:
        """Yield one outcome (or parked call) per call, as each finishes (a lone call's own timeout bounds
        it: `settle`), and the events tools emit meanwhile (`ctx.emit`: sub-agents'). Calls already
        `Prepared` (approved ones, on resume) skip resolution."""
        items = [c if isinstance(c, Prepared) else self.prepare(c) for c in calls]
        self.steps.batch([(i.call.id, i.tool) for i in items if isinstance(i, Prepared)])
        loop, clock = asyncio.get_running_loop(), self.seam.monotonic
        deadline = clock() + self.batch_timeout(items)
        limit = asyncio.Semaphore(self.settings.max_tool_concurrency)
        finished: asyncio.Queue[tuple[int, Outcome | Parked | Event | BaseException]] = asyncio.Queue()
        tasks: dict[int, asyncio.Task[None]] = {}
        self.ctx.emit = partial(_handed_over, finished)

        async def one(i: int) -> None:
            LANE.set(items[i].call.id)  # the task's own: its seam readings are in its call's lane
            try:
                async with limit:
                    finished.put_nowait((i, await self.settle(items[i])))
            except Exception as exc:  # e.g. a strict plugin failing: it fails the run, never hangs the batch
                finished.put_nowait((i, exc))

        done: set[int] = set()
        try:
            for phase in _phases(items, parallel=self.settings.parallel_tools):
                for i in phase:
                    tasks[i] = loop.create_task(one(i))
                while not done.issuperset(phase) and (got := await _next(finished, deadline - clock())) is not None:
                    done.add(got[0])
                    yield got[1]
                if not done.issuperset(phase):
                    break
        finally:
            await _cancel(tasks.values())
            self.ctx.emit = None
            late = [finished.get_nowait() for _ in range(finished.qsize())]  # finished while being cancelled
            self.leftover += [e for i, e in late if i < 0 and not isinstance(e, Outcome | Parked | BaseException)]
        for ev in self.take_leftover():
            yield ev
        for i, outcome in late:
            if i >= 0 and not isinstance(outcome, BaseException):
                done.add(i)
                yield outcome
        for i, item in enumerate(items):
            if i not in done:
                yield await self.finish(self._batch_expired(item))


def _phases(items: Sequence[Prepared | Outcome], *, parallel: bool) -> list[list[int]]:
    """Split a batch at `sequential` tools, which run alone after everything before them (each call alone
    when the batch is not `parallel`)."""
    if not parallel:
        return [[i] for i in range(len(items))]
    phases: list[list[int]] = [[]]
    for i, item in enumerate(items):
        if isinstance(item, Prepared) and item.tool.sequential:
            phases += [[i], []]
        else:
            phases[-1].append(i)
    return [p for p in phases if p]
