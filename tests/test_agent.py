"""Agent construction, the public API, run state, test doubles, usage and telemetry."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import ringlet
from helpers import collect, of_type
from ringlet import (
    Agent,
    ConfigError,
    Execution,
    Gates,
    Limits,
    Plugin,
    PostExecuteContext,
    RequestUsage,
    RunState,
    tool,
)
from ringlet.agent.settings import RunSettings
from ringlet.context import Caller
from ringlet.gates import ApprovalRules
from ringlet.models import ModelRequest, ToolCallArgsDelta, ToolCallStart
from ringlet.testing import Chunks, FunctionModel, Reply, ScriptedModel, call

PINNED = {"Agent", "RunResult", "tool", "Plugin", "Tool", "Toolset", "RunContext", "Message", "ToolCall",
          "Event", "events", "action", "ActionResult", "PreExecuteResult", "ProviderError", "RateLimitError",
          "OverloadedError", "ServerError", "ProviderTimeoutError", "NetworkError", "ContextWindowError",
          "AuthError", "BadRequestError", "RunError", "ConfigError", "TokenBreakdown", "Usage", "RunState"}


def test_public_names_exist() -> None:
    assert set(ringlet.__all__) >= PINNED
    for name in ringlet.__all__:
        assert getattr(ringlet, name) is not None, name
    from ringlet import testing

    assert {"ScriptedModel", "FunctionModel"} <= set(testing.__all__)


@tool
def ping() -> str:
    """p"""
    return "pong"


def test_construction_errors_name_the_culprit() -> None:
    model = ScriptedModel([])
    with pytest.raises(ConfigError, match="max_iterations: Input should be greater than or equal to 1"):
        Limits(max_iterations=0)  # a bad value fails where the settings are built, before any Agent
    with pytest.raises(TypeError, match="max_itertions"):
        Limits(max_itertions=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="max_iterations"):
        Agent(model, max_iterations=3)  # type: ignore[call-arg]  # the old flag: now in Limits
    with pytest.raises(ConfigError, match="is not `provider:model`"):
        Agent("not a model")
    with pytest.raises(ConfigError, match="model must be"):
        Agent(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'ping' is defined twice"):
        Agent(model, tools=[ping, ping])


async def test_run_state_is_serialisable_between_rounds() -> None:
    saved: list[bytes] = []

    def on_iteration(info: dict) -> None:
        saved.append(agent_stream.state.to_json())
        assert info["tool_calls_count"] == 1

    model = ScriptedModel([call("ping"), call("ping"), "done"])
    agent = Agent(model, tools=[ping], execution=Execution(on_iteration=on_iteration))
    agent_stream = agent.stream("go", settings=RunSettings(plugin_data={"p": {"n": 1}}))
    async for _ in agent_stream:
        pass
    assert len(saved) == 2
    restored = RunState.from_json(saved[-1])
    assert restored.iteration == 2
    assert restored.plugin_data == {"p": {"n": 1}}
    assert [m.role for m in restored.messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert restored.messages == agent_stream.state.messages[:5]
    assert RunState.from_json(agent_stream.state.to_json()) == agent_stream.state


async def test_on_iteration_may_be_async_and_its_errors_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def bad(info: dict) -> None:
        raise RuntimeError("callback broke")

    agent = Agent(ScriptedModel([call("ping"), "ok"]), tools=[ping], execution=Execution(on_iteration=bad))
    result = await agent.run("x")
    assert result.output == "ok"
    assert "callback broke" in caplog.text


async def test_usage_totals_cover_every_request() -> None:
    u = RequestUsage(in_tokens=100, out_tokens=10, cost_usd=0.01)
    model = ScriptedModel([Reply(calls=[call("ping")], usage=u), Reply("", usage=u), Reply("ok", usage=u)])
    events, result = await collect(Agent(model, tools=[ping]))
    assert (result.usage.in_tokens, result.usage.out_tokens, result.usage.requests) == (300, 30, 3)
    assert result.usage.cost_usd == pytest.approx(0.03)
    assert of_type(events, "message_end")[0].usage == {"in_tokens": 300, "out_tokens": 30,
                                                       "cost_usd": pytest.approx(0.03)}


async def test_missing_usage_is_estimated_and_cost_stays_null() -> None:
    _, result = await collect(Agent(ScriptedModel(["abcdefgh"]), instructions="abcd"), "abcd")
    assert (result.usage.in_tokens, result.usage.out_tokens, result.usage.estimated) == (2, 2, True)
    assert result.usage.cost_usd is None


async def test_scripted_model_records_requests_and_checks_completion() -> None:
    model = ScriptedModel(["a", "b"])
    await Agent(model).run("x")
    assert len(model.requests) == 1
    with pytest.raises(AssertionError, match="1 scripted reply was never requested"):
        model.assert_complete()
    _, result = await collect(Agent(ScriptedModel([]), limits=Limits(max_blank_stops=1)))
    assert result.error["code"] == "internal_error"
    assert "no reply left" in result.error["message"]


async def test_function_model_variants() -> None:
    async def streamer(request):  # an async generator of chunks or strings
        yield "Hel"
        yield "lo"

    assert (await Agent(FunctionModel(streamer)).run("x")).output == "Hello"

    def sync_fn(request):
        return "sync" if len(request.messages) == 1 else "?"

    assert (await Agent(FunctionModel(sync_fn)).run("x")).output == "sync"

    async def async_fn(request):
        if request.messages[-1].role == "tool":
            return f"got {request.messages[-1].text}"
        return call("ping")

    model = FunctionModel(async_fn)
    assert (await Agent(model, tools=[ping]).run("x")).output == "got pong"
    assert len(model.requests) == 2


async def test_telemetry_events_fire_on_every_exit() -> None:
    from ringlet import telemetry

    seen: list[tuple[str, dict, dict]] = []
    unsubscribe = telemetry.subscribe(lambda name, m, meta: seen.append((name, dict(m), dict(meta))))
    try:
        await Agent(ScriptedModel([call("ping"), "ok"]), tools=[ping]).run("x")
        await Agent(ScriptedModel([ringlet.ServerError("down", status=500)])).run("x")
    finally:
        unsubscribe()
    requests = [(m, meta) for n, m, meta in seen if n == "ringlet.model.request"]  # each model request, by model
    assert [meta for _, meta in requests] == [{"model": "test:scripted"}] * 2
    assert all(m["latency_ms"] is not None and m["in_tokens"] > 0 for m, _ in requests)
    seen = [event for event in seen if event[0] != "ringlet.model.request"]
    names = [n for n, _, _ in seen]
    assert names == ["ringlet.agent.tool_call.start", "ringlet.agent.tool_call.stop",
                     "ringlet.agent.loop_iteration", "ringlet.agent.complete", "ringlet.agent.complete"]
    assert seen[1][2] == {"tool_name": "ping", "call_id": "call_1", "success": True}
    assert seen[2][1] == {"iteration": 1, "tool_calls_count": 1}
    assert seen[3][1] == {"total_iterations": 1}
    assert seen[3][2] == {"tool_calls_count": 1, "finish_reason": "end_turn"}
    assert seen[4][2]["finish_reason"] == "error"


async def test_a_failing_subscriber_never_breaks_a_run() -> None:
    from ringlet import telemetry

    def broken(*_: object) -> None:
        raise RuntimeError("subscriber bug")

    unsubscribe = telemetry.subscribe(broken)
    try:
        assert (await Agent(ScriptedModel(["ok"])).run("x")).output == "ok"
    finally:
        unsubscribe()


def test_opentelemetry_spans_when_an_sdk_is_configured() -> None:
    code = """
