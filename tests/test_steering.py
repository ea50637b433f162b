"""Steering a working run from the library: `stream.steer(text)` (`ringlet.loop.steering`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ringlet import Agent, Execution, Plugin, tool
from ringlet.errors import ConfigError
from ringlet.events import SteerQueuedEvent
from ringlet.graph import GraphAgent, load_agent
from ringlet.hooks.plugin import UserMessageContext
from ringlet.testing import ScriptedModel, call


def make_agent(model: ScriptedModel, gate: asyncio.Event | None = None, started: asyncio.Event | None = None) -> Agent:
    @tool(effect="read")
    async def look(topic: str) -> str:
        "Look something up."
        if started is not None:
            started.set()
        if gate is not None:
            await gate.wait()  # the test steers while this call runs
        return f"notes on {topic}"

    return Agent(model, tools=[look])


async def test_a_steer_joins_the_transcript_at_the_next_round_boundary() -> None:
    gate, started = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([call("look", topic="logs"), "Only the errors: none."])
    stream = make_agent(model, gate, started).stream("Summarise the logs")

    async def steer_while_the_call_runs() -> SteerQueuedEvent:
        await started.wait()  # the call is running: the steer waits for it to settle
        queued = stream.steer("Only the errors, please")
        gate.set()
        return queued

    steering = asyncio.create_task(steer_while_the_call_runs())
    seen = [event.type async for event in stream]
    queued = await steering
    assert queued.type == "steer_queued"
    assert queued.text == "Only the errors, please"
    # taken after the tool result, before the second model request
    assert seen.index("tool_result") < seen.index("steer_taken") < seen.index("content_delta")
    result = stream.result
    assert result is not None
    assert result.output == "Only the errors: none."
    roles = [(m.role, m.text) for m in result.messages]
    assert roles[2:4] == [("tool", "notes on logs"), ("user", "Only the errors, please")]
    steered = result.messages[3]
    assert steered.id == queued.message_id
    assert steered.metadata["steer_id"] == queued.steer_id
    assert steered.run_id == stream.run_id
    # the model's second request saw it, last
    assert model.requests[1].messages[-1].text == "Only the errors, please"
    assert stream.steers_left == []


async def test_a_steer_sent_before_the_first_request_is_taken_first() -> None:
    model = ScriptedModel(["Fine."])
    stream = Agent(model).stream("Hello")
    stream.steer("Answer in French")
    types = [event.type async for event in stream]
    assert types.index("steer_taken") < types.index("content_delta")
    assert [m.text for m in model.requests[0].messages if m.role == "user"] == ["Hello", "Answer in French"]


async def test_a_steer_after_the_last_round_is_left_for_the_next_run() -> None:
    model = ScriptedModel(["First answer.", "Second answer."])
    agent = Agent(model)
    stream = agent.stream("Hello")
    async for event in stream:
        if event.type == "content_delta":  # the model is answering: no round is left to take it
            stream.steer("And one more thing")
    assert "steer_taken" not in [m.metadata.get("steer_id") for m in stream.result.messages]  # type: ignore[union-attr]
    left = stream.steers_left
    assert [m.text for m in left] == ["And one more thing"]
    nxt = await agent.run(left, history=stream.result.messages)  # type: ignore[union-attr]
    assert nxt.output == "Second answer."
    assert [m.text for m in nxt.messages if m.role == "user"] == ["Hello", "And one more thing"]


async def test_several_steers_are_taken_in_order_at_one_boundary() -> None:
    gate, started = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([call("look", topic="a"), "done"])
    stream = make_agent(model, gate, started).stream("go")

    async def steer_twice() -> list[str]:
        await started.wait()
        ids = [stream.steer("one").steer_id, stream.steer("two").steer_id]
        gate.set()
        return ids

    steering = asyncio.create_task(steer_twice())
    taken = [event.steer_id async for event in stream if event.type == "steer_taken"]  # type: ignore[union-attr]
    assert taken == await steering
    assert [m.text for m in model.requests[1].messages[-2:]] == ["one", "two"]


def test_a_graph_run_cannot_be_steered(tmp_path: Path) -> None:
    directory = tmp_path / "echo"
    directory.mkdir()
    (directory / "graph.yaml").write_text("name: echo\nstart: z\nnodes: {z: {type: end, output: 'x'}}\n")
    agent = load_agent(directory)
    assert isinstance(agent, GraphAgent)
    with pytest.raises(ConfigError, match="cannot be steered"):
        agent.stream("hi").steer("more")


async def test_a_taken_steer_goes_through_the_user_message_hook() -> None:
    heard: list[str] = []

    class Listener(Plugin):
        name = "listener"

        async def user_message_received(self, ctx: UserMessageContext) -> None:
            heard.append(ctx.message.text if ctx.message is not None else "")

    stream = Agent(ScriptedModel(["ok"]), execution=Execution(plugins=[Listener()])).stream("Hello")
    stream.steer("Answer in French")
    _ = [event async for event in stream]
    assert heard == ["Hello", "Answer in French"]  # what a guardrail on input sees, a steer included


async def test_a_durable_inbox_receives_again_where_the_first_execution_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run again after a crash, a workflow receives (`DBOS.recv`) at exactly the boundaries where its first
    execution did, so its recorded operations line up; past them it listens again, at once."""
    from dbos import DBOS

    from ringlet.loop.steering import Steer
    from ringlet.messages import Message
    from ringlet.server.durable.steers import DurableInbox

    recorded = [  # model 1, tool, (boundary 1: a steer, then none left), model 2, tool, model 3, tool
        {"function_id": 1, "function_name": "model test:m"}, {"function_id": 2, "function_name": "look"},
        {"function_id": 3, "function_name": "DBOS.recv"}, {"function_id": 4, "function_name": "DBOS.sleep"},
        {"function_id": 5, "function_name": "DBOS.recv"}, {"function_id": 6, "function_name": "DBOS.sleep"},
        {"function_id": 7, "function_name": "model test:m"}, {"function_id": 8, "function_name": "look"},
        {"function_id": 9, "function_name": "model test:m"}, {"function_id": 10, "function_name": "look"}]
    queue: list[dict[str, object] | None] = [Steer("st_1", Message.user("only errors")).to_json(), None, None]
    received: list[int] = []

    async def steps(run_id: str, **_: object) -> list[dict[str, object]]:
        return list(reversed(recorded))  # any order: sorted by function id

    async def recv(topic: str, timeout_seconds: float) -> object:
        received.append(len(received))
        return queue.pop(0)

    monkeypatch.setattr(DBOS, "list_workflow_steps_async", steps)
    monkeypatch.setattr(DBOS, "recv_async", recv)
    inbox = DurableInbox()
    await inbox.recall("r_1")
    assert inbox.pending
    assert await inbox.take(0) == []  # before the first request: the first execution did not receive there
    assert [s.steer_id for s in await inbox.take(1)] == ["st_1"]  # it did here: the same two receives
    assert len(received) == 2
    assert await inbox.take(2) == []  # passed without receiving
    assert len(received) == 2
    assert await inbox.take(3) == []  # past the record: it listens (a steer its worker heard may wait)
    assert len(received) == 3
    assert not inbox.pending  # and then only when told


