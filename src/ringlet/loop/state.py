"""The run state between rounds: one plain, JSON-serialisable value.

Everything a paused run needs to continue lives here, so a run can stop after any round and resume in
another process (or on a durable engine): `RunState.from_json(state.to_json())`. It is a plain dataclass
(mutated every round, so attribute writes must be cheap); pydantic (de)serialises it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import TypeAdapter

from ringlet.events import RunStatus
from ringlet.loop.fields import new_dict, new_list
from ringlet.loop.tools import Outcome, Parked
from ringlet.messages import Message, ToolCall
from ringlet.usage import Usage


@dataclass(slots=True)
class RunState:
    run_id: str
    agent: str
    conversation_id: str | None = None
    messages: list[Message] = field(default_factory=new_list)
    """The whole transcript, input included."""
    plugin_data: dict[str, Any] = field(default_factory=new_dict)
    usage: Usage = field(default_factory=Usage)
    status: RunStatus | None = None
    """None until the run starts."""
    iteration: int = 0
    """Rounds whose tools were executed (and `self` rounds): what `max_iterations` caps."""
    requests: int = 0
    """Model requests made so far; message durations count these."""
    born: dict[str, int] = field(default_factory=new_dict)
    """message id -> `requests` when the message joined the transcript (for durations)."""
    blank_finish_reasons: list[str | None] = field(default_factory=new_list)
    """Finish reasons of the current streak of blank responses."""
    error_fingerprint: list[tuple[str, str, str]] = field(default_factory=new_list)
    error_streak: int = 0
    call_counter: int = 0
    pending_calls: list[ToolCall] = field(default_factory=new_list)
    """Tool calls of the current batch that have no result yet."""
    deferred_calls: list[ToolCall] = field(default_factory=new_list)
    """Calls of deferred tools the run ended on: the caller runs them (`Tool.deferred`)."""
    results: dict[str, Outcome] = field(default_factory=new_dict)
    """Results of the current batch so far, by tool-call id (appended to the transcript in call order
    once every call has one)."""
    awaiting: dict[str, Parked] = field(default_factory=new_dict)
    """Calls of the current batch waiting for a human, by tool-call id: the run is paused while any is."""
    context_notes: dict[str, str] = field(default_factory=new_dict)
    """The run's context notes by kind (`memory`, `graph_context`): built once, recorded for audit."""
    response_id: str = ""
    """The message id of the run's `message_start`: a resumed run ends with the same id."""
    realm: str = "default"
    user_id: str | None = None
    org_id: str | None = None
    roles: list[str] = field(default_factory=new_list)
    channel: str = "chat"
    request_id: str | None = None
    history_length: int = 0
    """How many messages came before this run's input."""
    has_durations: bool = False
    """Whether any message has a `duration`, which makes the prompt a filtered view of the transcript."""

    output: Any = None
    """The validated result of a typed-output run, as JSON (`ringlet.output`)."""
    output_retries: int = 0
    """Results that did not validate so far."""
    has_compaction: bool = False
    """Whether the transcript holds a `<compacted>` note: the prompt then starts with it and leaves out what
    it covers."""

    def append(self, message: Message) -> None:
        self.messages.append(message)
        self.born[message.id] = self.requests
        meta = message.metadata
        if meta.get("duration") is not None:
            self.has_durations = True
        if meta.get("kind") == "compaction" or meta.get("compacted_into"):
            self.has_compaction = True

    def to_json(self) -> bytes:
        return _adapter().dump_json(self)

    @classmethod
    def from_json(cls, data: str | bytes) -> RunState:
        return _adapter().validate_json(data)


@cache
def _adapter() -> TypeAdapter[RunState]:
    return TypeAdapter(RunState)
