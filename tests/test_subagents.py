"""Sub-agents in the library (builtin-tools-and-subagents.md §6): `spawn_agent` runs a child agent as one
call: limits (depth, concurrency, a timeout that stops while a human is asked), nested events, usage,
realms, failures, and cancellation reaching every descendant."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from ringlet import Agent, Execution, Gates, SubAgents, tool
from ringlet.agent import RunHost
from ringlet.agent.settings import RunSettings
from ringlet.context import Caller, RunContext
from ringlet.gates import ApprovalBroker, ApprovalRules
from ringlet.hooks.plugin import Plugin, StatusContext
from ringlet.models.base import ModelRequest
from ringlet.testing import FunctionModel, ScriptedModel, call


def _tool_results(messages: list[Any]) -> dict[str, Any]:
    return {m.tool_call_id: m for m in messages if m.role == "tool"}


@tool(effect="write")
def deploy(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


def helper(name: str, reply: str = "child answer", **options: Any) -> Agent:
    return Agent(FunctionModel(lambda r: reply, name="test:child"), name=name, **options)


async def test_the_child_answer_is_the_result_with_ids_usage_and_nested_events() -> None:
    child = helper("researcher", "Paris is the capital.")
    parent = Agent(ScriptedModel([call("spawn_agent", {"task": "Find the capital", "agent": "researcher",
                                                       "context": "Country: France", "input": {"lang": "en"}},
                                       id="s1"), "It is Paris."]), name="lead", tools=[SubAgents([child])])
    stream = parent.stream("capital of France?")
    events = [e async for e in stream]
    starts = [e for e in events if e.type == "message_start"]
    assert [s.agent_path for s in starts] == [None, ("lead", "researcher")]
    nested = [e for e in events if e.agent_path is not None]
    assert [e.type for e in nested] == ["message_start", "status", "content_delta", "status", "message_end"]
    assert {(e.depth, e.parent_tool_call_id) for e in nested} == {(1, "s1")}
    assert {e.run_id for e in events} == {events[0].run_id}  # every event of the stream carries the run's id
    ends = [e for e in events if e.type == "message_end"]
    assert [e.agent_path for e in ends] == [("lead", "researcher"), None]
    assert events[-1].type == "message_end"
    assert stream.result is not None
    assert stream.result.usage.requests == 3  # the parent's two requests and the child's one


async def test_child_result_message_and_child_input() -> None:
    child_model = FunctionModel(lambda r: "done: " + r.messages[-1].text.splitlines()[0], name="test:child")
    child = Agent(child_model, name="researcher")
    parent = Agent(ScriptedModel([call("spawn_agent", {"task": "Find it", "agent": "researcher",
                                                       "context": "Country: France", "input": {"lang": "en"}},
                                       id="s1"), "ok"]), name="lead", tools=[SubAgents([child])])
    result = await parent.run("go")
    message = _tool_results(result.messages)["s1"]
    assert message.content == "done: Find it"
    meta = message.metadata
    assert meta["finish_reason"] == "end_turn"
    assert meta["child_run_id"].startswith("r_")
    assert meta["child_conversation_id"].startswith("c_")
    assert meta["usage"]["requests"] == 1
    sent = child_model.requests[0].messages[-1]
    assert sent.text == 'Find it\n\nContext:\nCountry: France\n\nInput:\n```json\n{\n  "lang": "en"\n}\n```'
    assert sent.metadata["source"] == "sub_agent"
    assert sent.metadata["parent_run_id"] == result.run_id


async def test_three_children_in_parallel_one_asks_a_human_one_times_out() -> None:
    hold = asyncio.Event()

    async def slow(request: ModelRequest) -> str:
        await hold.wait()  # never set: only the timeout ends it
        return "too late"

    def asks(request: ModelRequest) -> Any:
        if any(m.role == "tool" for m in request.messages):
            return "approved and deployed"
        return call("deploy", {"service": "api"})

    quick = helper("quick", "quick answer")
    careful = Agent(FunctionModel(asks, name="test:careful"), name="careful", tools=[deploy],
                    gates=Gates(approvals=ApprovalRules({"deploy": {"mode": "confirm"}})))
    stuck = Agent(FunctionModel(slow, name="test:stuck"), name="stuck")
    broker = ApprovalBroker()
    parent = Agent(ScriptedModel([[call("spawn_agent", {"task": "a", "agent": "quick"}, id="s_quick"),
                                   call("spawn_agent", {"task": "b", "agent": "careful"}, id="s_careful"),
                                   call("spawn_agent", {"task": "c", "agent": "stuck"}, id="s_stuck")],
                                  "summary of three"]),
                   name="lead", tools=[SubAgents([quick, careful, stuck], timeout_s=0.5)], gates=Gates(approver=broker))

    async def decide() -> None:
        [request] = await broker.wait_for_pending()
        await asyncio.sleep(0.7)  # a human slower than the timeout: the child's clock is stopped meanwhile
        broker.decide(request.approval_id, approved=True, decided_by="ana")

    deciding = asyncio.create_task(decide())
    events = [e async for e in parent.stream("three things")]
    await deciding
    results = {e.tool_call_id: e for e in events if e.type == "tool_result" and e.agent_path is None}
    assert results["s_quick"].result == "quick answer"
    assert results["s_careful"].result == "approved and deployed"
    timeout = results["s_stuck"].error
    assert timeout["code"] == "sub_agent_timeout"
    assert timeout["partial"] is None
    asked = [e for e in events if e.type == "approval_required"]
    assert [(e.agent_path, e.parent_tool_call_id) for e in asked] == [(("lead", "careful"), "s_careful")]
    stuck_end = next(e for e in events if e.type == "message_end" and e.agent_path == ("lead", "stuck"))
    assert stuck_end.finish_reason == "cancelled"
    assert events[-1].type == "message_end"
    assert events[-1].agent_path is None


def recursive(depths: list[int]) -> FunctionModel:
    """Each run spawns itself once, then answers with its child's result."""

    def reply(request: ModelRequest) -> Any:
        results = [m for m in request.messages if m.role == "tool"]
        if results:
            return f"got: {results[-1].content}"
        depths.append(1)
        return call("spawn_agent", {"task": "go deeper"})

    return FunctionModel(reply)


