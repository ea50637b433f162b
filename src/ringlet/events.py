"""The event union every consumer reads: CLI, SSE, OpenAI chunks, store and telemetry.

Each event has a `type` literal and serialises 1:1 to the payload of `server-contract.md` §4.2 with
`event.model_dump()` (or `model_dump_json()`). The nesting fields `agent_path`, `parent_tool_call_id`,
`depth` and `node_id` appear only when set; so do the optional fields the contract marks with `?`.

Events are slotted dataclasses, not pydantic models: the loop makes several per round and a dataclass
costs a fraction of a validated model. Pydantic still parses, validates and serialises them
(`event_adapter`) and gives their JSON Schema. Treat events as immutable values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, TypeAdapter

FinishReason = Literal["end_turn", "max_iterations", "empty_response", "length", "cancelled", "error"]
RunStatus = Literal["working", "completed", "failed", "canceled", "input_required"]
NotificationLevel = Literal["info", "warning", "error", "success", "progress"]

_NESTING = frozenset({"agent_path", "parent_tool_call_id", "depth", "node_id"})


@cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


@dataclass(slots=True, kw_only=True)
class BaseEvent:
    """Fields every event carries."""

    _optional: ClassVar[frozenset[str]] = frozenset()

    run_id: str
    """The run this event belongs to."""
    ts: str
    """When it happened (ISO 8601, UTC)."""
    agent_path: tuple[str, ...] | None = None
    """For a sub-agent's event: the agents from the top run down to the one that emitted it."""
    parent_tool_call_id: str | None = None
    """For a sub-agent's event: the parent's `spawn_agent` call."""
    depth: int | None = None
    """For a sub-agent's event: how deep it is (1 for a child of the top run)."""
    node_id: str | None = None
    """For a graph run's event: the node that emitted it."""

    def model_dump(self) -> dict[str, Any]:
        """The JSON payload of this event (what an SSE `data:` line carries)."""
        data = _adapter(type(self)).dump_python(self, mode="json")
        for key in _NESTING | self._optional:
            if data.get(key, 0) is None:
                del data[key]
        return data

    def model_dump_json(self) -> str:
        return json.dumps(self.model_dump(), ensure_ascii=False, separators=(",", ":"))


@dataclass(slots=True, kw_only=True)
class MessageStartEvent(BaseEvent):
    """An assistant message starts (`message_id`); its text follows as `content_delta` events."""

    type: Literal["message_start"] = "message_start"
    message_id: str
    conversation_id: str | None = None
    agent: str
    role: Literal["assistant"] = "assistant"


@dataclass(slots=True, kw_only=True)
class ContentDeltaEvent(BaseEvent):
    """A piece of the assistant message's text, as the provider streamed it."""

    type: Literal["content_delta"] = "content_delta"
    message_id: str
    delta: str


@dataclass(slots=True, kw_only=True)
class ToolCallStartEvent(BaseEvent):
    """The model starts a tool call: its id, the tool's `name`, its `connector` (a catalog or MCP tool) and its
    `index` in the batch."""

    type: Literal["tool_call_start"] = "tool_call_start"
    tool_call_id: str
    name: str
    connector: str | None = None
    index: int


@dataclass(slots=True, kw_only=True)
class ToolCallDeltaEvent(BaseEvent):
    """A piece of a tool call's arguments: concatenated, the deltas are the arguments' JSON."""

    type: Literal["tool_call_delta"] = "tool_call_delta"
    tool_call_id: str
    args_delta: str


@dataclass(slots=True, kw_only=True)
class ToolResultEvent(BaseEvent):
    """A tool call settled: its `result`, or its `error` (`code`, `message`, …) with `is_error`; `duration_ms`,
    whether the result was `truncated`, and the `policy` decision."""

    _optional: ClassVar[frozenset[str]] = frozenset({"result", "error", "policy"})
    type: Literal["tool_result"] = "tool_result"
    tool_call_id: str
    name: str
    result: Any = None
    error: dict[str, Any] | None = None
    is_error: bool = False
    duration_ms: float = 0.0
    truncated: bool = False
    policy: dict[str, Any] | None = None


