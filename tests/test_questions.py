"""`ask_question` in the library (builtin-tools-and-subagents.md §3): the run pauses on a question, resumes
with a checked answer (here, from JSON in a new run object, or through the broker), and the answer, its
absence or its timeout is the call's result."""

from __future__ import annotations

import asyncio
import json

import pytest

from helpers import of_type
from ringlet import Agent, Gates, Limits
from ringlet.agent import RunHost
from ringlet.agent.settings import RunSettings
from ringlet.gates import ApprovalBroker, AutoApprove
from ringlet.loop import RunState
from ringlet.testing import ScriptedModel, call
from ringlet.tools.builtin.question import ask_question_tool, check_answer

COLOURS = [{"label": "red"}, {"label": "green", "description": "the calm one"}, {"label": "blue"}]


def _agent(*replies: object, **options: object) -> Agent:
    return Agent(ScriptedModel(list(replies)), tools=[ask_question_tool()], **options)  # type: ignore[arg-type]


def _result_of(messages: list, name: str = "ask_question") -> dict:
    return json.loads(next(m.content for m in messages if m.role == "tool" and m.name == name))


# -- answers checked against the question -------------------------------------------------------------------

SINGLE = {"input_type": "single-select", "options": COLOURS, "allow_freeform": False}
MULTI = {"input_type": "multi-select", "options": COLOURS, "allow_freeform": False}
TEXT = {"input_type": "text", "options": [], "allow_freeform": True}


@pytest.mark.parametrize(("question", "answer", "expected"), [
    (SINGLE, "green", ("green", False)),
    (MULTI, ["red", "blue"], (["red", "blue"], False)),
    (MULTI, "red", (["red"], False)),
    (TEXT, "Tuesday at 10", ("Tuesday at 10", False)),
    ({**SINGLE, "allow_freeform": True}, "purple, please", ("purple, please", True)),
])
def test_valid_answers(question: dict, answer: object, expected: tuple) -> None:
    assert check_answer(question, answer) == expected


