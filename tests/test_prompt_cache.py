"""Prompt caching (issue 56): cache points on the wire in each official SDK's request shape, cached input
counted and priced at the cached rate, and the settings that turn it off or move the points.

Anthropic's requests go over real HTTP to `bench/prompt_cache.py`'s loopback server, which keeps a prompt
cache as the API documents it; OpenAI's to a loopback server that records them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from replay import Canned, Replay
from ringlet import Agent, ConfigError, tool
from ringlet.agent.config import load_agent
from ringlet.messages import Message, ToolDefinition
from ringlet.models import ModelRequest
from ringlet.models.anthropic import AnthropicModel
from ringlet.models.base import ModelSettings
from ringlet.models.openai import OpenAIModel
from ringlet.models.pricing import DEFAULT_PRICING
from ringlet.testing import ScriptedModel
from ringlet.usage import RequestUsage, Usage

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import prompt_cache


def _plain(value: Any) -> Any:
    """A validated TypedDict as plain data (pydantic hands lists of a TypedDict back as iterators)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ValidatorIterator":
        return [_plain(v) for v in value]
    return value


def in_sdk_shape(body: dict[str, Any], params: Any) -> None:
    """`body` is what the SDK's request type describes: validating it keeps every key and value as sent (a
    key the type does not know is dropped, a value it does not take becomes something else)."""
    assert _plain(TypeAdapter(params).validate_python(body)) == body


def _marks(body: dict[str, Any]) -> list[str]:
    """Where the request's `cache_control` breakpoints are."""
    found = [f"tool:{t['name']}" for t in body.get("tools", []) if "cache_control" in t]
    system = body.get("system")
    found += ["system" for b in system if "cache_control" in b] if isinstance(system, list) else []
    for i, m in enumerate(body["messages"]):
        content = m["content"] if isinstance(m["content"], list) else []
        found += [f"message:{i}:{j}" for j, b in enumerate(content) if "cache_control" in b]
    return found


@tool
def lookup(order: int) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


def _agent(url: str, **settings: Any) -> Agent:
    return Agent(AnthropicModel("claude-sonnet-4-5", api_key="sk-ant-test", base_url=url),
                 instructions=prompt_cache.INSTRUCTIONS, tools=[lookup], model_settings=ModelSettings(**settings))


async def test_anthropic_requests_mark_tools_system_and_the_last_turn() -> None:
    from anthropic.types.message_create_params import MessageCreateParamsStreaming

    with prompt_cache.CachingServer() as server:
        agent = _agent(server.url)
        first = await agent.run("Where is order 7?")
        second = await agent.run("And order 8?", history=first.messages)
    bodies = server.bodies
    assert len(bodies) == 4  # each turn: a tool call, then the answer
    for body in bodies:
        in_sdk_shape(body, MessageCreateParamsStreaming)
        last = len(body["messages"]) - 1
        blocks = len(body["messages"][last]["content"])
        assert _marks(body) == [f"tool:{body['tools'][-1]['name']}", "system", f"message:{last}:{blocks - 1}"]
        assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    usages = [RequestUsage(**m.metadata["usage"]) for m in second.messages if m.role == "assistant"]
    assert usages[0].cache_read_tokens == 0  # the first request writes
    assert usages[0].cache_write_tokens
    assert all(u.cache_read_tokens for u in usages[1:])  # every later one reads what the one before wrote
    assert second.usage.cache_read_tokens == sum(u.cache_read_tokens or 0 for u in usages[2:])
    assert second.usage.cache_write_tokens == sum(u.cache_write_tokens or 0 for u in usages[2:])
    end = second.usage.summary()
    assert end["cache_read_tokens"] == second.usage.cache_read_tokens  # message_end.usage says so


async def test_caching_turned_off_or_moved_by_model_settings() -> None:
    with prompt_cache.CachingServer() as server:
        off = await _agent(server.url, prompt_cache=False).run("Where is order 7?")
        system_only = await _agent(server.url, cache_points=("system",)).run("Where is order 7?")
    assert [_marks(b) for b in server.bodies] == [[], [], ["system"], ["system"]]
    assert off.usage.cache_read_tokens == off.usage.cache_write_tokens == 0
    assert "cache_read_tokens" not in off.usage.summary()  # nothing cached: message_end.usage as before
    assert system_only.usage.cache_read_tokens > 0  # its second request reads the system prompt


def test_cached_input_is_priced_at_the_cached_rate() -> None:
    plain = RequestUsage(provider="anthropic", model="claude-sonnet-4-5", in_tokens=10_000, out_tokens=100)
    cached = RequestUsage(provider="anthropic", model="claude-sonnet-4-5", in_tokens=10_000, out_tokens=100,
                          cache_read_tokens=8_000, cache_write_tokens=1_000)
    assert DEFAULT_PRICING.cost(plain) == pytest.approx((10_000 * 3.00 + 100 * 15.00) / 1e6)
    assert DEFAULT_PRICING.cost(cached) == pytest.approx((1_000 * 3.00 + 8_000 * 0.30 + 1_000 * 3.75
                                                          + 100 * 15.00) / 1e6)
    total = Usage()
    for u in (plain, cached, cached):
        total.add(u)
    assert (total.cache_read_tokens, total.cache_write_tokens, total.in_tokens) == (16_000, 2_000, 30_000)
    assert Usage(**total.as_dict()) == total  # a stored total reads back whole


