"""The loop's behaviour (`loop-and-hooks.md` §1–§2), driven by ScriptedModel."""

from __future__ import annotations

import asyncio
import json

import pytest

from helpers import collect, of_type, types
from ringlet import Agent, ConfigError, Execution, Limits, Message, ModelSettings, RateLimitError, ServerError, tool
from ringlet.agent.settings import RunSettings
from ringlet.gates.approval import AutoApprove
from ringlet.loop.run import EMPTY_ANSWER_SENTENCE, STEP_LIMIT_SENTENCE
from ringlet.models import TextDelta, ToolCallArgsDelta, ToolCallStart
from ringlet.testing import Chunks, Reply, ScriptedModel, call


@tool(effect="read")
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"Sunny in {city}"


@tool
def explode() -> str:
    """Always fails."""
    raise ValueError("kaboom")


async def test_rounds_until_a_text_answer() -> None:
    model = ScriptedModel([call("get_weather", city="Paris"), call("get_weather", city="Rome"), "Both sunny."])
    events, result = await collect(Agent(model, tools=[get_weather]), "Weather?")
    assert result.output == "Both sunny."
    assert result.finish_reason == "end_turn"
    assert result.status == "completed"
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [m.text for m in result.messages if m.role == "tool"] == ["Sunny in Paris", "Sunny in Rome"]
    assert types(events)[0] == "message_start"
    assert types(events)[-1] == "message_end"
    assert types(events).count("tool_result") == 2
    model.assert_complete()
    # each request sees the transcript so far, and the tools
    assert [len(r.messages) for r in model.requests] == [1, 3, 5]
    assert {t.name for t in model.requests[0].tools} == {"get_weather", "summary"}


async def test_tool_results_link_to_their_calls() -> None:
    model = ScriptedModel([call("get_weather", city="Oslo", id="abc"), "ok"])
    result = await Agent(model, tools=[get_weather]).run("w")
    assistant, tool_msg = result.messages[1], result.messages[2]
    assert assistant.tool_calls[0].id == "abc"
    assert assistant.tool_calls[0].arguments == {"city": "Oslo"}
    assert assistant.tool_calls[0].raw_arguments == '{"city": "Oslo"}'
    assert tool_msg.tool_call_id == "abc"
    assert tool_msg.metadata["is_tool_result"] is True


async def test_calls_without_ids_get_unique_call_n_ids() -> None:
    model = ScriptedModel([[call("get_weather", city="A"), call("get_weather", city="B")],
                           call("get_weather", city="C"), "done"])
    result = await Agent(model, tools=[get_weather]).run("w")
    ids = [c.id for m in result.messages for c in m.tool_calls]
    assert ids == ["call_1", "call_2", "call_3"]


async def test_max_iterations_makes_one_tool_less_final_request() -> None:
    model = ScriptedModel([call("get_weather", city="A"), call("get_weather", city="B"), "Here is what I have."])
    events, result = await collect(Agent(model, tools=[get_weather], limits=Limits(max_iterations=2)))
    assert result.finish_reason == "max_iterations"
    assert result.status == "completed"
    assert result.output == "Here is what I have."
    final = model.requests[-1]
    assert final.tools == ()
    assert "tool budget for this run is spent" in final.instructions
    assert final.messages[-1].role == "tool"
    assert of_type(events, "message_end")[0].finish_reason == "max_iterations"


async def test_max_iterations_final_request_failure_falls_back_to_last_text() -> None:
    model = ScriptedModel([Reply("Looking it up.", calls=[call("get_weather", city="A")]),
                           ServerError("down", status=503)])
    _, result = await collect(Agent(model, tools=[get_weather], limits=Limits(max_iterations=1)))
    assert result.finish_reason == "max_iterations"
    assert result.output == "Looking it up."


async def test_max_iterations_blank_final_answer_uses_the_fixed_sentence() -> None:
    model = ScriptedModel([call("get_weather", city="A"), ""])
    events, result = await collect(Agent(model, tools=[get_weather], limits=Limits(max_iterations=1)))
    assert result.output == STEP_LIMIT_SENTENCE
    assert STEP_LIMIT_SENTENCE in "".join(e.delta for e in of_type(events, "content_delta"))


