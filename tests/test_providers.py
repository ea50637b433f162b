"""Remote provider adapters against their HTTP wire formats, and the one retry layer.

The stream bodies below follow each provider's documented server-sent-event format (OpenAI chat
completion chunks, Anthropic message events, Gemini `streamGenerateContent?alt=sse`). A loopback
replay server answers with them over real HTTP, so each SDK's own transport (httpx or httpx2) runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from replay import Replay
from ringlet import Agent, AuthError, Limits, Message, NetworkError, RateLimitError, ServerError, tool
from ringlet.messages import ToolDefinition
from ringlet.models import ModelRequest, TextDelta, ToolCallArgsDelta, ToolCallStart
from ringlet.models.base import Finish, ModelSettings, Retrying
from ringlet.models.retry import RetryingModel, RetryPolicy


def sse(*events: dict[str, Any], named: bool = False, done: bool = False) -> bytes:
    out = []
    for e in events:
        head = f"event: {e['type']}\n" if named else ""
        out.append(f"{head}data: {json.dumps(e)}\n\n")
    if done:
        out.append("data: [DONE]\n\n")
    return "".join(out).encode()


# -- one wire description per provider ---------------------------------------------------------------------


def openai_text(parts: list[str]) -> bytes:
    chunks = [{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in parts]
    chunks.append({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                   "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}})
    return sse(*chunks, done=True)


def openai_tool(name: str, arg_parts: list[str]) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"tool_calls": [{"index": 0, "id": "call_abc", "type": "function",
                                     "function": {"name": name, "arguments": ""}}]})]
    chunks += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in arg_parts]
    chunks.append(chunk({}, "tool_calls"))
    chunks.append({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                   "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}})
    return sse(*chunks, done=True)


def anthropic_events(blocks: list[dict[str, Any]], deltas: list[tuple[int, dict[str, Any]]], stop: str) -> bytes:
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-x",
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 1}}}]
    events += [{"type": "content_block_start", "index": i, "content_block": b} for i, b in enumerate(blocks)]
    events += [{"type": "content_block_delta", "index": i, "delta": d} for i, d in deltas]
    events += [{"type": "content_block_stop", "index": i} for i in range(len(blocks))]
    events.append({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                   "usage": {"output_tokens": 5}})
    events.append({"type": "message_stop"})
    return sse(*events, named=True)


def anthropic_text(parts: list[str]) -> bytes:
    return anthropic_events([{"type": "text", "text": ""}],
                            [(0, {"type": "text_delta", "text": p}) for p in parts], "end_turn")


def anthropic_tool(name: str, arg_parts: list[str]) -> bytes:
    return anthropic_events([{"type": "tool_use", "id": "call_abc", "name": name, "input": {}}],
                            [(0, {"type": "input_json_delta", "partial_json": p}) for p in arg_parts], "tool_use")


def gemini_chunk(parts: list[dict[str, Any]], finish: str | None = None, usage: bool = False) -> dict[str, Any]:
    chunk: dict[str, Any] = {"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}],
                             "modelVersion": "gemini-x"}
    if finish:
        chunk["candidates"][0]["finishReason"] = finish
    if usage:
        chunk["usageMetadata"] = {"promptTokenCount": 12, "candidatesTokenCount": 5, "totalTokenCount": 17}
    return chunk


def gemini_text(parts: list[str]) -> bytes:
    chunks = [gemini_chunk([{"text": p}]) for p in parts[:-1]]
    chunks.append(gemini_chunk([{"text": parts[-1]}], "STOP", usage=True))
    return b"".join(f"data: {json.dumps(c)}\r\n\r\n".encode() for c in chunks)


def gemini_tool(name: str, arg_parts: list[str]) -> bytes:
    args = json.loads("".join(arg_parts))  # Gemini sends whole calls, never argument fragments
    chunk = gemini_chunk([{"functionCall": {"id": "call_abc", "name": name, "args": args}}], "STOP", usage=True)
    return f"data: {json.dumps(chunk)}\r\n\r\n".encode()


def error_body(provider: str, status: int, message: str) -> dict[str, Any]:
    if provider == "anthropic":
        return {"type": "error", "error": {"type": "rate_limit_error", "message": message}}
    if provider == "gemini":
        return {"error": {"code": status, "message": message, "status": "UNAVAILABLE"}}
    return {"error": {"message": message, "type": "error", "code": None}}


def _openai(url: str) -> Any:
    from ringlet.models.openai import OpenAIModel

    return OpenAIModel("gpt-4o-mini", api_key="sk-test", base_url=f"{url}/v1")


def _anthropic(url: str) -> Any:
    from ringlet.models.anthropic import AnthropicModel

    return AnthropicModel("claude-sonnet-4-6", api_key="sk-ant-test", base_url=url)


def _gemini(url: str) -> Any:
    from ringlet.models.gemini import GeminiModel

    return GeminiModel("gemini-2.5-flash", api_key="g-test", base_url=url)


@dataclass
class Wire:
    provider: str
    path: str
    factory: Callable[[str], Any]
    text: Callable[[list[str]], bytes]
    tool: Callable[[str, list[str]], bytes]
    usage: tuple[int, int]
    server: Replay | None = None

    def make(self) -> Any:
        assert self.server is not None
        return self.factory(self.server.url)

    def add(self, status: int = 200, body: bytes | dict[str, Any] = b"", headers: dict[str, str] | None = None,
            *, broken: bool = False) -> None:
        assert self.server is not None
        sse_headers = {"content-type": "text/event-stream"} if status == 200 else {}
        self.server.add(status, body, {**sse_headers, **(headers or {})}, broken=broken)

    @property
    def requests(self) -> list[Any]:
        assert self.server is not None
        return self.server.requests


WIRES = [
    ("openai", "/v1/chat/completions", _openai, openai_text, openai_tool, (12, 5)),
    ("anthropic", "/v1/messages", _anthropic, anthropic_text, anthropic_tool, (12, 5)),
    ("gemini", "/v1/models/gemini-2.5-flash:streamGenerateContent", _gemini, gemini_text, gemini_tool, (12, 5)),
]


@pytest.fixture(params=WIRES, ids=[w[0] for w in WIRES])
def wire(request: pytest.FixtureRequest) -> Any:
    with Replay() as server:
        yield Wire(*request.param, server=server)


@pytest.fixture
def server() -> Any:
    with Replay() as s:
        yield s


REQUEST = ModelRequest([Message.user("hi")], "Be brief.",
                       [ToolDefinition(name="get_weather", description="Weather.",
                                       parameters={"type": "object", "properties": {"city": {"type": "string"}}})],
                       ModelSettings(temperature=0.1))


async def chunks_of(model: Any, request: ModelRequest = REQUEST) -> list[Any]:
    return [c async for c in model.stream(request)]


def delays() -> tuple[list[float], RetryPolicy]:
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    return waited, RetryPolicy(sleep=sleep, jitter=lambda lo, hi: hi)


async def test_text_streams_as_deltas_with_usage(wire: Wire) -> None:
    wire.add(body=wire.text(["Hel", "lo"]))
    out = await chunks_of(wire.make())
    assert [c.text for c in out if isinstance(c, TextDelta)] == ["Hel", "lo"]
    finish = out[-1]
    assert isinstance(finish, Finish)
    assert finish.finish_reason == "stop"
    assert (finish.usage.in_tokens, finish.usage.out_tokens) == wire.usage
    assert wire.requests[0].path.startswith(wire.path)
    body = wire.requests[0].json()
    assert "Be brief." in json.dumps(body)
    assert "get_weather" in json.dumps(body)


async def test_tool_call_arguments_arrive_split_across_chunks(wire: Wire) -> None:
    wire.add(body=wire.tool("get_weather", ['{"ci', 'ty": "Pa', 'ris"}']))
    out = await chunks_of(wire.make())
    start = next(c for c in out if isinstance(c, ToolCallStart))
    assert (start.name, start.id) == ("get_weather", "call_abc")
    args = "".join(c.delta for c in out if isinstance(c, ToolCallArgsDelta))
    assert json.loads(args) == {"city": "Paris"}
    assert out[-1].finish_reason == "tool_calls"


async def test_a_429_with_retry_after_is_honoured(wire: Wire) -> None:
    wire.add(429, error_body(wire.provider, 429, "slow down"), {"retry-after": "7"})
    wire.add(body=wire.text(["ok"]))
    waited, policy = delays()
    out = await chunks_of(RetryingModel(wire.make(), policy))
    assert waited == [7.0]
    retry = next(c for c in out if isinstance(c, Retrying))
    assert (retry.attempt, retry.delay_s) == (1, 7.0)
    assert out[-1].usage.attempts == 2


async def test_a_500_is_retried_with_backoff(wire: Wire) -> None:
    wire.add(500, error_body(wire.provider, 500, "boom"))
    wire.add(503, error_body(wire.provider, 503, "busy"))
    wire.add(body=wire.text(["fine"]))
    waited, policy = delays()
    out = await chunks_of(RetryingModel(wire.make(), policy))
    assert waited == [1.0, 2.0]  # initial 1 s, ×2 (jitter pinned to its upper bound)
    assert len(wire.requests) == 3
    assert [c.text for c in out if isinstance(c, TextDelta)] == ["fine"]


async def test_a_401_is_not_retried(wire: Wire) -> None:
    wire.add(401, error_body(wire.provider, 401, "bad key"))
    waited, policy = delays()
    with pytest.raises(AuthError, match="401"):
        await chunks_of(RetryingModel(wire.make(), policy))
    assert len(wire.requests) == 1
    assert waited == []


async def test_a_stream_broken_after_the_first_delta_is_not_replayed(wire: Wire) -> None:
    sep = b"\r\n\r\n" if wire.provider == "gemini" else b"\n\n"
    events = wire.text(["Hel", "lo", "!"]).split(sep)
    upto = 3 if wire.provider == "anthropic" else 1  # anthropic: message_start, block start, first delta
    wire.add(body=sep.join(events[:upto]) + sep, broken=True)
    waited, policy = delays()
    model = RetryingModel(wire.make(), policy)
    seen: list[Any] = []

    async def consume() -> None:
        async for chunk in model.stream(REQUEST):
            seen.append(chunk)  # noqa: PERF401 - what came before the break must be kept

    with pytest.raises(NetworkError):
        await consume()
    assert [c.text for c in seen if isinstance(c, TextDelta)] == ["Hel"]
    assert len(wire.requests) == 1
    assert waited == []


async def test_provider_errors_map_onto_the_typed_classes(wire: Wire) -> None:
    wire.add(429, error_body(wire.provider, 429, "quota"))
    with pytest.raises(RateLimitError) as err:
        await chunks_of(wire.make())
    assert (err.value.status, err.value.retryable, err.value.provider) == (429, True, wire.provider)


async def test_a_whole_run_through_an_adapter(server: Replay) -> None:
    @tool
    def get_weather(city: str) -> str:
        """Weather."""
        return f"Sunny in {city}"

    sse_type = {"content-type": "text/event-stream"}
    server.add(body=openai_tool("get_weather", ['{"city":', ' "Rome"}']), headers=sse_type)
    server.add(body=openai_text(["It is ", "sunny."]), headers=sse_type)
    from ringlet.models.pricing import Price, Pricing

    agent = Agent(RetryingModel(_openai(server.url)), tools=[get_weather],
                  limits=Limits(pricing=Pricing({"openai:gpt-4o-mini": Price(1.0, 2.0)})))
    result = await agent.run("Weather in Rome?")
    assert result.output == "It is sunny."
    assert result.messages[2].text == "Sunny in Rome"
    assert (result.usage.in_tokens, result.usage.out_tokens) == (42, 14)
    assert result.usage.cost_usd == pytest.approx((42 * 1.0 + 14 * 2.0) / 1e6)
    second = server.requests[1].json()
    assert second["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]}
    assert second["messages"][2] == {"role": "tool", "tool_call_id": "call_abc", "content": "Sunny in Rome"}


EMPTY_STREAMS = {
    "openai": b"data: [DONE]\n\n",
    "anthropic": sse({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "claude-x",
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 9, "output_tokens": 0}}},
        {"type": "message_stop"}, named=True),
    "gemini": b"",
}
WHOLE_TOOL_REPLIES: dict[str, dict[str, Any]] = {
    "openai": {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
               "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                   "role": "assistant", "content": None, "tool_calls": [
                       {"id": "call_abc", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]}}],
               "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}},
    "anthropic": {"id": "msg_2", "type": "message", "role": "assistant", "model": "claude-x",
                  "content": [{"type": "tool_use", "id": "call_abc", "name": "get_weather", "input": {"city": "Oslo"}}],
                  "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 9, "output_tokens": 4}},
    "gemini": {"candidates": [{"content": {"role": "model", "parts": [
                   {"functionCall": {"id": "call_abc", "name": "get_weather", "args": {"city": "Oslo"}}}]},
                   "finishReason": "STOP", "index": 0}],
               "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 4, "totalTokenCount": 13}},
}


async def test_an_empty_stream_is_asked_for_once_more_without_streaming(wire: Wire) -> None:
    wire.add(body=EMPTY_STREAMS[wire.provider])
    assert wire.server is not None
    wire.server.add(body=WHOLE_TOOL_REPLIES[wire.provider])
    out = await chunks_of(wire.make())
    assert len(wire.requests) == 2
    second = wire.requests[1]
    assert second.json().get("stream") is not True
    assert "streamGenerateContent" not in second.path
    assert [type(c).__name__ for c in out] == ["ToolCallStart", "ToolCallArgsDelta", "Finish"]
    assert json.loads(out[1].delta) == {"city": "Oslo"}
    assert out[-1].finish_reason == "tool_calls"
    assert out[-1].usage.in_tokens == 9


async def test_retry_notifications_and_telemetry_reach_the_run() -> None:
    from ringlet import telemetry
    from ringlet.testing import ScriptedModel

    seen: list[tuple[str, dict]] = []
    unsubscribe = telemetry.subscribe(lambda name, m, meta: seen.append((name, {**m, **meta})))
    _, policy = delays()
    model = RetryingModel(ScriptedModel([ServerError("down", status=502), "ok"]), policy)
    try:
        events = [e async for e in Agent(model).stream("x")]
    finally:
        unsubscribe()
    note = next(e for e in events if e.type == "notification")
    assert note.level == "warning"
    assert "retrying in 1.0 s" in note.message
    retry = next(m for n, m in seen if n == "ringlet.provider.retry")
    assert retry == {"attempt": 1, "delay_ms": 1000, "error_class": "ServerError", "status": 502, "provider": "test"}
    assert events[-1].finish_reason == "end_turn"


def test_backoff_is_full_jitter_and_capped() -> None:
    bounds: list[tuple[float, float]] = []
    policy = RetryPolicy(jitter=lambda lo, hi: bounds.append((lo, hi)) or hi)
    err = ServerError("x", status=500)
    assert [policy.delay(k, err) for k in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert all(lo == 0 for lo, _ in bounds)
    assert policy.delay(0, RateLimitError("x", retry_after_s=500)) == 60
    assert policy.delay(0, RateLimitError("x", retry_after_s=-3)) == 0


def test_retry_after_parsing() -> None:
    from datetime import UTC, datetime
    from email.utils import format_datetime

    from ringlet.models.retry import retry_after

    assert retry_after({"Retry-After": "3"}) == 3
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    now = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    later = format_datetime(datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC), usegmt=True)
    assert retry_after({"Retry-After": later}, now=now) == 10
    past = format_datetime(datetime(2025, 1, 1, tzinfo=UTC), usegmt=True)
    assert retry_after({"Retry-After": past}, now=now) == 0
    assert retry_after({}) is None


def test_sdk_clients_are_built_with_their_retries_off() -> None:
    assert _anthropic("http://127.0.0.1:1").client.max_retries == 0  # the openai adapter has no SDK client


async def test_a_timeout_is_not_retried_inside_the_openai_adapter(server: Replay) -> None:
    from ringlet import ProviderTimeoutError
    from ringlet.models.openai import OpenAIModel

    server.add(body=openai_text(["late"]), headers={"content-type": "text/event-stream"}, delay_s=1.0)
    model = OpenAIModel("gpt-4o-mini", api_key="sk-test", base_url=f"{server.url}/v1", timeout_s=0.2)
    with pytest.raises(ProviderTimeoutError):
        await chunks_of(model)
    assert len(server.requests) == 1


async def test_an_error_event_inside_an_anthropic_stream_is_typed_and_retried(server: Replay) -> None:
    from ringlet import OverloadedError

    events = anthropic_text(["Hi"]).split(b"\n\n")[:1]  # message_start, then an error event
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    body = b"\n\n".join(events) + b"\n\n" + sse(error, named=True)
    server.add(body=body, headers={"content-type": "text/event-stream"})
    with pytest.raises(OverloadedError) as err:
        await chunks_of(_anthropic(server.url))
    assert err.value.retryable


def test_cache_reads_and_writes_are_priced_once() -> None:
    from ringlet import RequestUsage
    from ringlet.models.pricing import Price, Pricing

    pricing = Pricing({"x:m": Price(input=10, output=20, cache_read=1, cache_write=15)})
    usage = RequestUsage(provider="x", model="m", in_tokens=1000, out_tokens=100, cache_read_tokens=300,
                         cache_write_tokens=200)
    assert pricing.cost(usage) == pytest.approx((500 * 10 + 100 * 20 + 300 * 1 + 200 * 15) / 1e6)
    assert Pricing().cost(RequestUsage(provider="x", model="unknown", in_tokens=5)) is None
    assert Pricing().price("openai", "gpt-4o-2024-08-06") == Pricing().price("openai", "gpt-4o")


def test_model_names_resolve_to_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    from ringlet import ConfigError
    from ringlet.models.providers import resolve_model

    monkeypatch.setenv("OLLAMA_HOST", "127.0.0.1:11500")
    model = resolve_model("ollama:llama3.2")
    assert model.name == "ollama:llama3.2"
    assert model.inner.base_url == "http://127.0.0.1:11500/v1"
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        resolve_model("openai:gpt-4o-mini")
    with pytest.raises(ConfigError, match="names no model"):
        resolve_model("anthropic:")
    with pytest.raises(ConfigError, match="not `provider:model`"):
        resolve_model("gpt-4o")


def test_an_unknown_provider_is_named_with_a_did_you_mean() -> None:
    from ringlet import ConfigError
    from ringlet.models.providers import resolve_model

    with pytest.raises(ConfigError) as info:
        resolve_model("opnai:gpt-4o")
    assert str(info.value) == ("model 'opnai:gpt-4o': unknown provider 'opnai' (providers: openai, anthropic, "
                               "gemini, ollama, local); did you mean 'openai:gpt-4o'?")
    with pytest.raises(ConfigError, match="did you mean 'anthropic:claude-sonnet-4-6'"):
        Agent("Anthropic:claude-sonnet-4-6")
    with pytest.raises(ConfigError, match=r"unknown provider 'mistral' \(providers: openai, .*\); e\.g\. openai:"):
        resolve_model("mistral:large")


def test_a_missing_extra_is_an_import_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    from ringlet import ConfigError
    from ringlet.models.providers import resolve_model

    monkeypatch.setitem(sys.modules, "anthropic", None)  # as if the package were not installed
    monkeypatch.delitem(sys.modules, "ringlet.models.anthropic", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'ringlet\[anthropic\]'"):
        importlib.import_module("ringlet.models.anthropic")
    with pytest.raises(ConfigError, match=r"ringlet\[anthropic\]"):
        resolve_model("anthropic:claude-sonnet-4-6", api_key="k")


def test_anthropic_and_gemini_get_alternating_turns() -> None:
    from ringlet import ToolCall
    from ringlet.models.anthropic import to_anthropic
    from ringlet.models.gemini import to_gemini

    calls = [ToolCall(id="a", name="f", arguments={"x": 1}), ToolCall(id="b", name="f", arguments={"x": 2})]
    request = ModelRequest([Message.user("hi"), Message.system("note"), Message.assistant("", calls),
                            Message.tool("a", "f", "1"), Message.tool("b", "f", '{"y": 2}'), Message.user("more")],
                           "Be brief.")
    system, turns = to_anthropic(request)
    assert system == "Be brief.\n\nnote"
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "tool_result", "text"]
    system, contents = to_gemini(request)
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    responses = [p["function_response"]["response"] for p in contents[2]["parts"] if "function_response" in p]
    assert responses == [{"result": "1"}, {"y": 2}]
