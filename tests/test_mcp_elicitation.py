"""The rest of the MCP client protocol against `server-everything`: elicitation as a ringlet question
(library and server, accept and decline), resources (tools and `@server:uri` mentions), prompts, progress; and
against a Python SDK server, whose question reaches only the run of the call it concerns (stdio, streamable
HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ringlet import Agent
from ringlet.agent.config import MCPMentions
from ringlet.agent.settings import Execution, RunHost, RunSettings
from ringlet.events import NotificationEvent, QuestionEvent, StatusEvent, ToolResultEvent
from ringlet.gates import ApprovalBroker
from ringlet.mcp.client import MCPToolset
from ringlet.mcp.config import MCPServerConfig
from ringlet.mcp.elicit import question_for, result_of
from ringlet.mcp.mentions import mentions
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import ScriptedModel, call
from ringlet.tools.builtin.question import check_answer
from serving import serving
from test_mcp_client import EVERYTHING, free_port
from test_server import new_conversation
from test_server_approvals import client_for, until_paused

DOC = "demo://resource/static/document/architecture.md"


@pytest.fixture
async def everything() -> AsyncIterator[MCPToolset]:
    toolset = MCPToolset("everything", MCPServerConfig(command=str(EVERYTHING), args=["stdio"]))
    yield toolset
    await toolset.aclose()


def eliciting(toolset: MCPToolset) -> Agent:
    model = ScriptedModel([call("trigger-elicitation-request", {}, id="e1"), "done"])
    return Agent(model, name="forms", tools=[toolset])


async def answer_first(broker: ApprovalBroker, answer: Any) -> str:
    [request] = await broker.wait_for_pending()
    broker.answer(request.approval_id, answer, answered_by="ana")
    return request.approval_id


async def test_library_elicitation_is_a_question_whose_answer_reaches_the_server(everything: MCPToolset) -> None:
    broker = ApprovalBroker()
    answering = asyncio.create_task(answer_first(broker, '{"name": "Ada", "check": true, "integer": 7}'))
    events = [e async for e in eliciting(everything).stream("fill the form", settings=RunSettings(approver=broker))]
    question_id = await answering
    [asked] = [e for e in events if isinstance(e, QuestionEvent)]
    assert (asked.question_id, asked.tool_call_id) == (question_id, "e1")
    assert asked.question.startswith("Please provide inputs")
    assert "- name (string, required): Your full, legal name" in asked.question
    assert [o.label for o in asked.options] == ["Decline"]
    assert asked.allow_freeform
    states = [e.state for e in events if isinstance(e, StatusEvent)]
    assert states[:3] == ["working", "input_required", "working"]
    [result] = [e for e in events if isinstance(e, ToolResultEvent)]
    assert not result.is_error
    assert "- Name: Ada" in result.result
    assert "- Agreed to terms: true" in result.result
    assert "- Favorite Integer: 7" in result.result


async def test_library_decline_and_no_human(everything: MCPToolset) -> None:
    broker = ApprovalBroker()
    answering = asyncio.create_task(answer_first(broker, "Decline"))
    events = [e async for e in eliciting(everything).stream("fill the form", settings=RunSettings(approver=broker))]
    await answering
    [result] = [e for e in events if isinstance(e, ToolResultEvent)]
    assert "User declined" in result.result
    # no one to ask (a CLI run without a terminal): declined at once, no question asked
    settings = RunSettings(approver=broker, host=RunHost(humans=False))
    events = [e async for e in eliciting(everything).stream("fill", settings=settings)]
    assert not [e for e in events if isinstance(e, QuestionEvent)]
    [result] = [e for e in events if isinstance(e, ToolResultEvent)]
    assert "User declined" in result.result


def test_requested_schemas_map_to_questions_and_answers_are_checked() -> None:
    class Form:
        mode = "form"

        def __init__(self, message: str, **props: Any) -> None:
            self.message = message
            self.requested_schema = {"type": "object", "properties": props, "required": list(props)}

    yes_no = question_for(Form("Proceed?", ok={"type": "boolean"}), server="s")
    assert yes_no["input_type"] == "single-select"
    assert not yes_no["allow_freeform"]
    assert [o["label"] for o in yes_no["options"]] == ["Yes", "No", "Decline"]
    assert result_of(yes_no, "answered", {"answer": "No"}) == {"action": "accept", "content": {"ok": False}}
    hero = question_for(Form("Pick", hero={"type": "string", "oneOf": [{"const": "h1", "title": "Superman"},
                                                                         {"const": "h2", "title": "Batman"}]}),
                        server="s")
    assert [o["label"] for o in hero["options"]] == ["Superman", "Batman", "Decline"]
    assert result_of(hero, "answered", {"answer": "Batman"})["content"] == {"hero": "h2"}
    with pytest.raises(ValueError, match="options"):
        check_answer(hero, "Robin")
    tags = question_for(Form("Tags", tags={"type": "array", "items": {"enum": ["a", "b", "c"]}}), server="s")
    assert tags["input_type"] == "multi-select"
    assert result_of(tags, "answered", {"answer": ["a", "c"]})["content"] == {"tags": ["a", "c"]}
    age = question_for(Form("Age?", age={"type": "integer", "minimum": 1, "maximum": 120}), server="s")
    with pytest.raises(ValueError, match="maximum"):
        check_answer(age, "130")
    with pytest.raises(ValueError, match="expected JSON"):
        check_answer(age, "old")
    assert check_answer(age, "42") == ("42", True)
    assert result_of(age, "answered", {"answer": "42"}) == {"action": "accept", "content": {"age": 42}}
    assert result_of(age, "answered", {"answer": "Decline"}) == {"action": "decline"}
    assert result_of(age, "no_human") == {"action": "decline"}
    assert result_of(age, "cancelled") == {"action": "cancel"}


@pytest.fixture
async def forms_server(store: Store, everything: MCPToolset) -> AsyncIterator[tuple[str, Store]]:
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=[eliciting(everything)])
    async with serving(app) as url:
        yield url, store


async def test_server_elicitation_is_answered_through_the_questions_api(forms_server: tuple[str, Store]) -> None:
    url, store = forms_server
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        cid = (await new_conversation(ana, "forms"))["id"]
        seen: list[Any] = []
        asking = asyncio.Event()
        stream = asyncio.create_task(until_paused(ana, cid, "fill the form", seen, asking))
        await asking.wait()
        asked = next(json.loads(e.data) for e in seen if e.event == "question")
        assert asked["tool_call_id"] == "e1"
        assert asked["options"] == [
            {"label": "Decline", "description": "Do not give the server this information"}]
        detail = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()
        [pending] = detail["pending"]["questions"]  # the same record as ask_question's: the web UI lists it
        assert (pending["question_id"], pending["status"]) == (asked["question_id"], "pending")
        path = f"/api/v1/chat/conversations/{cid}/questions/{asked['question_id']}"
        wrong = await ana.post(path, json={"answer": '{"name": 5}'})
        assert wrong.status_code == 422
        assert "name: 5 is not of type 'string'" in wrong.json()["error"]["message"]
        answered = await ana.post(path, json={"answer": '{"name": "Grace", "email": "grace@example.org"}'})
        assert answered.status_code == 200, answered.text
        await stream
        [result] = [json.loads(e.data) for e in seen if e.event == "tool_result"]
        assert "- Name: Grace" in result["result"]
        assert "- Email: grace@example.org" in result["result"]
        states = [json.loads(e.data)["state"] for e in seen if e.event == "status"]
        assert states[-2:] == ["working", "completed"]
        assert "input_required" in states
        record = await store.approvals.get(asked["question_id"])
        assert record is not None
        assert (record.status, record.decided_by) == ("answered", "ana")


async def test_resources_through_tools_and_mentions(everything: MCPToolset) -> None:
    from ringlet.context import RunContext

    ctx = RunContext(run_id="r_res", agent="a")
    tools = {t.name: t for t in await everything.list_tools(ctx)}
    assert {"everything_list_resources", "everything_read_resource"} <= set(tools)
    listed = await tools["everything_list_resources"].run({}, ctx)
    assert DOC in [r["uri"] for r in listed["resources"]]
    assert "demo://resource/dynamic/text/{resourceId}" in [t["uri_template"] for t in listed["templates"]]
    text = await tools["everything_read_resource"].run({"uri": DOC}, ctx)
    assert text.startswith("# Everything Server")
    assert mentions(f"see @everything:{DOC}, and @other:x://y", {"everything": everything}) == [("everything", DOC)]
    model = ScriptedModel(["read it"])
    agent = Agent(model, tools=[everything], execution=Execution(plugins=[MCPMentions([everything])]))
    result = await agent.run(f"Summarise @everything:{DOC}.")
    assert result.output == "read it"
    [user] = [m for m in model.requests[0].messages if m.role == "user"]
    assert f'<resource server="everything" uri="{DOC}">\n# Everything Server' in user.text
    assert result.state.messages[0].text == f"Summarise @everything:{DOC}."  # stored as written


async def test_prompts_are_listed_and_filled_in(everything: MCPToolset) -> None:
    prompts = {p.name: p for p in await everything.list_prompts()}
    assert {"simple-prompt", "args-prompt"} <= set(prompts)
    assert [a.name for a in prompts["args-prompt"].arguments] == ["city", "state"]
    [message] = await everything.get_prompt("args-prompt", {"city": "Lyon", "state": "Rhône"})
    assert message["role"] == "user"
    assert "Lyon" in message["content"]


async def test_progress_notifications_become_progress_events(everything: MCPToolset) -> None:
    model = ScriptedModel([call("trigger-long-running-operation", {"duration": 0.3, "steps": 3}, id="p1"), "ok"])
    events = [e async for e in Agent(model, tools=[everything]).stream("go")]
    progress = [e for e in events if isinstance(e, NotificationEvent) and e.level == "progress"]
    assert [(e.progress.current, e.progress.total) for e in progress if e.progress] == [(1, 3), (2, 3), (3, 3)]
    assert {(e.title, e.source) for e in progress} == {("trigger-long-running-operation", "everything")}
    [result] = [e for e in events if isinstance(e, ToolResultEvent)]
    assert events.index(progress[-1]) < events.index(result)  # live, while the call runs


# -- whose question: an elicitation reaches only the run whose call caused it ---------------------------------

BANK = '''
import asyncio
import sys

import anyio
from pydantic import BaseModel

from mcp.server.mcpserver import Context, MCPServer


class Confirm(BaseModel):
    confirm: bool


server = MCPServer("bank")
state: dict[str, asyncio.Event] = {}
heard: list[str] = []
joined: list[str] = []


def event(name: str) -> asyncio.Event:
    return state.setdefault(name, asyncio.Event())


@server.tool()
async def transfer(owner: str, amount: int, ctx: Context) -> str:
    """Asks nothing while the call is open: once the client has given up on it (cancelled, timed out) and
    another call is open (`hold`), it logs and elicits anyway."""
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await event("held").wait()
            await ctx.info(f"moving {amount} EUR for {owner}")
            result = await ctx.elicit(f"Confirm transfer of {amount} EUR from {owner}'s account?", Confirm)
            heard.append(result.action)
            event("heard").set()
        raise
    return "unreachable"


@server.tool()
async def hold(ctx: Context) -> str:
    """Stays open until the transfer's question was answered; says what its server received."""
    event("held").set()
    await event("heard").wait()
    return f"the transfer question got: {heard[0]}"


