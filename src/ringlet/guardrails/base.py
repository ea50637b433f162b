"""What a guardrail is: a check of one text at one stage of a run, returning a decision value.

    class NoShouting:
        name = "no_shouting"
        stages = frozenset({"input"})

        async def check(self, text: str, at: Checked) -> Verdict:
            return Block("please do not shout") if text.isupper() else ALLOW

The stages: `input` (a user message, before the model sees it), `output` (the answer, before it is
stored or shown), `tool_args` (a call's arguments, before it runs) and `tool_result` (a call's result,
before the model sees it). A decision is `Allow`, `Redact(spans)` (each span's text replaced) or
`Block(reason)` (the run ends with the error `guardrail_blocked`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ringlet.usage import RequestUsage

Stage = Literal["input", "output", "tool_args", "tool_result"]
STAGES: tuple[Stage, ...] = ("input", "output", "tool_args", "tool_result")


@dataclass(frozen=True, slots=True)
class Span:
    """Characters `start:end` of the text checked, of a `kind` (`email`, `card`, …), and what replaces them."""

    start: int
    end: int
    kind: str
    replacement: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "kind": self.kind}


@dataclass(frozen=True, slots=True, kw_only=True)
class Allow:
    """The text goes on as it is."""

    decision: Literal["allow"] = "allow"
    usage: RequestUsage | None = None
    """What a model-graded guardrail's request used (its own cost); None for the others."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Redact:
    """The text goes on with each span replaced (spans may not overlap)."""

    spans: tuple[Span, ...]
    decision: Literal["redact"] = "redact"
    usage: RequestUsage | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Block:
    """The run ends (`guardrail_blocked`); `reason` is what the user is told."""

    reason: str
    kinds: tuple[str, ...] = ()
    decision: Literal["block"] = "block"
    usage: RequestUsage | None = None


Verdict = Allow | Redact | Block
ALLOW = Allow()


@dataclass(frozen=True, slots=True)
class Checked:
    """Where the text checked comes from: the stage, the tool (tool stages), and how a guardrail that asks a
    model sends its request (`stream_model(model, request)`: the run's step executor, so a durable run
    records it), prices it (`cost(usage)`) and times it (`clock`: the run's, so a replay reads the same)."""

    stage: Stage
    tool: str | None = None
    stream_model: Callable[[Any, Any], AsyncIterator[Any]] | None = None
    cost: Callable[[RequestUsage], float | None] = field(default=lambda usage: None)
    clock: Callable[[], float] = time.monotonic


@runtime_checkable
class Guardrail(Protocol):
    """A check of the texts of some stages. `name` names it in events and the audit log."""

    name: str
    stages: frozenset[Stage]

    async def check(self, text: str, at: Checked) -> Verdict: ...


def redacted(text: str, spans: tuple[Span, ...]) -> str:
    """`text` with each span replaced by its replacement (later spans first, so offsets stay right)."""
    for span in sorted(spans, key=lambda s: s.start, reverse=True):
        text = text[:span.start] + span.replacement + text[span.end:]
    return text