@dataclass(slots=True, kw_only=True)
class ApprovalRequiredEvent(BaseEvent):
    """A tool call waits for a human's decision (`approval_id`), with the tool, its arguments and effect, why,
    and the deadline."""

    type: Literal["approval_required"] = "approval_required"
    approval_id: str
    tool_call_id: str
    tool: str
    args: dict[str, Any]
    effect: Literal["read", "write", "destructive"]
    reason: str
    expires_at: str | None = None


@dataclass(slots=True)
class QuestionOption:
    label: str
    description: str | None = None


@dataclass(slots=True, kw_only=True)
class QuestionEvent(BaseEvent):
    """The run asks a human a question (`ask_question`, a graph's `input` node, an MCP elicitation) and waits
    for the answer."""

    _optional: ClassVar[frozenset[str]] = frozenset({"tool_call_id", "default"})
    type: Literal["question"] = "question"
    question_id: str
    tool_call_id: str | None = None
    question: str
    input_type: Literal["single-select", "multi-select", "text"]
    options: tuple[QuestionOption, ...] = ()
    allow_freeform: bool = False
    default: Any = None


@dataclass(slots=True)
class Progress:
    current: float
    total: float | None = None


@dataclass(slots=True, kw_only=True)
class NotificationEvent(BaseEvent):
    """Something worth showing that is not part of the answer: a model fallback, an MCP server's progress or log
    message, a warning."""

    _optional: ClassVar[frozenset[str]] = frozenset({"progress"})
    type: Literal["notification"] = "notification"
    level: NotificationLevel
    title: str
    message: str = ""
    source: str = "ringlet"
    progress: Progress | None = None


@dataclass(slots=True, kw_only=True)
class StatusEvent(BaseEvent):
    """The run's status changed: `working`, `completed`, `failed`, `canceled` or `input_required`."""

    type: Literal["status"] = "status"
    state: RunStatus


@dataclass(slots=True, kw_only=True)
class CompactionEvent(BaseEvent):
    """The oldest turns were summarised (or truncated) to keep the prompt within its budget."""

    type: Literal["compaction"] = "compaction"
    summary_message_id: str | None
    removed_messages: int
    tokens_before: int
    tokens_after: int
    trigger: Literal["threshold", "context_window", "manual"]
    method: Literal["summarize", "truncate"]


@dataclass(slots=True, kw_only=True)
class NodeStartEvent(BaseEvent):
    """A graph node starts (its type, super-step and visit; `item_index` for a map's item)."""

    _optional: ClassVar[frozenset[str]] = frozenset({"item_index"})
    type: Literal["node_start"] = "node_start"
    node_type: str
    step: int
    visit: int
    item_index: int | None = None


@dataclass(slots=True, kw_only=True)
class NodeEndEvent(BaseEvent):
    """A graph node ended: its outcome, duration and the nodes next."""

    _optional: ClassVar[frozenset[str]] = frozenset({"error", "item_index"})
    type: Literal["node_end"] = "node_end"
    node_type: str
    step: int
    duration_ms: float
    outcome: Literal["ok", "fallback", "failed"]
    next: tuple[str, ...] = ()
    error: Any = None
    item_index: int | None = None


@dataclass(slots=True, kw_only=True)
class RetractedEvent(BaseEvent):
    """What a model attempt streamed is withdrawn: the request was abandoned (the worker executing it
    stopped) and is sent again. Clients drop the text streamed so far for `message_id` (the next attempt may
    stream that message again, from its start) and the tool calls `tool_call_ids`; each of those calls was
    settled first by a `tool_result` with error code `superseded`, and none of them ran."""

    _optional: ClassVar[frozenset[str]] = frozenset({"message_id"})
    type: Literal["retracted"] = "retracted"
    message_id: str | None = None
    tool_call_ids: tuple[str, ...] = ()
    reason: str = "resent"


