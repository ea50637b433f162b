"""The `openai:` adapter as it was before issue 20, on the `openai` SDK: kept only for `openai_client.py`.

A frozen copy of the streamed request path of the old `ringlet.models.openai.OpenAIModel` (the SDK's
`AsyncOpenAI.post` with retries off, its SSE lines read with `aiter_lines`), so the bench can measure the
new client against it in the same run. Not imported by ringlet; do not extend it.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from ringlet.errors import ConfigError, ProviderError
from ringlet.models import errors, openai_format
from ringlet.models.base import Chunk, Finish, ModelRequest


class SdkOpenAIModel:
    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 provider: str = "openai", timeout_s: float = 120.0) -> None:
        self.model = model
        self.provider = provider
        key = api_key or os.environ.get("OPENAI_API_KEY")
        base = base_url or os.environ.get("OPENAI_BASE_URL")
        if key is None and base is None:
            raise ConfigError("openai: no API key")
        self.client = openai.AsyncOpenAI(api_key=key or "not-needed", base_url=base, max_retries=0,
                                         timeout=timeout_s)

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": openai_format.messages(request), "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if request.tools:
            body["tools"] = openai_format.tools(request.tools)
            body["tool_choice"] = "auto"
        s = request.settings
        body |= {k: v for k, v in (("temperature", s.temperature), ("top_p", s.top_p), ("max_tokens", s.max_tokens))
                 if v is not None}
        return body

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        reader = openai_format.DeltaReader()
        try:
            async for out in self._streamed(request, reader):
                yield out
        except openai.APIStatusError as exc:
            raise errors.from_status(exc.status_code, exc.message, provider=self.provider,
                                     headers=exc.response.headers) from exc
        except openai.APITimeoutError as exc:
            raise errors.timeout(str(exc), provider=self.provider) from exc
        except (openai.APIConnectionError, *errors.TRANSPORT_ERRORS) as exc:
            raise errors.network(f"{type(exc).__name__}: {exc}", provider=self.provider) from exc
        except openai.APIError as exc:
            raise ProviderError(f"{self.provider}: {exc}", provider=self.provider) from exc
        yield Finish(reader.finish_reason, reader.usage)

    async def _streamed(self, request: ModelRequest, reader: openai_format.DeltaReader) -> AsyncIterator[Chunk]:
        body = self._body(request, stream=True)
        stream: Any = await self.client.post("/chat/completions", body=body, cast_to=ChatCompletion,
                                             stream=True, stream_cls=openai.AsyncStream[ChatCompletionChunk])
        async with stream:
            async for chunk in _chunks(stream.response):
                if chunk.get("usage"):
                    reader.usage = openai_format.usage(chunk["usage"], self.provider, self.model)
                for choice in (chunk.get("choices") or ())[:1]:
                    for out in reader.delta(choice.get("delta") or {}, choice.get("finish_reason")):
                        yield out


async def _chunks(response: Any) -> AsyncIterator[dict[str, Any]]:
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
