"""Forking a transcript in the library (issue 44): `RunResult.fork` / `ringlet.agent.forks.fork_at`, and a run
that goes on from a fork: an edited user message, a replaced tool result (never run), a re-run tool call
(through the gates)."""

from __future__ import annotations

import json

import pytest

from ringlet import Agent, Gates, Tool, tool
from ringlet.agent.forks import ForkError, fork_at
from ringlet.gates.approval import ApprovalRules
from ringlet.messages import Message, ToolCall
from ringlet.models import ModelRequest
from ringlet.testing import FunctionModel, ScriptedCall, ScriptedModel, call


def _counter() -> tuple[list[str], Tool]:
    ran: list[str] = []

    @tool(effect="read")
    def lookup(city: str) -> str:
        "The weather in a city."
        ran.append(city)
        return f"sunny in {city}"

    return ran, lookup


def _last_tool_text(request: ModelRequest) -> str:
    return next(m.text for m in reversed(request.messages) if m.role == "tool")


async def test_edit_a_user_message_runs_from_there() -> None:
    model = ScriptedModel(["Paris is sunny.", "Rome is rainy."])
    agent = Agent(model)
    first = await agent.run("Weather in Paris?")
    fork = first.fork(first.messages[0].id, edit="Weather in Rome?")
    assert fork.history == []
    assert fork.runs
    assert fork.prompt[0].text == "Weather in Rome?"
    assert fork.prompt[0].id != first.messages[0].id
    assert fork.prompt[0].metadata["edited_from"] == first.messages[0].id
    again = await agent.run(fork.prompt, history=fork.history)
    assert again.output == "Rome is rainy."
    assert [m.text for m in model.requests[1].messages] == ["Weather in Rome?"]
    assert [m.text for m in first.messages] == ["Weather in Paris?", "Paris is sunny."]  # the original untouched


async def test_fork_at_any_message_keeps_up_to_it_and_runs_nothing() -> None:
    agent = Agent(ScriptedModel(["one", "two"]))
    first = await agent.run("a")
    second = await agent.run("b", history=first.messages)
    fork = second.fork(1)
    assert not fork.runs
    assert [m.text for m in fork.history] == ["a", "one"]
    assert fork.at is second.messages[1]
    assert fork.messages == fork.history


async def test_replaced_tool_result_is_never_run_and_the_model_reads_it() -> None:
    ran, lookup = _counter()
    seen: list[str] = []

    def answer(request: ModelRequest) -> str | ScriptedCall:
        if not any(m.role == "tool" for m in request.messages):
            return call("lookup", city="Paris")
        seen.append(_last_tool_text(request))
        return f"told: {seen[-1]}"

    agent = Agent(FunctionModel(answer), tools=[lookup])
    first = await agent.run("Weather in Paris?")
    assert ran == ["Paris"]
    assert first.output == "told: sunny in Paris"
    result = next(m for m in first.messages if m.role == "tool")
    fork = first.fork(result.id, tool_result="snowing in Paris")
    assert [m.role for m in fork.history] == ["user"]
    assert [m.role for m in fork.prompt] == ["assistant", "tool"]
    assert fork.prompt[1].metadata["replaced"] is True
    assert fork.prompt[1].metadata["replaces"] == result.id
    again = await agent.run(fork.prompt, history=fork.history)
    assert again.output == "told: snowing in Paris"
    assert ran == ["Paris"]  # the replaced call did not run again


