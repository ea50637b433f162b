"""How a run starts (`message_start`, the incoming messages, status `working`, its tools and context
notes), takes the steers sent to it (`ringlet.loop.steering`), pauses for humans (status `input_required`),
and ends (open calls cancelled, `error`, status, exactly one `message_end`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from ringlet.errors import RunError
from ringlet.events import (
    ErrorEvent,
    Event,
    MessageEndEvent,
    MessageStartEvent,
    SteerTakenEvent,
    ToolCallDeltaEvent,
    ToolCallStartEvent,
)
from ringlet.hooks.plugin import UserMessageContext
from ringlet.loop.next_step import End, RunTools, first_step
from ringlet.loop.run import Run
from ringlet.loop.steering import Steer
from ringlet.loop.tools import ToolRunner, error_outcome
from ringlet.messages import Message, ToolCall

log = logging.getLogger("ringlet.loop")


async def start(run: Run, incoming: Sequence[Message], resumed: bool) -> AsyncIterator[Event]:
    """A new run starts with message_start (a resumed one continues the same message); then its input
    joins the transcript, its status is `working`, and its tools and context notes are ready."""
    st, hooks = run.state, run.config.hooks
    if resumed:
        run.last_message_id = next((m.id for m in reversed(st.messages[st.history_length:])
                                    if m.role == "assistant"), None)
    else:
        st.response_id = run.seam.new_id("m")
        yield run.event(MessageStartEvent, message_id=st.response_id, conversation_id=st.conversation_id,
                        agent=run.config.name)
    for given in incoming:
        message = given if given.run_id else replace(given, run_id=st.run_id, conversation_id=st.conversation_id)
        if message.role == "user" and run.guard is not None and run.guard.has("input"):
            message = await run.guard.message(message)  # redacted before the model sees it
        st.append(message)
        if message.role == "user" and hooks.has("user_message_received"):
            await hooks.fire("user_message_received", UserMessageContext(run.ctx, message=message))
    async for ev in run.set_status("working"):
        yield ev
    async for ev in _tools_ready(run):
        yield ev
    if run.config.memory is not None:
        await context_notes(run, incoming)
    run.tools = ToolRunner(run.registry, hooks, run.config.steps, run.settings, ctx=run.ctx,
                           background=run.background() if run.background else None, span_parent=run.span,
                           gates=run.config.gates, approvals=run.config.approvals, audit=run.config.audit,
                           guard=run.guard)
    for ev in run.drain():
        yield ev
    if not resumed and isinstance(rerun := first_step(incoming, None), RunTools):
        for ev in announce(run, rerun.message.tool_calls):
            yield ev


async def _tools_ready(run: Run) -> AsyncIterator[Event]:
    """The run's tools (`run.registry`): the agent's, when they never change, else listed now. A toolset
    that may ask a human while it lists (`asks_while_listing`: an MCP server behind OAuth asks its user to
    connect first) is listed in a task, and what it emits meanwhile (`ctx.emit`: the question, status
    `input_required`) is handed on at once, while the run waits."""
    toolsets = run.config.toolsets
    if run.config.registry is not None:
        run.registry = run.config.registry
        return
    if not any(getattr(ts, "asks_while_listing", False) for ts in toolsets):
        run.registry = await run.tool_registry()
    else:
        emitted: asyncio.Queue[Event] = asyncio.Queue()
        run.ctx.emit = emitted.put_nowait
        task = asyncio.ensure_future(run.tool_registry())
        try:
            while not task.done():
                waiting = asyncio.ensure_future(emitted.get())
                await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
                if waiting.done():
                    yield waiting.result()
                else:
                    waiting.cancel()
            while not emitted.empty():
                yield emitted.get_nowait()
            run.registry = task.result()
        finally:
            run.ctx.emit = None
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    if all(ts.static_tools is not None for ts in toolsets):
        run.config.registry = run.registry  # static tools: every later run shares it


def announce(run: Run, calls: Sequence[ToolCall]) -> list[Event]:
    """`tool_call_start` and the arguments of calls the run's input asks it to run (a fork's re-run): no
    model request of this run streamed them."""
    events: list[Event] = []
    for index, c in enumerate(calls):
        route = run.registry.routes.get(c.name)
        events.append(run.event(ToolCallStartEvent, tool_call_id=c.id, name=c.name, index=index,
                                connector=route[1].connector if route else None))
        events.append(run.event(ToolCallDeltaEvent, tool_call_id=c.id, args_delta=c.raw_arguments))
    return events


async def context_notes(run: Run, incoming: Sequence[Message]) -> None:
    """Build the notes once per run, from the incoming user message (a resumed run keeps its own); they
    are recorded in the run state, for audit and replay."""
    st, memory = run.state, run.config.memory
    text = next((m.text for m in reversed(incoming) if m.role == "user"), None)
    if memory is not None and text is not None and not st.context_notes:
        st.context_notes = dict(await memory.notes(run.ctx, text))
    run.prompt.use_notes(st.context_notes, run.seam.stamp())


async def take_steers(run: Run) -> AsyncIterator[Event]:
    """The round boundary: the waiting steers join the transcript as user messages (`steer_taken` each)."""
    st, hooks = run.state, run.config.hooks
    taken = [Steer(s.steer_id, replace(s.message, run_id=st.run_id, conversation_id=st.conversation_id,
                                       metadata={**s.message.metadata, "steer_id": s.steer_id}))
             for s in await run.inbox.take(st.requests)]
    if taken:
        run.config.steps.took(st.requests, taken)  # a recording keeps them (`ringlet.replay`)
    for steer in taken:
        message = steer.message
        st.append(message)
        if hooks.has("user_message_received"):
            await hooks.fire("user_message_received", UserMessageContext(run.ctx, message=message))
        yield run.event(SteerTakenEvent, steer_id=steer.steer_id, message_id=message.id)
        for ev in run.drain():
            yield ev


async def pause(run: Run) -> AsyncIterator[Event]:
    """Calls wait for a human: status input_required, and no message_end until the run resumes. What a
    resumer needs is the run state: `state.awaiting` holds each parked call and its whole request."""
    async for ev in run.set_status("input_required"):
        yield ev


async def close(run: Run, end: End) -> AsyncIterator[Event]:
    """Settle open calls as cancelled, report the error, set the status, end with message_end."""
    st = run.state
    tools = getattr(run, "tools", None)  # None when the run failed before its tools were ready
    for ev in tools.take_leftover() if tools is not None else ():
        yield ev
    for c in [c for c in st.pending_calls if c.id not in st.results]:  # hooks see cancelled calls too
        outcome = error_outcome(c, "cancelled")
        try:
            outcome = await run.tools.finish(outcome)
        except RunError:  # a strict plugin failing now cannot change how the run ended
            log.exception("tool_executed hook failed while run %s was ending", st.run_id)
        yield run.settled(outcome)
    if st.pending_calls:
        run.append_results(st.pending_calls)
    for ev in run.drain():
        yield ev
    if end.error is not None:
        yield run.event(ErrorEvent, code=end.error.code, message=end.error.message, retryable=end.error.retryable)
    try:
        async for ev in run.set_status(end.status):
            yield ev
    except RunError:  # a strict plugin failing now cannot change how the run ended
        log.exception("status_changed hook failed while run %s was ending", st.run_id)
    yield run.event(MessageEndEvent, message_id=run.last_message_id or st.response_id, finish_reason=end.reason,
                    usage=st.usage.summary())
