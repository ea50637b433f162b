"""`openai:<model>`: OpenAI and every OpenAI-compatible server (vLLM, LM Studio, Ollama `/v1`, llama.cpp).

Speaks `POST {base}/chat/completions` itself over `aiohttp` rather than through the `openai` SDK, whose
request path cost ~2x the CPU per streamed request (issue 20; `bench/openai_client.py` measures both),
or over `httpx`, whose connection pool scans every pooled connection on each request and each response
close (O(N) with N concurrent streams: a third of the server's CPU under load). One `aiohttp.ClientSession`
per base URL and event loop is shared by every model (HTTP/1.1 keep-alive; its idle connections are taken
and given back in O(1), its HTTP parser is C). Nothing retries here: ringlet has exactly one retry layer
(`retry.py`); failures become the typed errors of `errors.py`.

A stream that ends with no content, no tool calls and no finish reason is a provider fault, not a blank
answer (llama.cpp's server cannot stream tool calls with `tool_choice: auto`, and hangs up), so the request
is made once more without streaming and its answer is emitted as deltas.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp

from ringlet.errors import ConfigError, ProviderError
from ringlet.models import errors, openai_format
from ringlet.models.base import Chunk, Finish, ModelRequest
from ringlet.output import ResponseFormat

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_BASE_URL = "https://api.openai.com/v1"
_MAX_CONNECTIONS = 1000  # the openai SDK's own limit
_TIMED_OUT = "Request timed out."
_DRAIN_S = 0.5


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
        self.timeout_s = timeout_s
        key = api_key or os.environ.get("OPENAI_API_KEY")
        base = base_url or os.environ.get("OPENAI_BASE_URL")
        if key is None and base is None:
            raise ConfigError("openai: no API key; set OPENAI_API_KEY (or OPENAI_BASE_URL for a local server)")
        self.base_url = (base or DEFAULT_BASE_URL).rstrip("/")
        self._url = f"{self.base_url}/chat/completions"
        headers = {"Authorization": f"Bearer {key or 'not-needed'}", "Content-Type": "application/json",
                   "Accept": "application/json", "User-Agent": "ringlet"}
        for header, env in (("OpenAI-Organization", "OPENAI_ORG_ID"), ("OpenAI-Project", "OPENAI_PROJECT_ID")):
            if value := os.environ.get(env):  # what the SDK sent from the same variables
                headers[header] = value
        self._headers = headers
        # connect (pool wait included) and each socket read, as httpx's `Timeout(timeout_s)`; no total
        self._timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_read=timeout_s)

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
        if request.output is not None:  # no `strict`: it rejects schemas outside OpenAI's strict subset
            body["response_format"] = response_format(request.output)
        s = request.settings
        body |= {k: v for k, v in (("temperature", s.temperature), ("top_p", s.top_p), ("max_tokens", s.max_tokens))
                 if v is not None}
        if s.prompt_cache and (key := s.cache_key or self._cache_key(request)):
            body["prompt_cache_key"] = key
        if self.extra_body:
            body["extra_body"] = self.extra_body
        return body

    def _cache_key(self, request: ModelRequest) -> str | None:
        """OpenAI's `prompt_cache_key` for a request without one set: the same for every request that starts
        with the same instructions and tools (one agent), so they reach the servers that cached its prefix.
        OpenAI caches prompts of 1,024 tokens or more by itself; the key only raises the hit rate. Sent to
        OpenAI's own endpoint only: other OpenAI-compatible servers may refuse a field they do not know."""
        if self.base_url != DEFAULT_BASE_URL:
            return None
        head = json.dumps([self.model, request.instructions, [t.name for t in request.tools]])
        return "ringlet-" + hashlib.sha256(head.encode()).hexdigest()[:32]

    def _content(self, request: ModelRequest, *, stream: bool) -> bytes:
        """The POST's body in wire format, with `extra_body` merged into it (as the SDK did)."""
        body = self._body(request, stream=stream)
        body |= body.pop("extra_body", None) or {}
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

    async def _send(self, session: aiohttp.ClientSession, request: ModelRequest, *,
                    stream: bool) -> aiohttp.ClientResponse:
        """The POST, up to its reply's headers."""
        return await session.post(self._url, data=self._content(request, stream=stream), headers=self._headers,
                                  timeout=self._timeout)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        reader = openai_format.DeltaReader()
        try:
            async for out in self._streamed(request, reader):
                yield out
            if not reader.anything and reader.finish_reason is None:  # an empty stream: ask once more, whole
                reply = await self._complete(request)
                reader.usage = openai_format.usage(reply.get("usage"), self.provider, self.model)
                for choice in (reply.get("choices") or ())[:1]:
                    for out in reader.complete(choice.get("message") or {}, choice.get("finish_reason")):
                        yield out
        except aiohttp.ClientError as exc:  # timeouts before the reply are typed where they happen
            raise errors.network(f"{type(exc).__name__}: {exc}", provider=self.provider) from exc
        yield Finish(reader.finish_reason, reader.usage)

    async def _streamed(self, request: ModelRequest, reader: openai_format.DeltaReader) -> AsyncIterator[Chunk]:
        """The streamed request's chunks. A request dropped before its reply, as when the server closed the
        pooled connection it went out on, is sent once more on a fresh connection (a one-off session, as in
        `_complete`). A stream dropped again, or accepted and then dropped before its first chunk, counts as
        empty (the caller falls back), not as a failure."""
        async with contextlib.AsyncExitStack() as fresh:
            response = await self._open(await _session(self.base_url), request)
            if response is None:
                session = await fresh.enter_async_context(_new_session(aiohttp.TCPConnector(force_close=True)))
                if (response := await self._open(session, request)) is None:
                    return
            try:
                if response.status >= 400:
                    raise self._status_error(response, await response.read())
                content = response.content
                try:
                    async for chunk in _chunks(content.iter_any(), self.provider):
                        if chunk.get("usage"):
                            reader.usage = openai_format.usage(chunk["usage"], self.provider, self.model)
                        for choice in (chunk.get("choices") or ())[:1]:
                            for out in reader.delta(choice.get("delta") or {}, choice.get("finish_reason")):
                                yield out
                    if not content.is_eof():
                        await _drain(content)
                except aiohttp.ClientError as exc:
                    if reader.anything or reader.finish_reason is not None or isinstance(exc, TimeoutError):
                        raise  # output was sent (the stream broke), or the server is too slow: not an empty one
            finally:
                response.release()  # back to the pool if the body was read to its end, else closed

    async def _open(self, session: aiohttp.ClientSession, request: ModelRequest) -> aiohttp.ClientResponse | None:
        """The streamed request, up to its reply's headers; None when the connection dropped before them."""
        try:
            return await self._send(session, request, stream=True)
        except TimeoutError as exc:  # aiohttp's own timeouts are `TimeoutError`s too
            raise errors.timeout(_TIMED_OUT, provider=self.provider) from exc
        except aiohttp.ClientError as exc:
            if _never_connected(exc):
                raise
            return None

    async def _complete(self, request: ModelRequest) -> dict[str, Any]:
        """The non-streamed request. A server that dropped the stream also drops its pooled connection,
        so a reply lost on a reused connection is asked for once more on a fresh one (a one-off session
        of its own: the shared pool may hold more connections the server has dropped)."""
        try:
            return await self._post(request, await _session(self.base_url))
        except aiohttp.ClientError as exc:
            if _never_connected(exc):
                raise
        async with _new_session(aiohttp.TCPConnector(force_close=True)) as fresh:
            return await self._post(request, fresh)

    async def _post(self, request: ModelRequest, session: aiohttp.ClientSession) -> dict[str, Any]:
        try:
            response = await self._send(session, request, stream=False)
            try:
                content = await response.read()
            finally:
                response.release()
        except TimeoutError as exc:
            raise errors.timeout(_TIMED_OUT, provider=self.provider) from exc
        if response.status >= 400:
            raise self._status_error(response, content)
        try:
            reply = json.loads(content)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            text = content.decode(errors="replace")
            raise ProviderError(f"{self.provider}: the reply is not a chat completion: {text[:200]!r}",
                                provider=self.provider)
        return reply

    def _status_error(self, response: aiohttp.ClientResponse, content: bytes) -> ProviderError:
        """The typed error for a non-2xx reply, from its body."""
        return errors.from_status(response.status, _message(response.status, content), provider=self.provider,
                                  headers=response.headers)


