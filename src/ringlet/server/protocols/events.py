"""How ringlet's events read where the protocols say the same thing: the one reader the `/v1`, AG-UI and A2A
encoders feed a run's events to, and the small facts they each map to their own wire.

    nested / in_node     whose an event is: a sub-agent's (it carries `agent_path`), or the work inside a graph
                         node (it carries `node_id`); everything else is the run's own
    RunReader            one run's own events, fed in order: the answer's text as it streams (`Delta`: which
                         message, whether it opens one) or is withdrawn (`Retraction`), the run's start, how
                         it ends (`message_end`: finish reason and `Usage`; `error`: `RunError`;
                         `status: input_required`: paused)
    pauses               a `status` event saying the run waits for a human
    ask_event            a stored approval or question as the event that asked it

Who maps what: `/v1` streams `Delta`s as chunk content and joins messages with a blank line; AG-UI opens a
text message per message id; A2A appends every delta to one `answer` artifact. A `Retraction` of text a
client has: `/v1` cannot take text back, so its stream ends with a retryable error; AG-UI ends the message
and sends MESSAGES_SNAPSHOT (the stored transcript, without it); A2A replaces the `answer` artifact. A
run's end becomes a finish reason and usage (`/v1`), RUN_FINISHED or RUN_ERROR (AG-UI), or the task's last
status (A2A). Nothing here knows a protocol, and nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ringlet.store.records import Approval


def nested(payload: dict[str, Any]) -> bool:
    """A sub-agent's event, forwarded into its parent run's stream (it carries `agent_path`)."""
    return "agent_path" in payload


def in_node(payload: dict[str, Any]) -> bool:
    """An event of the work inside a graph node (it carries `node_id`): node_start / node_end, and what an llm
    node's inner run streams (its text, tool calls, approvals, questions; never its framing)."""
    return "node_id" in payload


def pauses(kind: str, payload: dict[str, Any]) -> bool:
    """A `status` event saying the run (or, when nested, a sub-agent) waits for a human."""
    return kind == "status" and payload.get("state") == "input_required"


@dataclass(frozen=True)
class Delta:
    """A piece of the answer's text, as a `content_delta` gave it."""

    text: str
    message_id: str
    """The assistant message it belongs to: one per model round that streams text."""
    first: bool
    """The first piece of this reader's answer."""
    opens: bool
    """It begins another message than the previous piece's (never for the first): a new model round after
    server-side tool calls."""


@dataclass(frozen=True)
class Retraction:
    """A `retracted` event of the run's own: the text it had streamed for `message_id` (if any) is
    withdrawn, and so are the tool calls `tool_call_ids` (each settled by a `superseded` result first)."""

    message_id: str | None
    tool_call_ids: tuple[str, ...]
    text: str
    """The withdrawn text this reader had (empty: none of it reached the answer)."""


@dataclass(frozen=True)
class Usage:
    """A run's usage as its `message_end` states it (zero tokens and no cost before it ends)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @classmethod
    def of(cls, end: dict[str, Any] | None) -> Usage:
        usage = (end or {}).get("usage") or {}
        return cls(usage.get("in_tokens", 0), usage.get("out_tokens", 0), usage.get("cost_usd"))


@dataclass(frozen=True)
class RunError:
    """What an `error` event says went wrong: its code, message, and whether trying again may help."""

    code: str
    message: str
    retryable: bool = False

    @classmethod
    def of(cls, payload: dict[str, Any]) -> RunError:
        return cls(payload["code"], payload.get("message", ""), bool(payload.get("retryable", False)))


@dataclass(eq=False)
class RunReader:
    """What one run's own events say, fed to it in order (`feed`): the answer's text and how the run ends.

    A sub-agent's events are never the run's own. Those inside graph nodes are not either, unless `nodes`:
    a graph's llm nodes stream their text into the answer (A2A shows it; AG-UI shows a graph's steps instead,
    and `/v1` runs no graphs)."""

    nodes: bool = False
    """Whether events inside graph nodes count as the run's own."""
    started: dict[str, Any] | None = None
    """The run's first `message_start` payload (its `run_id`, and `message_id`: the first round's message)."""
    messages: list[str] = field(default_factory=list)
    """The answer's text so far, one entry per assistant message, in the order they streamed."""
    message_ids: list[str] = field(default_factory=list)
    """The id of each entry of `messages`."""
    message_id: str | None = None
    """The message the last piece of text belongs to."""
    end: dict[str, Any] | None = None
    """The run's `message_end` payload, once it has ended."""
    error: RunError | None = None
    """The run's last `error`."""
    paused: dict[str, Any] | None = None
    """The run's `status: input_required` payload while it waits for a human (a later status clears it)."""

    def own(self, payload: dict[str, Any]) -> bool:
        return not nested(payload) and (self.nodes or not in_node(payload))

    def feed(self, kind: str, payload: dict[str, Any]) -> Delta | Retraction | None:
        """Note what a run's event says; the piece of answer text it adds, or what it withdraws (the run's
        own events only)."""
        if not self.own(payload):
            return None
        if kind == "content_delta":
            return self._text(payload["message_id"], payload["delta"])
        if kind == "retracted":
            return self._retract(payload.get("message_id"), tuple(payload.get("tool_call_ids") or ()))
        if kind == "message_start" and self.started is None:
            self.started = payload
        elif kind == "message_end":
            self.end = payload
        elif kind == "error":
            self.error = RunError.of(payload)
        elif kind == "status":
            self.paused = payload if pauses(kind, payload) else None
        return None

    def _text(self, message_id: str, text: str) -> Delta:
        first = self.message_id is None
        opens = not first and message_id != self.message_id
        if first or opens:
            self.messages.append("")
            self.message_ids.append(message_id)
        self.messages[-1] += text
        self.message_id = message_id
        return Delta(text, message_id, first=first, opens=opens)

    def _retract(self, message_id: str | None, calls: tuple[str, ...]) -> Retraction:
        text = ""
        if message_id is not None and message_id in self.message_ids:
            at = self.message_ids.index(message_id)
            text = self.messages.pop(at)
            del self.message_ids[at]
            self.message_id = self.message_ids[-1] if self.message_ids else None
        return Retraction(message_id, calls, text)

    @property
    def finish_reason(self) -> str | None:
        """The run's finish reason (`end_turn`, `max_iterations`, `empty_response`, `cancelled`, `error`); None
        before it has ended."""
        return None if self.end is None else self.end.get("finish_reason")

    @property
    def usage(self) -> Usage:
        return Usage.of(self.end)


def ask_event(record: Approval) -> tuple[str, dict[str, Any]]:
    """A stored approval or question as the event that asked it: (`approval_required` | `question`, its
    payload)."""
    if record.kind == "question":
        q = record.question or {}
        return "question", {**q, "question_id": record.approval_id, "tool_call_id": record.tool_call_id}
    return "approval_required", {"approval_id": record.approval_id, "tool_call_id": record.tool_call_id,
                                 "tool": record.tool, "args": record.args, "effect": record.effect,
                                 "reason": record.reason, "expires_at": record.expires_at}
