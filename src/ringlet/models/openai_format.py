"""The OpenAI chat format, shared by every adapter that speaks it (OpenAI-compatible servers, llama.cpp)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from ringlet._ids import new_id
from ringlet.messages import AudioPart, FilePart, ImagePart, Message, TextPart, ToolCall, ToolDefinition
from ringlet.models.base import Chunk, ModelRequest, TextDelta, ToolCallArgsDelta, ToolCallStart
from ringlet.usage import RequestUsage


def _part(part: Any) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        url = part.url or f"data:{part.media_type or 'image/png'};base64,{part.data}"
        return {"type": "image_url", "image_url": {"url": url}}
    if isinstance(part, AudioPart):
        return {"type": "input_audio", "input_audio": {"data": part.data, "format": (part.media_type or "wav")[-3:]}}
    if isinstance(part, FilePart):
        return {"type": "file", "file": {"file_data": part.data, "filename": part.filename}}
    raise TypeError(f"unsupported content part {part!r}")


def message(m: Message) -> dict[str, Any]:
    """One transcript message in OpenAI's shape. `error` notes go as user-role notes."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.text}
    if m.role == "error":
        return {"role": "user", "content": f"[error] {m.text}"}
    content: Any = m.content if isinstance(m.content, str) else [_part(p) for p in m.content]
    out: dict[str, Any] = {"role": m.role, "content": content}
    if m.tool_calls:  # "" and not null: llama.cpp's server rejects a null content (vLLM, Ollama take both)
        out["content"] = content or ""
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.raw_arguments or "{}"}}
                             for c in m.tool_calls]
    return out


def messages(request: ModelRequest) -> list[dict[str, Any]]:
    out = [{"role": "system", "content": request.instructions}] if request.instructions else []
    out += [message(m) for m in request.messages]
    return out


def tools(definitions: Sequence[ToolDefinition]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": d.name, "description": d.description,
                                              "parameters": d.parameters}} for d in definitions]


def usage(raw: Any, provider: str, model: str) -> RequestUsage | None:
    """OpenAI usage (object or dict) as RequestUsage; None when absent."""
    if raw is None:
        return None
    get = raw.get if isinstance(raw, dict) else lambda k, d=None: getattr(raw, k, d)
    details = get("prompt_tokens_details") or {}
    out_details = get("completion_tokens_details") or {}
    dget = details.get if isinstance(details, dict) else lambda k, d=None: getattr(details, k, d)
    oget = out_details.get if isinstance(out_details, dict) else lambda k, d=None: getattr(out_details, k, d)
    return RequestUsage(provider=provider, model=model, in_tokens=get("prompt_tokens") or 0,
                        out_tokens=get("completion_tokens") or 0, cache_read_tokens=dget("cached_tokens"),
                        reasoning_tokens=oget("reasoning_tokens"))


class DeltaReader:
    """Turns OpenAI stream deltas (dicts) into chunks, and remembers whether anything came."""

    def __init__(self) -> None:
        self.seen: dict[int, str] = {}
        self.finish_reason: str | None = None
        self.anything = False
        self.usage: RequestUsage | None = None

    def delta(self, delta: dict[str, Any], finish_reason: str | None) -> Iterator[Chunk]:
        if text := delta.get("content"):
            self.anything = True
            yield TextDelta(text)
        for tc in delta.get("tool_calls") or ():
            index = tc.get("index", 0)
            fn = tc.get("function") or {}
            if index not in self.seen:
                self.seen[index] = tc.get("id") or ""
                self.anything = True
                yield ToolCallStart(index, fn.get("name") or "", tc.get("id") or None)
            if args := fn.get("arguments"):
                yield ToolCallArgsDelta(index, args)
        if finish_reason:
            self.finish_reason = finish_reason

    def complete(self, msg: dict[str, Any], finish_reason: str | None) -> Iterator[Chunk]:
        """A non-streamed message, emitted as the deltas it would have streamed."""
        calls = [{"index": i, **c} for i, c in enumerate(msg.get("tool_calls") or [])]
        yield from self.delta({"content": msg.get("content"), "tool_calls": calls}, finish_reason)


def parse_message(raw: dict[str, Any]) -> Message:
    """A message in OpenAI's chat shape (a validated request body) as a ringlet Message."""
    role, content = raw["role"], raw.get("content")
    if role == "developer":
        role = "system"
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        images = [ImagePart(url=p["image_url"]["url"]) for p in content
                  if isinstance(p, dict) and p.get("type") == "image_url"]
        parts = (TextPart(text="".join(texts)), *images) if images else None
        content = parts or "".join(texts)
    calls = []
    for c in raw.get("tool_calls") or ():
        arguments = c["function"].get("arguments") or "{}"
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = {}
        calls.append(ToolCall(id=c["id"], name=c["function"]["name"],
                              arguments=parsed if isinstance(parsed, dict) else {}, raw_arguments=arguments))
    fields: dict[str, Any] = {"role": role, "content": content or "", "tool_calls": tuple(calls)}
    if role == "tool":
        fields["tool_call_id"] = raw.get("tool_call_id")
    return Message(id=new_id("m"), **fields)
