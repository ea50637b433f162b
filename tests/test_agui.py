"""AG-UI (`POST /ag-ui/{agent}`, ringlet.server.protocols.agui) over real HTTP: every event ringlet sends parses as an
`ag_ui` event, in the order the protocol wants: text, parallel tool calls, an approval and a question that end
the run as an interrupt and resume with the next RunAgentInput, a graph agent's state, and the errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Event,
    MessagesSnapshotEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    TextMessageContentEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from pydantic import TypeAdapter

from ringlet import Agent, Execution, Gates, Plugin, SubAgents, tool
from ringlet.errors import ProviderError
from ringlet.gates import ApprovalRules
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog, HostedGraph
from ringlet.server.protocols.agui.graph_state import json_patch
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from ringlet.tools.builtin.question import ask_question_tool
from serving import serving
from test_graph_support import make_graph
from test_server_approvals import client_for

EVENTS: TypeAdapter[Any] = TypeAdapter(Event)
COUNTER = """
name: counter
initial_state: {n: 0, notes: {}}
start: first
nodes:
  first: {type: script, script: first.py, next: second}
  second: {type: script, script: second.py, next: done}
  done: {type: end, output: "n={{n}}"}
"""
COUNTER_FILES = {"first.py": "import json\nprint(json.dumps({'n': 1}))\n",
                 "second.py": "import json\nprint(json.dumps({'n': 2, 'notes': {'a/b': 'x'}}))\n"}
GATE = """
name: gate
start: prepare
nodes:
  prepare: {type: script, script: prepare.py, next: gate_blocked}
  gate_blocked:
    type: approval
    question: "Ship '{{initial_prompt}}'?"
    options: [ship, hold]
    routes: {ship: done, hold: done}
    on_other: done
    state_updates: {decision: "{{choice}}"}
  done: {type: end, output: "decided: {{decision}}"}
