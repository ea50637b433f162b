"""`anthropic:<model>`: Claude through the official `anthropic` SDK, streamed, with its retries off."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ringlet.errors import ConfigError
from ringlet.messages import ImagePart, Message, TextPart
from ringlet.models import errors
from ringlet.models.base import (
    CachePoint,
    Chunk,
    Finish,
    ModelRequest,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    merge_turns,
)
from ringlet.usage import RequestUsage

try:
    import anthropic
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the anthropic provider needs the 'anthropic' extra: pip install 'ringlet[anthropic]'") from exc

DEFAULT_MAX_TOKENS = 4096
_STOP = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length", "stop_sequence": "stop"}


def _content(m: Message) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        blocks = [{"type": "text", "text": m.content}] if m.content else []
    else:
        blocks = []
        for p in m.content:
            if isinstance(p, TextPart):
                blocks.append({"type": "text", "text": p.text})
            elif isinstance(p, ImagePart):
                source = ({"type": "url", "url": p.url} if p.url else
                          {"type": "base64", "media_type": p.media_type or "image/png", "data": p.data})
                blocks.append({"type": "image", "source": source})
    return blocks


def to_anthropic(request: ModelRequest) -> tuple[str, list[dict[str, Any]]]:
    """(system, messages): system notes join the system prompt; tool results become user blocks."""
    system = [request.instructions] if request.instructions else []
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for m in request.messages:
        if m.role == "system":
            system.append(m.text)
        elif m.role == "tool":
            turns.append(("user", [{"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.text,
                                    "is_error": bool(m.metadata.get("is_error"))}]))
        elif m.role == "assistant":
            blocks = _content(m) + [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                                    for c in m.tool_calls]
            turns.append(("assistant", blocks or [{"type": "text", "text": "(no text)"}]))
        else:
            turns.append(("user", _content(m) if m.role == "user"
                          else [{"type": "text", "text": f"[error] {m.text}"}]))
    return "\n\n".join(system), merge_turns(turns, "content")


class AnthropicModel:
    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None,
                 context_window: int | None = 200_000,
                 timeout_s: float = 120.0) -> None:
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ConfigError("anthropic: no API key; set ANTHROPIC_API_KEY")
        self.model = model
        self._context_window = context_window
        self.client = anthropic.AsyncAnthropic(api_key=key, base_url=base_url, max_retries=0, timeout=timeout_s)

    @property
    def name(self) -> str:
        return f"anthropic:{self.model}"

    @property
    def context_window(self) -> int | None:
        return self._context_window

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        system, messages = to_anthropic(request)
        s = request.settings
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": True,
                                "max_tokens": s.max_tokens or DEFAULT_MAX_TOKENS}
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters}
                             for t in request.tools]
        if request.output is not None:  # structured outputs (GA: no beta header), alongside tools if any
            body["output_config"] = {"format": {"type": "json_schema", "schema": _schema(request.output.schema)}}
        if s.prompt_cache:
            mark_cache_points(body, s.cache_points)
        sampling = {k: v for k, v in (("temperature", s.temperature), ("top_p", s.top_p)) if v is not None}
        if sampling:  # newer SDKs dropped these keywords; the API still takes them
            body["extra_body"] = sampling
        return body

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        usage = RequestUsage(provider="anthropic", model=self.model)
        finish: list[str | None] = [None]
        body = self._body(request)
        try:
            stream = await self.client.messages.create(**body)
            anything = False
            async with stream:  # closes the connection however the consumer stops
                async for chunk in _chunks(stream, usage, finish):
                    anything = True
                    yield chunk
            if not anything and finish[0] is None:  # an empty stream: ask once more, whole
                for chunk in await self._complete(body, usage, finish):
                    yield chunk
        except anthropic.APIStatusError as exc:
            status = exc.status_code if exc.status_code >= 400 else _STREAM_ERROR_STATUS.get(_error_type(exc), 500)
            raise errors.from_status(status, _message(exc), provider="anthropic",
                                     headers=exc.response.headers) from exc
        except anthropic.APITimeoutError as exc:
            raise errors.timeout(str(exc), provider="anthropic") from exc
        except (anthropic.APIConnectionError, *errors.TRANSPORT_ERRORS) as exc:
            raise errors.network(f"{type(exc).__name__}: {exc}", provider="anthropic") from exc
        yield Finish(finish[0], usage)


    async def _complete(self, body: dict[str, Any], usage: RequestUsage, finish: list[str | None]) -> list[Chunk]:
        message = await self.client.messages.create(**{**body, "stream": False})
        usage.in_tokens = message.usage.input_tokens or 0
        usage.out_tokens = message.usage.output_tokens or 0
        finish[0] = _STOP.get(message.stop_reason or "", message.stop_reason)
        out: list[Chunk] = []
        for block in message.content:
            if block.type == "text" and block.text:
                out.append(TextDelta(block.text))
            elif block.type == "tool_use":
                index = sum(isinstance(c, ToolCallStart) for c in out)
                out += [ToolCallStart(index, block.name, block.id), ToolCallArgsDelta(index, json.dumps(block.input))]
        return out


CACHED = {"type": "ephemeral"}
"""A cache breakpoint (`cache_control`): the prompt up to here is cached for five minutes, and a later
request that starts the same way reads it at a tenth of the input price (a write costs 1.25 times it)."""


def mark_cache_points(body: dict[str, Any], points: Sequence[CachePoint]) -> None:
    """Put a breakpoint (at most three of the API's four) at the end of each of `points` the request has:
    the tool list (its last tool), the system prompt, the transcript (its last block, so each turn reads the
    prefix the turn before it wrote). The API caches tools, then system, then messages, each prefix on its
    own; a prompt shorter than the model's minimum (1,024 tokens for most) is simply not cached."""
    if "tools" in points and body.get("tools"):
        body["tools"][-1] = {**body["tools"][-1], "cache_control": CACHED}
    if "system" in points and body.get("system"):
        body["system"] = [{"type": "text", "text": body["system"], "cache_control": CACHED}]
    if "history" in points and body["messages"] and body["messages"][-1]["content"]:
        blocks = body["messages"][-1]["content"]
        blocks[-1] = {**blocks[-1], "cache_control": CACHED}


def _schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The output schema as the API takes it, through the SDK's own `transform_schema` (what its typed
    `output_format` does): every object closed (`additionalProperties: false`, which the API requires) and
    keywords it does not support moved into the description. The answer is still checked against the
    original schema by the loop."""
    try:
        return anthropic.transform_schema(schema)
    except ValueError as exc:  # e.g. `{}` (any value): the API needs a type
        raise ConfigError(f"anthropic: native output cannot use this schema ({exc}); use ToolOutput") from None


async def _chunks(stream: Any, usage: RequestUsage, finish: list[str | None]) -> AsyncIterator[Chunk]:
    """Message events as chunks; usage and the stop reason are filled in as they arrive."""
    index_of: dict[int, int] = {}  # content block index -> tool call index
    async for event in stream:
        kind = event.type
        if kind == "message_start":
            u = event.message.usage
            read, written = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
            usage.in_tokens = (u.input_tokens or 0) + read + written
            usage.cache_read_tokens, usage.cache_write_tokens = u.cache_read_input_tokens, u.cache_creation_input_tokens
        elif kind == "content_block_start" and event.content_block.type == "tool_use":
            index_of[event.index] = len(index_of)
            yield ToolCallStart(index_of[event.index], event.content_block.name, event.content_block.id)
        elif kind == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta" and delta.text:
                yield TextDelta(delta.text)
            elif delta.type == "input_json_delta" and delta.partial_json:
                yield ToolCallArgsDelta(index_of[event.index], delta.partial_json)
        elif kind == "message_delta":
            finish[0] = _STOP.get(event.delta.stop_reason or "", event.delta.stop_reason)
            usage.out_tokens = event.usage.output_tokens or 0


# an `error` event inside a 200 stream carries its kind in the body, not in the HTTP status
_STREAM_ERROR_STATUS = {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500, "timeout_error": 504,
                        "invalid_request_error": 400, "authentication_error": 401, "permission_error": 403}


def _error_type(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("type")) if isinstance(error, dict) else ""


def _message(exc: anthropic.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", exc.message))
    return exc.message
