"""Assembling a streamed response: chunks in, contract events and the final message out."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from ringlet.loop.fields import new_dict, new_list
from ringlet.messages import ToolCall
from ringlet.models.base import Chunk, Finish, ModelSwitch, Retrying, TextDelta, ToolCallArgsDelta, ToolCallStart
from ringlet.usage import RequestUsage

_NOTICES: dict[type, str] = {Retrying: "retry", ModelSwitch: "switch"}
"""Chunks that are notices about the request, not part of the response, by their kind in `feed()`."""


@dataclass(slots=True)
class _PartialCall:
    id: str
    name: str
    raw: list[str] = field(default_factory=new_list)


def parse_arguments(raw: str) -> dict[str, Any]:
    """The arguments object of a raw JSON text; raises ValueError with the parser's message."""
    if not raw.strip():
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return cast("dict[str, Any]", value)


@dataclass(slots=True)
class ResponseBuilder:
    """Collects one response. `feed()` returns what to emit as (kind, payload) pairs."""

    new_call_id: Callable[[], str]
    text: list[str] = field(default_factory=new_list)
    calls: dict[int, _PartialCall] = field(default_factory=new_dict)
    finish_reason: str | None = None
    usage: RequestUsage | None = None
    finished: bool = False
    emitted: bool = False
    model: str | None = None
    """The model that answers, once a fallback model switched to it (`ModelSwitch`); None: the run's own."""
    _calls: list[ToolCall] | None = None

    def feed(self, chunk: Chunk) -> tuple[str, Any] | None:
        if isinstance(chunk, TextDelta):
            if not chunk.text:
                return None
            self.text.append(chunk.text)
            self.emitted = True
            return "text", chunk.text
        if isinstance(chunk, ToolCallStart):
            call = self.calls[chunk.index] = _PartialCall(chunk.id or self.new_call_id(), chunk.name)
            self.emitted = True
            return "call_start", (call.id, call.name, chunk.index)
        if isinstance(chunk, ToolCallArgsDelta):
            call = self.calls[chunk.index]
            call.raw.append(chunk.delta)
            return ("call_delta", (call.id, chunk.delta)) if chunk.delta else None
        if isinstance(chunk, ModelSwitch):
            self.model = chunk.model
        if (notice := _NOTICES.get(type(chunk))) is not None:
            return notice, chunk
        if isinstance(chunk, Finish):
            self.finished = True
            self.finish_reason = chunk.finish_reason
            self.usage = chunk.usage
        return None

    @property
    def content(self) -> str:
        return "".join(self.text)

    def tool_calls(self) -> list[ToolCall]:
        if self._calls is not None:
            return self._calls
        out: list[ToolCall] = []
        for index in sorted(self.calls):
            c = self.calls[index]
            raw = "".join(c.raw)
            try:
                args = parse_arguments(raw)
            except ValueError:
                args = {}
            out.append(ToolCall(id=c.id, name=c.name, arguments=args, raw_arguments=raw))
        self._calls = out
        return out