async def test_on_max_iterations_error_fails_the_run() -> None:
    model = ScriptedModel([call("get_weather", city="A")])
    events, result = await collect(Agent(model, tools=[get_weather],
                                         limits=Limits(max_iterations=1, on_max_iterations="error")))
    assert result.finish_reason == "error"
    assert result.error["code"] == "max_iterations"
    assert of_type(events, "error")[0].code == "max_iterations"
    model.assert_complete()


async def test_blank_stops_are_retried_in_place_without_spending_iterations() -> None:
    model = ScriptedModel(["", Reply("  \n", finish_reason="length"), "Finally."])
    _, result = await collect(Agent(model, limits=Limits(max_iterations=1)))
    assert result.output == "Finally."
    assert result.finish_reason == "end_turn"
    assert result.messages[-1].metadata["blank_stop_retries"] == 2
    assert result.state.iteration == 0
    assert result.usage.requests == 3


async def test_blank_stop_nudge_is_a_user_message_seen_once() -> None:
    model = ScriptedModel(["", "ok", ])
    _, result = await collect(Agent(model, limits=Limits(blank_stop_nudge="Please answer.")))
    assert model.requests[1].messages[-1].text == "Please answer."
    assert model.requests[1].messages[-1].metadata["duration"] == 1
    assert result.output == "ok"


async def test_too_many_blank_stops_end_the_run_with_a_fixed_answer() -> None:
    model = ScriptedModel(["", "", Reply("", finish_reason="length")])
    events, result = await collect(Agent(model, limits=Limits(max_blank_stops=3)))
    assert (result.finish_reason, result.status, result.error) == ("empty_response", "completed", None)
    assert result.output == EMPTY_ANSWER_SENTENCE
    last = result.messages[-1]
    assert (last.role, last.text, last.metadata["fallback"]) == ("assistant", EMPTY_ANSWER_SENTENCE, True)
    assert last.metadata["empty_response"] == {"iteration": 0, "attempts": 3, "provider": "test",
                                               "model": "scripted", "finish_reasons": ["stop", "stop", "length"]}
    assert types(events)[-3:] == ["content_delta", "status", "message_end"]
    assert of_type(events, "content_delta")[0].delta == EMPTY_ANSWER_SENTENCE
    assert of_type(events, "status")[-1].state == "completed"
    assert of_type(events, "message_end")[0].finish_reason == "empty_response"
    assert of_type(events, "error") == []
    assert result.usage.requests == 3
    model.assert_complete()


async def test_repeated_tool_error_breaker() -> None:
    model = ScriptedModel([call("explode"), call("explode"), call("explode"), "It keeps failing: kaboom."])
    events, result = await collect(Agent(model, tools=[explode]))
    assert result.finish_reason == "error"
    assert result.error["code"] == "repeated_tool_error"
    assert model.requests[-1].tools == ()
    assert "keep failing" in model.requests[-1].instructions
    assert result.output == "It keeps failing: kaboom."
    assert types(events)[-3:] == ["error", "status", "message_end"]
    model.assert_complete()


async def test_breaker_needs_the_same_fingerprint_in_consecutive_rounds() -> None:
    model = ScriptedModel([call("explode"), call("nope"), call("explode"), call("explode"), "done"])
    _, result = await collect(Agent(model, tools=[explode]))
    assert result.finish_reason == "end_turn"


async def test_terminal_summary_tool_ends_the_run_and_skips_the_rest() -> None:
    model = ScriptedModel([[call("get_weather", city="A"), call("summary", text="All done."),
                            call("get_weather", city="B")]])
    events, result = await collect(Agent(model, tools=[get_weather]))
    assert result.finish_reason == "end_turn"
    assert result.output == "All done."
    results = {e.tool_call_id: e for e in of_type(events, "tool_result")}
    assert results["call_1"].error == {"code": "skipped", "message": "run ended by summary"}
    assert results["call_3"].error["code"] == "skipped"
    assert not results["call_2"].is_error
    assert of_type(events, "content_delta")[-1].delta == "All done."
    assert result.messages[-1].role == "assistant"
    model.assert_complete()