@server.tool()
async def confirm(owner: str, callers: int, ctx: Context) -> str:
    """Once `callers` calls are open at once, each asks about its own owner's transfer."""
    joined.append(owner)
    if len(joined) == callers:
        event("together").set()
    await event("together").wait()
    result = await ctx.elicit(f"Confirm the transfer from {owner}'s account?", Confirm)
    answer = result.data.confirm if result.action == "accept" else None
    return f"{owner}: {result.action} {answer}"


if sys.argv[1:2] == ["http"]:
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
else:
    server.run()
'''


@pytest.fixture
def bank(tmp_path: Any) -> list[str]:
    """The command line of a Python SDK server (`MCPServer`, FastMCP's successor) whose tools elicit."""
    script = tmp_path / "bank.py"
    script.write_text(BANK)
    return [sys.executable, str(script)]


@contextlib.asynccontextmanager
async def bank_at(bank: list[str], transport: str, timeout_s: float) -> AsyncIterator[MCPToolset]:
    """The bank server as a toolset, over stdio or streamable HTTP (a subprocess on a loopback port)."""
    if transport == "stdio":
        toolset = MCPToolset("bank", MCPServerConfig(command=bank[0], args=bank[1:], timeout_s=timeout_s))
        try:
            yield toolset
        finally:
            await toolset.aclose()
        return
    port = free_port()
    process = await asyncio.create_subprocess_exec(*bank, "http", str(port), stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    toolset = MCPToolset("bank", MCPServerConfig(url=f"http://127.0.0.1:{port}/mcp", timeout_s=timeout_s))
    try:
        async with asyncio.timeout(30):
            while str(port).encode() not in (line := await process.stderr.readline()):
                assert line, "the server exited before it listened"
        yield toolset
    finally:
        await toolset.aclose()
        process.kill()
        await process.wait()


async def streaming(agent: Agent, prompt: str, broker: ApprovalBroker, events: list[Any],
                    answered: asyncio.Event | None = None) -> None:
    """Run `agent` to its end, keeping its events; `answered` is set at its first tool result."""
    async for event in agent.stream(prompt, settings=RunSettings(approver=broker)):
        events.append(event)
        if answered is not None and isinstance(event, ToolResultEvent):
            answered.set()


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_question_after_its_call_timed_out_reaches_no_other_run(bank: list[str], transport: str) -> None:
    """The finding: A's call times out on ringlet's side, then the server asks A's question while B's call is
    the only one open. B never sees it (nor the server's log line about A's transfer), and the server
    receives `decline`."""
    async with bank_at(bank, transport, timeout_s=2) as toolset:
        ana = Agent(ScriptedModel([call("transfer", {"owner": "Ana", "amount": 500}, id="t1"), "gave up"]),
                    name="ana", tools=[toolset])
        bo = Agent(ScriptedModel([call("hold", {}, id="h1"), "held"]), name="bo", tools=[toolset])
        ana_broker, bo_broker = ApprovalBroker(), ApprovalBroker()
        ana_events: list[Any] = []
        bo_events: list[Any] = []
        timed_out = asyncio.Event()
        running = asyncio.create_task(streaming(ana, "pay", ana_broker, ana_events, timed_out))
        await timed_out.wait()  # A's call is over on ringlet's side; the server is still at it
        bo_says_yes = asyncio.create_task(answer_first(bo_broker, "Yes"))  # B would answer Yes if asked
        await streaming(bo, "hold on", bo_broker, bo_events)
        await running
        assert [e.is_error for e in ana_events if isinstance(e, ToolResultEvent)] == [True]  # timed out
        assert not [e for e in bo_events if isinstance(e, QuestionEvent)]
        assert not bo_broker.pending
        assert not bo_says_yes.done()
        [result] = [e for e in bo_events if isinstance(e, ToolResultEvent)]
        assert result.result == "the transfer question got: decline"
        assert not [e for e in bo_events if isinstance(e, NotificationEvent) and "EUR" in e.message]
        bo_says_yes.cancel()


async def two_runs_confirm(toolset: MCPToolset) -> tuple[list[Any], list[Any], list[str]]:
    """Ana's and Bo's runs each call `confirm` at once; Ana answers Yes to what she is asked, Bo No."""
    runs = [(name, Agent(ScriptedModel([call("confirm", {"owner": name, "callers": 2}, id=f"c_{name}"), "ok"]),
                         name=name.lower(), tools=[toolset]), ApprovalBroker()) for name in ("Ana", "Bo")]
    answers = {"Ana": "Yes", "Bo": "No"}
    asked: list[str] = []

    async def answering(name: str, broker: ApprovalBroker) -> None:
        [request] = await broker.wait_for_pending()
        asked.append(f"{name}: {request.question['question']}")
        broker.answer(request.approval_id, answers[name], answered_by=name)

    events: dict[str, list[Any]] = {"Ana": [], "Bo": []}
    humans = [asyncio.create_task(answering(name, broker)) for name, _, broker in runs]
    await asyncio.gather(*(streaming(agent, "confirm", broker, events[name]) for name, agent, broker in runs))
    for human in humans:
        human.cancel()
    return events["Ana"], events["Bo"], sorted(asked)


def tool_result(events: list[Any]) -> str:
    [result] = [e for e in events if isinstance(e, ToolResultEvent)]
    return result.result


async def test_calls_of_two_runs_open_at_once_each_question_reaches_its_own_run(bank: list[str]) -> None:
    """Over streamable HTTP each elicitation rides the response stream of the call it belongs to: both runs
    are asked their own question at once, and each answer goes back to its own call."""
    async with bank_at(bank, "http", timeout_s=30) as toolset:
        ana, bo, asked = await two_runs_confirm(toolset)
    assert asked == ["Ana: Confirm the transfer from Ana's account?", "Bo: Confirm the transfer from Bo's account?"]
    assert tool_result(ana) == "Ana: accept True"
    assert tool_result(bo) == "Bo: accept False"


async def test_over_stdio_calls_of_two_runs_open_at_once_are_both_declined(bank: list[str]) -> None:
    """stdio carries nothing that ties a server's request to one of two open calls: neither run is asked."""
    async with bank_at(bank, "stdio", timeout_s=30) as toolset:
        ana, bo, asked = await two_runs_confirm(toolset)
    assert asked == []
    assert (tool_result(ana), tool_result(bo)) == ("Ana: decline None", "Bo: decline None")


def test_what_names_the_call_a_server_message_concerns() -> None:
    """`Wire.origin` without a server: the response stream (the context it came with), a progress token in
    `_meta`, or on stdio the one request held; a call that is over, or no call named, is no call."""
    from contextvars import copy_context
    from types import SimpleNamespace

    from ringlet.mcp.wire import CALLING, InFlight, Wire

    toolset = MCPToolset("forms", MCPServerConfig(command="true"))
    ana, bo = (InFlight("fill", SimpleNamespace(run_id=run)) for run in ("r_ana", "r_bo"))  # type: ignore[arg-type]
    toolset.session.inflight += [ana, bo]
    stdio = Wire(toolset.session, linked=False)
    assert stdio.origin({}, None)[0] is None  # nothing held
    stdio.held["1"] = ana
    assert stdio.origin({}, None) == (ana, "")
    stdio.held["2"] = bo
    assert stdio.origin({}, None) == (None, "it names no call, and the server holds 2 requests, not one run's")
    ana_too = InFlight("fill", ana.ctx)
    toolset.session.inflight.append(ana_too)
    one_run = Wire(toolset.session, linked=False)
    one_run.held.update({"1": ana, "2": ana_too, "3": None})  # parallel calls of one run (and a listing)
    assert one_run.origin({}, None) == (ana, "")  # that run is asked (the server works for it alone)
    toolset.session.inflight.remove(ana_too)
    assert stdio.origin({"_meta": {"progressToken": 2}}, None) == (bo, "")
    assert stdio.origin({"_meta": {"progressToken": 7}}, None)[0] is None
    toolset.session.inflight.remove(bo)  # Bo's call timed out: the server may still be at it, but it is over here
    assert stdio.origin({"_meta": {"progressToken": 2}}, None) == (None, "its call (fill) is over: timed out or "
                                                                         "cancelled")
    del stdio.held["1"]
    assert stdio.origin({}, None)[0] is None  # the one request held is Bo's, which is over
    http = Wire(toolset.session, linked=True)
    http.held["1"] = ana
    assert http.origin({}, None) == (None, "it names no tool call")  # not on a call's stream: no guess
    on_ana_stream = copy_context()
    on_ana_stream.run(CALLING.set, ana)
    assert http.origin({}, on_ana_stream) == (ana, "")
