"""Typed outputs (issue 21): `Agent(output_type=...)` in tool, native and prompted modes, retries with the
validator's message, output validators and `ModelRetry`, streamed partial values, per-run types."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict

from ringlet import Agent, Limits, ModelRetry
from ringlet.agent.settings import RunSettings
from ringlet.errors import ConfigError
from ringlet.models.base import Finish as End
from ringlet.models.base import TextDelta, ToolCallArgsDelta, ToolCallStart
from ringlet.output import JsonSchema, NativeOutput, PromptedOutput, ToolOutput
from ringlet.testing import Chunks, ScriptedModel, call


class Invoice(BaseModel):
    """An invoice."""

    number: str
    total: float


@dataclass
class Point:
    x: int
    y: int


class Person(TypedDict):
    name: str
    age: int


def tool_of(request: object, name: str = "final_result") -> dict:
    return next(t for t in request.tools if t.name == name).parameters  # type: ignore[attr-defined]


async def test_tool_mode_gives_a_validated_model_and_offers_the_tool() -> None:
    model = ScriptedModel([call("final_result", number="A-1", total="12.5")])
    result = await Agent(model, output_type=Invoice).run("Bill it")
    assert result.output == Invoice(number="A-1", total=12.5)
    assert (result.status, result.finish_reason) == ("completed", "end_turn")
    params = tool_of(model.requests[0])
    assert params["required"] == ["number", "total"]
    assert "title" not in params
    assert "summary" not in [t.name for t in model.requests[0].tools]  # the output tool replaces it
    assert json.loads(result.messages[-1].text) == {"number": "A-1", "total": 12.5}


@pytest.mark.parametrize(("output_type", "args", "expected"), [
    (Point, {"x": 1, "y": 2}, Point(1, 2)),
    (Person, {"name": "Ada", "age": 36}, {"name": "Ada", "age": 36}),
    (int, {"result": 7}, 7),
    (list[int], {"result": [1, 2]}, [1, 2]),
    (Invoice | Point, {"result": {"x": 3, "y": 4}}, Point(3, 4)),
    (Literal["yes", "no"], {"result": "no"}, "no"),
])
async def test_each_kind_of_type_in_tool_mode(output_type: object, args: dict, expected: object) -> None:
    model = ScriptedModel([call("final_result", args)])
    result = await Agent(model, output_type=output_type).run("go")  # type: ignore[call-overload]
    assert result.output == expected
    params = tool_of(model.requests[0])
    assert ("result" in params["properties"]) == ("result" in args)  # non-objects are wrapped


async def test_an_invalid_result_goes_back_with_the_validator_message_then_succeeds() -> None:
    model = ScriptedModel([call("final_result", number="A-1", total="lots"),
                           call("final_result", number="A-1", total=3)])
    result = await Agent(model, output_type=Invoice).run("Bill it")
    assert result.output == Invoice(number="A-1", total=3)
    error = json.loads(model.requests[1].messages[-1].text)["error"]
    assert error["code"] == "invalid_output"
    assert "total" in error["message"]
    assert "final_result" in error["message"]


async def test_retries_spent_fail_the_run_clearly() -> None:
    bad = call("final_result", number="A-1")
    model = ScriptedModel([bad, bad, bad])
    result = await Agent(model, output_type=Invoice, limits=Limits(output_retries=2)).run("Bill it")
    assert (result.status, result.output) == ("failed", None)
    assert result.error is not None
    assert result.error["code"] == "output_validation_failed"
    assert "total" in result.error["message"]
    assert result.error["details"]["tries"] == 3
    model.assert_complete()


async def test_text_instead_of_the_tool_is_sent_back() -> None:
    model = ScriptedModel(["It is 12.", call("final_result", number="B", total=12)])
    result = await Agent(model, output_type=Invoice).run("Bill it")
    assert result.output == Invoice(number="B", total=12)
    retry = model.requests[1].messages[-1]
    assert retry.role == "user"
    assert "final_result" in retry.text


async def test_other_tools_run_before_the_result() -> None:
    def lookup(number: str) -> float:
        """The total of an invoice."""
        return 99.0

    model = ScriptedModel([call("lookup", number="C"), call("final_result", number="C", total=99)])
    result = await Agent(model, tools=[lookup], output_type=Invoice).run("Total of C?")
    assert result.output == Invoice(number="C", total=99)
    assert {t.name for t in model.requests[0].tools} == {"lookup", "final_result"}


async def test_prompted_mode_parses_text_and_puts_the_schema_in_the_instructions() -> None:
    model = ScriptedModel(['```json\n{"number": "D", "total": 1}\n```'])
    result = await Agent(model, output_type=PromptedOutput(Invoice)).run("Bill it")
    assert result.output == Invoice(number="D", total=1)
    request = model.requests[0]
    assert request.tools == ()
    assert request.output is None
    assert '"total"' in (request.instructions or "")


async def test_native_mode_asks_the_provider_for_the_schema() -> None:
    model = ScriptedModel(['{"number": "bad"}', '{"number": "E", "total": 2}'])
    result = await Agent(model, output_type=NativeOutput(Invoice)).run("Bill it")
    assert result.output == Invoice(number="E", total=2)
    first = model.requests[0]
    assert first.output is not None
    assert first.output.schema["required"] == ["number", "total"]
    assert first.output.description == "An invoice."
    assert "total" in model.requests[1].messages[-1].text  # the validator's message, as a user turn


async def test_a_json_schema_output() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    model = ScriptedModel([call("final_result", town="Rome"), call("final_result", city="Rome")])
    result = await Agent(model, output_type=JsonSchema(schema)).run("Where?")
    assert result.output == {"city": "Rome"}
    assert "city" in json.loads(model.requests[1].messages[-1].text)["error"]["message"]


async def test_output_validators_and_model_retry() -> None:
    model = ScriptedModel([call("final_result", number="F", total=-1), call("final_result", number="F", total=5)])
    agent = Agent(model, output_type=Invoice)
    seen = []

    @agent.output_validator
    async def positive(ctx: object, value: Invoice) -> Invoice:
        seen.append(value.total)
        if value.total < 0:
            raise ModelRetry("the total must be positive")
        return value.model_copy(update={"number": value.number.lower()})

    result = await agent.run("Bill it")
    assert result.output == Invoice(number="f", total=5)
    assert seen == [-1, 5]
    assert "the total must be positive" in model.requests[1].messages[-1].text


async def test_a_per_run_output_type() -> None:
    model = ScriptedModel([call("final_result", result=3), "plain"])
    agent = Agent(model)
    assert (await agent.run("n?", settings=RunSettings(output_type=int))).output == 3
    assert (await agent.run("text?")).output == "plain"  # the agent's own runs stay text


async def test_stream_output_yields_validated_partials_then_the_value() -> None:
    model = ScriptedModel([Chunks([ToolCallStart(0, "final_result", "c1"),
                                   ToolCallArgsDelta(0, '{"number": "G-'),
                                   ToolCallArgsDelta(0, '12", "tot'),
                                   ToolCallArgsDelta(0, 'al": 4'),
                                   ToolCallArgsDelta(0, '2}'), End("tool_calls")])])

    class Draft(BaseModel):
        number: str
        total: float | None = None

    stream = Agent(model, output_type=Draft).stream("Bill it")
    seen = [value async for value in stream.stream_output()]
    assert seen[0] == Draft(number="G-")
    assert seen[-1] == Draft(number="G-12", total=42)
    assert Draft(number="G-12", total=4) in seen  # a value further along at each step
    assert stream.result is not None
    assert stream.result.output == Draft(number="G-12", total=42)


async def test_stream_output_of_text_mode_and_prompted_mode() -> None:
    model = ScriptedModel([Chunks([TextDelta('{"x": 1'), TextDelta(', "y": 2}'), End("stop")])])
    seen = [v async for v in Agent(model, output_type=PromptedOutput(Point)).stream("p").stream_output()]
    assert seen[-1] == Point(1, 2)
    plain = ScriptedModel([Chunks([TextDelta("Hel"), TextDelta("lo"), End("stop")])])
    assert [v async for v in Agent(plain).stream("hi").stream_output()] == ["Hel", "Hello"]


async def test_a_custom_tool_name_and_a_taken_one() -> None:
    model = ScriptedModel([call("invoice", number="H", total=1)])
    result = await Agent(model, output_type=ToolOutput(Invoice, name="invoice")).run("Bill it")
    assert result.output == Invoice(number="H", total=1)

    def final_result() -> str:
        """Clashes."""
        return "x"

    with pytest.raises(ConfigError, match="'final_result' is taken"):
        Agent(ScriptedModel(["x"]), tools=[final_result], output_type=Invoice)


def test_a_type_without_a_schema_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="has no JSON Schema"):
        Agent(ScriptedModel([]), output_type=Callable[[int], int])  # type: ignore[arg-type]


async def test_config_yaml_output_schema(tmp_path: Path) -> None:
    from ringlet.agent.config import build_agent, load_spec

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.yaml").write_text(
        "model: test:x\noutput_schema: {type: object, properties: {n: {type: integer}}, required: [n]}\n"
        "output_mode: prompted\n")
    agent = build_agent(load_spec(tmp_path / "a"), model=ScriptedModel(['{"n": 4}']))
    assert (await agent.run("n?")).output == {"n": 4}
    (tmp_path / "a" / "config.yaml").write_text("model: test:x\noutput_schema: {type: nope}\n")
    with pytest.raises(ConfigError, match="output_schema"):
        load_spec(tmp_path / "a")


async def test_a_tool_raising_model_retry_tells_the_model_why() -> None:
    def lookup(number: str) -> float:
        """The total of an invoice."""
        if not number.startswith("A-"):
            raise ModelRetry("invoice numbers start with A-")
        return 1.0

    model = ScriptedModel([call("lookup", number="7"), call("lookup", number="A-7"), "done"])
    await Agent(model, tools=[lookup]).run("Total of 7?")
    error = json.loads(model.requests[1].messages[-1].text)["error"]
    assert error == {"code": "retry", "message": "invoice numbers start with A-"}