async def test_invalid_terminal_call_is_an_ordinary_error() -> None:
    model = ScriptedModel([call("summary", wrong=1), "fine"])
    _, result = await collect(Agent(model, tools=[get_weather]))
    assert result.output == "fine"
    assert json.loads(result.messages[2].text)["error"]["code"] == "invalid_arguments"


async def test_no_terminal_tool_without_tools_or_when_disabled() -> None:
    model = ScriptedModel(["a", "b"])
    await Agent(model).run("x")
    await Agent(model, tools=[get_weather], limits=Limits(terminal_tool=None)).run("y")
    assert [t.name for t in model.requests[0].tools] == []
    assert [t.name for t in model.requests[1].tools] == ["get_weather"]


async def test_unknown_tool_is_returned_to_the_model() -> None:
    model = ScriptedModel([call("teleport", to="Mars"), "Sorry."])
    events, result = await collect(Agent(model, tools=[get_weather]))
    error = of_type(events, "tool_result")[0].error
    assert error["code"] == "unknown_tool"
    assert error["message"] == "unknown tool 'teleport'. Available tools: get_weather, summary"
    assert result.output == "Sorry."


async def test_unknown_tool_list_is_cut_after_50_names() -> None:
    tools = [tool(name=f"t{i:03d}")(lambda: "x") for i in range(60)]
    model = ScriptedModel([call("nope"), "ok"])
    events, _ = await collect(Agent(model, tools=tools))
    message = of_type(events, "tool_result")[0].error["message"]
    assert message.count(",") == 50
    assert message.endswith("…")


async def test_arguments_that_are_not_json_are_rejected_never_replaced() -> None:
    model = ScriptedModel([call("get_weather", raw='{"city": "Par'), "ok"])
    events, result = await collect(Agent(model, tools=[get_weather]))
    error = of_type(events, "tool_result")[0].error
    assert error["code"] == "invalid_arguments"
    assert "Unterminated string" in error["message"]
    assert result.messages[1].tool_calls[0].raw_arguments == '{"city": "Par'


async def test_arguments_failing_the_schema_name_path_and_message() -> None:
    model = ScriptedModel([call("get_weather", town="Paris"), "ok"])
    events, _ = await collect(Agent(model, tools=[get_weather]))
    error = of_type(events, "tool_result")[0].error
    assert error["code"] == "invalid_arguments"
    assert error["message"] == ("invalid arguments for 'get_weather': city: Field required; "
                                "town: Extra inputs are not permitted")


async def test_a_raising_tool_gives_an_error_result_and_the_run_continues(caplog: pytest.LogCaptureFixture) -> None:
    model = ScriptedModel([call("explode"), "Recovered."])
    events, result = await collect(Agent(model, tools=[explode]))
    res = of_type(events, "tool_result")[0]
    assert res.is_error
    assert res.error == {"code": "tool_error", "message": "ValueError: kaboom"}
    assert "Traceback" not in result.messages[2].text
    assert "Traceback" in caplog.text
    assert result.output == "Recovered."


async def test_result_encoding() -> None:
    from pydantic import BaseModel

    class Point(BaseModel):
        x: int

    @tool
    def as_dict() -> dict:
        """d"""
        return {"a": 1}

    @tool
    def as_none() -> None:
        """n"""

    @tool
    def as_model() -> Point:
        """m"""
        return Point(x=2)

    model = ScriptedModel([[call("as_dict"), call("as_none"), call("as_model")], "ok"])
    result = await Agent(model, tools=[as_dict, as_none, as_model]).run("x")
    assert [m.text for m in result.messages if m.role == "tool"] == [
        '{"a":1}', '{"success":false,"message":"no result"}', '{"x":2}']


async def test_long_results_are_truncated_with_a_trailer() -> None:
    @tool
    def big() -> str:
        """b"""
        return "x" * 100

    model = ScriptedModel([call("big"), "ok"])
    events, result = await collect(Agent(model, tools=[big], execution=Execution(tool_result_max_chars=10)))
    assert result.messages[2].text == "x" * 10 + "…[truncated: kept 10 of 100 characters]"
    assert result.messages[2].metadata["truncated"] is True
    assert of_type(events, "tool_result")[0].truncated is True