@dataclass(slots=True, kw_only=True)
class GuardrailEvent(BaseEvent):
    """A guardrail decided on a text of the run: `guardrail` (its name), `stage` (`input`, `output`,
    `tool_args`, `tool_result`), `decision` (`allow`, `redact`, `block`), the `kinds` it found (`email`,
    `card`, `injection`, …), the `reason` of a block, the tool call or message the text belongs to, the
    `usage` of a model-graded guardrail's own request (with its `cost_usd`), and the `audit_id` of its
    audit record. A block is followed by the error `guardrail_blocked`; the text it withheld is never sent."""

    _optional: ClassVar[frozenset[str]] = frozenset({"reason", "tool", "tool_call_id", "message_id", "usage",
                                                     "audit_id"})
    type: Literal["guardrail"] = "guardrail"
    guardrail: str
    stage: Literal["input", "output", "tool_args", "tool_result"]
    decision: Literal["allow", "redact", "block"]
    kinds: tuple[str, ...] = ()
    reason: str | None = None
    tool: str | None = None
    tool_call_id: str | None = None
    message_id: str | None = None
    usage: dict[str, Any] | None = None
    audit_id: str | None = None


@dataclass(slots=True, kw_only=True)
class SteerQueuedEvent(BaseEvent):
    """A user message was queued into the working run (`stream.steer(text)`, or `mode: "steer"` on the API):
    the run takes it at its next round boundary (`steer_taken`), or, when it had no round left, the message
    starts the next run. `message_id`: the user message it becomes; `text`: its text."""

    type: Literal["steer_queued"] = "steer_queued"
    steer_id: str
    message_id: str
    text: str


@dataclass(slots=True, kw_only=True)
class SteerTakenEvent(BaseEvent):
    """The run took a queued steer (`steer_id`): its user message (`message_id`) joined the transcript after the
    round's tool results, before the next model request."""

    type: Literal["steer_taken"] = "steer_taken"
    steer_id: str
    message_id: str


@dataclass(slots=True, kw_only=True)
class MessageEndEvent(BaseEvent):
    """The assistant message (and the run's answer) ends: its `finish_reason` and `usage` (`in_tokens`,
    `out_tokens`, `cost_usd`, and `cache_read_tokens`/`cache_write_tokens` when a provider's prompt cache took
    part). Always the last event of a run."""

    type: Literal["message_end"] = "message_end"
    message_id: str
    finish_reason: FinishReason
    usage: dict[str, Any]


@dataclass(slots=True, kw_only=True)
class ErrorEvent(BaseEvent):
    """The run failed: `code` (see the error codes), `message`, and whether a retry can help. Always followed by
    `message_end` with `finish_reason: error`."""

    type: Literal["error"] = "error"
    code: str
    message: str
    retryable: bool = False


@dataclass(slots=True)
class PingEvent:
    """The keepalive. It has no run, no id and is never stored."""

    type: Literal["ping"] = "ping"

    def model_dump(self) -> dict[str, Any]:
        return {}

    def model_dump_json(self) -> str:
        return "{}"


Event = Annotated[
    MessageStartEvent | ContentDeltaEvent | ToolCallStartEvent | ToolCallDeltaEvent | ToolResultEvent
    | ApprovalRequiredEvent | QuestionEvent | NotificationEvent | StatusEvent | CompactionEvent
    | NodeStartEvent | NodeEndEvent | RetractedEvent | GuardrailEvent | SteerQueuedEvent | SteerTakenEvent
    | MessageEndEvent | ErrorEvent | PingEvent,
    Field(discriminator="type"),
]



def __getattr__(name: str) -> Any:
    """`event_adapter` parses an event dict or JSON back into its class (`event_adapter.validate_python(d)`);
    it is built on first use, so importing this module stays cheap."""
    if name == "event_adapter":
        return _adapter(Event)  # type: ignore[arg-type]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