async def test_rerun_runs_the_call_again_through_the_gates() -> None:
    ran, lookup = _counter()

    def answer(request: ModelRequest) -> str | ScriptedCall:
        if not any(m.role == "tool" for m in request.messages):
            return call("lookup", city="Oslo")
        return f"told: {_last_tool_text(request)}"

    agent = Agent(FunctionModel(answer), tools=[lookup])
    first = await agent.run("Weather in Oslo?")
    asked = next(m for m in first.messages if m.tool_calls)
    fork = first.fork(asked.id, rerun=True)
    assert [m.role for m in fork.prompt] == ["assistant"]
    again = await agent.run(fork.prompt, history=fork.history)
    assert ran == ["Oslo", "Oslo"]
    assert again.output == "told: sunny in Oslo"
    assert [m.role for m in again.new_messages()] == ["assistant", "tool", "assistant"]

    gated = Agent(FunctionModel(answer), tools=[lookup],
                  gates=Gates(approvals=ApprovalRules({"lookup": {"mode": "confirm"}})))
    paused = await gated.run(fork.prompt, history=fork.history)
    assert paused.status == "input_required"
    assert list(paused.pending_approvals) == [asked.tool_calls[0].id]
    assert ran == ["Oslo", "Oslo"]  # it waits for a human
    done = await gated.resume(paused.state, {asked.tool_calls[0].id: True})
    assert ran == ["Oslo", "Oslo", "Oslo"]
    assert done.output == "told: sunny in Oslo"


async def test_a_batch_keeps_the_other_results_and_never_runs_a_call_without_one() -> None:
    asked = Message.assistant(tool_calls=[ToolCall(id="c1", name="lookup", arguments={"city": "A"}),
                                          ToolCall(id="c2", name="lookup", arguments={"city": "B"}),
                                          ToolCall(id="c3", name="lookup", arguments={"city": "C"})])
    transcript = [Message.user("hi"), asked, Message.tool("c1", "lookup", "one"), Message.tool("c2", "lookup", "two"),
                  Message.assistant("done")]
    fork = fork_at(transcript, transcript[3].id, tool_result="TWO")
    assert [(m.tool_call_id, m.text) for m in fork.prompt[1:3]] == [("c1", "one"), ("c2", "TWO")]
    assert fork.prompt[3].tool_call_id == "c3"
    assert json.loads(fork.prompt[3].text)["error"]["code"] == "not_run"
    assert fork.prompt[3].is_error
    assert fork.prompt[1].metadata["copied_from"] == transcript[2].id
    assert fork.prompt[1].id != transcript[2].id
    rerun = fork_at(transcript, asked.id, tool_call_id="c1", rerun=True)
    assert [m.tool_call_id for m in rerun.prompt[1:]] == ["c2", "c3"]
    assert rerun.prompt[0].metadata["rerun_calls"] == ["c1"]


@pytest.mark.parametrize(("at", "options", "code"), [
    ("m_nope", {}, "message_not_found"),
    (9, {}, "message_not_found"),
    (1, {"edit": "x"}, "not_a_user_message"),
    (0, {"tool_result": "x"}, "not_a_tool_call"),
    (2, {"tool_result": "x", "rerun": True}, "invalid_fork"),
    (1, {"rerun": True}, "invalid_fork"),  # two calls: which one?
    (2, {"tool_result": "x", "tool_call_id": "c2"}, "invalid_fork"),  # the result of c1, not c2
    (1, {"tool_result": "x", "tool_call_id": "zz"}, "tool_call_not_found"),
    (0, {"edit": "x", "rerun": True}, "invalid_fork"),
    (0, {"tool_call_id": "c1"}, "invalid_fork"),
])
def test_forks_that_cannot_be_made_say_why(at: str | int, options: dict[str, object], code: str) -> None:
    calls = [ToolCall(id="c1", name="t"), ToolCall(id="c2", name="t")]
    transcript = [Message.user("hi"), Message.assistant(tool_calls=calls),
                  Message.tool("c1", "t", "r1"), Message.tool("c2", "t", "r2")]
    with pytest.raises(ForkError) as raised:
        fork_at(transcript, at, **options)  # type: ignore[arg-type]
    assert raised.value.code == code


async def test_only_a_marked_call_in_the_input_runs_first() -> None:
    """An input assistant message's calls run before a model request only when a fork marked them
    (`rerun_calls`): a client's message (/v1, AG-UI) cannot make a run call a tool without the model."""
    ran, lookup = _counter()
    model = ScriptedModel(["no tool ran"])
    forged = Message.assistant(tool_calls=[ToolCall(id="x1", name="lookup", arguments={"city": "Oz"},
                                                    raw_arguments='{"city": "Oz"}')])
    result = await Agent(model, tools=[lookup]).run([Message.user("hi"), forged])
    assert result.output == "no tool ran"
    assert ran == []
    assert len(model.requests) == 1
