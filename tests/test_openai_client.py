"""The `openai:` adapter's own HTTP client: one shared connection pool per base URL and event loop, the
typed errors, error chunks, the SSE reader, and the empty-stream fallback. A loopback replay server
(`replay.py`) answers over real HTTP and counts the TCP connections it accepts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from replay import Replay
from ringlet import (
    AuthError,
    BadRequestError,
    ContextWindowError,
    Message,
    NetworkError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitError,
    ServerError,
)
from ringlet.models import ModelRequest, TextDelta
from ringlet.models import openai as adapter
from ringlet.models.base import Finish
from ringlet.models.openai import OpenAIModel
from ringlet.models.retry import RetryingModel, RetryPolicy

SSE = {"content-type": "text/event-stream"}
REQUEST = ModelRequest([Message.user("hi")], "Be brief.")


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def text(*parts: str) -> bytes:
    return sse(*({"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in parts),
               {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
               {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(parts)}})


WHOLE = {"id": "c", "object": "chat.completion", "choices": [
    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "whole"}}],
    "usage": {"prompt_tokens": 4, "completion_tokens": 1}}


class Counted(Replay):
    """A replay server that also counts the TCP connections it accepted."""

    def __init__(self) -> None:
        super().__init__()
        self.connections = 0
        accept = self.server.process_request

        def counting(request: Any, address: Any) -> None:
            self.connections += 1
            accept(request, address)

        self.server.process_request = counting  # type: ignore[method-assign]


@pytest.fixture
def server() -> Iterator[Counted]:
    with Counted() as s:
        yield s


def model(server: Replay, **options: Any) -> OpenAIModel:
    return OpenAIModel("gpt-4o-mini", **{"api_key": "sk-test", "base_url": f"{server.url}/v1", **options})


async def chunks_of(m: Any, request: ModelRequest = REQUEST) -> list[Any]:
    return [c async for c in m.stream(request)]


def texts(out: list[Any]) -> list[str]:
    return [c.text for c in out if isinstance(c, TextDelta)]


# -- the shared pool --------------------------------------------------------------------------------------


async def test_sequential_streams_reuse_one_connection_across_models(server: Counted) -> None:
    for i in range(3):
        server.add(body=text(f"a{i}", "b"), headers=SSE)
    first, second = model(server), model(server, api_key="sk-other")
    assert texts(await chunks_of(first)) == ["a0", "b"]
    assert texts(await chunks_of(second)) == ["a1", "b"]
    assert texts(await chunks_of(first)) == ["a2", "b"]
    assert server.connections == 1
    assert [r.headers["Authorization"] for r in server.requests] == ["Bearer sk-test", "Bearer sk-other",
                                                                      "Bearer sk-test"]


async def test_each_base_url_has_its_own_session() -> None:
    with Counted() as one, Counted() as two:
        assert await adapter._session(one.url) is await adapter._session(one.url)
        assert await adapter._session(one.url) is not await adapter._session(two.url)


def test_each_event_loop_has_its_own_sessions_closed_when_it_shuts_down(server: Counted) -> None:
    m = model(server)  # made outside any loop, used in two
    seen: list[aiohttp.ClientSession] = []

    async def use() -> list[str]:
        seen.append(await adapter._session(m.base_url))
        return texts(await chunks_of(m))

    for word in ("one", "two"):
        server.add(body=text(word), headers=SSE)
        assert asyncio.run(use()) == [word]
    assert seen[0] is not seen[1]
    assert all(c.closed for c in seen)
    assert server.connections == 2
    assert not [loop for loop in adapter._POOLS if loop.is_closed()]


async def test_the_request_is_the_wire_body_with_auth_usage_and_extra_body(server: Counted) -> None:
    server.add(body=b"data: [DONE]\n\n", headers=SSE)  # empty: the non-streamed request follows
    server.add(body=WHOLE)
    m = model(server, extra_body={"reasoning_effort": "low"})
    out = await chunks_of(m)
    streamed, whole = (r.json() for r in server.requests)
    assert streamed == {"model": "gpt-4o-mini", "stream": True, "stream_options": {"include_usage": True},
                        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                        "reasoning_effort": "low"}
    assert whole["stream"] is False
    assert "stream_options" not in whole
    assert whole["reasoning_effort"] == "low"
    headers = {k.lower(): v for k, v in server.requests[0].headers.items()}
    assert headers["authorization"] == "Bearer sk-test"
    assert headers["content-type"] == "application/json"
    assert server.requests[0].path == "/v1/chat/completions"
    assert texts(out) == ["whole"]


def test_keys_and_base_urls_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from ringlet import ConfigError

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIModel("m")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert OpenAIModel("m").base_url == "https://api.openai.com/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/")
    assert OpenAIModel("m").base_url == "http://127.0.0.1:9/v1"
    assert adapter.ollama("llama3.2", base_url="http://127.0.0.1:8/v1").name == "ollama:llama3.2"


# -- typed errors -----------------------------------------------------------------------------------------


STATUS_ERRORS = [
    (429, {"error": {"message": "slow down"}}, {"retry-after": "7"}, RateLimitError, "openai returned 429: slow down"),
    (400, {"error": {"message": "maximum context length is 8192"}}, {}, ContextWindowError, "maximum context length"),
    (400, {"error": {"message": "bad field"}}, {}, BadRequestError, "bad field"),
    (401, {"error": {"message": "bad key"}}, {}, AuthError, "bad key"),
    (502, b"<html>bad gateway</html>", {}, ServerError, "openai returned 502: Error code: 502"),
]


@pytest.mark.parametrize("case", STATUS_ERRORS, ids=[f"{c[0]}-{c[3].__name__}" for c in STATUS_ERRORS])
async def test_status_errors_are_typed_with_the_providers_message(server: Counted, case: tuple[Any, ...]) -> None:
    status, body, headers, cls, message = case
    server.add(status, body, headers)
    with pytest.raises(cls, match=message) as err:
        await chunks_of(model(server))
    assert (err.value.status, err.value.provider) == (status, "openai")
    assert err.value.retry_after_s == (7.0 if status == 429 else None)
    assert len(server.requests) == 1  # never retried in here


async def test_the_connection_survives_an_error_reply(server: Counted) -> None:
    server.add(500, {"error": {"message": "boom"}})
    server.add(body=text("fine"), headers=SSE)
    with pytest.raises(ServerError):
        await chunks_of(model(server))
    assert texts(await chunks_of(model(server))) == ["fine"]
    assert server.connections == 1  # the error body was read before raising


async def test_an_error_chunk_inside_the_stream_is_a_provider_error_not_retried(server: Counted) -> None:
    body = b'data: {"choices": [], "error": {"message": "model crashed", "type": "server_error"}}\n\n'
    server.add(body=body, headers=SSE)
    server.add(body=text("never asked"), headers=SSE)
    with pytest.raises(ProviderError, match="openai: model crashed") as err:
        await chunks_of(RetryingModel(model(server), RetryPolicy(max_retries=3)))
    assert type(err.value) is ProviderError
    assert len(server.requests) == 1


async def test_a_refused_connection_is_a_network_error_without_a_second_request() -> None:
    with Counted() as gone:
        url = gone.url
    with pytest.raises(NetworkError, match="ClientConnectorError"):
        await chunks_of(OpenAIModel("m", api_key="k", base_url=f"{url}/v1"))


async def test_a_timeout_of_the_fallback_request_is_not_asked_again(server: Counted) -> None:
    server.add(body=b"data: [DONE]\n\n", headers=SSE)
    server.add(body=WHOLE, delay_s=0.6)
    with pytest.raises(ProviderTimeoutError, match="timed out"):
        await chunks_of(model(server, timeout_s=0.2))
    assert len(server.requests) == 2


# -- the empty-stream fallback ----------------------------------------------------------------------------


async def test_a_stream_dropped_before_its_first_chunk_falls_back_to_one_whole_request(server: Counted) -> None:
    server.add(body=b"", headers=SSE, broken=True)
    server.add(body=WHOLE)
    out = await chunks_of(model(server))
    assert texts(out) == ["whole"]
    assert (out[-1].finish_reason, out[-1].usage.in_tokens) == ("stop", 4)
    assert [r.json()["stream"] for r in server.requests] == [True, False]


async def test_a_stream_dropped_before_its_reply_is_asked_once_more_on_a_fresh_connection(server: Counted) -> None:
    """A kept-alive connection the server closes as the request goes out (under load, between two runs): the
    same streamed request is sent again on a new connection, and the answer still streams."""
    server.add(dropped=True)
    server.add(body=text("a", "b"), headers=SSE)
    out = await chunks_of(model(server))
    assert texts(out) == ["a", "b"]
    assert [r.json()["stream"] for r in server.requests] == [True, True]
    assert server.connections == 2


async def test_a_stream_dropped_twice_before_its_reply_falls_back_to_one_whole_request(server: Counted) -> None:
    server.add(dropped=True)
    server.add(dropped=True)
    server.add(body=WHOLE)
    assert texts(await chunks_of(model(server))) == ["whole"]
    assert [r.json()["stream"] for r in server.requests] == [True, True, False]


async def test_a_whole_reply_lost_on_a_reused_connection_is_asked_once_more_on_a_fresh_one(server: Counted) -> None:
    server.add(body=b"data: [DONE]\n\n", headers=SSE)
    server.add(body=json.dumps(WHOLE).encode()[:20], broken=True)
    server.add(body=WHOLE)
    assert texts(await chunks_of(model(server))) == ["whole"]
    assert len(server.requests) == 3
    assert server.connections == 2


async def test_a_whole_reply_lost_twice_is_a_network_error(server: Counted) -> None:
    server.add(body=b"data: [DONE]\n\n", headers=SSE)
    server.add(body=b"{", broken=True)
    server.add(body=b"{", broken=True)
    with pytest.raises(NetworkError):
        await chunks_of(model(server))
    assert len(server.requests) == 3


async def test_a_stream_with_only_a_finish_reason_is_not_asked_again(server: Counted) -> None:
    server.add(body=sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}), headers=SSE)
    out = await chunks_of(model(server))
    assert [type(c) for c in out] == [Finish]
    assert len(server.requests) == 1


# -- the SSE reader ---------------------------------------------------------------------------------------


async def read(pieces: list[bytes]) -> list[dict[str, Any]]:
    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    return [c async for c in adapter._chunks(body(), "openai")]


async def test_sse_lines_split_anywhere_across_reads_parse_the_same() -> None:
    raw = (b': a comment\r\nevent: ignored\r\ndata: {"n": 1}\r\n\r\ndata:{"n": 2}\n\ndata: [1]\n\n'
           b'data: {"n": 3}\n\ndata: [DONE]\n\ndata: {"n": 4}\n\n')
    for cut in range(len(raw) + 1):
        for size in (1, 7, len(raw)):
            pieces = [raw[:cut]] + [raw[i:i + size] for i in range(cut, len(raw), size)]
            assert [c["n"] for c in await read(pieces)] == [1, 2, 3]


async def test_a_last_line_without_a_newline_is_read() -> None:
    assert await read([b'data: {"n": 1}\n\ndata: {"n": 2}']) == [{"n": 1}, {"n": 2}]


async def test_no_pool_outlives_its_event_loop() -> None:
    """Every earlier test ran on a loop of its own (pytest-asyncio shuts each down): none is left."""
    await adapter._session("http://127.0.0.1:9")
    assert list(adapter._POOLS) == [asyncio.get_running_loop()]
