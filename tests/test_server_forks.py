"""Forking a conversation over HTTP (issue 44): `POST /api/v1/chat/conversations/{id}/fork` at any message, with
an edited user message, a replaced tool result or a re-run tool call; the fork's origin in the list and the
detail; realms, keys and a running conversation; the original left untouched. A real uvicorn on loopback, the
store on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from ringlet import Agent, Gates, tool
from ringlet.gates import ApprovalRules
from ringlet.messages import Message
from ringlet.models import ModelRequest
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel, ScriptedCall, call
from serving import serving
from test_server import sse_events

looked_up: list[str] = []


@tool(effect="read")
def lookup(city: str) -> str:
    """The weather in a city."""
    looked_up.append(city)
    return f"sunny in {city}"


def weather(request: ModelRequest) -> str | ScriptedCall:
    """Looks the city up once per question, then repeats what the tool said."""
    last = request.messages[-1]
    if last.role == "user":
        return call("lookup", city=last.text.split()[-1].rstrip("?"))
    return f"told: {last.text} (after {len(request.messages)} messages)"


class Gate:
    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.open = asyncio.Event()

    async def stream(self, request: Any) -> AsyncIterator[str]:
        yield "thinking"
        self.entered.set()
        await self.open.wait()
        yield " done"


@pytest.fixture
async def server(store: Store) -> AsyncIterator[tuple[str, Store, Gate]]:
    looked_up.clear()
    gate = Gate()
    agents = [Agent(FunctionModel(weather), name="weather", tools=[lookup]),
              Agent(FunctionModel(weather), name="careful", tools=[lookup], gates=Gates(approvals=ApprovalRules(
                  {"lookup": {"mode": "confirm", "timeout_s": 60}}))),
              Agent(FunctionModel(gate.stream), name="slow")]
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=agents)
    async with serving(app) as url:
        yield url, store, gate


async def client_for(url: str, store: Store, **key: Any) -> httpx.AsyncClient:
    token, _ = await store.keys.create(key.pop("name", "k"), scopes=key.pop("scopes", ["chat", "approve"]), **key)
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


@pytest.fixture
async def client(server: tuple[str, Store, Gate]) -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(server[0], server[1], name="admin", scopes=["chat", "approve", "admin"]) as c:
        yield c


async def chat(client: httpx.AsyncClient, agent: str, *questions: str, realm: str | None = None) -> str:
    """A conversation with `agent` in which each question was asked and answered."""
    made = await client.post("/api/v1/chat/conversations", json={"agent": agent, **({"realm": realm} if realm else {})})
    assert made.status_code == 201, made.text
    cid = made.json()["id"]
    for q in questions:
        sent = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": q},
                                 headers={"Accept": "application/json"})
        assert sent.json()["status"] == "completed", sent.text
    return cid


async def transcript(client: httpx.AsyncClient, cid: str) -> list[dict[str, Any]]:
    got = await client.get(f"/api/v1/chat/conversations/{cid}")
    assert got.status_code == 200, got.text
    return got.json()["messages"]


async def fork(client: httpx.AsyncClient, cid: str, **body: Any) -> dict[str, Any]:
    made = await client.post(f"/api/v1/chat/conversations/{cid}/fork", json=body)
    assert made.status_code == 201, made.text
    return made.json()


async def run_events(client: httpx.AsyncClient, cid: str) -> list[Any]:
    """The fork's event log from its start (`Last-Event-ID: 0`), to its run's message_end."""
    return await sse_events(client, "GET", f"/api/v1/chat/conversations/{cid}/events",
                            headers={"Last-Event-ID": "0"})


def texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    def text(m: dict[str, Any]) -> str:
        content = m["content"]
        return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    return [(m["role"], text(m)) for m in messages]


async def test_fork_at_a_message_copies_up_to_it_and_lists_like_any_conversation(
        client: httpx.AsyncClient) -> None:
    cid = await chat(client, "weather", "Weather in Paris?", "Weather in Rome?")
    original = await transcript(client, cid)
    at = original[3]  # the first answer
    made = await fork(client, cid, at_message_id=at["id"])
    new = made["conversation"]
    assert made["run_id"] is None
    assert new["forked_from"] == {"conversation_id": cid, "message_id": at["id"]}
    assert new["id"] != cid
    assert new["status"] == "idle"
    assert texts(made["messages"]) == texts(original[:4])
    assert not {m["id"] for m in made["messages"]} & {m["id"] for m in original}  # new ids
    assert [m["metadata"]["copied_from"] for m in made["messages"]] == [m["id"] for m in original[:4]]
    assert await transcript(client, cid) == original  # the original untouched
    listed = {c["id"]: c for c in (await client.get("/api/v1/chat/conversations")).json()["data"]}
    assert listed[new["id"]]["forked_from"] == new["forked_from"]
    assert listed[cid]["forked_from"] is None
    assert (listed[cid]["title"], listed[new["id"]]["title"]) == ("Weather in Paris?", "Weather in Paris? (fork)")
    again = (await fork(client, new["id"], at_message_id=made["messages"][1]["id"]))["conversation"]
    assert again["title"] == "Weather in Paris? (fork 2)"  # a fork of a fork: told apart from both
    detail = (await client.get(f"/api/v1/chat/conversations/{new['id']}")).json()
    assert detail["conversation"]["forked_from"] == new["forked_from"]
    # the fork goes on like any conversation: the model sees the copy, and the original's log stays its own
    sent = await client.post(f"/api/v1/chat/conversations/{new['id']}/messages", json={"content": "Weather in Oslo?"},
                             headers={"Accept": "application/json"})
    assert sent.json()["message"]["content"] == "told: sunny in Oslo (after 7 messages)"
    events = await run_events(client, new["id"])
    assert events[0].event == "message_start"
    assert events[0].id == "1"
    assert json.loads(events[0].data)["conversation_id"] == new["id"]
    assert await transcript(client, cid) == original


async def test_edit_a_user_message_and_run_from_there(client: httpx.AsyncClient) -> None:
    cid = await chat(client, "weather", "Weather in Paris?", "Weather in Rome?")
    original = await transcript(client, cid)
    made = await fork(client, cid, at_message_id=original[4]["id"], edit={"content": "Weather in Lima?"})
    new = made["conversation"]["id"]
    assert made["run_id"].startswith("r_")
    assert texts(made["messages"])[-1] == ("user", "Weather in Lima?")
    assert made["messages"][-1]["metadata"]["edited_from"] == original[4]["id"]
    events = await run_events(client, new)
    assert events[-1].event == "message_end"
    assert {json.loads(e.data)["run_id"] for e in events} == {made["run_id"]}
    assert texts(await transcript(client, new)) == [*texts(original[:4]), ("user", "Weather in Lima?"),
                                                   ("assistant", ""), ("tool", "sunny in Lima"),
                                                   ("assistant", "told: sunny in Lima (after 7 messages)")]
    assert made["conversation"]["title"] == "Weather in Lima?"  # the edited message names it, not the original's
    run = (await client.get(f"/api/v1/runs/{made['run_id']}")).json()
    assert run["conversation_id"] == new
    assert run["status"] == "completed"
    assert await transcript(client, cid) == original
    assert looked_up == ["Paris", "Rome", "Lima"]


async def test_a_replaced_tool_result_is_never_run_and_the_model_goes_on(client: httpx.AsyncClient) -> None:
    cid = await chat(client, "weather", "Weather in Paris?")
    original = await transcript(client, cid)
    result = original[2]
    assert result["role"] == "tool"
    made = await fork(client, cid, at_message_id=result["id"], tool_result={"content": "snowing in Paris"})
    events = await run_events(client, made["conversation"]["id"])
    assert [e.event for e in events if e.event.startswith("tool")] == []  # nothing ran
    assert texts(await transcript(client, made["conversation"]["id"])) == [
        ("user", "Weather in Paris?"), ("assistant", ""), ("tool", "snowing in Paris"),
        ("assistant", "told: snowing in Paris (after 3 messages)")]
    assert looked_up == ["Paris"]
    replaced = (await transcript(client, made["conversation"]["id"]))[2]
    assert replaced["metadata"]["replaced"] is True
    assert replaced["metadata"]["replaces"] == result["id"]


async def test_rerun_runs_the_call_again_through_the_approval_gate(client: httpx.AsyncClient) -> None:
    cid = await chat(client, "weather", "Weather in Paris?")
    asked = (await transcript(client, cid))[1]
    made = await fork(client, cid, at_message_id=asked["id"], rerun=True)
    events = await run_events(client, made["conversation"]["id"])
    tools = [e for e in events if e.event.startswith("tool")]  # announced as a model's call would be
    assert [e.event for e in tools] == ["tool_call_start", "tool_call_delta", "tool_result"]
    assert json.loads(tools[1].data)["args_delta"] == '{"city": "Paris"}'
    assert looked_up == ["Paris", "Paris"]
    assert texts(await transcript(client, made["conversation"]["id"]))[-1] == (
        "assistant", "told: sunny in Paris (after 3 messages)")

    careful = await chat(client, "careful")  # a call that needs approval: the fork's run asks again
    await client.post(f"/api/v1/chat/conversations/{careful}/messages", json={"content": "Weather in Nuuk?"},
                      headers={"Accept": "application/json"})
    call_message = (await transcript(client, careful))[1]
    approval = (await client.get(f"/api/v1/chat/conversations/{careful}/approvals")).json()["data"][0]
    decided = await client.post(f"/api/v1/chat/conversations/{careful}/approvals/{approval['approval_id']}",
                                json={"approved": True})
    assert decided.status_code == 200, decided.text
    await sse_events(client, "GET", f"/api/v1/chat/conversations/{careful}/events", headers={"Last-Event-ID": "0"})
    assert looked_up == ["Paris", "Paris", "Nuuk"]
    again = await fork(client, careful, at_message_id=call_message["id"], rerun=True)
    new = again["conversation"]["id"]
    seen = [event async for event in _until_status(client, new, "input_required")]
    assert "approval_required" in seen
    assert looked_up == ["Paris", "Paris", "Nuuk"]  # not run before a human says so
    pending = (await client.get(f"/api/v1/chat/conversations/{new}")).json()["pending"]["approvals"]
    assert [a["tool_call_id"] for a in pending] == [call_message["tool_calls"][0]["id"]]


async def _until_status(client: httpx.AsyncClient, cid: str, state: str) -> AsyncIterator[str]:
    async with aconnect_sse(client, "GET", f"/api/v1/chat/conversations/{cid}/events",
                            headers={"Last-Event-ID": "0"}) as source:
        async for event in source.aiter_sse():
            yield event.event
            if event.event == "status" and json.loads(event.data)["state"] == state:
                return


async def test_forks_that_cannot_be_made_are_refused(client: httpx.AsyncClient,
                                                     server: tuple[str, Store, Gate]) -> None:
    cid = await chat(client, "weather", "Weather in Paris?")
    messages = await transcript(client, cid)
    url = f"/api/v1/chat/conversations/{cid}/fork"
    unknown = await client.post(url, json={"at_message_id": "m_nope"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "message_not_found"
    assert "m_nope" in unknown.json()["error"]["message"]
    not_user = await client.post(url, json={"at_message_id": messages[3]["id"], "edit": {"content": "x"}})
    assert not_user.status_code == 422
    assert "only a user message can be edited" in not_user.json()["error"]["message"]
    both = await client.post(url, json={"at_message_id": messages[2]["id"], "rerun": True,
                                        "tool_result": {"content": "x"}})
    assert both.status_code == 422
    assert "not both" in both.json()["error"]["message"]
    no_call = await client.post(url, json={"at_message_id": messages[0]["id"], "rerun": True})
    assert no_call.status_code == 422
    assert (await client.post(url, json={"at_message_id": messages[0]["id"], "extra": 1})).status_code == 422
    assert (await client.post("/api/v1/chat/conversations/c_nope/fork",
                              json={"at_message_id": messages[0]["id"]})).status_code == 404
    listed = (await client.get("/api/v1/chat/conversations")).json()["data"]
    assert [c["id"] for c in listed] == [cid]  # no refused fork left a conversation behind

    gate = server[2]  # a running conversation: 409, as for its other routes
    slow = await chat(client, "slow")
    sending = asyncio.create_task(client.post(f"/api/v1/chat/conversations/{slow}/messages", json={"content": "hi"},
                                              headers={"Accept": "application/json"}))
    await gate.entered.wait()
    first = (await transcript(client, slow))[0]
    busy = await client.post(f"/api/v1/chat/conversations/{slow}/fork", json={"at_message_id": first["id"]})
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "run_in_progress"
    gate.open.set()
    assert (await sending).json()["status"] == "completed"
    assert (await client.post(f"/api/v1/chat/conversations/{slow}/fork",
                              json={"at_message_id": first["id"]})).status_code == 201


async def test_realms_and_keys_hold_for_forks(client: httpx.AsyncClient, server: tuple[str, Store, Gate]) -> None:
    url, store, _ = server
    red = await chat(client, "weather", "Weather in Paris?", realm="red")
    first = (await transcript(client, red))[0]
    async with await client_for(url, store, name="blue", realms=["blue"]) as blue, \
            await client_for(url, store, name="careful-only", agents=["careful"]) as careful, \
            await client_for(url, store, name="approver", scopes=["approve"]) as approver:
        for other in (blue, careful):  # another realm's, another agent's: as unknown as a made-up id
            refused = await other.post(f"/api/v1/chat/conversations/{red}/fork",
                                       json={"at_message_id": first["id"], "edit": {"content": "Weather in Oslo?"}})
            assert refused.status_code == 404
            assert refused.json()["error"]["code"] == "conversation_not_found"
        no_chat = await approver.post(f"/api/v1/chat/conversations/{red}/fork", json={"at_message_id": first["id"]})
        assert no_chat.status_code == 403
    made = await fork(client, red, at_message_id=first["id"])
    assert made["conversation"]["realm"] == "red"
    assert looked_up == ["Paris"]


async def test_a_copy_keeps_a_compaction_s_references_among_its_new_ids(store: Store) -> None:
    source = await store.conversations.create(agent="weather", title="long")
    old = [Message.user("a"), Message.assistant("b")]
    note = Message.system("<compacted>a, b</compacted>", kind="compaction", covers=[m.id for m in old])
    covered = [Message(id=m.id, role=m.role, content=m.content, metadata={"compacted_into": note.id}) for m in old]
    transcript = [*covered, note, Message.user("c")]
    await store.conversations.append_messages(source.id, transcript)
    forked = await store.conversations.fork(source, transcript[-1].id, transcript, org_id=None, user_id=None)
    copied = await store.conversations.load_messages(forked.id)
    ids = [m.id for m in copied]
    assert not set(ids) & {m.id for m in transcript}
    assert [m.metadata.get("compacted_into") for m in copied[:2]] == [ids[2], ids[2]]
    assert copied[2].metadata["covers"] == ids[:2]
    assert forked.forked_from == {"conversation_id": source.id, "message_id": transcript[-1].id}
    assert [m.id for m in await store.conversations.load_messages(source.id)] == [m.id for m in transcript]
