"""The tool rounds (`loop-and-hooks.md` §1–2, `gates.md` §4): run a batch of calls, or apply humans'
decisions to the calls a paused run waits on; then pause, hand deferred calls over, or go on.

`tool_round(run, step)` and `resume_round(run, step)` yield `tool_result` (and `approval_required` or
`question`) events as calls settle, then the next step.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import replace

from ringlet.events import ApprovalRequiredEvent, ContentDeltaEvent, Event, QuestionEvent, QuestionOption
from ringlet.gates.approval import ApprovalDecision, ApprovalRequest
from ringlet.loop.next_step import CallModel, End, ResumeTools, RunTools, Step, Suspend, next_round
from ringlet.loop.run import Run
from ringlet.loop.terminal import terminal_tool
from ringlet.loop.tools import Outcome, Parked, Prepared, decision_for, error_outcome, undecided
from ringlet.loop.typed_output import call_answer, check_call, invalid_call, output_call, retry
from ringlet.messages import ToolCall


async def tool_round(run: Run, step: RunTools) -> AsyncGenerator[Event | Step, None]:
    """Run the calls of one response: a terminal call ends the run, deferred calls go to the caller."""
    st, calls = run.state, step.message.tool_calls
    st.pending_calls = list(calls)
    run.tool_calls_count += len(calls)
    term = terminal_call(run, calls)
    if term is not None:
        async for item in terminal_answer(run, term, calls):
            yield item
        return
    problem, result = None, output_call(run, calls)
    if result is not None:
        if (problem := await check_call(run, result)) is None:
            async for item in call_answer(run, result, calls):
                yield item
            return
        for ev in took(run, invalid_call(run, result, problem)):
            yield ev
        calls = [c for c in calls if c is not result]
    calls = hand_over(run, calls)
    route = run.registry.routes.get(calls[0].name) if len(calls) == 1 else None
    if len(calls) == 1 and not (route and route[1].emits):  # the common case, without the batch queue
        for ev in took(run, await run.tools.settle(run.tools.prepare(calls[0]))):
            yield ev
    elif calls:
        async with aclosing(run.tools.run_batch(calls)) as outcomes:
            async for outcome in outcomes:
                for ev in took(run, outcome):
                    yield ev
    after = await round_end(run)
    yield retry(run, problem, told=True)[1] if problem is not None and isinstance(after, CallModel) else after


def hand_over(run: Run, calls: Sequence[ToolCall]) -> Sequence[ToolCall]:
    """The batch's calls of deferred tools are the caller's to run (`state.deferred_calls`); the rest."""
    st = run.state
    deferred = [c for c in calls if (route := run.registry.routes.get(c.name)) and route[1].deferred]
    if not deferred:
        return calls
    st.deferred_calls = deferred
    st.pending_calls = [c for c in st.pending_calls if c not in deferred]
    return [c for c in calls if c not in deferred]


async def resume_round(run: Run, step: ResumeTools) -> AsyncGenerator[Event | Step, None]:
    """Apply humans' decisions to the parked calls: approved ones run (policy re-check, then the
    backend), the others get their error result; undecided ones keep the run paused. Requests past
    their `expires_at` count as denied (`approval_timeout`)."""
    st, now = run.state, run.seam.now()
    cancelled = any(d.status == "cancelled" for d in step.decisions.values())
    ready: list[Prepared] = []
    for call_id, parked in list(st.awaiting.items()):
        decision = decision_for(step.decisions, parked.request, cancelled=cancelled, now=now)
        if decision is None:
            continue
        del st.awaiting[call_id]
        applied = await apply(run, parked, decision)
        if isinstance(applied, Prepared):
            ready.append(applied)
        else:
            yield run.settled(await run.tools.finish(applied))
    if ready:
        async with aclosing(run.tools.run_batch(ready)) as outcomes:
            async for outcome in outcomes:
                for ev in took(run, outcome):
                    yield ev
    for ev in run.drain():
        yield ev
    yield End("cancelled", "canceled") if cancelled else await round_end(run)


async def apply(run: Run, parked: Parked, decision: ApprovalDecision) -> Prepared | Outcome:
    """One decision: audited (and captured, with its note); an approved call is ready to run, any
    other gets its error result."""
    request = parked.request
    if request.question is not None:  # an answer (or its lack) is the call's result
        if decision.status == "answered" and decision.answer:
            await capture(run, [], decision=f"{decision.decided_by} answered {request.question['question']!r}: "
                                           f"{decision.answer.get('answer')}")
        return undecided(parked, decision)
    await run.tools.record(parked.call, request.tool, decision.status, decision.decided_by, decision.note,
                           approval_id=request.approval_id)
    if decision.note:  # a human's reasons are worth remembering
        args = json.dumps(request.args, ensure_ascii=False)[:200]
        await capture(run, [], decision=f"{decision.decided_by} {decision.status} {request.tool}({args}): "
                                       f"{decision.note}")
    prepared = run.tools.prepare(parked.call)  # the route stage again: a connector call is its inner tool
    if isinstance(prepared, Outcome):  # the tool (or its connector, or access to it) is gone: that error
        return prepared
    if decision.status == "approved" or (decision.status == "executing" and prepared.tool.idempotent):
        return Prepared(parked.call, prepared.toolset, prepared.tool, parked.args, approved=decision)
    outcome = undecided(parked, decision)
    outcome.policy = parked.policy
    return outcome


async def capture(run: Run, durable: Sequence[Outcome], decision: str | None = None) -> None:
    """Implicit capture of durable tool results and human decisions (memory agents only)."""
    if run.config.memory is not None:
        from ringlet.memory.tools import capture as remember

        items = [("tool_result", f"{o.call.name}: {' '.join(o.content.split())[:300]}") for o in durable]
        await remember(run.config.memory, run.ctx, items + ([("decision", decision)] if decision else []))


def took(run: Run, outcome: Outcome | Parked | Event) -> list[Event]:
    """A call's outcome as its `tool_result` event, a parked call as its `approval_required` (or
    `question`); an event a tool emitted passes as it is."""
    if not isinstance(outcome, Outcome | Parked):
        return [outcome]
    if isinstance(outcome, Parked):
        run.state.awaiting[outcome.call.id] = outcome
        first: Event = asked(run, outcome.request)
    else:
        first = run.settled(outcome)
    return [first, *run.drain()]


def asked(run: Run, r: ApprovalRequest) -> Event:
    """A parked call's `approval_required`, or `question` for a question. The whole request (connector,
    requested_at, timeout_s) is in the run state: `state.awaiting[r.tool_call_id].request`."""
    if (q := r.question) is None:
        return run.event(ApprovalRequiredEvent, approval_id=r.approval_id, tool_call_id=r.tool_call_id,
                         tool=r.tool, args=r.args, effect=r.effect, reason=r.reason, expires_at=r.expires_at)
    return run.event(QuestionEvent, question_id=r.approval_id, tool_call_id=r.tool_call_id, question=q["question"],
                     input_type=q["input_type"], allow_freeform=q["allow_freeform"],
                     options=tuple(QuestionOption(o["label"], o.get("description")) for o in q["options"]))


async def round_end(run: Run) -> Step:
    """Pause while calls wait for a human; otherwise append the results in call order and go on."""
    st = run.state
    if st.awaiting:
        return Suspend()
    calls = st.pending_calls
    results = run.append_results(calls)
    if run.config.memory is not None:  # implicit capture; nothing to do (per round) without memory
        await capture(run, [o for o in results if not o.is_error and o.metadata.get("durable")])
    if st.deferred_calls:  # the caller runs these: hand the calls over
        st.results = {}
        return End("end_turn", "input_required")
    failed = sorted((o.call.name, str(o.error.get("code")), str(o.error.get("message", "")))
                    for o in results if o.is_error and o.error)
    st.error_streak = st.error_streak + 1 if failed and failed == st.error_fingerprint else int(bool(failed))
    st.error_fingerprint = failed
    st.results = {}
    st.iteration += 1
    await run.on_iteration(len(calls))
    if st.error_streak >= run.settings.max_repeated_tool_errors:
        return CallModel("repeated_error")
    return next_round(st, run.settings)


def terminal_call(run: Run, calls: Sequence[ToolCall]) -> ToolCall | None:
    """The batch's valid call to the terminal tool, if it has one."""
    name = run.settings.terminal_tool
    route = run.registry.routes.get(name or "")
    if name is None or route is None or route[1] is not terminal_tool(name):
        return None  # no terminal tool, or an ordinary tool of the agent's own that has the name
    for c in calls:
        if c.name == name:
            prepared = run.tools.prepare(c)
            if not isinstance(prepared, Outcome):
                return replace(c, arguments=prepared.args)
    return None


async def terminal_answer(run: Run, term: ToolCall, calls: Sequence[ToolCall]) -> AsyncGenerator[Event | Step, None]:
    """The terminal call's `text` is the answer; the batch's other calls are skipped."""
    for c in calls:
        outcome = (Outcome(c, '{"success":true}', params=dict(term.arguments)) if c.id == term.id else
                   error_outcome(c, "skipped", f"run ended by {term.name}"))
        yield run.settled(await run.tools.finish(outcome))
    run.append_results(calls)
    text = str(term.arguments["text"])
    message_id = run.seam.new_id("m")
    yield run.event(ContentDeltaEvent, message_id=message_id, delta=text)
    run.add("assistant", text, id=message_id, metadata={"terminal_tool": term.name})
    yield End("end_turn", "completed")
