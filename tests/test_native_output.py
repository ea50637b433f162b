"""Native structured output (`ModelRequest.output`): each adapter asks its provider for JSON constrained
to the schema with the provider's own feature, and a request without `output` is unchanged.

The shapes are checked where each adapter builds them and, for the remote providers, on the wire (the
SDKs' own serialisation, through a loopback replay server); the local model decodes a real answer.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from replay import Replay
from ringlet import ConfigError, Message
from ringlet.messages import ToolDefinition
from ringlet.models import ModelRequest, TextDelta
from ringlet.output import ResponseFormat, schema_errors
from test_providers import anthropic_text, gemini_text, openai_text

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
FORMAT = ResponseFormat("final_result", SCHEMA)
WEATHER = ToolDefinition(name="get_weather", description="Weather.",
                         parameters={"type": "object", "properties": {"city": {"type": "string"}}})


def request(output: ResponseFormat | None = FORMAT, *, tools: tuple[ToolDefinition, ...] = ()) -> ModelRequest:
    return ModelRequest(messages=[Message.user("How many?")], tools=tools, output=output)


@pytest.fixture
def server() -> Any:
    with Replay() as s:
        yield s


# -- openai (and ollama) -------------------------------------------------------------------------------------


def _openai(url: str = "http://127.0.0.1:9/v1") -> Any:
    from ringlet.models.openai import OpenAIModel

    return OpenAIModel("gpt-4o-mini", api_key="sk-test", base_url=url)


def test_openai_asks_for_a_json_schema_response_format() -> None:
    body = _openai()._body(request(), stream=True)
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "final_result", "schema": SCHEMA}}
    described = _openai()._body(request(ResponseFormat("answer", SCHEMA, "The count.")), stream=False)
    assert described["response_format"]["json_schema"] == {"name": "answer", "schema": SCHEMA,
                                                           "description": "The count."}


def test_openai_sends_tools_and_response_format_together() -> None:
    body = _openai()._body(request(tools=(WEATHER,)), stream=True)
    assert body["tools"][0]["function"]["name"] == "get_weather"
    assert body["response_format"]["type"] == "json_schema"


def test_openai_without_output_has_no_response_format() -> None:
    with_output, without = _openai()._body(request(), stream=True), _openai()._body(request(None), stream=True)
    assert "response_format" not in without
    assert {k: v for k, v in with_output.items() if k != "response_format"} == without


def test_ollama_sends_the_same_response_format() -> None:
    from ringlet.models.openai import ollama

    body = ollama("qwen3")._body(request(), stream=True)
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "final_result", "schema": SCHEMA}}


async def test_openai_response_format_on_the_wire(server: Replay) -> None:
    server.add(body=openai_text(['{"n": ', "3}"]), headers={"content-type": "text/event-stream"})
    out = [c async for c in _openai(f"{server.url}/v1").stream(request())]
    assert "".join(c.text for c in out if isinstance(c, TextDelta)) == '{"n": 3}'
    assert server.requests[0].json()["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "final_result", "schema": SCHEMA}}


# -- anthropic -----------------------------------------------------------------------------------------------


def _anthropic(url: str | None = None) -> Any:
    from ringlet.models.anthropic import AnthropicModel

    return AnthropicModel("claude-sonnet-4-6", api_key="sk-ant-test", base_url=url)


CLOSED = {**SCHEMA, "additionalProperties": False}  # the API requires closed objects; the SDK's transform


def test_anthropic_asks_for_a_json_schema_output_config() -> None:
    body = _anthropic()._body(request())
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": CLOSED}}
    assert SCHEMA == {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}  # untouched


def test_anthropic_sends_tools_and_output_config_together() -> None:
    body = _anthropic()._body(request(tools=(WEATHER,)))
    assert [t["name"] for t in body["tools"]] == ["get_weather"]
    assert body["output_config"]["format"]["type"] == "json_schema"


def test_anthropic_without_output_has_no_output_config() -> None:
    with_output, without = _anthropic()._body(request()), _anthropic()._body(request(None))
    assert "output_config" not in without
    assert {k: v for k, v in with_output.items() if k != "output_config"} == without


def test_anthropic_unsupported_keywords_move_into_the_description() -> None:
    bounded = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}
    schema = _anthropic()._body(request(ResponseFormat("final_result", bounded)))["output_config"]["format"]["schema"]
    assert schema["properties"]["n"] == {"type": "integer", "description": "{minimum: 1}"}


async def test_anthropic_a_schema_the_api_cannot_take_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="use ToolOutput"):
        [c async for c in _anthropic().stream(request(ResponseFormat("final_result", {})))]


async def test_anthropic_output_config_on_the_wire(server: Replay) -> None:
    server.add(body=anthropic_text(['{"n": ', "3}"]), headers={"content-type": "text/event-stream"})
    out = [c async for c in _anthropic(server.url).stream(request())]
    assert "".join(c.text for c in out if isinstance(c, TextDelta)) == '{"n": 3}'
    seen = server.requests[0]
    assert seen.json()["output_config"] == {"format": {"type": "json_schema", "schema": CLOSED}}
    assert "anthropic-beta" not in {k.lower() for k in seen.headers}  # generally available: no beta header


# -- gemini --------------------------------------------------------------------------------------------------


def _gemini(url: str | None = None) -> Any:
    from ringlet.models.gemini import GeminiModel

    return GeminiModel("gemini-2.5-flash", api_key="g-test", base_url=url)


def test_gemini_asks_for_json_with_the_raw_json_schema() -> None:
    config = _gemini()._config(request(), None)
    assert (config.response_mime_type, config.response_json_schema, config.response_schema) == (
        "application/json", SCHEMA, None)


def test_gemini_with_tools_sends_the_tools_and_leaves_the_schema_to_the_loop() -> None:
    config = _gemini()._config(request(tools=(WEATHER,)), None)
    assert config.tools
    assert (config.response_mime_type, config.response_json_schema) == (None, None)


def test_gemini_without_output_config_is_unchanged() -> None:
    with_output, without = _gemini()._config(request(), None), _gemini()._config(request(None), None)
    assert (without.response_mime_type, without.response_json_schema) == (None, None)
    assert with_output.model_copy(update={"response_mime_type": None, "response_json_schema": None}) == without


async def test_gemini_schema_on_the_wire(server: Replay) -> None:
    server.add(body=gemini_text(['{"n": ', "3}"]), headers={"content-type": "text/event-stream"})
    out = [c async for c in _gemini(server.url).stream(request())]
    assert "".join(c.text for c in out if isinstance(c, TextDelta)) == '{"n": 3}'
    config = server.requests[0].json()["generationConfig"]
    assert (config["responseMimeType"], config["responseJsonSchema"]) == ("application/json", SCHEMA)


# -- local (llama.cpp) ---------------------------------------------------------------------------------------


def _local(**options: Any) -> Any:
    from ringlet.models.local import LocalModel

    return LocalModel(**options)


@pytest.mark.parametrize("protocol", ["native", "prompt"])
def test_local_asks_llama_cpp_for_a_json_object_under_the_schema(protocol: str) -> None:
    model = _local(tool_protocol=protocol)
    body = model._body(request())
    assert body["response_format"] == {"type": "json_object", "schema": SCHEMA}
    without = model._body(request(None))
    assert "response_format" not in without
    assert {k: v for k, v in body.items() if k != "response_format"} == without


@pytest.mark.parametrize("protocol", ["native", "prompt"])
def test_local_with_tools_keeps_the_tools_path(protocol: str) -> None:
    body = _local(tool_protocol=protocol)._body(request(tools=(WEATHER,)))
    assert "response_format" not in body


def test_local_grammar_protocol_answers_under_the_schemas_grammar() -> None:
    from ringlet.models.local import schema_grammar
    from ringlet.models.local.examples import CHARSETS
    from ringlet.models.local.prompt import grammar

    model = _local()
    assert model._plan(None, request()) == (None, schema_grammar(SCHEMA))  # no tools: no router needed
    assert model._plan(None, request(None)) == (None, grammar(()))
    assert '"\\"n\\""' in schema_grammar(SCHEMA)
    result = Message.tool("c1", "get_weather", "Sunny")
    after_result = ModelRequest(messages=[Message.user("Weather in Paris?"), result], tools=(WEATHER,), output=FORMAT)
    assert model._plan(None, after_result) == (None, schema_grammar(SCHEMA))  # channel routing: an answer now
    direct = _local(routing="direct")._plan(None, request(tools=(WEATHER,)))[1]
    assert direct == grammar((WEATHER,), CHARSETS)  # the model chooses: its answer is left to the loop


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grammar", "native"])
async def test_local_model_answers_json_matching_the_schema(protocol: str) -> None:
    model = _local(tool_protocol=protocol)
    req = ModelRequest(messages=[Message.user("How many legs does a cat have? Answer in JSON.")], output=FORMAT)
    text = "".join([c.text async for c in model.stream(req) if isinstance(c, TextDelta)])
    value = json.loads(text)
    assert schema_errors(value, SCHEMA) == []
    assert isinstance(value["n"], int)
