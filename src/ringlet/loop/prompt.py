"""What the next request sends: the duration filter (`loop-and-hooks.md` §4.3) and the token budget."""

from __future__ import annotations

from collections.abc import Sequence

from ringlet.messages import Message


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
