"""Token estimation (`loop-and-hooks.md` §5) and the TokenBreakdown of a prompt."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ringlet.messages import Message, TextPart, ToolDefinition

MEDIA_TOKENS = 100
_CJK = re.compile("[\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7af]")


def estimate_text(text: str) -> int:
    """`ceil(cjk + other / 4)`: CJK code points count one each, everything else a quarter."""
    if text.isascii():
        return math.ceil(len(text) / 4)
    cjk = len(_CJK.findall(text))
    return math.ceil(cjk + (len(text) - cjk) / 4)


def estimate_tool_definition(tool: ToolDefinition) -> int:
    """A definition counts as the compact JSON of `{name, description, parameters}`."""
    compact = json.dumps({"name": tool.name, "description": tool.description, "parameters": tool.parameters},
                         separators=(",", ":"), ensure_ascii=False)
    return estimate_text(compact)


def estimate_message(message: Message) -> int:
    """Text, media parts (100 each) and tool calls (name plus raw arguments)."""
    if isinstance(message.content, str):
        n = estimate_text(message.content)
    else:
        n = sum(estimate_text(p.text) if isinstance(p, TextPart) else MEDIA_TOKENS for p in message.content)
    for call in message.tool_calls:
        n += estimate_text(call.name) + estimate_text(call.raw_arguments)
    return n


@dataclass(slots=True)
class TokenBreakdown:
    """Where the tokens of one prompt go. Error notes count as user; call arguments as assistant."""

    system: int = 0
    tool_definitions: int = 0
    user: int = 0
    assistant: int = 0
    tool_results: int = 0
    total: int = 0


_BUCKET = {"system": "system", "user": "user", "error": "user", "assistant": "assistant", "tool": "tool_results"}


def estimate_tools(tools: Iterable[ToolDefinition]) -> int:
    return sum(estimate_tool_definition(t) for t in tools)


def breakdown(instructions: str | None, messages: Iterable[Message], tool_tokens: int,
              *, cache: dict[str, int] | None = None) -> TokenBreakdown:
    """The TokenBreakdown of exactly this prompt.

    `tool_tokens` is `estimate_tools()` of the tools offered (computed once per tool set), and `cache`
    (message id -> tokens) keeps each message from being counted twice over a run.
    """
    counts = {"system": estimate_text(instructions) if instructions else 0, "user": 0, "assistant": 0,
              "tool_results": 0}
    for m in messages:
        if cache is None:
            n = estimate_message(m)
        else:
            n = cache.get(m.id)
            if n is None:
                n = cache[m.id] = estimate_message(m)
        counts[_BUCKET[m.role]] += n
    return TokenBreakdown(**counts, tool_definitions=tool_tokens, total=sum(counts.values()) + tool_tokens)


def prompt_tokens(instructions: str | None, messages: Iterable[Message], tool_tokens: int,
                  cache: dict[str, int]) -> int:
    """The total of `breakdown()` without building it: the loop's per-round budget check."""
    total = tool_tokens + (estimate_text(instructions) if instructions else 0)
    for m in messages:
        n = cache.get(m.id)
        if n is None:
            n = cache[m.id] = estimate_message(m)
        total += n
    return total
