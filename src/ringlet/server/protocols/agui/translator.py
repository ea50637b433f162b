"""Ringlet events → AG-UI events. The run's own events are read by the shared `RunReader`
(`protocols/events.py`: its text, first message, end, error, pause); this maps them to AG-UI's.

**Events** (ringlet event → AG-UI):

    (start of the stream)           RUN_STARTED {threadId, runId, metadata.ringlet.run_id}
    content_delta                   TEXT_MESSAGE_START (first delta of a message id) + TEXT_MESSAGE_CONTENT;
                                    TEXT_MESSAGE_END when the message's round ends
    tool_call_start / _delta        TOOL_CALL_START {parentMessageId: the round's message} / TOOL_CALL_ARGS
    tool_result                     TOOL_CALL_END (every open call of the round, first) + TOOL_CALL_RESULT
    approval_required / question    CUSTOM {name: "ringlet.approval_required" | "ringlet.question",
                                    value: the ringlet payload}
    status input_required           RUN_FINISHED {outcome: {type: "interrupt", interrupts: [...]}}
    node_start / node_end           STEP_STARTED / STEP_FINISHED {stepName: node id, `id[i]` for a map's
                                    item i}; a graph run's state
                                    is read from its checkpoint: STATE_SNAPSHOT first, then STATE_DELTA
                                    (JSON Patch) whenever it changed (at each node_start and at the end)
    notification                    CUSTOM {name: "ringlet.notification"}
    retracted                       TEXT_MESSAGE_END / TOOL_CALL_END for what is open, then MESSAGES_SNAPSHOT
                                    (the stored transcript, without the withdrawn text and calls); the
                                    message, streamed again, comes under a new id
    error + message_end             MESSAGES_SNAPSHOT + RUN_ERROR {message, code}
    message_end                     MESSAGES_SNAPSHOT + RUN_FINISHED {outcome: success | cancelled, usage}

**Nothing is left open.** Before the run's last event, on every path (success, interrupt, error, cancel, a
stream that ended without the run's end), whatever is still open is closed: the text message
(TEXT_MESSAGE_END), tool calls (TOOL_CALL_END), and steps (STEP_FINISHED, innermost first), e.g. the node a
graph is paused at, which ends only when the resumed run passes it (and starts it again in the resumed
stream). `@ag-ui/client` refuses a RUN_FINISHED while any of them is active. A node_end whose start this
stream did not carry is sent as STEP_STARTED + STEP_FINISHED.

Events of sub-agents (`agent_path`) and inside graph nodes (`node_id`) are not shown as text or tool calls,
only their approvals and questions (the graph's End output is its answer). Ringlet's models stream no
reasoning, so there are no REASONING_* events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Interrupt,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from ringlet._ids import new_id
from ringlet.server.protocols.agui.interrupts import interrupt_of
from ringlet.server.protocols.events import Delta, Retraction, RunError, RunReader, ask_event, nested
from ringlet.server.runs.service import Runs

UNFINISHED = RunError("interrupted", "the run ended without its end event")
"""What a stream that ended without the run's end (and no error) says."""


def ringlet_run(run_id: str) -> dict[str, Any]:
    """The metadata naming the ringlet run behind an AG-UI run (`GET /api/v1/runs/{id}`, the event log)."""
    return {"ringlet": {"run_id": run_id}}