"""
GATE_FILES = {"prepare.py": "import json\nprint(json.dumps({'ready': True}))\n"}
deployed: list[str] = []


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool(effect="write")
def deploy(service: str) -> str:
    """Deploy a service."""
    deployed.append(service)
    return f"deployed {service}"


def adding(request: Any) -> Any:
    """Two parallel calls, then an answer from both results."""
    results = [m.text for m in request.messages if m.role == "tool"]
    if results:
        return f"sums: {', '.join(results)}"
    return [call("add", a=1, b=2, id="c_one"), call("add", a=3, b=4, id="c_two")]


def deploying(request: Any) -> Any:
    results = [m for m in request.messages if m.role == "tool"]
    return results[-1].text if results else call("deploy", service="web", id="c_deploy")


def asking(request: Any) -> Any:
    results = [m for m in request.messages if m.role == "tool"]
    if results:
        return f"you said {json.loads(results[-1].text)['answer']}"
    return call("ask_question", {"question": "Which colour?", "input_type": "single-select",
                                 "options": [{"label": "red"}, {"label": "blue"}], "allow_freeform": False},
                id="c_ask")


def styling(request: Any) -> Any:
    """Calls the front-end's `set_theme` and the server's `add` in one round, then answers from both."""
    results = {m.name: m.text for m in request.messages if m.role == "tool"}
    if "set_theme" in results:
        return f"theme: {results['set_theme']}, sum: {results['add']}"
    assert "set_theme" in [t.name for t in request.tools]
    return [call("set_theme", color="dark", id="c_theme"), call("add", a=2, b=2, id="c_add")]


@tool(effect="write")
def ship(parcel: str) -> str:
    """Ship a parcel."""
    return f"shipped {parcel}"


def shipping(request: Any) -> Any:
    results = [m for m in request.messages if m.role == "tool"]
    return results[-1].text if results else call("ship", parcel="books", id="c_ship")


def leading(request: Any) -> Any:
    results = [m for m in request.messages if m.role == "tool"]
    return f"child said: {results[-1].text}" if results else \
        call("spawn_agent", {"task": "ship the books", "agent": "shipper"}, id="c_spawn")


def broken(request: Any) -> Any:
    raise ProviderError("upstream exploded", provider="test", status=400)


@pytest.fixture
async def url(store: Store, tmp_path: Path) -> AsyncIterator[str]:
    deployed.clear()
    shipper = Agent(FunctionModel(shipping), name="shipper", tools=[ship], gates=Gates(approvals=ApprovalRules(
        {"ship": {"mode": "confirm", "timeout_s": 60}})))
    agents = [Agent(FunctionModel(lambda request: "Hello from ringlet"), name="talker"),
              Agent(FunctionModel(adding), name="adder", tools=[add]),
              Agent(FunctionModel(deploying), name="ops", tools=[deploy], gates=Gates(approvals=ApprovalRules(
                  {"deploy": {"mode": "confirm", "timeout_s": 60}}))),
              Agent(FunctionModel(asking), name="painter", tools=[ask_question_tool()]),
              Agent(FunctionModel(broken), name="broken"),
              Agent(FunctionModel(styling), name="stylist", tools=[add]),
              Agent(FunctionModel(leading), name="lead", tools=[SubAgents([shipper])])]
    counter = make_graph(tmp_path / "agents", COUNTER, name="counter", files=COUNTER_FILES)
    gate = make_graph(tmp_path / "agents", GATE, name="gate", files=GATE_FILES)
    catalog = Catalog([HostedGraph.at(counter), HostedGraph.at(gate), *Catalog.of(agents).hosted.values()])
    async with serving(create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=catalog)) as base:
        yield base


def run_input(thread: str, *texts: str, **extra: Any) -> dict[str, Any]:
    messages = [{"id": f"u{i}", "role": "user", "content": text} for i, text in enumerate(texts)]
    return {"threadId": thread, "runId": "client-run", "messages": messages, "tools": [], "context": [], **extra}


async def agui(client: httpx.AsyncClient, agent: str, body: dict[str, Any]) -> list[BaseEvent]:
    """Every event of one AG-UI response, each parsed with the package's event union."""
    events = []
    async with client.stream("POST", f"/ag-ui/{agent}", json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(EVENTS.validate_json(line.removeprefix("data: ")))
            else:
                assert line in ("", ": ping"), line
    return events


async def thread(client: httpx.AsyncClient, thread_id: str) -> dict[str, Any]:
    """The conversation a thread id names for this key (its `client_id`), as `GET …/conversations/{id}`."""
    listed = (await client.get("/api/v1/chat/conversations")).json()["data"]
    [cid] = [c["id"] for c in listed if c.get("client_id") == thread_id]
    return (await client.get(f"/api/v1/chat/conversations/{cid}")).json()


def kinds(events: list[BaseEvent]) -> list[str]:
    return [e.type.value for e in events]


def run_end(events: list[BaseEvent]) -> RunFinishedEvent:
    """The run's last event, which must be RUN_FINISHED."""
    end = events[-1]
    assert isinstance(end, RunFinishedEvent), end
    return end


def left_open(events: list[BaseEvent]) -> list[str]:
    """What is still open (steps, text messages, tool calls) when the run's last event is sent: `@ag-ui/client`
    refuses a RUN_FINISHED while anything is."""
    opened: dict[str, None] = {}
    for event in events[:-1]:
        kind = event.type.value
        key = {"STEP": getattr(event, "step_name", None), "TEXT": getattr(event, "message_id", None),
               "TOOL": getattr(event, "tool_call_id", None)}.get(kind.split("_")[0])
        if kind in ("STEP_STARTED", "TEXT_MESSAGE_START", "TOOL_CALL_START"):
            opened[f"{kind.split('_')[0]} {key}"] = None
        elif kind in ("STEP_FINISHED", "TEXT_MESSAGE_END", "TOOL_CALL_END"):
            opened.pop(f"{kind.split('_')[0]} {key}", None)
    return list(opened)


def text_of(events: list[BaseEvent]) -> str:
    return "".join(e.delta for e in events if isinstance(e, TextMessageContentEvent))


async def test_a_text_run_streams_as_one_text_message(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        events = await agui(ana, "talker", run_input("thread-text", "hi"))
        assert kinds(events) == ["RUN_STARTED", "TEXT_MESSAGE_START", *["TEXT_MESSAGE_CONTENT"] * (
            len(events) - 5), "TEXT_MESSAGE_END", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
        started, finished = events[0], events[-1]
        assert isinstance(started, RunStartedEvent)
        assert isinstance(finished, RunFinishedEvent)
        assert started.thread_id == finished.thread_id == "thread-text"
        assert started.run_id == finished.run_id == "client-run"  # the AG-UI run is the client's
        assert started.metadata == finished.metadata
        assert started.metadata["ringlet"]["run_id"].startswith("r_")  # type: ignore[index]
        assert text_of(events) == "Hello from ringlet"
        assert finished.outcome is None
        assert finished.usage
        assert finished.usage[0].total_tokens is not None
        snapshot = events[-2]
        assert isinstance(snapshot, MessagesSnapshotEvent)
        assert [(m.role, m.id, m.content) for m in snapshot.messages] == [
            ("user", "u0", "hi"), ("assistant", events[1].message_id, "Hello from ringlet")]  # type: ignore[attr-defined]
        # the thread is a stored conversation of the key; the next message runs on its transcript
        detail = await thread(ana, "thread-text")
        assert (detail["conversation"]["agent"], detail["conversation"]["status"]) == ("talker", "idle")
        again = await agui(ana, "talker", run_input("thread-text", "hi", "again"))
        assert text_of(again) == "Hello from ringlet"
        assert [m.id for m in again[-2].messages][-2] == "u1"  # type: ignore[attr-defined]
        synced = await agui(ana, "talker", run_input("thread-text", "hi", "again"))  # nothing new: no run
        assert kinds(synced) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
        assert synced[1] == again[-2]
        assert (await thread(ana, "thread-text"))["messages"][-1]["role"] == "assistant"


async def test_parallel_tool_calls_end_before_their_results(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        events = await agui(ana, "adder", run_input("thread-tools", "add"))
    names = kinds(events)
    starts = [e for e in events if isinstance(e, ToolCallStartEvent)]
    assert [(s.tool_call_id, s.tool_call_name) for s in starts] == [("c_one", "add"), ("c_two", "add")]
    assert starts[0].parent_message_id == starts[1].parent_message_id is not None
    for call_id in ("c_one", "c_two"):
        own = [n for n, e in zip(names, events, strict=True) if getattr(e, "tool_call_id", None) == call_id]
        assert own[0] == "TOOL_CALL_START"
        assert own[-2:] == ["TOOL_CALL_END", "TOOL_CALL_RESULT"]
        assert "TOOL_CALL_ARGS" in own
    args = "".join(e.delta for e in events if e.type.value == "TOOL_CALL_ARGS" and e.tool_call_id == "c_one")  # type: ignore[attr-defined]
    assert json.loads(args) == {"a": 1, "b": 2}
    results = {e.tool_call_id: e.content for e in events if isinstance(e, ToolCallResultEvent)}
    assert results == {"c_one": "3", "c_two": "7"}
    assert names.index("TEXT_MESSAGE_START") > max(i for i, n in enumerate(names) if n == "TOOL_CALL_RESULT")
    assert text_of(events) == "sums: 3, 7"
    snapshot = events[-2]
    assert isinstance(snapshot, MessagesSnapshotEvent)
    assert [m.role for m in snapshot.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c.id for c in snapshot.messages[1].tool_calls] == ["c_one", "c_two"]  # type: ignore[union-attr]
    assert names[-1] == "RUN_FINISHED"


async def test_an_approval_interrupts_the_run_and_resume_continues_it(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat", "approve"]) as ana, \
            await client_for(url, store, "viewer", ["chat"]) as viewer:
        body = run_input("thread-ops", "deploy web")
        first = await agui(ana, "ops", body)
        assert kinds(first)[-3:] == ["CUSTOM", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
        custom, finished = first[-3], first[-1]
        assert isinstance(custom, CustomEvent)
        assert custom.name == "ringlet.approval_required"
        assert isinstance(finished, RunFinishedEvent)
        assert isinstance(finished.outcome, RunFinishedInterruptOutcome)
        [interrupt] = finished.outcome.interrupts
        assert (interrupt.id, interrupt.reason, interrupt.tool_call_id) == (
            custom.value["approval_id"], "approval_required", "c_deploy")
        assert interrupt.metadata == {"ringlet": custom.value}
        assert interrupt.response_schema is not None
        assert interrupt.response_schema["required"] == ["approved"]
        assert "TOOL_CALL_END" in kinds(first)
        assert deployed == []
        reconnect = await agui(ana, "ops", body)  # nothing new: the thread still waits on the interrupt
        again_paused = run_end(reconnect).outcome
        assert isinstance(again_paused, RunFinishedInterruptOutcome)
        assert [(i.id, i.reason, i.tool_call_id, i.response_schema) for i in again_paused.interrupts] == [
            (interrupt.id, "approval_required", "c_deploy", interrupt.response_schema)]
        busy = await ana.post("/ag-ui/ops", json=run_input("thread-ops", "deploy web", "deploy api"))
        assert (busy.status_code, busy.json()["error"]["details"]) == (409, {"interrupts": [interrupt.id]})
        resume = {**body, "resume": [{"interruptId": interrupt.id, "status": "resolved",
                                      "payload": {"approved": True, "note": "go"}}]}
        refused = await viewer.post("/ag-ui/ops", json={**resume, "threadId": "thread-ops"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "forbidden")
        bad = await ana.post("/ag-ui/ops", json={**body, "resume": [{"interruptId": interrupt.id,
                                                                     "status": "resolved", "payload": {}}]})
        assert (bad.status_code, bad.json()["error"]["details"]["errors"][0]["loc"]) == (
            422, "body.resume.0.payload.approved")
        second = await agui(ana, "ops", resume)
        assert deployed == ["web"]
        assert second[0].metadata == finished.metadata  # type: ignore[attr-defined]  # the same ringlet run goes on
        assert kinds(second)[0] == "RUN_STARTED"
        assert kinds(second)[-2:] == ["MESSAGES_SNAPSHOT", "RUN_FINISHED"]
        assert [e.content for e in second if isinstance(e, ToolCallResultEvent)] == ["deployed web"]
        assert text_of(second) == "deployed web"
        assert run_end(second).outcome is None
        again = await ana.post("/ag-ui/ops", json=resume)
        assert (again.status_code, again.json()["error"]["code"]) == (409, "interrupt_not_pending")
        cid = (await thread(ana, "thread-ops"))["conversation"]["id"]
        record = (await ana.get(f"/api/v1/chat/conversations/{cid}/approvals")).json()["data"][0]
        assert (record["status"], record["decided_by"], record["note"]) == ("approved", "ana", "go")


async def test_a_question_is_answered_through_resume(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        body = run_input("thread-q", "paint")
        first = await agui(ana, "painter", body)
        finished = first[-1]
        assert isinstance(finished, RunFinishedEvent)
        assert isinstance(finished.outcome, RunFinishedInterruptOutcome)
        [interrupt] = finished.outcome.interrupts
        assert (interrupt.reason, interrupt.message) == ("question", "Which colour?")
        assert interrupt.response_schema == {"type": "object", "required": ["answer"], "properties": {
            "answer": {"type": "string", "enum": ["red", "blue"]}}}
        assert [e.name for e in first if isinstance(e, CustomEvent)] == ["ringlet.question"]
        wrong = await ana.post("/ag-ui/painter", json={**body, "resume": [
            {"interruptId": interrupt.id, "status": "resolved", "payload": {"answer": "pink"}}]})
        assert wrong.status_code == 422
        unknown = await ana.post("/ag-ui/painter", json={**body, "resume": [
            {"interruptId": "q_nope", "status": "resolved", "payload": {"answer": "red"}}]})
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "interrupt_not_found")
        second = await agui(ana, "painter", {**body, "resume": [
            {"interruptId": interrupt.id, "status": "resolved", "payload": {"answer": "blue"}}]})
        assert text_of(second) == "you said blue"
        assert kinds(second)[-1] == "RUN_FINISHED"
        assert run_end(second).outcome is None
        late = await ana.post("/ag-ui/painter", json={**body, "resume": [  # the run it paused has ended
            {"interruptId": interrupt.id, "status": "cancelled"}]})
        assert (late.status_code, late.json()["error"]["code"]) == (409, "interrupt_not_pending")


async def test_a_graph_run_sends_steps_and_its_state(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        events = await agui(ana, "counter", run_input("thread-graph", "count"))
    steps = [(e.type.value, e.step_name) for e in events if e.type.value.startswith("STEP_")]  # type: ignore[attr-defined]
    assert steps == [("STEP_STARTED", "first"), ("STEP_FINISHED", "first"), ("STEP_STARTED", "second"),
                     ("STEP_FINISHED", "second"), ("STEP_STARTED", "done"), ("STEP_FINISHED", "done")]
    snapshots = [e for e in events if isinstance(e, StateSnapshotEvent)]
    deltas = [e for e in events if isinstance(e, StateDeltaEvent)]
    assert len(snapshots) == 1
    assert kinds(events).index("STATE_SNAPSHOT") < kinds(events).index("STATE_DELTA")
    state = snapshots[0].snapshot
    assert (state["n"], state["initial_prompt"]) == (0, "count")
    for delta in deltas:  # applying the deltas to the snapshot gives the final state
        state = apply_patch(state, [op.model_dump(by_alias=True) for op in delta.delta])
    assert (state["n"], state["notes"]) == (2, {"a/b": "x"})
    assert text_of(events) == "n=2"
    assert kinds(events)[-1] == "RUN_FINISHED"


async def test_a_failed_run_ends_with_run_error(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        events = await agui(ana, "broken", run_input("thread-broken", "hi"))
    assert kinds(events) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_ERROR"]
    error = events[-1]
    assert isinstance(error, RunErrorEvent)
    assert "upstream exploded" in error.message
    assert error.code is not None


async def test_a_graph_paused_at_an_approval_node_closes_its_step_before_run_finished(url: str, store: Store) -> None:
    """The issue's case: `AGUIError: Cannot send 'RUN_FINISHED' while steps are still active: gate_blocked`.
    The paused node's step is finished before the interrupt, and the resumed run starts it again."""
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        body = run_input("thread-gate", "books")
        first = await agui(ana, "gate", body)
        outcome = run_end(first).outcome
        assert isinstance(outcome, RunFinishedInterruptOutcome)
        [interrupt] = outcome.interrupts
        assert (interrupt.reason, interrupt.metadata["ringlet"]["node_id"]) == ("question", "gate_blocked")  # type: ignore[index]
        steps = [(e.type.value, e.step_name) for e in first if e.type.value.startswith("STEP_")]  # type: ignore[attr-defined]
        assert steps == [("STEP_STARTED", "prepare"), ("STEP_FINISHED", "prepare"),
                         ("STEP_STARTED", "gate_blocked"), ("STEP_FINISHED", "gate_blocked")]
        assert left_open(first) == []
        second = await agui(ana, "gate", {**body, "runId": "client-run-2", "resume": [
            {"interruptId": interrupt.id, "status": "resolved", "payload": {"answer": "ship"}}]})
        assert run_end(second).outcome is None
        assert left_open(second) == []
        steps = [(e.type.value, e.step_name) for e in second if e.type.value.startswith("STEP_")]  # type: ignore[attr-defined]
        assert steps == [("STEP_STARTED", "gate_blocked"), ("STEP_FINISHED", "gate_blocked"),
                         ("STEP_STARTED", "done"), ("STEP_FINISHED", "done")]
        assert text_of(second) == "decided: ship"


async def test_a_cancelled_graph_interrupt_closes_what_is_open(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        body = run_input("thread-gate-cancel", "books")
        first = await agui(ana, "gate", body)
        [interrupt] = run_end(first).outcome.interrupts  # type: ignore[union-attr]
        second = await agui(ana, "gate", {**body, "runId": "client-run-2", "resume": [
            {"interruptId": interrupt.id, "status": "cancelled"}]})
        assert left_open(first) == left_open(second) == []
        assert isinstance(second[-1], RunFinishedEvent | RunErrorEvent)


def apply_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """Enough of RFC 6902 (add, remove, replace on objects) to check the deltas."""
    doc = json.loads(json.dumps(doc))
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = doc
        for p in parents:
            target = target[p]
        if op["op"] == "remove":
            del target[last]
        else:
            target[last] = op["value"]
    return doc


def test_json_patch_is_minimal_and_escapes_keys() -> None:
    assert json_patch({"a": 1, "b": {"c": [1]}, "gone": 0}, {"a": 1, "b": {"c": [2]}, "x/y": 3}) == [
        {"op": "remove", "path": "/gone"}, {"op": "replace", "path": "/b/c", "value": [2]},
        {"op": "add", "path": "/x~1y", "value": 3}]
    assert json_patch([1], [1]) == []
    assert json_patch(1, 2) == [{"op": "replace", "path": "", "value": 2}]


async def test_errors(url: str, store: Store) -> None:
    async with httpx.AsyncClient(base_url=url) as anonymous:
        response = await anonymous.post("/ag-ui/talker", json=run_input("thread-e", "hi"))
        assert (response.status_code, response.json()["error"]["code"]) == (401, "unauthorized")
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        bad = await ana.post("/ag-ui/talker", json={"runId": "r", "messages": []})
        assert bad.status_code == 422
        error = bad.json()["error"]
        assert error["code"] == "validation_error"
        assert error["details"]["errors"][0]["loc"] == "body.threadId"
        unknown = await ana.post("/ag-ui/nobody", json=run_input("thread-e", "hi"))
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "agent_not_found")
        tools = await ana.post("/ag-ui/talker", json=run_input("thread-e", "hi", tools=[
            {"name": "confirm", "description": "Ask the user", "parameters": {"type": "object"}},
            {"name": "bad name!", "description": "Not a tool name", "parameters": {"type": "object"}}]))
        assert (tools.status_code, tools.json()["error"]["details"]["errors"][0]["loc"]) == (422, "body.tools.1")
        arrays = await ana.post("/ag-ui/talker", json=run_input("thread-e", "hi", tools=[
            {"name": "confirm", "description": "Ask the user", "parameters": {"type": "array"}}]))
        assert (arrays.status_code, arrays.json()["error"]["details"]["errors"][0]["loc"]) == (422, "body.tools.0")
        graph = await ana.post("/ag-ui/counter", json=run_input("thread-g", "go", tools=[
            {"name": "confirm", "description": "Ask the user", "parameters": {"type": "object"}}]))
        assert (graph.status_code, graph.json()["error"]["details"]["errors"][0]["loc"]) == (422, "body.tools")
        await agui(ana, "talker", run_input("thread-e", "hi"))
        talker = (await thread(ana, "thread-e"))["conversation"]["id"]
        other = await ana.post("/ag-ui/adder", json=run_input(talker, "hi", "more"))  # a conversation id it gave
        assert (other.status_code, other.json()["error"]["code"]) == (400, "invalid_request")
        assert "belongs to agent 'talker'" in other.json()["error"]["message"]
        await agui(ana, "adder", run_input("thread-e", "hi", "more"))  # the same name for another agent: its own
        assert [c["agent"] for c in (await ana.get("/api/v1/chat/conversations")).json()["data"]
                if c.get("client_id") == "thread-e"] == ["adder", "talker"]
    key, _ = await store.keys.create("elsewhere", scopes=["chat"], realms=["other"])
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as elsewhere:
        for name in ("thread-e", talker):  # another realm's thread name or id: a new thread of its own realm
            mine = await agui(elsewhere, "talker", run_input(name, "hi", "more"))
            assert text_of(mine) == "Hello from ringlet"
        listed = (await elsewhere.get("/api/v1/chat/conversations")).json()["data"]
        assert sorted((c["realm"], c["client_id"]) for c in listed) == [("other", talker), ("other", "thread-e")]


THEME_TOOL = {"name": "set_theme", "description": "Change the page's colour theme.",
              "parameters": {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}}


async def test_a_front_end_tool_goes_to_the_client_and_its_result_continues_the_run(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        first = await agui(ana, "stylist", run_input("thread-fe", "go dark", tools=[THEME_TOOL]))
        end = run_end(first)
        assert end.outcome is None
        started = [e for e in first if isinstance(e, ToolCallStartEvent)]
        assert sorted(e.tool_call_name for e in started) == ["add", "set_theme"]
        results = {e.tool_call_id: e.content for e in first if isinstance(e, ToolCallResultEvent)}
        assert results == {"c_add": "4"}  # the server's own call ran; the client's did not
        ended = [e.tool_call_id for e in first if isinstance(e, ToolCallEndEvent)]
        assert "c_theme" in ended
        snapshot = next(e for e in first if isinstance(e, MessagesSnapshotEvent))
        history = [m.model_dump(by_alias=True, exclude_none=True) for m in snapshot.messages]
        body = run_input("thread-fe", tools=[THEME_TOOL])
        body["runId"] = "client-run-2"
        body["messages"] = [*history, {"id": "t1", "role": "tool", "toolCallId": "c_theme", "content": "ok"}]
        second = await agui(ana, "stylist", body)
        assert run_end(second).run_id == "client-run-2"
        assert text_of(second) == "theme: ok, sum: 4"
        again = await ana.post("/ag-ui/stylist", json={**body, "messages": [
            *history, {"id": "t2", "role": "tool", "toolCallId": "c_theme", "content": "twice"}]})
        assert (again.status_code, again.json()["error"]["code"]) == (422, "validation_error")
        assert "already has its result" in again.json()["error"]["message"]


async def test_a_sub_agents_approval_resumes_through_the_thread(url: str, store: Store) -> None:
    """The child's request is stored under the thread with the child's run id; resuming it follows the root
    run the child works inside (not the child's id, whose events the thread never carries)."""
    async with await client_for(url, store, "ana", ["chat", "approve"]) as ana:
        first: list[BaseEvent] = []
        asked = asyncio.Event()

        async def follow() -> None:
            async with ana.stream("POST", "/ag-ui/lead", json=run_input("thread-lead", "ship")) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        first.append(EVENTS.validate_json(line.removeprefix("data: ")))
                        if isinstance(first[-1], CustomEvent):
                            asked.set()

        following = asyncio.create_task(follow())
        await asked.wait()
        custom = next(e for e in first if isinstance(e, CustomEvent))
        assert (custom.name, custom.value["tool"]) == ("ringlet.approval_required", "ship")
        second = await agui(ana, "lead", {**run_input("thread-lead"), "resume": [
            {"interruptId": custom.value["approval_id"], "status": "resolved", "payload": {"approved": True}}]})
        await following
        for events in (first, second):
            assert run_end(events).outcome is None
            assert text_of(events).endswith("child said: shipped books")


class Lingering(Plugin):
    """Holds the run's last steps after it paused (its `status_changed` hook) until the test lets go: the
    window in which a client that saw the pause already sends the next message."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def status_changed(self, ctx: Any) -> None:
        if ctx.new == "input_required":
            await self.go.wait()


async def test_a_front_end_result_sent_the_moment_the_run_finished_continues_it(store: Store, tmp_path: Path) -> None:
    """RUN_FINISHED is sent once the run has let go of the thread: the client's next message, sent at once,
    never meets its own finished run (409 run_in_progress)."""
    lingering = Lingering()
    agent = Agent(FunctionModel(styling), name="stylist", tools=[add],
                  execution=Execution(plugins=[lingering], hook_timeout_s=1))  # then it goes on, with a notification
    async with serving(create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=Catalog.of([agent]))) \
            as base, await client_for(base, store, "ana", ["chat"]) as ana:
        first = await agui(ana, "stylist", run_input("thread-now", "go dark", tools=[THEME_TOOL]))
        snapshot = next(e for e in first if isinstance(e, MessagesSnapshotEvent))
        history = [m.model_dump(by_alias=True, exclude_none=True) for m in snapshot.messages]
        body = {**run_input("thread-now", tools=[THEME_TOOL]), "runId": "client-run-2",
                "messages": [*history, {"id": "t1", "role": "tool", "toolCallId": "c_theme", "content": "ok"}]}
        answering = asyncio.create_task(agui(ana, "stylist", body))
        done, _ = await asyncio.wait([answering], timeout=10)  # the first run's hook still holds its end
        lingering.go.set()
        assert done, "the answer did not start while the first run was ending"
        assert text_of(answering.result()) == "theme: ok, sum: 4"


async def test_the_endpoint_with_a_trailing_slash_is_answered_not_redirected(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        async with ana.stream("POST", "/ag-ui/talker/", json=run_input("thread-slash", "hi")) as response:
            assert response.status_code == 200, await response.aread()
            events = [EVENTS.validate_json(line.removeprefix("data: ")) async for line in response.aiter_lines()
                      if line.startswith("data: ")]
        assert text_of(events) == "Hello from ringlet"
        assert isinstance(events[-1], RunFinishedEvent)
