"""Test doubles that ship with ringlet: models that answer from a script or a function, with no network.

```python
from ringlet import Agent, tool
from ringlet.testing import ScriptedModel, call


@tool(effect="read")
def get_weather(city: str) -> str:
    "Current weather for a city."
    return f"Sunny in {city}"


model = ScriptedModel([
    call("get_weather", city="Paris"),                                     # one tool call
    [call("get_weather", city="Rome"), call("get_weather", city="Oslo")],  # a parallel batch
    "It is sunny everywhere.",                                             # a text answer
])
result = Agent(model, tools=[get_weather]).run_sync("Weather in Paris, Rome and Oslo?")
assert result.output == "It is sunny everywhere."
model.assert_complete()
```

A script's other items: `Chunks([TextDelta("Hel"), TextDelta("lo")])` (explicit stream chunks), `Reply(...)`,
or an exception the model raises (`RateLimitError("slow down", status=429)`, a provider failure). Every
request is recorded in `model.requests`.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ringlet.errors import ConfigError
from ringlet.models.base import (
    Chunk,
    Finish,
    ModelRequest,
    Retrying,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
)
from ringlet.usage import RequestUsage

__all__ = ["Chunks", "FunctionModel", "Reply", "ScriptedCall", "ScriptedModel", "call"]


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    """A tool call in a scripted reply. `raw` overrides the JSON text (to send invalid JSON)."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    raw: str | None = None

    @property
    def raw_arguments(self) -> str:
        return self.raw if self.raw is not None else json.dumps(self.args)


def call(name: str, args: dict[str, Any] | None = None, /, *, id: str | None = None, raw: str | None = None,
         **kwargs: Any) -> ScriptedCall:
    """`call("get_weather", city="Paris")` or `call("f", {"x": 1}, id="call_7")`."""
    return ScriptedCall(name, {**(args or {}), **kwargs}, id, raw)


@dataclass(frozen=True, slots=True)
class Reply:
    """One complete model response: text and/or tool calls, a finish reason and optional usage."""

    text: str = ""
    calls: Sequence[ScriptedCall] = ()
    finish_reason: str | None = "stop"
    usage: RequestUsage | None = None

    def chunks(self) -> list[Chunk]:
        out: list[Chunk] = [TextDelta(self.text)] if self.text else []
        for i, c in enumerate(self.calls):
            out.append(ToolCallStart(i, c.name, c.id))
            out.append(ToolCallArgsDelta(i, c.raw_arguments))
        reason = "tool_calls" if self.calls and self.finish_reason == "stop" else self.finish_reason
        out.append(Finish(reason, self.usage))
        return out


@dataclass(frozen=True, slots=True)
class Chunks:
    """Explicit stream chunks. An exception instance among them is raised at that point of the stream."""

    items: Sequence[Chunk | BaseException]


Script = str | Reply | ScriptedCall | Sequence[ScriptedCall] | Chunks | BaseException


def to_chunks(item: Script) -> Sequence[Chunk | BaseException]:
    if isinstance(item, str):
        return Reply(item).chunks()
    if isinstance(item, Reply):
        return item.chunks()
    if isinstance(item, ScriptedCall):
        return Reply(calls=[item]).chunks()
    if isinstance(item, Chunks):
        return item.items
    if isinstance(item, BaseException):
        return [item]
    return Reply(calls=list(item)).chunks()


async def _play(items: Iterable[Chunk | BaseException]) -> AsyncIterator[Chunk]:
    for item in items:
        if isinstance(item, BaseException):
            raise item
        yield item


class ScriptedModel:
    """Answers each request with the next scripted item; records every request."""

    def __init__(self, script: Iterable[Script], *, name: str = "test:scripted",
                 context_window: int | None = None) -> None:
        self._script = [to_chunks(item) for item in script]
        self._next = 0
        self.requests: list[ModelRequest] = []
        self._name = name
        self._context_window = context_window

    @property
    def name(self) -> str:
        return self._name

    @property
    def context_window(self) -> int | None:
        return self._context_window

    @property
    def remaining(self) -> int:
        return len(self._script) - self._next

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        self.requests.append(request)
        if self._next >= len(self._script):
            raise AssertionError(f"ScriptedModel has no reply left for request #{len(self.requests)} "
                                 f"(script had {len(self._script)})")
        chunks = self._script[self._next]
        self._next += 1
        return _play(chunks)

    def assert_complete(self) -> None:
        """Fail unless every scripted reply was used."""
        if self.remaining:
            raise AssertionError(f"ScriptedModel: {self.remaining} scripted repl"
                                 f"{'y was' if self.remaining == 1 else 'ies were'} never requested")


_CHUNK_TYPES = (TextDelta, ToolCallStart, ToolCallArgsDelta, Finish, Retrying)


def _yielded_chunk(item: object, request: int) -> Chunk:
    """What an async generator `fn` yielded, as a chunk; anything else fails the request at once, naming it
    (a script item such as `call(...)` is not a chunk: it would otherwise end as a blank answer)."""
    if isinstance(item, str):
        return TextDelta(item)
    if isinstance(item, _CHUNK_TYPES):
        return item
    hint = ""
    if isinstance(item, ScriptedCall | Reply | Chunks | list | tuple):
        hint = ("; to call a tool from a generator yield `ToolCallStart(0, name)` then `ToolCallArgsDelta(0, "
                "json_text)`, or make `fn` a plain function that returns the script item (e.g. `call(...)`)")
    raise ConfigError(f"FunctionModel (request #{request}): the async generator yielded {item!r}, which is not "
                      "a stream chunk; it may yield only str (text) or the chunks of ringlet.models: TextDelta, "
                      f"ToolCallStart, ToolCallArgsDelta, Finish (or Retrying){hint}")


ModelFunction = Callable[[ModelRequest], "Script | Awaitable[Script] | AsyncIterator[Chunk | str]"]


class FunctionModel:
    """Answers with `fn(request)`: a script item (or an awaitable of one), or, when `fn` is an async
    generator function, the chunks (or plain strings, as text deltas) it yields. A generator yielding
    anything else (e.g. `call(...)`, which only a plain `fn` may return) fails that request at once with a
    ConfigError naming the item: the run ends `internal_error`, not as a blank answer."""

    def __init__(self, fn: ModelFunction, *, name: str = "test:function",
                 context_window: int | None = None) -> None:
        self.fn = fn
        self.requests: list[ModelRequest] = []
        self._name = name
        self._context_window = context_window

    @property
    def name(self) -> str:
        return self._name

    @property
    def context_window(self) -> int | None:
        return self._context_window

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        self.requests.append(request)
        produced: Any = self.fn(request)
        if inspect.isasyncgen(produced):
            finished = False
            async for item in produced:
                chunk = _yielded_chunk(item, len(self.requests))
                finished = finished or isinstance(chunk, Finish)
                yield chunk
            if not finished:
                yield Finish("stop")
            return
        if inspect.isawaitable(produced):
            produced = await produced
        async for chunk in _play(to_chunks(produced)):  # type: ignore[arg-type]
            yield chunk
