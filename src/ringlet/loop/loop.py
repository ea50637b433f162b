"""The agent loop: one async generator that sequences rounds and nothing else.

Each round is an async generator function of the `Run` that yields events and, last, the explicit next
step: `CallModel` (maybe the tool-less final request), `RunTools`, `ResumeTools`, `Suspend` or `End`.
`agent_loop` matches on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing

from ringlet import logs, telemetry
from ringlet.errors import ProviderError, RunError
from ringlet.events import Event
from ringlet.gates.approval import ApprovalDecision
from ringlet.loop.lifecycle import close, pause, start, take_steers
from ringlet.loop.model_round import model_round
from ringlet.loop.next_step import STEPS, CallModel, End, ResumeTools, RunTools, Step, Suspend, first_step
from ringlet.loop.run import Run
from ringlet.loop.tool_round import resume_round, tool_round
from ringlet.messages import Message

log = logging.getLogger("ringlet.loop")


def round_for(run: Run, step: CallModel | RunTools | ResumeTools) -> AsyncGenerator[Event | Step, None]:
    """The round a step asks for: a model request, a batch of tools, or humans' decisions applied."""
    if isinstance(step, CallModel):  # steers sent to the run join the transcript before its next request
        return steered_round(run, step) if run.inbox.pending else model_round(run, step)
    return tool_round(run, step) if isinstance(step, RunTools) else resume_round(run, step)


async def steered_round(run: Run, step: CallModel) -> AsyncGenerator[Event | Step, None]:
    """The steers waiting for the run join the transcript (`ringlet.loop.steering`), then the model round."""
    async for ev in take_steers(run):
        yield ev
    async with aclosing(model_round(run, step)) as items:
        async for item in items:
            yield item


async def agent_loop(run: Run, incoming: Sequence[Message],
                     resume: Mapping[str, ApprovalDecision] | None = None) -> AsyncGenerator[Event, None]:
    """Run rounds until the model answers or a limit is hit; always end with exactly one message_end,
    unless calls wait for a human: then the run pauses (`run.paused`) and `resume` (the decisions, by
    tool-call or approval id) continues it later, from the same state, toward that one message_end."""
    st, end, cancelled = run.state, None, None
    with telemetry.span(lambda: (f"invoke_agent {run.config.name}", {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": run.config.name,
            "ringlet.run_id": st.run_id})) as span, \
            logs.bound(st.run_id, run.ctx.conversation_id, run.ctx.realm, span):
        run.span, run.end = span, None
        try:
            async for ev in start(run, incoming, resumed=resume is not None):
                yield ev
            step: Step = first_step(incoming, resume)
            while not isinstance(step, End | Suspend):
                items = round_for(run, step)
                try:
                    async for item in items:
                        if isinstance(item, STEPS):
                            step = item
                        else:
                            yield item
                finally:  # a run cancelled or closed mid-round closes the round at once
                    await items.aclose()
            end = step
        except asyncio.CancelledError as exc:
            end, cancelled = End("cancelled", "canceled"), exc
        except Exception as exc:
            end = _failed(exc, st.run_id)
        finally:
            telemetry.emit("ringlet.agent.complete", {"total_iterations": st.iteration},
                           {"tool_calls_count": run.tool_calls_count, "finish_reason": _reason(end)})
        run.end = end = end or End("cancelled", "canceled")  # set first: `result` is ready by the last event
        async for ev in pause(run) if isinstance(end, Suspend) else close(run, end):
            yield ev
    if cancelled is not None:
        raise cancelled


def _failed(exc: Exception, run_id: str) -> End:
    """How a run that raised ends: its RunError, a provider's error, or `internal_error` (logged)."""
    if isinstance(exc, RunError):
        return End("error", "failed", exc)
    if isinstance(exc, ProviderError):
        return End("error", "failed", RunError(exc.code, exc.message, retryable=exc.retryable,
                                               details={"status": exc.status, "provider": exc.provider}))
    log.exception("run %s failed", run_id, exc_info=exc)
    return End("error", "failed", RunError("internal_error", f"{type(exc).__name__}: {exc}"))


def _reason(end: Step | None) -> str:
    return "input_required" if isinstance(end, Suspend) else end.reason if isinstance(end, End) else "cancelled"