async def test_depth_four_is_refused() -> None:
    depths: list[int] = []
    agent = Agent(recursive(depths), name="diver", tools=[SubAgents([])])
    result = await agent.run("dive")
    assert len(depths) == 4  # the root (depth 0) and children at depths 1, 2 and 3 each tried to spawn
    assert result.output == ('got: got: got: got: {"error": {"code": "max_depth_exceeded", '
                             '"message": "max agent depth exceeded (4/3)"}}')


async def test_concurrency_is_shared_by_the_root_run() -> None:
    running, peak = 0, 0

    async def busy(request: ModelRequest) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1
        return "ok"

    child = Agent(FunctionModel(busy), name="worker")
    parent = Agent(ScriptedModel([[call("spawn_agent", {"task": str(i), "agent": "worker"}) for i in range(6)],
                                  "all done"]), name="lead", tools=[SubAgents([child], max_concurrent_agents=2)])
    result = await parent.run("six")
    assert result.output == "all done"
    assert peak == 2


async def test_agents_not_allowed_and_realms() -> None:
    other = helper("other", gates=Gates(realm="secret"))
    parent = Agent(ScriptedModel([[call("spawn_agent", {"task": "x", "agent": "nobody"}, id="a"),
                                   call("spawn_agent", {"task": "x", "agent": "other"}, id="b")], "ok"]),
                   name="lead", tools=[SubAgents([other])])
    result = await parent.run("x", caller=Caller(realm="public"),
                              settings=RunSettings(host=RunHost(realms=frozenset({"public"}))))
    errors = {k: json.loads(m.content)["error"] for k, m in _tool_results(result.messages).items()}
    assert errors["a"]["code"] == "agent_not_allowed"
    assert errors["b"] == {"code": "realm_forbidden", "message": "agent 'other' runs in realm 'secret', which "
                                                                 "this run's principal may not use"}

    seen: list[str] = []

    @tool(effect="read")
    def where(ctx: RunContext) -> str:
        """The realm."""
        seen.append(ctx.realm)
        return ctx.realm

    inheriting = Agent(ScriptedModel([call("where", {}), "fine"]), name="inheriting", tools=[where])
    own = Agent(ScriptedModel([call("where", {}), "fine"]), name="own", tools=[where], gates=Gates(realm="secret"))
    parent = Agent(ScriptedModel([[call("spawn_agent", {"task": "x", "agent": "inheriting"}),
                                   call("spawn_agent", {"task": "x", "agent": "own"})], "ok"]),
                   name="lead", tools=[SubAgents([inheriting, own])], execution=Execution(parallel_tools=False))
    await parent.run("x", caller=Caller(realm="public"),
                     settings=RunSettings(host=RunHost(realms=frozenset({"public", "secret"}))))
    assert seen == ["public", "secret"]


