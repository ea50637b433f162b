"""Messages, durations and token estimation (`loop-and-hooks.md` §4–§5)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringlet import Agent, Message, ToolCall, ToolDefinition, tool
from ringlet.messages import SCHEMA_VERSION, ImagePart, TextPart, dump_messages, load_messages, migrate
from ringlet.models import breakdown, estimate_message, estimate_text, estimate_tools
from ringlet.testing import ScriptedModel, call


def test_text_estimate_counts_cjk_as_one_and_the_rest_as_a_quarter() -> None:
    assert estimate_text("") == 0
    assert estimate_text("abcd") == 1
    assert estimate_text("abcde") == 2
    assert estimate_text("日本語") == 3
    assert estimate_text("한국어 ok") == 4  # ceil(3 + 3 / 4)
    assert estimate_text("ひらがなabcd") == 5


@given(st.text())
def test_text_estimate_matches_the_formula(text: str) -> None:
    cjk = sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff" or "\u3040" <= ch <= "\u30ff"
              or "\uac00" <= ch <= "\ud7af")
    expected = cjk + (len(text) - cjk) / 4
    assert estimate_text(text) == -(-expected // 1)


def test_media_parts_count_100_and_calls_count_name_plus_raw_arguments() -> None:
    m = Message.user([TextPart(text="abcd"), ImagePart(url="http://x/y.png")])
    assert estimate_message(m) == 101
    a = Message.assistant("", [ToolCall(id="c", name="abcd", raw_arguments='{"a":1234}')])
    assert estimate_message(a) == 1 + 3


def test_tool_definitions_count_their_compact_json() -> None:
    d = ToolDefinition(name="f", description="d", parameters={"type": "object"})
    assert estimate_tools([d]) == estimate_text('{"name":"f","description":"d","parameters":{"type":"object"}}')


def test_token_breakdown_buckets() -> None:
    msgs = [Message.system("s" * 8), Message.user("u" * 4), Message(id="e", role="error", content="e" * 4),
            Message.assistant("a" * 4, [ToolCall(id="c", name="ab", raw_arguments="{}")]),
            Message.tool("c", "ab", "r" * 12)]
    b = breakdown("i" * 4, msgs, 7)
    assert (b.system, b.user, b.assistant, b.tool_results, b.tool_definitions) == (3, 2, 3, 3, 7)
    assert b.total == 18


def test_messages_round_trip_through_the_serialiser() -> None:
    msgs = [Message.user([TextPart(text="hi"), ImagePart(data="AAA", media_type="image/png")], source="chat"),
            Message.assistant("", [ToolCall(id="c1", name="f", arguments={"x": 1}, raw_arguments='{"x": 1}')]),
            Message.tool("c1", "f", "ok")]
    data = dump_messages(msgs)
    assert json.loads(data)[0]["schema_version"] == SCHEMA_VERSION
    assert load_messages(data) == msgs


def test_newer_schema_versions_are_refused_with_a_fix() -> None:
    with pytest.raises(ValueError, match="upgrade ringlet"):
        migrate({"id": "m", "role": "user", "schema_version": SCHEMA_VERSION + 1})


def test_untrusted_messages_are_validated() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Message.validate({"id": "m", "role": "robot"})
    assert Message.validate({"id": "m", "role": "user", "content": "hi"}).text == "hi"


@tool
def ping() -> str:
    """p"""
    return "pong"


async def test_duration_zero_is_never_sent_and_n_is_sent_n_times() -> None:
    model = ScriptedModel([call("ping"), call("ping"), "done"])
    history = [Message.user("ui only", duration=0), Message.user("once", duration=1),
               Message.user("twice", duration=2), Message.user("always")]
    await Agent(model, tools=[ping]).run("go", history=history)
    seen = [[m.text for m in r.messages if m.role == "user"] for r in model.requests]
    assert seen == [["once", "twice", "always", "go"], ["twice", "always", "go"], ["always", "go"]]


async def test_a_tool_call_and_its_results_are_one_unit() -> None:
    model = ScriptedModel(["done"])
    history = [Message.user("q"),
               Message.assistant("", [ToolCall(id="c1", name="ping", raw_arguments="{}")], duration=0),
               Message.tool("c1", "ping", "pong")]
    await Agent(model, tools=[ping]).run("go", history=history)
    roles = [m.role for m in model.requests[0].messages]
    assert roles == ["user", "assistant", "tool", "user"]  # the result keeps its call in
    model2 = ScriptedModel(["done"])
    history[2] = Message.tool("c1", "ping", "pong", duration=0)
    history[1] = Message.assistant("", [ToolCall(id="c1", name="ping", raw_arguments="{}")], duration=0)
    await Agent(model2, tools=[ping]).run("go", history=history)
    assert [m.role for m in model2.requests[0].messages] == ["user", "user"]
