"""Sub-agents on the server (builtin-tools-and-subagents.md §6): the child's events nested in order in the
parent's SSE stream, its approval decided through the parent conversation, its conversation stored and
hidden from default lists, and cancelling the parent reaching the child."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ringlet import Agent, Gates, SubAgents, tool
from ringlet.gates import ApprovalRules
from ringlet.models.base import ModelRequest
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel, ScriptedModel, call
from serving import serving
from test_server import new_conversation
from test_server_approvals import client_for

shipped: list[str] = []


@tool(effect="write")
def ship(parcel: str) -> str:
    """Ship a parcel."""
    shipped.append(parcel)
    return f"shipped {parcel}"


def careful_model(request: ModelRequest) -> Any:
    if any(m.role == "tool" for m in request.messages):
        return "the parcel is on its way"
    return call("ship", {"parcel": "books"})


def lead_model(request: ModelRequest) -> Any:
    results = [m for m in request.messages if m.role == "tool"]
    if results:
        return f"child said: {results[-1].content}"
    return call("spawn_agent", {"task": "ship the books", "agent": "careful"}, id="s1")


@pytest.fixture
async def server(store: Store) -> AsyncIterator[tuple[str, Store]]:
    shipped.clear()
    careful = Agent(FunctionModel(careful_model), name="careful", tools=[ship],
                    gates=Gates(approvals=ApprovalRules({"ship": {"mode": "confirm"}})))
    lead = Agent(FunctionModel(lead_model), name="lead", tools=[SubAgents([careful])])
    hold = asyncio.Event()

    async def stuck(request: ModelRequest) -> str:
        await hold.wait()
        return "never"

    sleeper = Agent(FunctionModel(stuck), name="sleeper")
    boss = Agent(ScriptedModel([call("spawn_agent", {"task": "sleep", "agent": "sleeper"})]), name="boss",
                 tools=[SubAgents([sleeper])])
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=[lead, careful, boss, sleeper])
    async with serving(app) as url:
        yield url, store


async def test_child_events_nested_and_its_approval_decided_through_the_parent(server: tuple[str, Store]) -> None:
    url, store = server
    async with await client_for(url, store, "ana", ["chat", "approve"]) as ana:
        cid = (await new_conversation(ana, "lead"))["id"]
        seen: list[Any] = []
        waiting = asyncio.Event()
        stream = asyncio.create_task(follow_until_asked(ana, cid, seen, waiting))
        await waiting.wait()
        asked = next(json.loads(e.data) for e in seen if e.event == "approval_required")
        assert asked["agent_path"] == ["lead", "careful"]
        assert (asked["depth"], asked["parent_tool_call_id"]) == (1, "s1")
        listed = (await ana.get(f"/api/v1/chat/conversations/{cid}/approvals")).json()["data"]
        assert [a["approval_id"] for a in listed] == [asked["approval_id"]]  # under the parent conversation
        decided = await ana.post(f"/api/v1/chat/conversations/{cid}/approvals/{asked['approval_id']}",
                                 json={"approved": True})
        assert decided.status_code == 200, decided.text
        await stream
        events = [(e.event, json.loads(e.data)) for e in seen if e.event != "ping"]
        nested = [(kind, d) for kind, d in events if "agent_path" in d]
        kinds = [kind for kind, _ in nested]
        assert kinds[0] == "message_start"
        assert kinds[-1] == "message_end"
        assert kinds.index("approval_required") < kinds.index("tool_result")
        spawn_result = next(i for i, (kind, d) in enumerate(events) if kind == "tool_result" and
                            "agent_path" not in d)
        last_nested = max(i for i, (_, d) in enumerate(events) if "agent_path" in d)
        assert last_nested < spawn_result  # the child's events come before the call's own result
        assert events[-1][0] == "message_end"
        assert "agent_path" not in events[-1][1]
        answer = "".join(d["delta"] for kind, d in events if kind == "content_delta" and "agent_path" not in d)
        assert answer == "child said: the parcel is on its way"
        assert shipped == ["books"]
        default = (await ana.get("/api/v1/chat/conversations")).json()["data"]
        assert [c["id"] for c in default] == [cid]
        everything = (await ana.get("/api/v1/chat/conversations?include_sub_agents=true")).json()["data"]
        child = next(c for c in everything if c["id"] != cid)
        assert child["is_sub_agent"] is True
        assert (child["agent"], child["parent_conversation_id"], child["parent_tool_call_id"]) == \
            ("careful", cid, "s1")
        transcript = (await ana.get(f"/api/v1/chat/conversations/{child['id']}")).json()["messages"]
        assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "assistant"]
        assert transcript[0]["metadata"]["source"] == "sub_agent"


async def follow_until_asked(client: Any, cid: str, seen: list[Any], asked: asyncio.Event) -> None:
    from httpx_sse import aconnect_sse

    async with aconnect_sse(client, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                            json={"content": "ship it"}) as source:
        async for event in source.aiter_sse():
            seen.append(event)
            if event.event == "approval_required":
                asked.set()
            if event.event == "message_end" and "agent_path" not in json.loads(event.data):
                return


async def test_cancelling_the_parent_cancels_the_child(server: tuple[str, Store]) -> None:
    url, store = server
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        cid = (await new_conversation(ana, "boss"))["id"]
        seen: list[Any] = []
        started = asyncio.Event()

        async def follow() -> None:
            from httpx_sse import aconnect_sse

            async with aconnect_sse(ana, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                    json={"content": "go"}) as source:
                async for event in source.aiter_sse():
                    seen.append(event)
                    data = json.loads(event.data) if event.event != "ping" else {}
                    if event.event == "status" and data.get("agent_path") and data["state"] == "working":
                        started.set()
                    if event.event == "message_end" and "agent_path" not in data:
                        return

        following = asyncio.create_task(follow())
        await started.wait()
        assert (await ana.post(f"/api/v1/chat/conversations/{cid}/cancel")).status_code == 202
        await following
        ends = [json.loads(e.data) for e in seen if e.event == "message_end"]
        assert [(e.get("agent_path"), e["finish_reason"]) for e in ends] == [
            (["boss", "sleeper"], "cancelled"), (None, "cancelled")]
        children = [c for c in (await ana.get("/api/v1/chat/conversations?include_sub_agents=true")).json()["data"]
                    if c["id"] != cid]
        transcript = (await ana.get(f"/api/v1/chat/conversations/{children[0]['id']}")).json()["messages"]
        assert [m["role"] for m in transcript] == ["user"]  # kept, though the child never answered