@pytest.mark.parametrize(("question", "answer", "message"), [
    (SINGLE, "purple", "expected one option label; options: red, green, blue"),
    (SINGLE, ["red", "blue"], "expected one option label"),
    (MULTI, [], "a list of one or more option labels"),
    (MULTI, ["red", "red"], "the labels must be distinct"),
    (MULTI, ["red", "pink"], "a list of one or more option labels"),
    (TEXT, "  ", "a text question needs a non-empty string"),
    (TEXT, ["a"], "a text question needs a non-empty string"),
])
def test_invalid_answers(question: dict, answer: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_answer(question, answer)


@pytest.mark.parametrize(("args", "error"), [
    ({"question": "Pick", "options": [{"label": "only one"}]}, "needs 2 to 10 options, got 1"),
    ({"question": "Pick", "input_type": "multi-select"}, "needs 2 to 10 options, got 0"),
    ({"question": "Pick", "options": [{"label": "a"}, {"label": "a"}]}, "labels must be unique"),
    ({"question": "x" * 2001, "input_type": "text"}, "question"),
    ({"question": "Pick", "input_type": "radio"}, "input_type"),
])
async def test_invalid_questions_reach_the_model(args: dict, error: str) -> None:
    agent = _agent([call("ask_question", args)], "fine")
    result = await agent.run("ask me")
    outcome = _result_of(result.messages)
    assert outcome["error"]["code"] == "invalid_arguments"
    assert error in outcome["error"]["message"]
    assert result.status == "completed"


# -- pausing and resuming -----------------------------------------------------------------------------------

async def test_question_pauses_the_run_and_the_answer_resumes_it_elsewhere() -> None:
    question = {"question": "Which colour?", "options": COLOURS, "allow_freeform": False}
    agent = _agent([call("ask_question", question, id="q1")])
    events = [e async for e in agent.stream("paint the shed")]
    asked = of_type(events, "question")[0]
    assert (asked.tool_call_id, asked.question, asked.input_type) == ("q1", "Which colour?", "single-select")
    assert [o.label for o in asked.options] == ["red", "green", "blue"]
    assert asked.question_id.startswith("q_")
    assert events[-1].type == "status"
    assert events[-1].state == "input_required"
    assert not of_type(events, "message_end")


async def test_answer_through_json_state_in_a_new_agent() -> None:
    question = {"question": "Which colour?", "options": COLOURS, "allow_freeform": False}
    first = _agent([call("ask_question", question, id="q1")])
    paused = await first.run("paint the shed")
    assert paused.status == "input_required"
    assert paused.finish_reason is None
    request = paused.pending_approvals["q1"]
    assert request.question is not None
    assert request.kind == "question"
    saved = paused.state.to_json()

    second = _agent("green it is")
    with pytest.raises(ValueError, match="expected one option label"):
        await second.resume(saved, {"q1": "purple"})
    resumed = await second.resume(RunState.from_json(saved), {request.approval_id: "green"})
    assert resumed.status == "completed"
    assert resumed.output == "green it is"
    result = _result_of(resumed.messages)
    assert result == {"question_id": request.approval_id, "answer": "green", "freeform": False,
                      "answered_by": "user"}


async def test_other_calls_of_the_batch_run_while_the_question_waits() -> None:
    ran: list[str] = []

    def note(text: str) -> str:
        """Write a note."""
        ran.append(text)
        return "noted"

    agent = Agent(ScriptedModel([[call("ask_question", {"question": "When?", "input_type": "text"}, id="q1"),
                                  call("note", {"text": "asked"}, id="n1")], "done"]),
                  tools=[ask_question_tool(), note])
    paused = await agent.run("plan")
    assert ran == ["asked"]
    assert list(paused.pending_approvals) == ["q1"]
    done = await agent.resume(paused.state, {"q1": "tomorrow"})
    assert [m.tool_call_id for m in done.messages if m.role == "tool"] == ["q1", "n1"]
    assert _result_of(done.messages)["answer"] == "tomorrow"


async def test_broker_answers_while_the_stream_waits() -> None:
    broker = ApprovalBroker()
    agent = _agent([call("ask_question", {"question": "Which?", "input_type": "multi-select",
                                          "options": COLOURS}, id="q1")], "ok",
                   gates=Gates(approver=broker))

    async def answer() -> None:
        [pending] = await broker.wait_for_pending()
        with pytest.raises(ValueError):
            broker.answer(pending.approval_id, ["pink"])
        broker.answer("q1", ["red", "blue"], answered_by="ana")

    answering = asyncio.create_task(answer())
    result = await agent.run("choose")
    await answering
    assert result.status == "completed"
    assert _result_of(result.messages) | {"question_id": "-"} == {
        "question_id": "-", "answer": ["red", "blue"], "freeform": False, "answered_by": "ana"}


async def test_question_timeout() -> None:
    agent = _agent([call("ask_question", {"question": "Now?", "input_type": "text"}, id="q1")], "no answer came",
                   limits=Limits(question_timeout_s=0.05))
    paused = await agent.run("ask")
    request = paused.pending_approvals["q1"]
    assert request.timeout_s == 0.05
    request.expires_at = "2001-01-01T00:00:00.000Z"  # as if the time had passed
    done = await agent.resume(paused.state, {})
    assert _result_of(done.messages)["error"]["code"] == "question_timeout"


async def test_no_human_available_returns_at_once() -> None:
    agent = _agent([call("ask_question", {"question": "Now?", "input_type": "text"})], "carrying on")
    result = await agent.run("ask", settings=RunSettings(host=RunHost(humans=False)))
    error = _result_of(result.messages)["error"]
    assert error == {"code": "no_human_available", "message": "no one can answer questions in this run"}
    assert result.status == "completed"


async def test_auto_approver_cannot_answer_questions() -> None:
    agent = _agent([call("ask_question", {"question": "Now?", "input_type": "text"})], "ok",
                   gates=Gates(approver=AutoApprove()))
    result = await agent.run("ask")
    assert _result_of(result.messages)["error"]["code"] == "no_human_available"


async def test_cancelling_a_waiting_question_gives_cancelled() -> None:
    broker = ApprovalBroker()
    agent = _agent([call("ask_question", {"question": "Now?", "input_type": "text"}, id="q1")],
                   gates=Gates(approver=broker))
    events: list = []

    async def consume() -> None:
        async for event in agent.stream("ask"):
            events.append(event)  # noqa: PERF401 - one by one, so the events before the cancel are kept

    task = asyncio.create_task(consume())
    await broker.wait_for_pending()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    result = of_type(events, "tool_result")[0]
    assert result.error["code"] == "cancelled"
    assert events[-1].type == "message_end"
    assert events[-1].finish_reason == "cancelled"