async def test_streamed_chunks_become_events_in_order() -> None:
    model = ScriptedModel([
        Chunks([TextDelta("Let me "), TextDelta("check."), ToolCallStart(0, "get_weather", "c1"),
                ToolCallArgsDelta(0, '{"ci'), ToolCallArgsDelta(0, 'ty": "Rome"}')]),
        Chunks([TextDelta("Sun"), TextDelta("ny")]),
    ])
    events, result = await collect(Agent(model, tools=[get_weather]))
    assert types(events) == ["message_start", "status", "content_delta", "content_delta", "tool_call_start",
                             "tool_call_delta", "tool_call_delta", "tool_result", "content_delta",
                             "content_delta", "status", "message_end"]
    assert "".join(e.args_delta for e in of_type(events, "tool_call_delta")) == '{"city": "Rome"}'
    assert result.output == "Sunny"
    assert result.messages[1].text == "Let me check."


async def test_a_stream_broken_after_output_is_not_replayed() -> None:
    model = ScriptedModel([Chunks([TextDelta("Hal"), ToolCallStart(0, "get_weather", "c"),
                                   ServerError("reset", status=502)])])
    _, result = await collect(Agent(model, tools=[get_weather]))
    assert result.error["code"] == "stream_interrupted"
    partial = result.messages[-1]
    assert partial.metadata["interrupted"] is True
    assert partial.text == "Hal"
    assert partial.tool_calls == ()
    assert len(model.requests) == 1


async def test_a_provider_error_fails_the_run_with_its_code() -> None:
    model = ScriptedModel([RateLimitError("slow down", status=429)])
    events, result = await collect(Agent(model))
    err = of_type(events, "error")[0]
    assert (err.code, err.retryable) == ("rate_limit_error", True)
    assert result.finish_reason == "error"
    assert result.status == "failed"


async def test_context_budget_exceeded() -> None:
    model = ScriptedModel(["never"])
    _, result = await collect(Agent(model, limits=Limits(max_tokens_per_turn=10)), "word " * 100)
    assert result.error["code"] == "context_budget_exceeded"
    assert model.requests == []


async def test_budget_takes_context_window_minus_output_tokens() -> None:
    model = ScriptedModel(["never"], context_window=100)
    _, result = await collect(Agent(model, model_settings=ModelSettings(max_tokens=90)),
                              "x" * 60)  # 15 tokens > 100 - 90
    assert result.error["details"] == {"tokens": 15, "budget": 10}


async def test_cost_limit_is_checked_before_each_request() -> None:
    from ringlet import RequestUsage

    priced = RequestUsage(in_tokens=10, out_tokens=10, cost_usd=0.6)
    model = ScriptedModel([Reply(calls=[call("get_weather", city="A")], usage=priced), "never"])
    _, result = await collect(Agent(model, tools=[get_weather], limits=Limits(max_cost_usd_per_run=0.5)))
    assert result.error["code"] == "cost_limit_exceeded"
    assert len(model.requests) == 1


async def test_cancelling_the_consumer_cancels_tools_and_still_ends_the_run() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """w"""
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    agent = Agent(ScriptedModel([[call("wait_forever"), call("wait_forever")]]), tools=[wait_forever])
    seen = []

    async def consume() -> None:
        async for event in agent.stream("go"):
            seen.append(event)  # noqa: PERF401 - the list must fill while the stream runs

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled.is_set()
    assert seen[-1].type == "message_end"
    assert seen[-1].finish_reason == "cancelled"
    assert of_type(seen, "status")[-1].state == "canceled"
    errors = [e.error["code"] for e in of_type(seen, "tool_result")]
    assert errors == ["cancelled", "cancelled"]


async def test_per_request_overrides() -> None:
    model = ScriptedModel([call("get_weather", city="A"), "final"])
    agent = Agent(model, tools=[get_weather], limits=Limits(max_iterations=5))
    settings = RunSettings(limits=Limits(max_iterations=1), instructions="Answer in French.",
                           model_settings=ModelSettings(temperature=0.2))
    result = await agent.run("x", settings=settings)
    assert result.finish_reason == "max_iterations"
    assert model.requests[0].settings.temperature == 0.2
    assert "Answer in French." in (model.requests[0].instructions or "")
    assert agent.limits.max_iterations == 5  # the run's limits replaced the agent's for that run only
    with pytest.raises(ConfigError, match="max_iterations"):  # a bad per-run setting names its field
        agent.stream("x", settings=RunSettings(limits=Limits(max_iterations=0)))


