"""One run contract (issue 53, DESIGN §1): a loop `Agent`, a graph agent and a remote A2A agent are each a
`Runnable`, started with a prompt, one `Caller` (who runs and where) and one `RunSettings`, and each streams a
`RunStream` of the same events; code asks `kind`, never which class it has. Pyright checks the classes
against the protocols (`test_the_agents_are_runnables_to_pyright`)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ringlet import Agent, Caller, Limits, RunContext, RunSettings, tool
from ringlet.agent.contract import RunKind, Runnable, RunOutcome
from ringlet.agent.remote import RemoteAgent
from ringlet.errors import ConfigError
from ringlet.graph import GraphAgent, load_agent
from ringlet.testing import ScriptedModel, call

GRAPH = "name: echo\nstart: z\nnodes: {z: {type: end, output: 'echo {{initial_prompt}}'}}\n"


def static_contract(agent: Agent, graph: GraphAgent, remote: RemoteAgent) -> list[Runnable]:
    """Checked by pyright, not run: each kind of agent is a `Runnable` as it is."""
    return [agent, graph, remote]


async def through_the_contract(agent: Runnable, prompt: str, caller: Caller) -> tuple[list[str], RunOutcome]:
    """A host's view of a run: only the contract."""
    stream = agent.stream(prompt, caller=caller)
    types = [event.type async for event in stream]
    assert not stream.paused
    assert stream.result is not None
    return types, stream.result


def graph_of(tmp_path: Path) -> GraphAgent:
    directory = tmp_path / "echo"
    directory.mkdir()
    (directory / "graph.yaml").write_text(GRAPH, encoding="utf-8")
    agent = load_agent(directory)
    assert isinstance(agent, GraphAgent)
    return agent


def unreachable() -> str:
    """A loopback address nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"a2a:http://127.0.0.1:{s.getsockname()[1]}/.well-known/agent-card.json"


async def test_every_kind_of_agent_runs_through_the_contract(tmp_path: Path) -> None:
    who = Caller(user_id="ada", run_id="r_given")
    kinds: dict[RunKind, tuple[list[str], RunOutcome]] = {}
    agents: list[Runnable] = [Agent(ScriptedModel(["hello"])), graph_of(tmp_path), RemoteAgent.of(unreachable())]
    for agent in agents:
        kinds[agent.kind] = await through_the_contract(agent, "hi", who)
        await agent.aclose()
    assert sorted(kinds) == ["graph", "loop", "remote"]
    for kind, (types, _) in kinds.items():
        assert (types[0], types[-1]) == ("message_start", "message_end"), kind
    loop, graph, remote = kinds["loop"][1], kinds["graph"][1], kinds["remote"][1]
    assert (loop.run_id, loop.status, loop.output) == ("r_given", "completed", "hello")
    assert (graph.run_id, graph.status, graph.output) == ("r_given", "completed", "echo hi")
    assert remote.status == "failed"  # nothing answers there: a failure naming the cause, not a crash
    assert remote.error is not None
    assert "cannot read the agent card" in remote.error["message"]


async def test_the_caller_reaches_the_runs_context_and_state() -> None:
    seen: list[RunContext] = []

    @tool(effect="read")
    def whoami(ctx: RunContext) -> str:
        """Who runs this."""
        seen.append(ctx)
        return "ok"

    caller = Caller(conversation_id="c_1", realm="blue", user_id="ada", org_id="acme", roles=["admin"],  # type: ignore[arg-type]
                    channel="api", request_id="req_1", run_id="r_1")
    assert caller.roles == ("admin",)  # a list given is kept as a tuple: the value stays frozen
    agent = Agent(ScriptedModel([call("whoami", {}), "done"]), tools=[whoami])
    result = await agent.run("hi", caller=caller)
    ctx, state = seen[0], result.state
    assert (ctx.run_id, ctx.conversation_id, ctx.realm, ctx.user_id, ctx.org_id, ctx.roles, ctx.channel,
            ctx.request_id) == ("r_1", "c_1", "blue", "ada", "acme", ("admin",), "api", "req_1")
    assert (state.run_id, state.conversation_id, state.realm, state.user_id, state.org_id, state.roles,
            state.channel, state.request_id) == ("r_1", "c_1", "blue", "ada", "acme", ["admin"], "api", "req_1")
    assert result.messages[0].metadata["source"] == "api"  # a text prompt is the run's own message, from there


async def test_run_settings_change_this_run_only() -> None:
    model = ScriptedModel([call("nothing", {}), "first", "second"])

    @tool(effect="read")
    def nothing() -> str:
        """Does nothing."""
        return "nothing"

    agent = Agent(model, instructions="Be brief.", tools=[nothing])
    once = await agent.run("a", settings=RunSettings(limits=Limits(max_iterations=1), instructions="In French.",
                                                     plugin_data={"p": {"n": 1}}))
    assert model.requests[0].instructions == "Be brief.\n\nIn French."
    assert once.state.plugin_data == {"p": {"n": 1}}
    assert agent.limits.max_iterations == 10
    assert agent.instructions == "Be brief."
    again = await agent.run("b")
    assert model.requests[-1].instructions == "Be brief."
    assert again.output == "second"


async def test_a_graph_takes_the_caller_and_refuses_what_its_nodes_own(tmp_path: Path) -> None:
    graph = graph_of(tmp_path)
    result = await graph.run("hi", caller=Caller(user_id="ada", org_id="acme", realm="blue", run_id="r_g"))
    assert result.checkpoint is not None
    run = result.checkpoint.run
    assert (result.run_id, run["user_id"], run["org_id"], run["realm"]) == ("r_g", "ada", "acme", "blue")
    with pytest.raises(ConfigError, match=r"^limits, tools: not for graph agent 'echo'; its nodes name"):
        graph.stream("hi", settings=RunSettings(limits=Limits(), tools=[lambda: None]))


@pytest.mark.slow
def test_the_agents_are_runnables_to_pyright() -> None:
    """`static_contract` above type-checks: remove a method from a kind of agent, or change a signature the
    contract names, and this fails."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([str(Path(sys.executable).with_name("pyright")), __file__], capture_output=True,
                          text=True, timeout=300, cwd=root, check=False)
    assert done.returncode == 0, done.stdout
    assert "0 errors" in done.stdout