def response_format(out: ResponseFormat) -> dict[str, Any]:
    """The `response_format` of a native-output request: a JSON Schema the answer's text must match."""
    spec: dict[str, Any] = {"name": out.name, "schema": out.schema}
    if out.description:
        spec["description"] = out.description
    return {"type": "json_schema", "json_schema": spec}


async def _chunks(body: AsyncIterator[bytes], provider: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI-style SSE body, parsed as plain dicts from the `data:` lines of the
    bytes as read (each read split here: cheaper than a coroutine per line); `[DONE]` ends it."""
    rest = b""
    async for data in body:
        lines = (rest + data if rest else data).split(b"\n")
        rest = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                chunk = _chunk(line, provider)
                if chunk is None:
                    return
                if chunk is not _SKIP:
                    yield chunk
    if rest.startswith(b"data:") and (chunk := _chunk(rest, provider)) is not None and chunk is not _SKIP:
        yield chunk


async def _drain(content: aiohttp.StreamReader) -> None:
    """Reads on past `[DONE]` to the end of the body (the last chunk of a chunked reply usually comes in a
    read of its own), so that the connection goes back to the pool rather than being closed; a server
    that keeps the stream open after `[DONE]` gets a moment, then loses the connection."""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with asyncio.timeout(_DRAIN_S):
            async for _ in content.iter_any():
                pass


_SKIP: dict[str, Any] = {}
"""What `_chunk` returns for a line that holds no JSON object (skipped, as the SDK's reader did)."""


def _chunk(line: bytes, provider: str) -> dict[str, Any] | None:
    """One `data:` line's chunk: None for `[DONE]`, `_SKIP` for a non-object; an error chunk raises."""
    data = line[5:].strip()
    if data == b"[DONE]":
        return None
    chunk = json.loads(data)
    if not isinstance(chunk, dict):
        return _SKIP
    if error := chunk.get("error"):
        message = error.get("message") if isinstance(error, dict) else str(error)
        raise ProviderError(f"{provider}: {message or error}", provider=provider)
    return chunk


def _never_connected(exc: aiohttp.ClientError) -> bool:
    """Whether the request failed outright (refused, DNS, TLS, proxy, bad URL, any timeout), as opposed to
    a reply the server dropped after accepting the request. Only the latter may be asked for again here."""
    return isinstance(exc, aiohttp.ClientConnectorError | TimeoutError | aiohttp.InvalidURL
                      | aiohttp.ClientHttpProxyError)


def _message(status: int, content: bytes) -> str:
    """The provider's own words from an `{"error": {"message": ...}}` body, else the status (as the SDK)."""
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return f"Error code: {status}"


# -- one shared session per (event loop, base URL) -----------------------------------------------------------


def _new_session(connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=connector, trust_env=True)  # proxies from the environment


class _Pool:
    """An event loop's sessions, one per base URL (each its own connection pool)."""

    __slots__ = ("closer", "sessions")

    def __init__(self) -> None:
        self.sessions: dict[str, aiohttp.ClientSession] = {}
        self.closer: AsyncGenerator[None, None] | None = None


_POOLS: dict[asyncio.AbstractEventLoop, _Pool] = {}


async def _session(base_url: str) -> aiohttp.ClientSession:
    """The shared session for `base_url` on the running loop, made on first use.

    Connections belong to the loop that opened them, so each loop has its own sessions. They are closed,
    while their loop still runs, by its async-generator shutdown (`asyncio.run`, `asyncio.Runner`,
    uvicorn, pytest-asyncio all run it): a suspended generator per loop holds them. A loop closed without
    that shutdown has its sessions dropped when the next loop makes its pool."""
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        for old in list(_POOLS):  # a copy: other threads' loops may add theirs meanwhile
            if old.is_closed():
                _POOLS.pop(old, None)
        pool = _POOLS[loop] = _Pool()
        pool.closer = _close_at_shutdown(pool)
        await pool.closer.asend(None)  # runs up to its `yield`: the loop now tracks it
    session = pool.sessions.get(base_url)
    if session is None:
        connector = aiohttp.TCPConnector(limit=_MAX_CONNECTIONS, limit_per_host=0)
        session = pool.sessions[base_url] = _new_session(connector)
    return session


async def _close_at_shutdown(pool: _Pool) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        for loop, p in list(_POOLS.items()):
            if p is pool:
                _POOLS.pop(loop, None)
        sessions = list(pool.sessions.values())
        pool.sessions.clear()
        for session in sessions:
            await session.close()


def ollama(model: str, **options: Any) -> OpenAIModel:
    """`ollama:<model>`: Ollama's OpenAI-compatible `/v1`, at `OLLAMA_HOST` (default 127.0.0.1:11434)."""
    host = os.environ.get("OLLAMA_HOST", "http://127.0.0.1:11434")
    if "://" not in host:
        host = f"http://{host}"
    return OpenAIModel(model, base_url=options.pop("base_url", None) or f"{host.rstrip('/')}/v1",
                       api_key=options.pop("api_key", None) or "ollama", provider="ollama", **options)