async def test_history_and_new_messages() -> None:
    model = ScriptedModel(["second answer"])
    history = [Message.user("first"), Message.assistant("first answer")]
    result = await Agent(model, instructions="Be brief.").run("second", history=history)
    assert [m.text for m in model.requests[0].messages] == ["first", "first answer", "second"]
    assert model.requests[0].instructions == "Be brief."
    assert [m.text for m in result.new_messages()] == ["second", "second answer"]


def test_run_sync() -> None:
    result = Agent(ScriptedModel(["hi"])).run_sync("hello")
    assert result.output == "hi"


@pytest.mark.parametrize("retrying", [False, True], ids=["bare", "through-the-retry-layer"])
async def test_cancelling_during_the_model_stream_closes_the_provider_stream(retrying: bool) -> None:
    from ringlet.models.retry import RetryingModel
    from ringlet.testing import FunctionModel

    streaming, closed = asyncio.Event(), asyncio.Event()

    async def slow_stream(request):  # a provider stream that sends one delta, then stalls
        try:
            yield "partial"
            streaming.set()
            await asyncio.Event().wait()
        finally:
            closed.set()

    seen = []

    async def consume() -> None:
        model = RetryingModel(FunctionModel(slow_stream)) if retrying else FunctionModel(slow_stream)
        async for event in Agent(model).stream("x"):
            seen.append(event)  # noqa: PERF401 - the list must fill while the stream runs

    task = asyncio.create_task(consume())
    await streaming.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed.is_set()
    assert seen[-1].finish_reason == "cancelled"


def test_request_overrides_become_typed_options() -> None:
    from dataclasses import replace as changed

    from ringlet.agent.settings import run_options

    agent = Agent(ScriptedModel([]), limits=Limits(max_iterations=4, max_blank_stops=2),
                  model_settings=ModelSettings(top_p=0.5))
    options = run_options(agent, {"max_iterations": 2, "temperature": 0.1, "max_output_tokens": 99,
                                  "extra_instructions": "Be brief.", "model": "test:other"})
    assert options == {"settings": RunSettings(model="test:other", instructions="Be brief.",
                                               limits=changed(agent.limits, max_iterations=2),
                                               model_settings=ModelSettings(temperature=0.1, top_p=0.5, max_tokens=99))}
    approver = AutoApprove("test")  # the settings a caller gives are completed, not replaced
    assert run_options(agent, {"max_iterations": 2}, RunSettings(approver=approver)) == {
        "settings": RunSettings(approver=approver, limits=changed(agent.limits, max_iterations=2))}
    assert run_options(agent, {}) == {}
    with pytest.raises(ConfigError, match="graph agent's"):
        run_options(agent, {"variables": {"x": 1}})  # a loop agent has none (the API answers 422)
    with pytest.raises(ConfigError, match="cannot override"):
        run_options(agent, {"parallel_tools": False})


async def test_a_batch_mixing_a_deferred_call_runs_the_rest_then_hands_the_call_over() -> None:
    """The caller's (deferred) call is split off the batch: the other call runs and its result joins the
    transcript, then the run ends `input_required` with only the deferred call in `deferred_calls`."""
    from ringlet.tools.base import Tool

    async def never(args: dict, ctx: object) -> str:
        raise AssertionError("a deferred tool never runs in the loop")

    @tool(effect="read")
    async def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    client = Tool(name="pick_colour", description="The client picks.", parameters={"type": "object"}, run=never,
                  deferred=True)
    agent = Agent(ScriptedModel([[call("lookup", q="x"), call("pick_colour")], "done"]), tools=[lookup, client])
    result = await agent.run("go")
    assert result.status == "input_required"
    assert [c.name for c in result.state.deferred_calls] == ["pick_colour"]
    tool_messages = [m for m in result.messages if m.role == "tool"]
    assert [(m.name, m.text) for m in tool_messages] == [("lookup", "found x")]
    assert result.state.pending_calls == []