async def test_a_failing_child_is_a_coded_error() -> None:
    def broken(request: ModelRequest) -> str:
        raise RuntimeError("model exploded")

    child = Agent(FunctionModel(broken), name="fragile")
    parent = Agent(ScriptedModel([call("spawn_agent", {"task": "x", "agent": "fragile"}, id="f"), "sorry"]),
                   name="lead", tools=[SubAgents([child])])
    result = await parent.run("x")
    error = json.loads(_tool_results(result.messages)["f"].content)["error"]
    assert error["code"] == "sub_agent_failed"
    assert "model exploded" in error["message"]
    assert error["child_run_id"].startswith("r_")


class Statuses(Plugin):
    """Records each run's last status, by its depth among sub-agents."""

    def __init__(self) -> None:
        self.last: dict[int, str] = {}

    async def status_changed(self, ctx: StatusContext) -> None:
        self.last[ctx.run.lineage.depth] = ctx.new


async def test_cancelling_the_parent_cancels_every_descendant() -> None:
    started = asyncio.Event()
    statuses = Statuses()

    def reply(request: ModelRequest) -> Any:
        text = request.messages[-1].text
        if "deepest" in text:
            return waiting()
        return call("spawn_agent", {"task": "deepest" if "middle" in text else "middle"})

    async def waiting() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    agent = Agent(FunctionModel(reply), name="nest", tools=[SubAgents([])], execution=Execution(plugins=[statuses]))
    task = asyncio.create_task(agent.run("top"))
    await started.wait()
    assert statuses.last == {0: "working", 1: "working", 2: "working"}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert statuses.last == {0: "canceled", 1: "canceled", 2: "canceled"}


async def test_library_child_without_an_approver_fails_clearly() -> None:
    careful = Agent(ScriptedModel([call("deploy", {"service": "api"})]), name="careful", tools=[deploy],
                    gates=Gates(approvals=ApprovalRules({"deploy": {"mode": "confirm"}})))
    parent = Agent(ScriptedModel([call("spawn_agent", {"task": "x", "agent": "careful"}, id="c"), "ok"]),
                   name="lead", tools=[SubAgents([careful])])
    result = await parent.run("x")
    error = json.loads(_tool_results(result.messages)["c"].content)["error"]
    assert error["code"] == "sub_agent_failed"
    assert "no approver" in error["message"]


async def test_a_graph_agent_is_a_sub_agent(tmp_path: Any) -> None:
    from ringlet.agent.config import find
    from ringlet.graph import load_agent
    from test_graph_support import EXAMPLES

    poll = load_agent(find(str(EXAMPLES / "poll")))
    parent = Agent(ScriptedModel([call("spawn_agent", {"task": "poll it", "agent": "poll"}, id="g"), "polled"]),
                   name="lead", tools=[SubAgents([poll])])
    stream = parent.stream("go")
    events = [e async for e in stream]
    assert stream.result is not None
    assert _tool_results(stream.result.messages)["g"].content == "done after 3 polls"
    nodes = [e for e in events if e.type == "node_start"]
    assert [(e.node_id, e.agent_path, e.depth, e.parent_tool_call_id) for e in nodes] == \
        [("check", ("lead", "poll"), 1, "g")] * 3 + [("done", ("lead", "poll"), 1, "g")]


async def test_config_agents_spawn_graph_agents_by_name(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from ringlet.agent.config import find
    from ringlet.graph import load_agent
    from test_graph_support import EXAMPLES

    shutil.copytree(EXAMPLES / "poll", tmp_path / "poll")
    (tmp_path / "lead").mkdir()
    (tmp_path / "lead" / "config.yaml").write_text("can_spawn_agents: true\nsub_agents: {allowed: [poll]}\n")
    monkeypatch.setenv("RINGLET_AGENTS_DIR", str(tmp_path))
    lead = load_agent(find("lead"),
                      model=ScriptedModel([call("spawn_agent", {"task": "x", "agent": "poll"}, id="g"), "ok"]))
    result = await lead.run("go")
    assert _tool_results(result.messages)["g"].content == "done after 3 polls"
