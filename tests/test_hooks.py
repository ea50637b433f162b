"""Plugins and hooks (`loop-and-hooks.md` §3)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from helpers import collect, of_type, types
from ringlet import (
    ActionResult,
    Agent,
    Execution,
    Limits,
    Message,
    Plugin,
    PluginOrderError,
    PostExecuteContext,
    PreExecuteContext,
    PreExecuteResult,
    PrePromptContext,
    ResponseCompleteContext,
    RunContext,
    ToolExecutedContext,
    action,
    tool,
)
from ringlet.hooks import BackgroundQueue, StatusContext, UserMessageContext, order_plugins
from ringlet.testing import ScriptedModel, call


@tool(effect="read")
def echo(text: str) -> str:
    """Echo the text."""
    return text


def named(name: str, *, priority: int = 0, before: tuple[str, ...] = (), after: tuple[str, ...] = (),
          core: bool = False) -> Plugin:
    cls = type(f"P_{name}", (Plugin,), {"name": name, "priority": priority, "before": before, "after": after,
                                        "core": core})
    return cls()


def test_ordering_is_topological_then_priority_then_name() -> None:
    plugins = [named("b"), named("a"), named("hi", priority=5), named("z", before=("a",)),
               named("late", after=("hi",), priority=9), named("core", core=True)]
    assert [p.name for p in order_plugins(plugins)] == ["core", "hi", "late", "b", "z", "a"]


def test_an_ordering_cycle_is_an_error_naming_it() -> None:
    with pytest.raises(PluginOrderError, match=r"cycle: .*x.*y"):
        Agent(ScriptedModel([]), execution=Execution(plugins=[named("x", before=("y",)), named("y", before=("x",))]))


def test_a_reference_to_a_missing_plugin_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert [p.name for p in order_plugins([named("a", after=("ghost",))])] == ["a"]
    assert "ghost" in caplog.text


def test_plugin_names_default_from_the_class() -> None:
    class AuditTrailPlugin(Plugin):
        pass

    assert AuditTrailPlugin.name == "audit_trail"


class Recorder(Plugin):
    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def user_message_received(self, ctx: UserMessageContext) -> None:
        self.calls.append("user_message_received")
        ctx.message.metadata["tagged"] = True

    async def status_changed(self, ctx: StatusContext) -> None:
        self.calls.append(f"status:{ctx.old}->{ctx.new}")

    async def pre_prompt(self, ctx: PrePromptContext) -> None:
        self.calls.append(f"pre_prompt:{ctx.round}:{ctx.token_breakdown.total > 0}")

    async def response_complete(self, ctx: ResponseCompleteContext) -> None:
        self.calls.append("response_complete")

    async def pre_execute(self, ctx: PreExecuteContext) -> None:
        self.calls.append(f"pre_execute:{ctx.tool}")

    async def tool_executed(self, ctx: ToolExecutedContext) -> None:
        self.calls.append(f"tool_executed:{ctx.tool}")
        ctx.metadata["seen_by"] = "recorder"


async def test_hooks_fire_in_the_documented_places() -> None:
    rec = Recorder()
    model = ScriptedModel([call("echo", text="hi"), "done"])
    _, result = await collect(Agent(model, tools=[echo], execution=Execution(plugins=[rec])))
    assert rec.calls == ["user_message_received", "status:None->working", "pre_prompt:1:True",
                         "pre_execute:echo", "tool_executed:echo", "pre_prompt:2:True", "response_complete",
                         "status:working->completed"]
    assert result.messages[0].metadata["tagged"] is True
    assert result.messages[2].metadata["seen_by"] == "recorder"


async def test_pre_prompt_can_edit_the_prompt_and_instructions() -> None:
    class Editor(Plugin):
        async def pre_prompt(self, ctx: PrePromptContext) -> None:
            ctx.instructions = "Speak like a pirate."
            ctx.examples.append(Message.user("example"))
            ctx.messages.append(Message.system("extra note"))
            ctx.plugin_data["editor"] = {"rounds": ctx.round}

    model = ScriptedModel(["arr"])
    result = await Agent(model, instructions="Be nice.", execution=Execution(plugins=[Editor()])).run("hi")
    req = model.requests[0]
    assert req.instructions == "Speak like a pirate."
    assert [m.text for m in req.messages] == ["example", "hi", "extra note"]
    assert [m.text for m in result.messages] == ["hi", "arr"]  # the transcript is untouched
    assert result.state.plugin_data == {"editor": {"rounds": 1}}


async def test_pre_prompt_cancel_ends_the_run_and_skips_later_plugins() -> None:
    later: list[str] = []

    class Stop(Plugin):
        priority = 10

        async def pre_prompt(self, ctx: PrePromptContext) -> None:
            ctx.cancel("quota exhausted")

    class Later(Plugin):
        async def pre_prompt(self, ctx: PrePromptContext) -> None:
            later.append("ran")

    model = ScriptedModel([])
    events, result = await collect(Agent(model, execution=Execution(plugins=[Stop(), Later()])))
    assert result.finish_reason == "cancelled"
    assert result.status == "canceled"
    assert later == []
    assert model.requests == []
    assert of_type(events, "notification")[0].message == "quota exhausted"


async def test_response_complete_can_ask_for_another_round() -> None:
    class Again(Plugin):
        async def response_complete(self, ctx: ResponseCompleteContext) -> None:
            if ctx.message.text == "draft":
                ctx.actions.next_round = "self"
                ctx.actions.new_user_message = "Improve it."

    model = ScriptedModel(["draft", "final"])
    result = await Agent(model, execution=Execution(plugins=[Again()])).run("write")
    assert result.output == "final"
    assert model.requests[1].messages[-1].text == "Improve it."
    assert result.state.iteration == 1


async def test_response_complete_self_rounds_count_toward_the_limit() -> None:
    class Forever(Plugin):
        async def response_complete(self, ctx: ResponseCompleteContext) -> None:
            ctx.actions.next_round = "self"

    model = ScriptedModel(["one", "two", "closing"])
    result = await Agent(model, limits=Limits(max_iterations=2), execution=Execution(plugins=[Forever()])).run("go")
    assert result.finish_reason == "max_iterations"
    assert model.requests[-1].tools == ()


async def test_response_complete_human_hands_over() -> None:
    class Ask(Plugin):
        async def response_complete(self, ctx: ResponseCompleteContext) -> None:
            ctx.actions.next_round = "human"

    events, result = await collect(Agent(ScriptedModel(["Which city?"]), execution=Execution(plugins=[Ask()])))
    assert result.finish_reason == "end_turn"
    assert result.status == "input_required"
    assert of_type(events, "status")[-1].state == "input_required"


async def test_pre_execute_can_modify_params_which_are_validated_again() -> None:
    class Shout(Plugin):
        async def pre_execute(self, ctx: PreExecuteContext) -> PreExecuteResult:
            return PreExecuteResult(modified_params={"text": ctx.params["text"].upper()})

    class Breaks(Plugin):
        async def pre_execute(self, ctx: PreExecuteContext) -> PreExecuteResult:
            return PreExecuteResult(modified_params={"text": 42})

    result = await Agent(ScriptedModel([call("echo", text="hi"), "ok"]), tools=[echo],
                         execution=Execution(plugins=[Shout()])).run("x")
    assert result.messages[2].text == "HI"
    result = await Agent(ScriptedModel([call("echo", text="hi"), "ok"]), tools=[echo],
                         execution=Execution(plugins=[Breaks()])).run("x")
    assert json.loads(result.messages[2].text)["error"]["code"] == "invalid_arguments"


async def test_pre_execute_chain_passes_params_on_and_stops_at_the_first_abort() -> None:
    seen: list[dict] = []

    class First(Plugin):
        priority = 2

        async def pre_execute(self, ctx: PreExecuteContext) -> PreExecuteResult:
            return PreExecuteResult(modified_params={"text": "changed"})

    class Second(Plugin):
        priority = 1

        async def pre_execute(self, ctx: PreExecuteContext) -> PreExecuteResult:
            seen.append(dict(ctx.params))
            return PreExecuteResult(proceed=False, abort_message="not today")

    class Third(Plugin):
        async def pre_execute(self, ctx: PreExecuteContext) -> None:
            seen.append({"third": True})

    agent = Agent(ScriptedModel([call("echo", text="hi"), "ok"]), tools=[echo],
                  execution=Execution(plugins=[First(), Second(), Third()]))
    events, _ = await collect(agent)
    assert seen == [{"text": "changed"}]
    assert of_type(events, "tool_result")[0].error == {"code": "aborted", "message": "not today", "plugin": "second"}


async def test_a_raising_pre_execute_aborts_only_that_call() -> None:
    class Picky(Plugin):
        async def pre_execute(self, ctx: PreExecuteContext) -> None:
            if ctx.params["text"] == "bad":
                raise RuntimeError("picky")

    model = ScriptedModel([[call("echo", text="bad"), call("echo", text="good")], "ok"])
    events, result = await collect(Agent(model, tools=[echo], execution=Execution(plugins=[Picky()])))
    res = {e.tool_call_id: e for e in of_type(events, "tool_result")}
    assert res["call_1"].error["code"] == "aborted"
    assert res["call_2"].result == "good"
    assert of_type(events, "notification")[0].level == "warning"
    assert result.output == "ok"


async def test_a_raising_hook_becomes_a_warning_and_the_run_goes_on() -> None:
    class Flaky(Plugin):
        async def pre_prompt(self, ctx: PrePromptContext) -> None:
            raise ValueError("oops")

    events, result = await collect(Agent(ScriptedModel(["fine"]), execution=Execution(plugins=[Flaky()])))
    note = of_type(events, "notification")[0]
    assert (note.level, note.source, note.message) == ("warning", "flaky", "ValueError: oops")
    assert result.output == "fine"


async def test_strict_plugins_fail_the_run() -> None:
    class Flaky(Plugin):
        async def pre_prompt(self, ctx: PrePromptContext) -> None:
            raise ValueError("oops")

    _, result = await collect(Agent(ScriptedModel(["never"]),
                                    execution=Execution(plugins=[Flaky()], strict_plugins=True)))
    assert result.error["code"] == "plugin_error"


async def test_a_slow_hook_is_skipped_after_its_timeout() -> None:
    class Slow(Plugin):
        async def pre_prompt(self, ctx: PrePromptContext) -> None:
            await asyncio.Event().wait()

    events, result = await collect(Agent(ScriptedModel(["fine"]),
                                         execution=Execution(plugins=[Slow()], hook_timeout_s=0.05)))
    assert "timed out after 0.05 s" in of_type(events, "notification")[0].message
    assert result.output == "fine"


async def test_post_execute_is_off_the_hot_path_and_sees_every_call() -> None:
    gate = asyncio.Event()
    seen: list[tuple[str, bool, str | None]] = []

    class After(Plugin):
        async def post_execute(self, ctx: PostExecuteContext) -> None:
            await gate.wait()
            seen.append((ctx.tool, ctx.success, (ctx.error or {}).get("code")))

    @tool(timeout_s=0.01)
    async def hang() -> str:
        """h"""
        await asyncio.Event().wait()
        return "x"

    agent = Agent(ScriptedModel([[call("echo", text="a"), call("nope"), call("hang")], "ok"]),
                  tools=[echo, hang], execution=Execution(plugins=[After()]))
    result = await agent.run("x")
    assert result.output == "ok"  # the run finished while every post_execute hook was still waiting
    assert seen == []
    gate.set()
    await agent.wait_background()
    assert sorted(seen) == [("echo", True, None), ("hang", False, "tool_timeout"), ("nope", False, "unknown_tool")]


async def test_post_execute_context_fields() -> None:
    got: list[PostExecuteContext] = []

    class After(Plugin):
        async def post_execute(self, ctx: PostExecuteContext) -> None:
            got.append(ctx)

    agent = Agent(ScriptedModel([call("echo", text="a"), "ok"]), tools=[echo], execution=Execution(plugins=[After()]))
    await agent.run("x")
    await agent.wait_background()
    ctx = got[0]
    assert (ctx.tool, ctx.params, ctx.result) == ("echo", {"text": "a"}, "a")
    assert (ctx.success, ctx.was_cancelled) == (True, False)
    assert ctx.duration_ms >= 0


async def test_a_full_background_queue_drops_work_without_waiting() -> None:
    gate = asyncio.Event()
    done: list[int] = []

    async def job(i: int) -> None:
        await gate.wait()
        done.append(i)

    queue = BackgroundQueue(size=2, workers=1)
    accepted = [queue.submit(lambda i=i: job(i)) for i in range(5)]
    # one job is taken by the worker only once the loop runs; before that the queue holds two
    assert accepted == [True, True, False, False, False]
    assert queue.dropped == 3
    gate.set()
    await queue.join()
    assert done == [0, 1]
    for w in queue.workers:
        w.cancel()


async def test_notifications_from_hooks_are_events_never_sent_to_the_model() -> None:
    class Notes(Plugin):
        async def pre_prompt(self, ctx: PrePromptContext) -> None:
            ctx.notify("progress", "thinking", "step", (1, 3))

    model = ScriptedModel(["ok"])
    events, _ = await collect(Agent(model, execution=Execution(plugins=[Notes()])))
    note = of_type(events, "notification")[0]
    assert (note.level, note.title, note.source) == ("progress", "thinking", "notes")
    assert all("thinking" not in m.text for m in model.requests[0].messages)
    assert types(events).index("notification") < types(events).index("content_delta")


async def test_response_update_gets_partial_messages() -> None:
    from ringlet.hooks import ResponseUpdateContext
    from ringlet.models import TextDelta
    from ringlet.testing import Chunks

    partials: list[tuple[str, bool]] = []

    class Watch(Plugin):
        async def response_update(self, ctx: ResponseUpdateContext) -> None:
            partials.append((ctx.message.text, ctx.message.metadata["is_complete"]))

    await Agent(ScriptedModel([Chunks([TextDelta("He"), TextDelta("llo")])]),
                execution=Execution(plugins=[Watch()])).run("x")
    assert partials == [("He", False), ("Hello", False)]


class Notes(Plugin):
    name = "notes"

    @action(description="Save a note.", input_schema={"type": "object", "properties": {"text": {"type": "string"}},
                                                      "required": ["text"]})
    async def save(self, params: dict, ctx: RunContext) -> ActionResult:
        data = ctx.plugin_data.setdefault("notes", [])
        data.append(params["text"])
        return ActionResult(success=True, message="saved", data={"count": len(data)})

    @action()
    async def anything(self, params: dict, ctx: RunContext) -> ActionResult:
        return ActionResult(data=params)


async def test_plugin_actions_are_tools_named_plugin_action() -> None:
    model = ScriptedModel([[call("notes_save", text="milk"), call("notes_anything", x=1), call("notes_save")], "ok"])
    result = await Agent(model, execution=Execution(plugins=[Notes()])).run("x")
    tools = {t.name: t for t in model.requests[0].tools}
    assert set(tools) == {"notes_save", "notes_anything", "summary"}
    assert tools["notes_anything"].parameters == {"type": "object", "properties": {}, "additionalProperties": True}
    outs = [json.loads(m.text) for m in result.messages if m.role == "tool"]
    assert outs[0] == {"success": True, "message": "saved", "data": {"count": 1}}
    assert outs[1]["data"] == {"x": 1}
    assert outs[2]["error"]["code"] == "invalid_arguments"
    assert "'text' is a required property" in outs[2]["error"]["message"]
    assert result.state.plugin_data == {"notes": ["milk"]}


def test_an_action_name_clashing_with_a_tool_is_a_load_error() -> None:
    @tool
    def notes_save(text: str) -> str:
        """clash"""
        return text

    with pytest.raises(Exception, match="'notes_save' is defined twice"):
        Agent(ScriptedModel([]), tools=[notes_save], execution=Execution(plugins=[Notes()]))


def test_plugin_state_is_per_run_not_per_instance() -> None:
    plugin = Notes()
    agent = Agent(ScriptedModel([call("notes_save", text="a"), "ok", call("notes_save", text="b"), "ok"]),
                  execution=Execution(plugins=[plugin]))
    first, second = agent.run_sync("x"), agent.run_sync("y")
    assert first.state.plugin_data == {"notes": ["a"]}
    assert second.state.plugin_data == {"notes": ["b"]}


async def test_a_slow_pre_execute_hook_is_skipped_not_an_abort() -> None:
    class Slow(Plugin):
        async def pre_execute(self, ctx: PreExecuteContext) -> None:
            await asyncio.Event().wait()

    events, _ = await collect(Agent(ScriptedModel([call("echo", text="hi"), "ok"]), tools=[echo],
                                    execution=Execution(plugins=[Slow()], hook_timeout_s=0.05)))
    assert of_type(events, "tool_result")[0].result == "hi"
    assert "timed out" in of_type(events, "notification")[0].message


async def test_pre_execute_cancel_aborts_the_call() -> None:
    class No(Plugin):
        async def pre_execute(self, ctx: PreExecuteContext) -> None:
            ctx.cancel("not allowed here")

    events, _ = await collect(Agent(ScriptedModel([call("echo", text="hi"), "ok"]), tools=[echo],
                                    execution=Execution(plugins=[No()])))
    assert of_type(events, "tool_result")[0].error == {"code": "aborted", "message": "not allowed here",
                                                       "plugin": "no"}


async def test_cancel_and_proceed_false_differ_as_their_docstrings_say() -> None:
    """Both abort only the call (`aborted`); `proceed=False` has a default message, and `cancel()` wins
    over whatever the same hook returns. Each docstring names the other and says so."""

    class Quiet(Plugin):
        async def pre_execute(self, ctx: PreExecuteContext) -> PreExecuteResult:
            return PreExecuteResult(proceed=False)

    class Both(Plugin):
        async def pre_execute(self, ctx: PreExecuteContext) -> PreExecuteResult:
            ctx.cancel("cancelled first")
            return PreExecuteResult(proceed=False, abort_message="returned second")

    for plugin, message in ((Quiet(), "aborted by plugin 'quiet'"), (Both(), "cancelled first")):
        events, result = await collect(Agent(ScriptedModel([call("echo", text="hi"), "ok"]), tools=[echo],
                                             execution=Execution(plugins=[plugin])))
        assert of_type(events, "tool_result")[0].error == {"code": "aborted", "message": message,
                                                           "plugin": plugin.name}
        assert result.output == "ok"  # the run went on
    result_doc = " ".join((PreExecuteResult.__doc__ or "").split())
    cancel_doc = " ".join((PreExecuteContext.cancel.__doc__ or "").split())
    assert "`PreExecuteContext.cancel(reason)`" in result_doc
    assert "`aborted by plugin '<name>'` when it is None" in result_doc
    assert "`cancel()` is checked first" in result_doc
    assert "`PreExecuteResult(proceed=False, abort_message=reason)`" in cancel_doc
    assert "`cancel()` is checked first: whatever the hook returns is then ignored" in cancel_doc
    assert "the run goes on (unlike `PrePromptContext.cancel`, which ends the run)" in cancel_doc
    assert "wait_background()" in (PostExecuteContext.__doc__ or "")


async def test_a_strict_plugin_failing_inside_a_batch_fails_the_run_without_waiting() -> None:
    class Breaks(Plugin):
        async def tool_executed(self, ctx: ToolExecutedContext) -> None:
            raise RuntimeError("broken plugin")

    agent = Agent(ScriptedModel([[call("echo", text="a"), call("echo", text="b")], "never"]), tools=[echo],
                  execution=Execution(plugins=[Breaks()], strict_plugins=True))
    async with asyncio.timeout(10):  # the batch deadline is 120 s: this must not wait for it
        events, result = await collect(agent)
    assert result.error["code"] == "plugin_error"
    assert events[-1].type == "message_end"


async def test_post_execute_sees_terminal_skipped_and_cancelled_calls() -> None:
    seen: list[tuple[str, str | None, bool]] = []

    class After(Plugin):
        async def post_execute(self, ctx: PostExecuteContext) -> None:
            seen.append((ctx.tool, (ctx.error or {}).get("code"), ctx.was_cancelled))

    agent = Agent(ScriptedModel([[call("summary", text="done"), call("echo", text="x")]]), tools=[echo],
                  execution=Execution(plugins=[After()]))
    await agent.run("x")
    await agent.wait_background()
    assert sorted(seen) == [("echo", "skipped", False), ("summary", None, False)]

    started = asyncio.Event()

    @tool
    async def hang() -> str:
        """h"""
        started.set()
        await asyncio.Event().wait()
        return "never"

    seen.clear()
    agent = Agent(ScriptedModel([[call("hang"), call("hang")]]), tools=[hang], execution=Execution(plugins=[After()]))
    task = asyncio.create_task(agent.run("x"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await agent.wait_background()
    assert seen == [("hang", "cancelled", True), ("hang", "cancelled", True)]


async def test_a_strict_status_hook_failing_at_the_end_still_ends_the_run() -> None:
    class Breaks(Plugin):
        async def status_changed(self, ctx: StatusContext) -> None:
            if ctx.new == "completed":
                raise RuntimeError("late failure")

    events, result = await collect(Agent(ScriptedModel(["ok"]),
                                         execution=Execution(plugins=[Breaks()], strict_plugins=True)))
    assert events[-1].type == "message_end"
    assert result.output == "ok"


def test_run_sync_lets_post_execute_hooks_finish() -> None:
    seen: list[str] = []

    class After(Plugin):
        async def post_execute(self, ctx: PostExecuteContext) -> None:
            await asyncio.sleep(0)
            seen.append(ctx.tool)

    Agent(ScriptedModel([call("echo", text="a"), "ok"]), tools=[echo],
          execution=Execution(plugins=[After()])).run_sync("x")
    assert seen == ["echo"]


async def test_an_own_tool_named_summary_is_an_ordinary_tool() -> None:
    @tool
    def summary(topic: str) -> str:
        """Summarise a topic."""
        return f"summary of {topic}"

    model = ScriptedModel([call("summary", topic="tea"), "done"])
    result = await Agent(model, tools=[summary]).run("x")
    assert result.messages[2].text == "summary of tea"
    assert result.output == "done"


def test_a_stream_made_outside_an_event_loop_runs_inside_one() -> None:
    seen: list[str] = []

    class After(Plugin):
        async def post_execute(self, ctx: PostExecuteContext) -> None:
            seen.append(ctx.tool)

    agent = Agent(ScriptedModel([call("echo", text="a"), "ok"]), tools=[echo], execution=Execution(plugins=[After()]))
    stream = agent.stream("x")  # no running loop yet

    async def consume() -> None:
        async for _ in stream:
            pass
        await agent.wait_background()

    asyncio.run(consume())
    assert seen == ["echo"]
