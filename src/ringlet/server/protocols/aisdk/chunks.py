"""Ringlet events → the AI SDK's UI message stream chunks. The run's own events are read by the shared
`RunReader` (`protocols/events.py`); this maps them to the chunks `useChat` builds its assistant message from.

    (start of the stream)           start {messageMetadata.ringlet: {run_id, conversation_id}}
    (a model round streams)         start-step; after tool results, finish-step + start-step
    content_delta                   text-start (first delta of a message id) + text-delta; text-end when the
                                    round's text is over
    tool_call_start / _delta        tool-input-start {toolCallId, toolName} / tool-input-delta
                                    {inputTextDelta}; tool-input-available {input} once the arguments
                                    are a whole JSON object (else when the round's streaming is over)
    tool_result                     tool-output-available {output}; tool-output-error {errorText};
                                    tool-output-denied for a call a human (or a rule) denied
    approval_required               tool-approval-request {approvalId: the approval id, toolCallId}
    question                        tool-approval-request {approvalId: the question id, toolCallId} on the
                                    `ask_question` call, or on a dynamic `question` tool part (input: the
                                    question) when no tool call asked it (a graph's input node)
    retracted                       reset-step: the abandoned attempt's text and calls leave the message
    error                           error {errorText: "code: message"}, then finish {finishReason: error}
    message_end                     finish-step + finish {finishReason, messageMetadata: {usage, ringlet}}
    status input_required           finish-step + finish {finishReason: tool-calls}: the client answers
                                    with addToolApprovalResponse and sends the messages again

A cancelled run ends `abort {reason}` + finish {finishReason: other}. Before the end, on every path, whatever
is open is closed (text part, tool inputs, step). Events of sub-agents and inside graph nodes are not shown,
only their approvals and questions. Ringlet's models stream no reasoning, so there are no reasoning parts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ringlet.server.protocols.events import Delta, Retraction, RunReader, ask_event
from ringlet.store.records import Approval

Chunk = dict[str, Any]
FINISH_REASONS = {"end_turn": "stop", "max_iterations": "length", "empty_response": "other"}


@dataclass
class _Call:
    name: str
    args: str = ""


@dataclass(eq=False)
class Chunks:
    """One run's events into UI message chunks."""

    run_id: str
    conversation_id: str
    run: RunReader = field(default_factory=RunReader)
    text: str | None = None
    """The open text part's id."""
    step: bool = False
    """A step (model round) is open."""
    settled: bool = False
    """A tool call of the open step has its result: what streams next is the next round's."""
    calls: dict[str, _Call] = field(default_factory=dict)
    """Tool calls whose input streams: not available yet."""
    shown: set[str] = field(default_factory=set)
    """Tool calls this stream made available (their input)."""
    asked: set[str] = field(default_factory=set)
    """Approvals and questions this stream asked."""

    @property
    def ending(self) -> dict[str, Any] | None:
        """What ended the stream: the message_end payload, or the input_required status."""
        return self.run.end if self.run.end is not None else self.run.paused

    def metadata(self, **more: Any) -> dict[str, Any]:
        return {"ringlet": {"run_id": self.run_id, "conversation_id": self.conversation_id, **more}}

    def start(self) -> list[Chunk]:
        return [{"type": "start", "messageMetadata": self.metadata()}]

    def feed(self, kind: str, payload: dict[str, Any]) -> list[Chunk]:
        if kind == "approval_required":
            return self.approval(payload["approval_id"], payload["tool_call_id"], payload["tool"], payload["args"])
        if kind == "question":
            return self.approval(payload["question_id"], payload.get("tool_call_id"), "question", payload)
        delta = self.run.feed(kind, payload)
        if not self.run.own(payload):
            return []
        if isinstance(delta, Retraction):  # its calls' `superseded` results leave with the step: it goes on
            self.settled = False
            return [*self._close(), {"type": "reset-step"}]
        if isinstance(delta, Delta):
            return self._content(delta)
        handler = getattr(self, "_" + kind, None)
        return handler(payload) if handler is not None else []

    def _message_start(self, payload: dict[str, Any]) -> list[Chunk]:
        return [*self._close(), *self._open_step()]

    def _content(self, delta: Delta) -> list[Chunk]:
        out = self._round()
        if self.text != delta.message_id:
            out += [*self._close(), {"type": "text-start", "id": delta.message_id}]
            self.text = delta.message_id
        if delta.text:
            out.append({"type": "text-delta", "id": delta.message_id, "delta": delta.text})
        return out

    def _tool_call_start(self, payload: dict[str, Any]) -> list[Chunk]:
        out = [*self._round(), *self._end_text()]
        self.calls[payload["tool_call_id"]] = _Call(payload["name"])
        return [*out, {"type": "tool-input-start", "toolCallId": payload["tool_call_id"], "toolName": payload["name"]}]

    def _tool_call_delta(self, payload: dict[str, Any]) -> list[Chunk]:
        call = self.calls.get(payload["tool_call_id"])
        if call is None or not payload["args_delta"]:
            return []
        call.args += payload["args_delta"]
        out: list[Chunk] = [{"type": "tool-input-delta", "toolCallId": payload["tool_call_id"],
                             "inputTextDelta": payload["args_delta"]}]
        complete = _complete(call.args)
        if complete is not None:  # the arguments are whole: the input is available before the call runs
            del self.calls[payload["tool_call_id"]]
            out.append(self._available(payload["tool_call_id"], call.name, complete))
        return out

    def _tool_result(self, payload: dict[str, Any]) -> list[Chunk]:
        out = self._close()
        call_id, self.settled = payload["tool_call_id"], True
        error = payload.get("error") or {}
        if payload.get("is_error") and error.get("code") == "approval_denied":
            return [*out, {"type": "tool-output-denied", "toolCallId": call_id}]
        if payload.get("is_error"):
            text = f"{error.get('code', 'error')}: {error.get('message', '')}".rstrip(": ")
            return [*out, {"type": "tool-output-error", "toolCallId": call_id, "errorText": text}]
        return [*out, {"type": "tool-output-available", "toolCallId": call_id, "output": payload.get("result")}]

    def _status(self, payload: dict[str, Any]) -> list[Chunk]:
        return self._close() if self.run.paused is not None else []

    def _error(self, payload: dict[str, Any]) -> list[Chunk]:
        return self._close()

    def _message_end(self, payload: dict[str, Any]) -> list[Chunk]:
        return self._close()

    def approval(self, approval_id: str, call_id: str | None, tool: str, args: Any) -> list[Chunk]:
        """tool-approval-request on the call it is about; a call this stream did not show (asked before it
        began, a sub-agent's, or none: a graph's question) is shown first as a dynamic tool part."""
        if approval_id in self.asked:
            return []
        self.asked.add(approval_id)
        out = self._close()
        call_id = call_id or approval_id
        if call_id not in self.shown:
            self.shown.add(call_id)
            out.append({"type": "tool-input-available", "toolCallId": call_id, "toolName": tool, "input": args,
                        "dynamic": True})
        return [*out, {"type": "tool-approval-request", "approvalId": approval_id, "toolCallId": call_id}]

    def closing(self) -> list[Chunk]:
        """What is still open, closed before the end: the text part, tool inputs, the step."""
        return [*self._close(), *self._finish_step()]

    def end(self, pending: list[Approval]) -> list[Chunk]:
        """The last chunks: the error, the approvals a paused run waits on, or how it finished."""
        run = self.run
        if run.error is not None or run.finish_reason == "error" or self.ending is None:
            code, message = (run.error.code, run.error.message) if run.error else (
                "interrupted", "the run ended without its end event")
            return [{"type": "error", "errorText": f"{code}: {message}"},
                    {"type": "finish", "finishReason": "error", "messageMetadata": self.metadata(error=code)}]
        if run.end is None:  # paused for a human
            out = [c for record in pending for c in self.approval(
                record.approval_id, record.tool_call_id, *_asked(record))]
            return [*out, {"type": "finish", "finishReason": "tool-calls",
                           "messageMetadata": self.metadata(status="input_required")}]
        reason = run.finish_reason or "other"
        metadata = {"usage": {"inputTokens": run.usage.input_tokens, "outputTokens": run.usage.output_tokens,
                              "totalTokens": run.usage.total_tokens, "costUsd": run.usage.cost_usd},
                    **self.metadata(finish_reason=reason)}
        aborted = [{"type": "abort", "reason": "cancelled"}] if reason == "cancelled" else []
        return [*aborted, {"type": "finish", "finishReason": FINISH_REASONS.get(reason, "other"),
                           "messageMetadata": metadata}]

    def _round(self) -> list[Chunk]:
        """The step of the model round that streams: a new one after tool results."""
        if not self.settled:
            return self._open_step()
        self.settled = False
        return [*self._close(), *self._finish_step(), *self._open_step()]

    def _open_step(self) -> list[Chunk]:
        if self.step:
            return []
        self.step = True
        return [{"type": "start-step"}]

    def _finish_step(self) -> list[Chunk]:
        if not self.step:
            return []
        self.step = False
        return [{"type": "finish-step"}]

    def _end_text(self) -> list[Chunk]:
        if self.text is None:
            return []
        ended, self.text = self.text, None
        return [{"type": "text-end", "id": ended}]

    def _close(self) -> list[Chunk]:
        """End the open text part and make every streaming tool input available (the round's streaming is
        over)."""
        out = self._end_text()
        out += [self._available(call_id, call.name, _parsed(call.args)) for call_id, call in self.calls.items()]
        self.calls = {}
        return out

    def _available(self, call_id: str, name: str, args: Any) -> Chunk:
        self.shown.add(call_id)
        return {"type": "tool-input-available", "toolCallId": call_id, "toolName": name, "input": args}


def _asked(record: Approval) -> tuple[str, Any]:
    kind, payload = ask_event(record)
    return (payload["tool"], payload["args"]) if kind == "approval_required" else ("question", payload)


def _complete(args: str) -> dict[str, Any] | None:
    """The arguments, once their JSON object is whole (no longer text can be an object too)."""
    if not args.rstrip().endswith("}"):
        return None
    try:
        found = json.loads(args)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _parsed(args: str) -> Any:
    try:
        return json.loads(args) if args else {}
    except ValueError:
        return args


def frame(chunk: Chunk) -> bytes:
    return f"data: {json.dumps(chunk, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()

