"""What the next request sends: the duration filter (`loop-and-hooks.md` §4.3), the token budget, and a
run's `PromptParts` (its instructions, context notes and token counts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ringlet.loop.fields import new_dict, new_list
from ringlet.messages import Message
from ringlet.models.base import ModelSettings
from ringlet.models.tokens import estimate_message, estimate_text, prompt_tokens

if TYPE_CHECKING:
    from ringlet.loop.state import RunState


@dataclass(eq=False, slots=True)
class PromptParts:
    """What every request of one run starts from: its instructions and sampling settings, its context
    notes, and the token counts made so far (so that each round counts only what is new)."""

    instructions: str | None
    settings: ModelSettings
    instruction_tokens: int = 0
    notes: list[Message] = field(default_factory=new_list)
    """The run's context notes (`<memory>`, `<graph_context>`), as system messages; never stored."""
    note_tokens: int = 0
    tokens: dict[str, int] = field(default_factory=new_dict)
    """Tokens by message id: reported by the provider for its answers, else estimated once."""
    counted: int = 0
    transcript_tokens: int = 0

    def use_notes(self, notes: Mapping[str, str], stamp: str) -> None:
        """Carry `notes` (by kind) in every request of the run, made at `stamp` (the run's clock)."""
        self.notes = [Message(id=f"note_{kind}", role="system", content=note, metadata={"context_note": kind},
                              created_at=stamp) for kind, note in notes.items()]
        self.note_tokens = sum(estimate_message(m) for m in self.notes)

    def transcript(self, st: RunState) -> list[Message]:
        """The transcript the next request sees: the duration filter, and after a compaction its note first
        and the messages it covers left out."""
        prompt = visible_messages(st.messages, st.born, st.requests, st.has_durations)
        return without_compacted(prompt) if st.has_compaction else prompt

    def estimate(self, st: RunState, transcript: list[Message], tool_tokens: int) -> int:
        """The tokens of a request made of the instructions, the notes, `transcript` and the tools."""
        if st.has_durations or st.has_compaction:
            return prompt_tokens(self.instructions, [*self.notes, *transcript], tool_tokens, self.tokens)
        for m in st.messages[self.counted:]:  # the whole transcript: count only what joined it since last time
            self.transcript_tokens += self.tokens.get(m.id) or estimate_message(m)
        self.counted = len(st.messages)
        return self.instruction_tokens + tool_tokens + self.transcript_tokens + self.note_tokens

    @classmethod
    def of(cls, instructions: str | None, settings: ModelSettings) -> PromptParts:
        return cls(instructions, settings, estimate_text(instructions or ""))


def visible_messages(messages: Sequence[Message], born: dict[str, int], requests: int,
                     has_durations: bool = True) -> list[Message]:
    """Messages the next request may see.

    A message with `duration` N is sent in at most the N requests made after it was created; 0 means UI
    only; None means always. An assistant tool-call message and its results are one unit: if any of them
    is sent, all are.
    """
    if not has_durations:
        return list(messages)
    keep = [_fresh(m, born, requests) for m in messages]
    unit_of: dict[str, int] = {}
    for i, m in enumerate(messages):
        for call in m.tool_calls:
            unit_of[call.id] = i
    for i, m in enumerate(messages):
        owner = unit_of.get(m.tool_call_id or "")
        if owner is not None and keep[i] != keep[owner]:
            keep[i] = keep[owner] = True
    for i, m in enumerate(messages):  # propagate a kept owner to all its results
        owner = unit_of.get(m.tool_call_id or "")
        if owner is not None and keep[owner]:
            keep[i] = True
    return [m for m, k in zip(messages, keep, strict=True) if k]


def _fresh(message: Message, born: dict[str, int], requests: int) -> bool:
    duration = message.metadata.get("duration")
    if duration is None:
        return True
    return requests - born.get(message.id, requests) < duration


def effective_budget(max_tokens_per_turn: int, context_window: int | None, max_output_tokens: int | None) -> int:
    """`min(max_tokens_per_turn, context_window - max_output_tokens)` (`loop-and-hooks.md` §7)."""
    if context_window is None:
        return max_tokens_per_turn
    return min(max_tokens_per_turn, context_window - (max_output_tokens or 0))


def without_compacted(messages: Sequence[Message]) -> list[Message]:
    """The prompt after a compaction: its `<compacted>` note first, the messages it covers left out."""
    note = next((m for m in reversed(messages) if m.metadata.get("kind") == "compaction"
                 and not m.metadata.get("compacted_into")), None)
    rest = [m for m in messages if not m.metadata.get("compacted_into") and m.metadata.get("kind") != "compaction"]
    return [note, *rest] if note is not None else rest