@dataclass(eq=False)
class Translator:
    """Ringlet events of one run into AG-UI events. A ringlet run has one message_start/message_end around
    every model round; each round's text is its own AG-UI text message (ringlet's message id), and its tool
    calls are ended (TOOL_CALL_END) once the round's streaming is over, before their results."""

    thread_id: str
    run_id: str
    """ringlet's run."""
    client_run: str
    """The AG-UI run (the input's `runId`), which the run's AG-UI events name."""
    run: RunReader = field(default_factory=RunReader)
    """What the run's own events say: its first round's message, its end, error or pause."""
    text: str | None = None
    """The open text message."""
    round_id: str | None = None
    """The message id of the current model round, once known."""
    calls: list[str] = field(default_factory=list)
    """Tool calls started and not ended yet."""
    steps: list[str] = field(default_factory=list)
    """Steps (graph nodes) started and not finished yet, in the order they started."""
    interrupts: dict[str, Interrupt] = field(default_factory=dict)
    results: int = 0
    renamed: dict[str, str] = field(default_factory=dict)
    """A retracted message's id → the AG-UI id its next attempt streams under."""
    resync: bool = False
    """Text or calls were retracted: the stream sends MESSAGES_SNAPSHOT next (then clears this)."""

    @property
    def ending(self) -> dict[str, Any] | None:
        """What ended the stream: the message_end payload, or the input_required status."""
        return self.run.end if self.run.end is not None else self.run.paused

    def feed(self, kind: str, payload: dict[str, Any]) -> list[BaseEvent]:
        if kind in ("approval_required", "question"):
            return [*self._close(), self._interrupt(kind, payload)]
        if kind in ("notification", "guardrail") and not nested(payload):  # no AG-UI event says these
            return [CustomEvent(name=f"ringlet.{kind}", value=payload)]
        if kind in ("node_start", "node_end") and not nested(payload):
            return [*self._close(), *self._step(kind, payload)]
        delta = self.run.feed(kind, payload)
        if not self.run.own(payload):
            return []  # a sub-agent's own work, or inside a graph node: its answer is the graph's output
        if delta is not None:
            return self._retracted(delta) if isinstance(delta, Retraction) else self._content(delta)
        handler = getattr(self, "_" + kind, None)
        return handler(payload) if handler is not None else []

    def _content(self, delta: Delta) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        message_id = self.renamed.get(delta.message_id, delta.message_id)
        if self.text != message_id:
            out = [*self._close(), TextMessageStartEvent(message_id=message_id, role="assistant")]
            self.text = self.round_id = message_id
        if delta.text:
            out.append(TextMessageContentEvent(message_id=message_id, delta=delta.text))
        return out

    def _retracted(self, retraction: Retraction) -> list[BaseEvent]:
        """An abandoned attempt's text and calls are withdrawn: its open message and calls end, the stream
        sends the stored transcript (`resync`), and the message, if the next attempt streams it again, comes
        under a new id (a client finds messages by id: it would append to the withdrawn one)."""
        out = self._close()
        if retraction.message_id is not None:
            self.renamed[retraction.message_id] = new_id("m")
        self.round_id, self.resync = None, True
        return out

    def _tool_call_start(self, payload: dict[str, Any]) -> list[BaseEvent]:
        out = self._end_text()
        if self.round_id is None:  # a round that streamed no text: its message id is not in the events
            first = self.run.started["message_id"] if self.run.started else None  # the first round's message
            self.round_id = first if self.results == 0 and first else new_id("m")
        self.calls.append(payload["tool_call_id"])
        return [*out, ToolCallStartEvent(tool_call_id=payload["tool_call_id"], tool_call_name=payload["name"],
                                         parent_message_id=self.round_id)]

    def _tool_call_delta(self, payload: dict[str, Any]) -> list[BaseEvent]:
        if not payload["args_delta"]:
            return []
        return [ToolCallArgsEvent(tool_call_id=payload["tool_call_id"], delta=payload["args_delta"])]

    def _tool_result(self, payload: dict[str, Any]) -> list[BaseEvent]:
        out = self._close()
        self.round_id, self.results = None, self.results + 1
        value = payload.get("error") if payload.get("is_error") else payload.get("result")
        content = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return [*out, ToolCallResultEvent(message_id=new_id("m"), tool_call_id=payload["tool_call_id"],
                                          content=content, role="tool")]

    def _status(self, payload: dict[str, Any]) -> list[BaseEvent]:
        return self._close() if self.run.paused is not None else []  # the reader noted the pause

    def _error(self, payload: dict[str, Any]) -> list[BaseEvent]:
        return self._close()  # the reader noted the error

    def _message_end(self, payload: dict[str, Any]) -> list[BaseEvent]:
        return self._close()  # the reader noted the end

    def _step(self, kind: str, payload: dict[str, Any]) -> list[BaseEvent]:
        """A node's STEP_STARTED / STEP_FINISHED, named so that no two open steps share a name (a map's items
        run one node at once)."""
        name = payload["node_id"] if payload.get("item_index") is None else \
            f"{payload['node_id']}[{payload['item_index']}]"
        if kind == "node_start":
            out: list[BaseEvent] = [StepFinishedEvent(step_name=name)] if name in self.steps else []
            if name in self.steps:  # started again before its end: the first run of it is over
                self.steps.remove(name)
            self.steps.append(name)
            return [*out, StepStartedEvent(step_name=name)]
        if name in self.steps:
            self.steps.remove(name)
            return [StepFinishedEvent(step_name=name)]
        return [StepStartedEvent(step_name=name), StepFinishedEvent(step_name=name)]  # started before this stream

    def closing(self) -> list[BaseEvent]:
        """What is still open, closed before the run's last event: the text message, tool calls, and steps
        (innermost first)."""
        steps: list[BaseEvent] = [StepFinishedEvent(step_name=s) for s in reversed(self.steps)]
        self.steps = []
        return [*self._close(), *steps]

    def _interrupt(self, kind: str, payload: dict[str, Any]) -> BaseEvent:
        interrupt = interrupt_of(kind, payload)
        self.interrupts[interrupt.id] = interrupt
        return CustomEvent(name=f"ringlet.{kind}", value=payload)

    def _end_text(self) -> list[BaseEvent]:
        if self.text is None:
            return []
        ended, self.text = self.text, None
        return [TextMessageEndEvent(message_id=ended)]

    def _close(self) -> list[BaseEvent]:
        """End the open text message and every open tool call (their round's streaming is over)."""
        ended: list[BaseEvent] = [ToolCallEndEvent(tool_call_id=c) for c in self.calls]
        self.calls = []
        return [*self._end_text(), *ended]

    def _finished(self, **fields: Any) -> RunFinishedEvent:
        return RunFinishedEvent(thread_id=self.thread_id, run_id=self.client_run, metadata=ringlet_run(self.run_id),
                                **fields)

    async def end(self, runs: Runs) -> BaseEvent:
        """The run's last AG-UI event: RUN_ERROR, or RUN_FINISHED (an interrupt, cancelled, or success)."""
        run = self.run
        if run.error is not None or run.finish_reason == "error" or self.ending is None:
            error = run.error or UNFINISHED
            return RunErrorEvent(message=error.message, code=error.code)
        if run.end is None:  # paused for a human
            return await self._interrupted(runs)
        if run.finish_reason == "cancelled":
            return self._finished(outcome=RunFinishedCancelledOutcome())
        usage = run.usage
        return self._finished(usage=[TokenUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                                                total_tokens=usage.total_tokens)])

    async def _interrupted(self, runs: Runs) -> BaseEvent:
        """RUN_FINISHED with the interrupts the paused run waits on."""
        pending = await runs.records.approvals.list(run_id=self.run_id, status="pending")
        for record in pending:  # also those asked before this stream began (a partly decided batch)
            if record.approval_id not in self.interrupts:
                interrupt = interrupt_of(*ask_event(record))
                self.interrupts[interrupt.id] = interrupt
        live = {r.approval_id for r in pending}
        interrupts = [i for i in self.interrupts.values() if i.id in live] or list(self.interrupts.values())
        if not interrupts:  # paused on nothing it can name here (e.g. decided meanwhile): resend to see
            return self._finished()
        return self._finished(outcome=RunFinishedInterruptOutcome(interrupts=interrupts))
