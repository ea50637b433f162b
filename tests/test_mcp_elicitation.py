"""The rest of the MCP client protocol against `server-everything`: elicitation as a ringlet question
(library and server, accept and decline), resources (tools and `@server:uri` mentions), prompts, progress."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ringlet import Agent
from ringlet.agent.config import MCPMentions
from ringlet.agent.settings import Execution, RunHost
from ringlet.events import NotificationEvent, QuestionEvent, StatusEvent, ToolResultEvent
from ringlet.gates import ApprovalBroker
from ringlet.mcp.client import MCPServerConfig, MCPToolset
from ringlet.mcp.elicit import question_for, result_of
from ringlet.mcp.mentions import mentions
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import ScriptedModel, call
from ringlet.tools.question import check_answer
from serving import serving
from test_mcp_client import EVERYTHING
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
    events = [e async for e in eliciting(everything).stream("fill the form", approver=broker)]
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
    events = [e async for e in eliciting(everything).stream("fill the form", approver=broker)]
    await answering
    [result] = [e for e in events if isinstance(e, ToolResultEvent)]
    assert "User declined" in result.result
    # no one to ask (a CLI run without a terminal): declined at once, no question asked
    events = [e async for e in eliciting(everything).stream("fill", approver=broker, host=RunHost(humans=False))]
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
        record = await store.get_approval(asked["question_id"])
        assert record is not None
        assert (record["status"], record["decided_by"]) == ("answered", "ana")


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


def test_a_server_request_during_calls_of_several_runs_reaches_none_of_them() -> None:
    """One toolset serves every conversation of a hosted agent: a question goes to a run only when every
    open call serves that run, never to another user's run by guess."""
    from types import SimpleNamespace

    from ringlet.mcp.client import MCPServerConfig, _InFlight

    toolset = MCPToolset("forms", MCPServerConfig(command="true"))
    assert toolset._asker() is None  # no call open
    ana = _InFlight("fill", SimpleNamespace(run_id="r_ana"))  # type: ignore[arg-type]
    toolset._inflight += [ana, _InFlight("fill", SimpleNamespace(run_id="r_ana"))]  # type: ignore[arg-type]
    assert toolset._asker() is ana
    toolset._inflight.append(_InFlight("fill", SimpleNamespace(run_id="r_bo")))  # type: ignore[arg-type]
    assert toolset._asker() is None
