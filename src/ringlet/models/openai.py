"""`openai:<model>`: OpenAI and every OpenAI-compatible server (vLLM, LM Studio, Ollama `/v1`, llama.cpp).

Built on the official `openai` SDK with its retries off (ringlet has exactly one retry layer). A stream
that ends with no content, no tool calls and no finish reason is a provider fault, not a blank answer
(llama.cpp's server cannot stream tool calls with `tool_choice: auto`, and hangs up), so the request is
made once more without streaming and its answer is emitted as deltas.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

from ringlet.errors import ConfigError, ProviderError
from ringlet.models import errors, openai_format
from ringlet.models.base import Chunk, Finish, ModelRequest

try:
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the openai provider needs the 'openai' extra: pip install 'ringlet[openai]'") from exc

DEFAULT_TIMEOUT_S = 120.0


class OpenAIModel:
    """A chat model behind an OpenAI-compatible `/v1/chat/completions` endpoint."""

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 provider: str = "openai", context_window: int | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S,
                 extra_body: dict[str, Any] | None = None) -> None:
        self.model = model
        self.provider = provider
        self._context_window = context_window
        self.extra_body = extra_body
        key = api_key or os.environ.get("OPENAI_API_KEY")
        base = base_url or os.environ.get("OPENAI_BASE_URL")
        if key is None and base is None:
            raise ConfigError("openai: no API key; set OPENAI_API_KEY (or OPENAI_BASE_URL for a local server)")
        self.client = openai.AsyncOpenAI(api_key=key or "not-needed", base_url=base, max_retries=0,
                                         timeout=timeout_s)

    @property
    def name(self) -> str:
        return f"{self.provider}:{self.model}"

    @property
    def context_window(self) -> int | None:
        return self._context_window

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": openai_format.messages(request), "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if request.tools:  # "auto" is OpenAI's default; some servers (llama.cpp) only call tools when told
            body["tools"] = openai_format.tools(request.tools)
            body["tool_choice"] = "auto"
        s = request.settings
        body |= {k: v for k, v in (("temperature", s.temperature), ("top_p", s.top_p), ("max_tokens", s.max_tokens))
                 if v is not None}
        if self.extra_body:
            body["extra_body"] = self.extra_body
        return body

    async def _complete(self, request: ModelRequest) -> Any:
        """The non-streamed request. A server that dropped the stream also drops its pooled connection,
        so a reply lost on a reused connection is asked for once more on a fresh one."""
        body = self._body(request, stream=False)
        try:
            return await self.client.chat.completions.create(**body)
        except openai.APIConnectionError as exc:
            if _never_connected(exc):
                raise
            return await self.client.chat.completions.create(**body)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        reader = openai_format.DeltaReader()
        try:
            async for out in self._streamed(request, reader):
                yield out
            if not reader.anything and reader.finish_reason is None:  # an empty stream: ask once more, whole
                response = await self._complete(request)
                reader.usage = openai_format.usage(response.usage, self.provider, self.model)
                for choice in response.choices[:1]:
                    for out in reader.complete(choice.message.model_dump(exclude_none=True), choice.finish_reason):
                        yield out
        except openai.APIStatusError as exc:
            raise errors.from_status(exc.status_code, _message(exc), provider=self.provider,
                                     headers=exc.response.headers) from exc
        except openai.APITimeoutError as exc:
            raise errors.timeout(str(exc), provider=self.provider) from exc
        except (openai.APIConnectionError, *errors.TRANSPORT_ERRORS) as exc:
            raise errors.network(f"{type(exc).__name__}: {exc}", provider=self.provider) from exc
        except openai.APIError as exc:  # an error event inside the stream
            raise ProviderError(f"{self.provider}: {exc}", provider=self.provider) from exc
        yield Finish(reader.finish_reason, reader.usage)

    async def _streamed(self, request: ModelRequest, reader: openai_format.DeltaReader) -> AsyncIterator[Chunk]:
        """The streamed request's chunks. A stream the server accepted and then dropped before its first
        chunk counts as empty (the caller falls back), not as a failure."""
        body = self._body(request, stream=True)
        body |= body.pop("extra_body", None) or {}
        try:  # the body is already in wire format: post it as is (the SDK's params transform costs ~3 ms)
            stream: Any = await self.client.post("/chat/completions", body=body, cast_to=ChatCompletion,
                                                 stream=True, stream_cls=openai.AsyncStream[ChatCompletionChunk])
        except openai.APIConnectionError as exc:
            if _never_connected(exc):
                raise
            return
        try:
            async with stream:  # the SDK sent the request and checked its status; the body is read here
                async for chunk in _chunks(stream.response):
                    if chunk.get("usage"):
                        reader.usage = openai_format.usage(chunk["usage"], self.provider, self.model)
                    for choice in (chunk.get("choices") or ())[:1]:
                        for out in reader.delta(choice.get("delta") or {}, choice.get("finish_reason")):
                            yield out
        except (openai.APIConnectionError, *errors.TRANSPORT_ERRORS) as exc:
            if reader.anything or reader.finish_reason is not None or "Timeout" in type(exc).__name__:
                raise  # output was sent (the stream broke), or the server is too slow: not an empty stream


async def _chunks(response: Any) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI-style SSE body, parsed as plain dicts: building the SDK's typed chunk
    objects costs more CPU than everything else a streamed token does in ringlet."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            continue
        if chunk.get("error"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else str(error)
            raise openai.APIError(str(message or error), request=response.request, body=chunk)
        yield chunk


def _never_connected(exc: BaseException) -> bool:
    """Whether the request failed outright (refused, DNS, any timeout), as opposed to a reply the server
    dropped after accepting the request. Only the latter may be asked for again here."""
    cause = exc.__cause__
    return isinstance(exc, openai.APITimeoutError) or cause is None or "Connect" in type(cause).__name__ \
        or "Timeout" in type(cause).__name__


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return exc.message


def ollama(model: str, **options: Any) -> OpenAIModel:
    """`ollama:<model>`: Ollama's OpenAI-compatible `/v1`, at `OLLAMA_HOST` (default 127.0.0.1:11434)."""
    host = os.environ.get("OLLAMA_HOST", "http://127.0.0.1:11434")
    if "://" not in host:
        host = f"http://{host}"
    return OpenAIModel(model, base_url=options.pop("base_url", None) or f"{host.rstrip('/')}/v1",
                       api_key=options.pop("api_key", None) or "ollama", provider="ollama", **options)
