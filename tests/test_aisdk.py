"""The AI SDK route over HTTP (`/ai-sdk/{agent}`): the stream's framing, the request's checks, and the
security rules (keys, scopes, realms, agents) as on every route; and the chunk table (`Chunks`) on events
the client tests cannot make happen at will (a retraction, a graph's question, arguments never whole).
The real client (`ai`'s chat) is driven in tests/test_conformance_aisdk.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ringlet import Agent, Gates
from ringlet.gates import ApprovalRules
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog, HostedGraph
from ringlet.server.protocols.aisdk.chunks import Chunks
from ringlet.store import Store
from ringlet.testing import FunctionModel
from serving import serving
from test_agui import COUNTER, COUNTER_FILES, GATE, GATE_FILES, deploy, deployed, deploying
from test_graph_support import make_graph
from test_server_approvals import client_for


@pytest.fixture
async def url(store: Store, tmp_path: Path) -> AsyncIterator[str]:
    deployed.clear()
    agents = [Agent(FunctionModel(lambda request: "Hello from ringlet"), name="talker"),
              Agent(FunctionModel(deploying), name="ops", tools=[deploy], gates=Gates(approvals=ApprovalRules(
                  {"deploy": {"mode": "confirm", "timeout_s": 60}})))]
    graphs = [make_graph(tmp_path / "agents", COUNTER, name="counter", files=COUNTER_FILES),
              make_graph(tmp_path / "agents", GATE, name="gate", files=GATE_FILES)]
    catalog = Catalog([*(HostedGraph.at(g) for g in graphs), *Catalog.of(agents).hosted.values()])
    async with serving(create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=catalog)) as base:
        yield base


def user(id: str, text: str) -> dict[str, Any]:
    return {"id": id, "role": "user", "parts": [{"type": "text", "text": text}]}


def chat(id: str, *messages: dict[str, Any]) -> dict[str, Any]:
    return {"id": id, "messages": list(messages), "trigger": "submit-message", "messageId": None}


async def chunks(client: httpx.AsyncClient, agent: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every chunk of one response; the stream is a v1 UI message stream ending `data: [DONE]`."""
    lines = []
    async with client.stream("POST", f"/ai-sdk/{agent}", json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def error_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def test_the_stream_and_a_reconnect(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        body = chat("chat-1", user("u1", "hi"))
        first = await chunks(ana, "talker", body)
        assert [c["type"] for c in first] == ["start", "start-step", "text-start", "text-delta", "text-end",
                                              "finish-step", "finish"]
        assert first[-1]["messageMetadata"]["usage"]["inputTokens"] > 0
        again = await chunks(ana, "talker", body)  # nothing new: an empty message, no run
        assert [c["type"] for c in again] == ["start", "finish"]
        cid = first[0]["messageMetadata"]["ringlet"]["conversation_id"]
        stored = await store.conversations.load_messages(cid)
        assert [(m.role, m.metadata.get("ai_sdk_id")) for m in stored] == [("user", "u1"), ("assistant", None)]


async def test_bad_requests_name_the_field(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        assert error_of(await ana.post("/ai-sdk/talker", content=b"{")) == (400, "invalid_request")
        cases = [({"messages": []}, "body.id"),
                 (chat("has space", user("u1", "hi")), "body.id"),
                 ({**chat("c", user("u1", "hi")), "trigger": "regenerate-message"}, "body.trigger"),
                 (chat("c", {"id": "u1", "role": "user", "parts": [{"type": "data-x", "data": 1}]}),
                  "body.messages.0.parts.0"),
                 (chat("c", {"id": "u1", "role": "user", "parts": [
                     {"type": "file", "mediaType": "image/png", "url": "data:image/png,raw"}]}),
                  "body.messages.0.parts.0.url")]
        for body, loc in cases:
            response = await ana.post("/ai-sdk/talker", json=body)
            assert error_of(response) == (422, "validation_error"), response.json()
            assert response.json()["error"]["details"]["errors"][0]["loc"] == loc
        assert error_of(await ana.post("/ai-sdk/nobody", json=chat("c", user("u1", "hi")))) == (404, "agent_not_found")


async def test_keys_scopes_realms_and_agents(url: str, store: Store) -> None:
    async with httpx.AsyncClient(base_url=url) as anonymous:
        assert error_of(await anonymous.post("/ai-sdk/talker", json=chat("c", user("u1", "hi")))) == (
            401, "unauthorized")
    async with await client_for(url, store, "metrics", ["metrics"]) as metrics:
        assert error_of(await metrics.post("/ai-sdk/talker", json=chat("c", user("u1", "hi")))) == (403, "forbidden")
    key, _ = await store.keys.create("only-ops", scopes=["chat"], agents=["ops"])
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as only_ops:
        assert error_of(await only_ops.post("/ai-sdk/talker", json=chat("c", user("u1", "hi")))) == (403, "forbidden")
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        mine = (await chunks(ana, "talker", chat("shared", user("u1", "mine"))))[0]["messageMetadata"]["ringlet"]
    key, _ = await store.keys.create("elsewhere", scopes=["chat"], realms=["other"])
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as elsewhere:
        for name in ("shared", mine["conversation_id"]):  # another realm's chat id or conversation: its own
            theirs = (await chunks(elsewhere, "talker", chat(name, user("u1", "theirs"))))[0]["messageMetadata"]
            other = await store.conversations.get(theirs["ringlet"]["conversation_id"])
            assert other is not None
            assert (other.realm, other.client_id) == ("other", name)
    stored = await store.conversations.load_messages(mine["conversation_id"])
    assert [m.text for m in stored if m.role == "user"] == ["mine"]  # never reached from the other realm


async def test_approving_needs_the_approve_scope(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat", "approve"]) as ana, \
            await client_for(url, store, "viewer", ["chat"]) as viewer:
        asked = await chunks(ana, "ops", chat("ops-1", user("u1", "deploy web")))
        request = next(c for c in asked if c["type"] == "tool-approval-request")
        assert (asked[-1]["type"], asked[-1]["finishReason"]) == ("finish", "tool-calls")
        busy = await ana.post("/ai-sdk/ops", json=chat("ops-1", user("u1", "deploy web"), user("u2", "and api")))
        assert error_of(busy) == (409, "input_required")
        assert busy.json()["error"]["details"] == {"approvals": [request["approvalId"]]}

        def answered(approval_id: str) -> dict[str, Any]:
            part = {"type": "tool-deploy", "toolCallId": "c_deploy", "state": "approval-responded",
                    "input": {"service": "web"}, "approval": {"id": approval_id, "approved": True}}
            return chat("ops-1", user("u1", "deploy web"), {"id": "a1", "role": "assistant", "parts": [part]})

        assert error_of(await viewer.post("/ai-sdk/ops", json=answered(request["approvalId"]))) == (403, "forbidden")
        assert error_of(await ana.post("/ai-sdk/ops", json=answered("ap_nothing"))) == (404, "approval_not_found")
        assert deployed == []
        other = await chunks(ana, "ops", chat("ops-2", user("u1", "deploy web")))  # another conversation's
        other_request = next(c for c in other if c["type"] == "tool-approval-request")
        assert error_of(await ana.post("/ai-sdk/ops", json=answered(other_request["approvalId"]))) == (
            404, "approval_not_found")
        done = await chunks(ana, "ops", answered(request["approvalId"]))
        assert [c["output"] for c in done if c["type"] == "tool-output-available"] == ["deployed web"]
        assert deployed == ["web"]
        again = await chunks(ana, "ops", answered(request["approvalId"]))  # decided: history, nothing runs
        assert [c["type"] for c in again] == ["start", "finish"]


async def test_a_graphs_answer_and_its_question(url: str, store: Store) -> None:
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        counted = await chunks(ana, "counter", chat("graph-1", user("u1", "count")))
        assert "".join(c["delta"] for c in counted if c["type"] == "text-delta") == "n=2"
        asked = await chunks(ana, "gate", chat("graph-2", user("u1", "books")))
        shown, request = asked[-4:-2]
        assert (shown["type"], shown["toolName"], shown["dynamic"]) == ("tool-input-available", "question", True)
        assert shown["input"]["question"] == "Ship 'books'?"
        assert request == {"type": "tool-approval-request", "approvalId": shown["toolCallId"],
                           "toolCallId": shown["toolCallId"]}
        part = {"type": "dynamic-tool", "toolName": "question", "toolCallId": shown["toolCallId"],
                "state": "approval-responded", "input": shown["input"],
                "approval": {"id": request["approvalId"], "approved": True, "reason": "ship"}}
        answered = await chunks(ana, "gate", chat("graph-2", user("u1", "books"),
                                                  {"id": "a1", "role": "assistant", "parts": [part]}))
        assert "".join(c["delta"] for c in answered if c["type"] == "text-delta") == "decided: ship"
        assert answered[-1]["finishReason"] == "stop"


def fed(chunks: Chunks, *events: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for kind, payload in events for c in chunks.feed(kind, payload)]


def test_a_retracted_attempt_leaves_the_step() -> None:
    chunks = Chunks(run_id="r_1", conversation_id="c_1")
    out = fed(chunks, ("content_delta", {"message_id": "m1", "delta": "Hel"}),
              ("tool_call_start", {"tool_call_id": "t1", "name": "add", "index": 0}),
              ("tool_call_delta", {"tool_call_id": "t1", "args_delta": '{"a": 1'}),
              ("tool_result", {"tool_call_id": "t1", "name": "add", "is_error": True,
                               "error": {"code": "superseded", "message": "resent"}}),
              ("retracted", {"message_id": "m1", "tool_call_ids": ["t1"]}),
              ("content_delta", {"message_id": "m1", "delta": "Hello"}))
    assert [c["type"] for c in out] == ["start-step", "text-start", "text-delta", "text-end", "tool-input-start",
                                        "tool-input-delta", "tool-input-available", "tool-output-error",
                                        "reset-step", "text-start", "text-delta"]  # the same step goes on
    assert out[6]["input"] == '{"a": 1'  # never whole: the text as it came, when the round's streaming ended


def test_a_question_no_tool_call_asked_gets_a_part_of_its_own() -> None:
    chunks = Chunks(run_id="r_1", conversation_id="c_1")
    question = {"question_id": "q_1", "question": "Ship?", "input_type": "text", "node_id": "ask"}
    out = fed(chunks, ("question", question), ("question", question))  # asked once, however often it comes
    assert out == [{"type": "tool-input-available", "toolCallId": "q_1", "toolName": "question", "input": question,
                    "dynamic": True},
                   {"type": "tool-approval-request", "approvalId": "q_1", "toolCallId": "q_1"}]
