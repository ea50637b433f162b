"""A run as its caller holds it: `AgentStream` (the events as they come, then the result) and `RunResult`
(how the run ended, or paused). `Agent.stream()` gives the one, `Agent.run()` returns the other."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, cast

from typing_extensions import TypeVar

from ringlet._ids import SYSTEM
from ringlet.agent.forks import Fork, fork_at
from ringlet.errors import ConfigError
from ringlet.events import Event, FinishReason, RunStatus, SteerQueuedEvent
from ringlet.gates.approval import NEVER, ApprovalDecision, ApprovalRequest, Approver, epoch
from ringlet.loop import Run, RunState, Suspend, agent_loop
from ringlet.loop.fields import new_dict
from ringlet.loop.steering import MemoryInbox, Steer
from ringlet.messages import Message
from ringlet.usage import Usage

__all__ = ["AgentStream", "OutputT", "RunResult"]

OutputT = TypeVar("OutputT", default=str)
"""The type of a run's result: `str` (the answer's text) unless the agent has an `output_type`."""


@dataclass(slots=True)
class RunResult(Generic[OutputT]):
    """How a run ended. `state` is the serialisable run state (enough to inspect or continue the run)."""

    run_id: str
    output: OutputT | None
    """The answer: its text, or with an `output_type` the validated result — None when such a run did not
    produce it: it failed (`error`, e.g. `output_validation_failed`) or paused (`pending_approvals`). Typed
    `| None` for every run, so code checks before it reads a field (a text run's is then what it said so far)."""
    finish_reason: FinishReason | None
    """None while the run is paused for approvals."""
    status: RunStatus
    usage: Usage
    messages: list[Message]
    error: dict[str, Any] | None
    state: RunState = field(repr=False)
    pending_approvals: dict[str, ApprovalRequest] = field(default_factory=new_dict)
    """The paused run's approval requests and questions (`request.question` set), by tool-call id: decide
    or answer them, then `agent.resume(state, …)`."""

    def new_messages(self) -> list[Message]:
        """The messages of this run: its input and everything the run added."""
        return self.messages[self.state.history_length:]

    def fork(self, at: str | int, *, edit: str | None = None, tool_result: str | None = None,
             tool_call_id: str | None = None, rerun: bool = False) -> Fork:
        """This run's transcript forked at message `at` (its id or index): `agent.run(fork.prompt,
        history=fork.history)` goes on from there. `edit`: new text for that user message; `tool_result`: a
        result in place of a tool call's; `rerun`: run that call again (`ringlet.agent.forks`)."""
        return fork_at(self.messages, at, edit=edit, tool_result=tool_result, tool_call_id=tool_call_id,
                       rerun=rerun)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (without the state): output, finish_reason, status, usage, messages, error."""
        return {"run_id": self.run_id, "output": self.output, "finish_reason": self.finish_reason,
                "status": self.status, "usage": self.usage.as_dict(), "error": self.error,
                "messages": [m.model_dump(mode="json") for m in self.messages],
                "pending_approvals": {k: asdict(r) for k, r in self.pending_approvals.items()}}


class AgentStream(Generic[OutputT]):
    """The events of one run, as an async iterator; `.result` is available once `message_end` has passed
    (or once the run paused for approvals: `.paused`). With an `approver` the stream waits for its
    decisions instead of pausing. What a consumer needs is in the events and in `.state` (serialisable)."""

    def __init__(self, run: Run, incoming: Sequence[Message], *, approver: Approver | None = None,
                 resume: Mapping[str, ApprovalDecision] | None = None) -> None:
        self.run = run
        events = agent_loop(run, incoming, resume)
        self._events = events if approver is None else self._waiting(events, approver)

    async def _waiting(self, events: AsyncGenerator[Event, None], approver: Approver) -> AsyncGenerator[Event, None]:
        """Resume the paused run with the approver's decisions (or at the earliest expiry) until it ends."""
        run = self.run
        while True:
            async with aclosing(events):
                async for event in events:
                    yield event
            if not run.paused:
                return
            requests = [p.request for p in run.state.awaiting.values()]
            earliest = min((epoch(r.expires_at) for r in requests if r.expires_at != NEVER), default=None)
            try:
                async with asyncio.timeout(None if earliest is None else max(0.0, earliest - run.seam.now())):
                    decisions = dict(await approver.wait(requests))
            except TimeoutError:
                decisions = {}  # the loop counts an expired request as denied
            except asyncio.CancelledError:  # cancelled while waiting: the run still ends with message_end
                cancel = {r.tool_call_id: ApprovalDecision("cancelled", "system:cancel") for r in requests}
                async for event in agent_loop(run, (), cancel):
                    yield event
                raise
            events = agent_loop(run, (), decisions)

    @property
    def run_id(self) -> str:
        return self.run.state.run_id

    @property
    def state(self) -> RunState:
        """The run state: transcript, usage, `response_id` (the id `message_start` gave), and while paused
        `awaiting` (each waiting call's whole `ApprovalRequest`)."""
        return self.run.state

    @property
    def paused(self) -> bool:
        """Whether the run paused for humans' decisions: set when its `status: input_required` event is
        yielded; no `message_end` until `Agent.resume` continues it."""
        return self.run.paused

    @property
    def ending(self) -> bool:
        """Whether the run is closing: its last events (`status`, `message_end`) are being yielded."""
        return self.run.end is not None and not self.run.paused

    def steer(self, text: str | Message, *, steer_id: str | None = None) -> SteerQueuedEvent:
        """Send the working run a user message: it joins the transcript at the run's next round boundary
        (after the current tool calls settle, before the next model request), and the stream yields
        `steer_taken` then. Returns the `steer_queued` event. A run with no round left (it is answering, or
        has ended) does not take it: it is in `steers_left`, to start the next run with."""
        inbox = self.run.inbox
        if not isinstance(inbox, MemoryInbox):
            raise ConfigError(f"run {self.run_id} takes its steers from its durable inbox; send them to its "
                              "workflow (the server's `mode: \"steer\"`)")
        message = text if isinstance(text, Message) else Message.user(text, source="steer")
        steer = Steer(steer_id or SYSTEM.new_id("st"), message)
        inbox.put(steer)
        return SteerQueuedEvent(run_id=self.run_id, ts=SYSTEM.stamp(), steer_id=steer.steer_id, message_id=message.id,
                                text=message.text)

    @property
    def steers_left(self) -> list[Message]:
        """The steers the run did not take (sent after its last round), once it has ended or paused: start
        the next run with them (`agent.stream(stream.steers_left, history=result.messages)`)."""
        inbox = self.run.inbox
        if self.run.end is None or not isinstance(inbox, MemoryInbox):
            return []
        return [s.message for s in inbox.queue]

    def __aiter__(self) -> AsyncGenerator[Event, None]:
        return self._events  # iterate the loop itself: no wrapper on the per-event path

    async def __anext__(self) -> Event:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()

    async def stream_output(self) -> AsyncGenerator[OutputT, None]:
        """Run to the end, yielding the typed result as it streams: validated partial values while the
        model writes it (each one further along), then the final value. Without an `output_type`, the
        text so far. Afterwards `.result` is set as usual."""
        output, raw, source, last = self.run.config.output, "", None, None
        tool_mode = output is not None and output.mode == "tool"
        async for event in self:
            if tool_mode and event.type == "tool_call_start" and event.name == output.name:  # type: ignore[union-attr]
                source, raw = event.tool_call_id, ""
                continue
            if tool_mode and event.type == "tool_call_delta" and event.tool_call_id == source:
                raw += event.args_delta
            elif not tool_mode and event.type == "content_delta":
                if event.message_id != source:  # a new message: a new answer
                    source, raw = event.message_id, ""
                raw += event.delta
            else:
                continue
            value: Any = raw if output is None else output.partial(raw)
            if value is not None and value != last:
                last = value
                yield value
        if output is not None and self.run.output_value is not None and self.run.output_value != last:
            yield self.run.output_value

    @property
    def result(self) -> RunResult[OutputT] | None:
        """How the run ended (or paused), or None while it has not."""
        end, st, output = self.run.end, self.run.state, self.run.config.output
        if end is None:
            return None
        end = None if isinstance(end, Suspend) else end
        e = end.error if end else None
        final = next((m for m in reversed(st.messages) if m.role == "assistant"), None)
        text = final.text if final and not final.tool_calls else ""
        value: Any = text if output is None else self.run.output_value
        if value is None and output is not None and st.output is not None:  # resumed elsewhere: from JSON
            value = output.validate(st.output)
        return RunResult(run_id=st.run_id, output=cast("OutputT", value),
                         finish_reason=end.reason if end else None, status=end.status if end else "input_required",
                         usage=st.usage, messages=list(st.messages),
                         error={"code": e.code, "message": e.message, "details": e.details} if e else None,
                         state=st, pending_approvals={k: p.request for k, p in st.awaiting.items()})
