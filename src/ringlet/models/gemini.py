"""`gemini:<model>`: Gemini through the official `google-genai` SDK, streamed, with its retries off."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

from ringlet.errors import ConfigError
from ringlet.messages import ImagePart, Message, TextPart
from ringlet.models import errors
from ringlet.models.base import Chunk, Finish, ModelRequest, TextDelta, ToolCallArgsDelta, ToolCallStart, merge_turns
from ringlet.usage import RequestUsage

try:
    from google import genai
    from google.genai import errors as genai_errors
    from google.genai import types
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the gemini provider needs the 'gemini' extra: pip install 'ringlet[gemini]'") from exc

_STOP = {"STOP": "stop", "MAX_TOKENS": "length"}


def _parts(m: Message) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"text": m.content}] if m.content else []
    out: list[dict[str, Any]] = []
    for p in m.content:
        if isinstance(p, TextPart):
            out.append({"text": p.text})
        elif isinstance(p, ImagePart) and p.data:
            out.append({"inline_data": {"mime_type": p.media_type or "image/png", "data": p.data}})
        elif isinstance(p, ImagePart) and p.url:
            out.append({"file_data": {"file_uri": p.url, "mime_type": p.media_type or "image/png"}})
    return out


def to_gemini(request: ModelRequest) -> tuple[str | None, list[dict[str, Any]]]:
    """(system instruction, contents). Tool results go back as `function_response` parts."""
    system = [request.instructions] if request.instructions else []
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for m in request.messages:
        if m.role == "system":
            system.append(m.text)
        elif m.role == "tool":
            try:
                payload = json.loads(m.text)
            except ValueError:
                payload = None
            response = payload if isinstance(payload, dict) else {"result": m.text}
            turns.append(("user", [{"function_response": {"id": m.tool_call_id, "name": m.name,
                                                          "response": response}}]))
        elif m.role == "assistant":
            calls = [{"function_call": {"id": c.id, "name": c.name, "args": c.arguments}} for c in m.tool_calls]
            turns.append(("model", _parts(m) + calls or [{"text": ""}]))
        else:
            turns.append(("user", _parts(m) if m.role == "user" else [{"text": f"[error] {m.text}"}]))
    return "\n\n".join(system) or None, merge_turns(turns, "parts")


class GeminiModel:
    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None,
                 context_window: int | None = 1_000_000) -> None:
        key = api_key or os.environ.get("GEMINI_API_KEY") or os.environ.get("GOOGLE_API_KEY")
        if not key:
            raise ConfigError("gemini: no API key; set GEMINI_API_KEY")
        self.model = model
        self._context_window = context_window
        options = types.HttpOptions(base_url=base_url, retry_options=types.HttpRetryOptions(attempts=1))
        self.client = genai.Client(api_key=key, http_options=options)

    @property
    def name(self) -> str:
        return f"gemini:{self.model}"

    @property
    def context_window(self) -> int | None:
        return self._context_window

    def _config(self, request: ModelRequest, system: str | None) -> types.GenerateContentConfig:
        s = request.settings
        tools: list[Any] | None = None
        if request.tools:
            tools = [types.Tool(function_declarations=[
                types.FunctionDeclaration(name=t.name, description=t.description,
                                          parameters_json_schema=t.parameters) for t in request.tools])]
        # Native output: JSON constrained by the raw JSON Schema (`response_json_schema`, not the OpenAPI
        # subset of `response_schema`). Gemini before 3 rejects function tools together with a JSON mime type
        # ("Function calling with a response mime type: 'application/json' is unsupported"), so a request
        # with tools sends the tools only: its answer is then unconstrained text, which the loop parses and
        # validates against the schema like any native answer (and asks again when it does not match).
        native = request.output is not None and not tools
        return types.GenerateContentConfig(
            system_instruction=system, tools=tools, temperature=s.temperature, top_p=s.top_p,
            max_output_tokens=s.max_tokens,
            response_mime_type="application/json" if native else None,
            response_json_schema=request.output.schema if native and request.output else None,
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True) if tools else None)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        system, contents = to_gemini(request)
        config = self._config(request, system)
        reader = _Reader(RequestUsage(provider="gemini", model=self.model))
        try:
            stream: Any = await self.client.aio.models.generate_content_stream(
                model=self.model, contents=contents, config=config)  # type: ignore[arg-type]
            async with aclosing(stream):  # closes the connection however the consumer stops
                async for response in stream:
                    for chunk in reader.read(response):
                        yield chunk
            if not reader.anything and reader.finish is None:  # an empty stream: ask once more, whole
                response = await self.client.aio.models.generate_content(
                    model=self.model, contents=contents, config=config)  # type: ignore[arg-type]
                for chunk in reader.read(response):
                    yield chunk
        except genai_errors.APIError as exc:
            headers = getattr(getattr(exc, "response", None), "headers", None)
            raise errors.from_status(exc.code, exc.message or str(exc), provider="gemini", headers=headers) from exc
        except errors.TRANSPORT_ERRORS as exc:
            raise errors.network(f"{type(exc).__name__}: {exc}", provider="gemini") from exc
        finish = "tool_calls" if reader.calls and reader.finish == "stop" else reader.finish
        yield Finish(finish, reader.usage)


class _Reader:
    """Gemini responses (streamed pieces or a whole one) as chunks; usage and finish filled as they come."""

    def __init__(self, usage: RequestUsage) -> None:
        self.usage = usage
        self.finish: str | None = None
        self.calls = 0
        self.anything = False

    def read(self, response: Any) -> Iterator[Chunk]:
        if (meta := response.usage_metadata) is not None:
            self.usage.in_tokens = meta.prompt_token_count or 0
            self.usage.out_tokens = meta.candidates_token_count or 0
            self.usage.cache_read_tokens = meta.cached_content_token_count
        for candidate in (response.candidates or [])[:1]:
            if candidate.finish_reason is not None:
                self.finish = _STOP.get(candidate.finish_reason.value, candidate.finish_reason.value.lower())
            for part in (candidate.content.parts or []) if candidate.content else []:
                if part.function_call is not None:
                    fc = part.function_call
                    self.anything = True
                    yield ToolCallStart(self.calls, fc.name or "", fc.id)
                    yield ToolCallArgsDelta(self.calls, json.dumps(fc.args or {}))
                    self.calls += 1
                elif part.text:
                    self.anything = True
                    yield TextDelta(part.text)
