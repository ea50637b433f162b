"""Compaction (`memory-and-context.md` §5): the oldest turns of a long conversation become one
`<compacted>` note, so the prompt stays inside the budget.

The unit is a turn pair (a user message and everything up to the next one), so a tool call is never
separated from its results; the last `keep_recent_turns` pairs, the current message and the round in
progress are never compacted. The summary is one model request with no tools; if it fails, the turns are
dropped instead (`truncate`) and what must survive (durable results, decisions) is kept verbatim.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ringlet.messages import Message

DURABLE_CHARS = 2000
SUMMARY_INSTRUCTIONS = """You compact the early part of a conversation between a user and an assistant that \
uses tools. Write a faithful summary that replaces those turns in the assistant's memory. Keep, precisely:
- the user's decisions and stated preferences;
- approval decisions and their notes, and answers the user gave to questions;
- tool results marked DURABLE, verbatim (up to 2000 characters each);
- the active task: the newest open task, or the user's stated goal;
- identifiers later turns may need: ids, URLs, file names, numbers.
Drop chit-chat, superseded or repeated tool results, and failed attempts that were later resolved. Write plain \
sentences and short lists, no preamble."""


class CompactionConfig(BaseModel):
    """The `compaction:` section of an agent's config (§5, §7)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    enabled: bool = True
    threshold: float = Field(default=0.8, gt=0, le=1)
    target: float = Field(default=0.5, gt=0, le=1)
    keep_recent_turns: int = Field(default=2, ge=0)
    model: str | None = None
    """The summarising model (`provider:model`); default: the agent's model."""


def is_note(m: Message) -> bool:
    return m.metadata.get("kind") == "compaction"


def turns(messages: Sequence[Message]) -> list[list[Message]]:
    """Turn pairs: each starts at a user message; what comes before the first one is its own group."""
    out: list[list[Message]] = []
    for m in messages:
        if m.role == "user" or not out:
            out.append([m])
        else:
            out[-1].append(m)
    return out


def select(messages: Sequence[Message], *, keep_recent_turns: int, over_target: int,
           tokens: Callable[[Message], int]) -> list[Message]:
    """The oldest turn pairs whose removal brings the prompt `over_target` tokens down (all that may go if
    that is not enough). System messages and the compaction note are never selected."""
    groups = [g for g in turns([m for m in messages if not is_note(m)]) if g[0].role == "user"]
    candidates = groups[:max(0, len(groups) - max(keep_recent_turns, 1))]  # the current turn always stays
    chosen: list[Message] = []
    saved = 0
    for group in candidates:
        if saved >= over_target:
            break
        chosen += group
        saved += sum(tokens(m) for m in group)
    return chosen


def render(previous: Message | None, selected: Sequence[Message]) -> str:
    """The turns to summarise, as text for the summary request."""
    lines = []
    if previous is not None:
        lines.append(f"EARLIER SUMMARY:\n{previous.text}\n")
    for m in selected:
        if m.role == "tool":
            durable = " DURABLE" if m.metadata.get("durable") else ""
            lines.append(f"TOOL RESULT{durable} ({m.name}): {m.text[:DURABLE_CHARS]}")
        elif m.tool_calls:
            calls = "; ".join(f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in m.tool_calls)
            lines.append(f"ASSISTANT: {m.text} [calls: {calls}]".replace(" ]", "]"))
        else:
            lines.append(f"{m.role.upper()}: {m.text}")
    return "\n".join(lines)


def kept_verbatim(previous: Message | None, selected: Sequence[Message]) -> str:
    """What a failed summary must still keep: the earlier summary, durable results and decisions."""
    lines = [_body(previous.text)] if previous is not None else []
    for m in selected:
        if m.role != "tool":
            continue
        error = _error(m.text)
        if m.metadata.get("durable"):
            lines.append(f"- durable result of {m.name}: {m.text[:DURABLE_CHARS]}")
        elif error.get("code") in ("approval_denied", "approval_timeout") and error.get("note") is not None:
            lines.append(f"- approval decision on {m.name}: {error.get('message')}")
    return "\n".join(line for line in lines if line) or "(earlier turns were dropped to fit the context window)"


def note_text(body: str) -> str:
    return f"<compacted>\n{body.strip()}\n</compacted>"


def _body(text: str) -> str:
    return text.removeprefix("<compacted>").removesuffix("</compacted>").strip()


def _error(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value.get("error", {}) if isinstance(value, dict) and isinstance(value.get("error"), dict) else {}