async def test_a_first_durable_execution_listens_only_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    from dbos import DBOS

    from ringlet.server.durable.steers import DurableInbox, Steering

    async def steps(run_id: str, **_: object) -> list[dict[str, object]]:
        return []

    monkeypatch.setattr(DBOS, "list_workflow_steps_async", steps)
    inbox = DurableInbox()
    await inbox.recall("r_1")
    assert not inbox.pending  # nothing recorded: no receive at all unless a steer is heard
    steering = Steering()
    steering.heard("r_2")  # sent while it waited in its queue
    assert steering.open("r_2").pending
    assert not steering.open("r_3").pending
    steering.heard("r_3")  # sent while it executes here
    assert steering.inboxes["r_3"].pending


async def test_a_steered_recording_replays_without_divergence() -> None:
    """The steers a run took are on its tape: its replay takes them at the same boundary."""
    from ringlet.replay import Recording, replay

    gate, started = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([call("look", topic="logs"), "Only the errors: none."])
    agent = make_agent(model, gate, started)
    recording = Recording()
    stream = recording.stream(agent, "Summarise the logs")

    async def steer_while_the_call_runs() -> None:
        await started.wait()
        stream.steer("Only the errors, please")
        gate.set()

    steering = asyncio.create_task(steer_while_the_call_runs())
    seen = [event.type async for event in stream]
    await steering
    assert "steer_taken" in seen
    [tape] = recording.tapes()
    assert [t["at"] for t in tape["steers"]] == [1]
    loaded = Recording.from_json(recording.to_json())
    report = await replay(make_agent(ScriptedModel([])), loaded)
    assert report.same, report.divergences
    assert [e["type"] for e in report.events] == seen
    # a replay that reaches no boundary where the recording took its steer says so
    del loaded.segments[0]["steers"]
    changed = await replay(make_agent(ScriptedModel([])), loaded)
    assert changed.divergence is not None
    assert changed.divergence.kind == "request"
