"""Questions on the server (builtin-tools-and-subagents.md §3, server-contract.md §5): the run pauses
durably on `ask_question`, the answer comes through `POST …/questions/{id}` (checked: 422) or a chat
message, and a pending question survives a server restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from ringlet import Agent
from ringlet.models.base import ModelRequest
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from ringlet.tools.builtin.question import ask_question_tool
from serving import openai_model, serving
from test_recovery import events_until_end, free_port, paused_then_killed, ringlet_serve
from test_server import new_conversation
from test_server_approvals import client_for, until_paused

COLOURS = [{"label": "red"}, {"label": "green"}, {"label": "blue"}]


def asking(request: ModelRequest) -> Any:
    """Asks which colours (multi-select, free text allowed), then says what the answer was."""
    results = [m for m in request.messages if m.role == "tool"]
    if results:
        return f"you said {results[-1].content}"
    return call("ask_question", {"question": "Which colours?", "input_type": "multi-select", "options": COLOURS},
                id="q1")


@pytest.fixture
async def server(store: Store) -> AsyncIterator[tuple[str, Store]]:
    agent = Agent(FunctionModel(asking), name="painter", tools=[ask_question_tool()])
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=[agent])
    async with serving(app) as url:
        yield url, store


async def test_answer_over_http_is_checked_and_resumes_the_stream(server: tuple[str, Store]) -> None:
    url, store = server
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        cid = (await new_conversation(ana, "painter"))["id"]
        seen: list[Any] = []
        paused = asyncio.Event()
        stream = asyncio.create_task(until_paused(ana, cid, "paint", seen, paused))
        await paused.wait()
        asked = next(json.loads(e.data) for e in seen if e.event == "question")
        assert asked["input_type"] == "multi-select"
        assert [o["label"] for o in asked["options"]] == ["red", "green", "blue"]
        detail = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()
        assert detail["conversation"]["status"] == "input_required"
        assert detail["pending"]["approvals"] == []
        [pending] = detail["pending"]["questions"]
        assert pending["question_id"] == asked["question_id"]
        assert (pending["question"], pending["status"], pending["tool_call_id"]) == ("Which colours?", "pending", "q1")
        assert (await ana.get("/api/v1/approvals")).json()["data"] == []  # questions are not approvals
        path = f"/api/v1/chat/conversations/{cid}/questions/{asked['question_id']}"
        wrong = await ana.post(path, json={"answer": ["red", "pink"]})
        assert wrong.status_code == 422
        assert "options: red, green, blue" in wrong.json()["error"]["message"]
        missing = await ana.post(f"/api/v1/chat/conversations/{cid}/questions/q_nope", json={"answer": "red"})
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "question_not_found"
        answered = await ana.post(path, json={"answer": ["red", "blue"]})
        assert answered.status_code == 200, answered.text
        assert answered.json() == {"question_id": asked["question_id"], "status": "answered"}
        await stream
        text = "".join(json.loads(e.data)["delta"] for e in seen if e.event == "content_delta")
        result = json.loads(text.removeprefix("you said "))
        assert result == {"question_id": asked["question_id"], "answer": ["red", "blue"], "freeform": False,
                          "answered_by": "ana"}
        again = await ana.post(path, json={"answer": ["red"]})
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "question_already_answered"


async def test_a_chat_message_answers_a_free_text_question(server: tuple[str, Store]) -> None:
    url, store = server
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        cid = (await new_conversation(ana, "painter"))["id"]
        seen: list[Any] = []
        paused = asyncio.Event()
        first = asyncio.create_task(until_paused(ana, cid, "paint", seen, paused))
        await paused.wait()
        rest: list[Any] = []
        async with aconnect_sse(ana, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                json={"content": "whatever is cheapest"}) as source:
            async for event in source.aiter_sse():
                if event.event != "ping":
                    rest.append(event)
                if event.event == "message_end":
                    break
        await first
        kinds = [e.event for e in rest]
        assert "message_start" not in kinds  # the same run, resumed
        assert kinds[-1] == "message_end"
        text = "".join(json.loads(e.data)["delta"] for e in rest if e.event == "content_delta")
        assert json.loads(text.removeprefix("you said "))["answer"] == "whatever is cheapest"
        assert json.loads(text.removeprefix("you said "))["freeform"] is True
        messages = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]


def ask_then_quote(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last = messages[-1]
    if last["role"] == "tool":
        return [{"role": "assistant", "content": f"Answer: {last['content']}"}]
    args = json.dumps({"question": "Deploy where?", "options": [{"label": "eu"}, {"label": "us"}],
                       "allow_freeform": False})
    return [{"role": "assistant", "tool_calls": [{"index": 0, "id": "call_q", "type": "function", "function": {
        "name": "ask_question", "arguments": args}}]}]


@pytest.mark.slow
async def test_a_question_answered_after_a_server_restart(tmp_path: Path) -> None:
    async with serving(openai_model(ask_then_quote)) as model_url:
        agent = tmp_path / "agents" / "ops"
        agent.mkdir(parents=True)
        (agent / "config.yaml").write_text(
            f"model: openai:m\nmodel_options: {{base_url: '{model_url}/v1', api_key: x}}\n")
        port, db = free_port(), tmp_path / "ringlet.db"
        base = f"http://127.0.0.1:{port}"
        cid, received = await paused_then_killed(port, db, tmp_path / "agents", "ops", "Deploy")
        asked = next(json.loads(e.data) for e in received if e.event == "question")
        async with ringlet_serve(port, db, tmp_path / "agents"), httpx.AsyncClient(base_url=base) as c:
            detail = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()
            assert [q["question_id"] for q in detail["pending"]["questions"]] == [asked["question_id"]]
            path = f"/api/v1/chat/conversations/{cid}/questions/{asked['question_id']}"
            invalid = await c.post(path, json={"answer": "mars"})  # no free text for this one
            assert invalid.status_code == 422
            answered = await c.post(path, json={"answer": "eu"})
            assert answered.status_code == 200, answered.text
            rest = await events_until_end(c, cid, received[-1].id)
            assert json.loads(rest[-1].data)["finish_reason"] == "end_turn"
            messages = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
            assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
            assert json.loads(messages[-1]["content"].removeprefix("Answer: "))["answer"] == "eu"