def test_a_ten_turn_conversation_costs_less_with_caching() -> None:
    """The bench's comparison, shortened: the same conversation, the same tokens, a smaller bill."""
    import asyncio

    result = asyncio.run(prompt_cache.main(3))
    off, on = result["off"], result["on"]
    assert (off["requests"], off["input"]) == (on["requests"], on["input"]) == (6, off["input"])
    assert off["read"] == off["written"] == 0
    assert on["read"] > on["written"] > 0
    assert on["cost"] < off["cost"] / 2


def _request(instructions: str = "Be brief.") -> ModelRequest:
    lookup = ToolDefinition(name="lookup", description="Look up.", parameters={"type": "object"})
    return ModelRequest([Message.user("hi")], instructions, [lookup])


def test_openai_gets_a_prompt_cache_key_per_agent_on_its_own_endpoint_only() -> None:
    official = OpenAIModel("gpt-4.1", api_key="sk-test")
    key = official._body(_request(), stream=True)["prompt_cache_key"]
    assert key == official._body(_request(), stream=True)["prompt_cache_key"]  # the same agent: one key
    assert key != official._body(_request("Be thorough."), stream=True)["prompt_cache_key"]
    assert "prompt_cache_key" not in official._body(
        ModelRequest([Message.user("hi")], "Be brief.", settings=ModelSettings(prompt_cache=False)), stream=True)
    compatible = OpenAIModel("llama", base_url="http://127.0.0.1:9/v1")  # vLLM, llama.cpp… may refuse the field
    assert "prompt_cache_key" not in compatible._body(_request(), stream=True)


async def test_a_cache_key_set_is_sent_in_the_openai_sdks_request_shape() -> None:
    from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming

    from test_providers import openai_text

    server = Replay()
    with server:
        server.responses.append(Canned(body=openai_text(["ok"]), headers={"content-type": "text/event-stream"}))
        model = OpenAIModel("gpt-4.1", api_key="sk-test", base_url=f"{server.url}/v1")
        answer = await Agent(model, instructions="Be brief.",
                             model_settings=ModelSettings(cache_key="support-bot")).run("hi")
    assert answer.output == "ok"
    body = server.requests[0].json()
    assert body["prompt_cache_key"] == "support-bot"
    in_sdk_shape(body, CompletionCreateParamsStreaming)


def _config(tmp_path: Path, extra: str) -> Path:
    agent = tmp_path / "bot"
    agent.mkdir()
    (agent / "config.yaml").write_text(f"model: openai:gpt-4.1\ninstructions: Hi.\n{extra}")
    return agent


@pytest.mark.parametrize(("extra", "expected"), [
    ("", (True, ("tools", "system", "history"), None)),
    ("prompt_cache: false\n", (False, ("tools", "system", "history"), None)),
    ("prompt_cache:\n  points: [system]\n  key: bot-v1\n", (True, ("system",), "bot-v1")),
])
def test_config_yaml_turns_caching_off_or_moves_its_points(tmp_path: Path, extra: str,
                                                           expected: tuple[Any, ...]) -> None:
    settings = load_agent(_config(tmp_path, extra), model=ScriptedModel([])).settings
    assert (settings.prompt_cache, settings.cache_points, settings.cache_key) == expected


def test_a_bad_prompt_cache_value_names_its_file_and_line(tmp_path: Path) -> None:
    path = _config(tmp_path, "prompt_cache:\n  points: [tool]\n")
    with pytest.raises(ConfigError) as raised:
        load_agent(path, model=ScriptedModel([]))
    message = str(raised.value)
    assert "config.yaml:4:" in message, message
    assert "prompt_cache.points.0" in message, message
    assert "'tools', 'system' or 'history'" in message, message
    assert "bool" not in message, message


def test_the_cli_usage_line_shows_cached_input() -> None:
    from rich.console import Console

    from ringlet.cli.render import Renderer
    from ringlet.events import MessageEndEvent

    out, err = Console(record=True, width=200), Console(record=True, width=200)
    renderer = Renderer(out, err)
    usage = Usage(in_tokens=1200, out_tokens=3, cost_usd=0.001, requests=1, cache_read_tokens=1000)
    renderer.handle(MessageEndEvent(run_id="r", ts="t", message_id="m", finish_reason="end_turn",
                                    usage=usage.summary()))
    assert "1200 in (1000 cached) / 3 out tokens" in err.export_text()