import asyncio, json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider(); provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
from ringlet import Agent, tool
from ringlet.testing import ScriptedModel, call
@tool
def ping() -> str:
    "p"
    return "pong"
Agent(ScriptedModel([call("ping"), "ok"]), tools=[ping], name="demo").run_sync("x")
spans = exporter.get_finished_spans()
print(json.dumps([[s.name, s.parent.span_id if s.parent else None, s.context.span_id,
                   dict(s.attributes)] for s in spans]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    spans = json.loads(out.stdout)
    names = [s[0] for s in spans]
    assert names == ["chat test:scripted", "execute_tool ping", "chat test:scripted", "invoke_agent demo"]
    root = spans[-1][2]
    assert all(s[1] == root for s in spans[:-1])
    assert spans[1][3]["gen_ai.tool.name"] == "ping"
    assert spans[-1][3]["gen_ai.agent.name"] == "demo"


def test_without_an_sdk_opentelemetry_is_never_imported() -> None:
    code = """
import sys
from ringlet import Agent
from ringlet.testing import ScriptedModel
Agent(ScriptedModel(["ok"])).run_sync("x")
print(any(m.startswith("opentelemetry") for m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_events_carry_the_run_id_and_a_timestamp() -> None:
    events, result = await collect(Agent(ScriptedModel([Chunks([])])), "x")  # a blank stream, then failure
    assert {e.run_id for e in events} == {result.run_id}
    assert all(e.ts.endswith("Z") and "T" in e.ts for e in events)


def test_plugins_are_checked_at_construction() -> None:
    class A(Plugin):
        name = "a"
        after = ("a",)

    with pytest.raises(ringlet.PluginOrderError):
        Agent(ScriptedModel([]), execution=Execution(plugins=[A()]))


async def test_messages_carry_their_run_and_request_usage() -> None:
    result = await Agent(ScriptedModel(["ok"])).run("x", caller=Caller(conversation_id="c_1"))
    assert {m.run_id for m in result.messages} == {result.run_id}
    assert {m.conversation_id for m in result.messages} == {"c_1"}
    usage = result.messages[-1].metadata["usage"]
    assert usage["provider"] == "test"
    assert usage["estimated"] is True
    assert usage["latency_ms"] >= 0


def test_defaults_are_those_of_the_spec() -> None:
    from ringlet.hooks.dispatch import HOOK_TIMEOUT_S, QUEUE_SIZE, QUEUE_WORKERS
    from ringlet.loop import DEFAULT_SETTINGS as s
    from ringlet.models.retry import RetryPolicy

    assert (s.max_iterations, s.max_blank_stops, s.max_repeated_tool_errors, s.terminal_tool) == (10, 3, 3, "summary")
    assert (s.max_tokens_per_turn, s.parallel_tools, s.max_tool_concurrency) == (32_000, True, 8)
    assert (s.batch_timeout_s, s.tool_result_max_chars, s.hook_timeout_s) == (120, 32_000, 5)
    assert (HOOK_TIMEOUT_S, QUEUE_SIZE, QUEUE_WORKERS) == (5, 256, 4)
    assert ping.timeout_s == 30
    p = RetryPolicy()
    assert (p.max_retries, p.initial_delay_s, p.multiplier, p.max_delay_s, p.retry_after_cap_s) == (3, 1, 2, 30, 60)


async def test_complete_telemetry_fires_on_cancellation_too() -> None:
    import asyncio

    from ringlet import telemetry

    seen: list[dict] = []
    unsubscribe = telemetry.subscribe(lambda n, m, meta: seen.append(dict(meta)) if n.endswith("complete") else None)
    started = asyncio.Event()

    @tool
    async def hang() -> str:
        """h"""
        started.set()
        await asyncio.Event().wait()
        return "x"

    try:
        task = asyncio.create_task(Agent(ScriptedModel([call("hang")]), tools=[hang]).run("x"))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        unsubscribe()
    assert seen == [{"tool_calls_count": 1, "finish_reason": "cancelled"}]


async def test_a_context_window_error_fails_with_context_window() -> None:
    from ringlet import ContextWindowError

    _, result = await collect(Agent(ScriptedModel([ContextWindowError("too long", status=400)])))
    assert result.error["code"] == "context_window"


async def test_at_most_five_schema_errors_are_reported() -> None:
    @tool
    def many(*, a: int, b: int, c: int, d: int, e: int, f: int, g: int) -> str:
        """m"""
        return ""

    events, _ = await collect(Agent(ScriptedModel([call("many"), "ok"]), tools=[many]))
    error = next(e for e in events if e.type == "tool_result").error
    assert len(error["errors"]) == 5


def test_action_names_must_match_the_pattern() -> None:
    from ringlet import ToolDefinitionError, action

    with pytest.raises(ToolDefinitionError, match="must match"):
        type("Bad", (Plugin,), {"name": "bad plugin", "act": action()(lambda self, p, c: None)})


# -- issue 27: library paper cuts ---------------------------------------------------------------------------


def test_the_package_ships_its_py_typed_marker() -> None:
    from importlib import resources

    assert resources.files("ringlet").joinpath("py.typed").is_file()


@pytest.mark.slow
def test_strict_pyright_on_user_code_finds_ringlets_types(tmp_path: Path) -> None:
    """Without `py.typed`, pyright in strict mode reports "Stub file not found" for every ringlet import."""
    pyright = Path(sys.executable).parent / "pyright"
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "strict"}))
    (tmp_path / "user.py").write_text(textwrap.dedent('''
        from ringlet import Agent, Gates, RunResult, tool
        from ringlet.gates import ApprovalRules, deny
        from ringlet.testing import ScriptedModel


        @tool(effect="read")
        def ping() -> str:
            """Ping."""
            return "pong"


        agent = Agent(ScriptedModel(["hi"]), tools=[ping], gates=Gates(approvals=ApprovalRules()))
        result: RunResult = agent.run_sync("hi")
        print(result.output, deny("no").note)
    '''))
    out = subprocess.run([str(pyright), "--outputjson", "--pythonpath", sys.executable, "user.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    report = json.loads(out.stdout)
    assert [(d["rule"], d["message"]) for d in report["generalDiagnostics"]] == []
    assert report["summary"]["filesAnalyzed"] == 1


@pytest.mark.slow
def test_pyright_infers_the_output_and_deps_types(tmp_path: Path) -> None:
    """`Agent[DepsT, OutputT]`: the result's type comes from `output_type` (str without one), and a tool's
    `RunContext[Deps]` types `ctx.deps`, for a user's type checker in strict mode."""
    pyright = Path(sys.executable).parent / "pyright"
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "strict"}))
    (tmp_path / "user.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass
        from typing import assert_type

        from pydantic import BaseModel

        from ringlet import Agent, Limits, RunContext
        from ringlet.testing import ScriptedModel


        class Invoice(BaseModel):
            total: float


        @dataclass
        class Deps:
            tenant: str


        def who(ctx: RunContext[Deps]) -> str:
            """Who asks."""
            return ctx.deps.tenant


        agent = Agent(ScriptedModel([]), tools=[who], output_type=Invoice, deps_type=Deps,
                      limits=Limits(output_retries=2))
        assert_type(agent, Agent[Deps, Invoice])
        assert_type(agent.run_sync("bill", deps=Deps("acme")).output, Invoice | None)  # None: it failed
        assert_type(Agent(ScriptedModel([])).run_sync("hi").output, str | None)
    '''))
    out = subprocess.run([str(pyright), "--outputjson", "--pythonpath", sys.executable, "user.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    report = json.loads(out.stdout)
    assert [(d["rule"], d["message"]) for d in report["generalDiagnostics"]] == []


@tool(effect="write")
def deploy() -> str:
    """Deploy."""
    return "deployed"


async def test_run_sync_inside_a_running_loop_says_to_await_run(recwarn: pytest.WarningsRecorder) -> None:
    model = ScriptedModel([call("deploy"), "done"])
    agent = Agent(model, tools=[deploy], gates=Gates(approvals=ApprovalRules()))
    with pytest.raises(ConfigError, match=r"run_sync\(\) cannot be called from a running event loop .*"
                                          r"use `await agent.run\(\.\.\.\)` there instead"):
        agent.run_sync("x")
    paused = await agent.run("x")
    with pytest.raises(ConfigError, match=r"use `await agent.resume\(\.\.\.\)` there instead"):
        agent.resume_sync(paused.state, {"call_1": True})
    gc.collect()
    assert [str(w.message) for w in recwarn if "never awaited" in str(w.message)] == []
    assert len(model.requests) == 1  # the refused calls never started a run


def test_resume_sync_continues_a_paused_run_like_run_sync() -> None:
    seen: list[str] = []

    class After(Plugin):
        async def post_execute(self, ctx: PostExecuteContext) -> None:
            await asyncio.sleep(0.05)
            seen.append(ctx.tool)

    agent = Agent(ScriptedModel([call("deploy"), "shipped"]), tools=[deploy], execution=Execution(plugins=[After()]),
                  gates=Gates(approvals=ApprovalRules()))
    paused = agent.run_sync("ship it")
    assert (paused.status, list(paused.pending_approvals)) == ("input_required", ["call_1"])
    result = agent.resume_sync(paused.state.to_json(), {"call_1": True})
    assert (result.status, result.output) == ("completed", "shipped")
    assert seen == ["deploy"]  # its post_execute hook finished before resume_sync returned


async def test_a_function_model_generator_yielding_a_script_item_fails_at_once_naming_it() -> None:
    async def wrong(request: ModelRequest) -> AsyncIterator[Any]:
        yield call("ping")  # a script item: only a plain function may return it

    model = FunctionModel(wrong)
    result = await Agent(model, tools=[ping]).run("x")
    assert result.status == "failed"
    assert result.error is not None
    assert result.error["code"] == "internal_error"
    message = result.error["message"]
    assert message.startswith("ConfigError: FunctionModel (request #1): the async generator yielded "
                              "ScriptedCall(name='ping'")
    assert "str (text) or the chunks of ringlet.models: TextDelta, ToolCallStart, ToolCallArgsDelta, Finish" in message
    assert "yield `ToolCallStart(0, name)` then `ToolCallArgsDelta(0, json_text)`" in message
    assert len(model.requests) == 1  # not retried as a blank answer (`empty_response`)

    async def right(request: ModelRequest) -> AsyncIterator[Any]:
        if request.messages[-1].role == "tool":
            yield "got " + request.messages[-1].text
        else:
            yield ToolCallStart(0, "ping")
            yield ToolCallArgsDelta(0, "{}")

    assert (await Agent(FunctionModel(right), tools=[ping]).run("x")).output == "got pong"
