"""The HTTP server (issue #4, server-contract.md): a real uvicorn on loopback, real HTTP clients, the
store on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from ringlet import Agent, tool
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from serving import serving


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class Gate:
    """A model whose answer waits until the test opens the gate."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.open = asyncio.Event()

    async def stream(self, request: Any) -> AsyncIterator[str]:
        yield "thinking"
        self.entered.set()
        await self.open.wait()
        yield " done"


def adding(request: Any) -> Any:
    """Calls `add` for a new question, answers once the result is in."""
    return "The sum is 5." if request.messages[-1].role == "tool" else call("add", a=2, b=3)


def agents(gate: Gate | None = None) -> list[Agent]:
    return [
        Agent(FunctionModel(adding), name="adder", tools=[add], instructions="Add numbers."),
        Agent(FunctionModel((gate or Gate()).stream), name="slow"),
    ]


@pytest.fixture
async def server(store: Store) -> AsyncIterator[tuple[str, Store, Gate]]:
    gate = Gate()
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=agents(gate))
    async with serving(app) as url:
        yield url, store, gate


@pytest.fixture
async def admin_key(server: tuple[str, Store, Gate]) -> str:
    key, _ = await server[1].keys.create("admin", scopes=["chat", "approve", "trigger", "admin"])
    return key


@pytest.fixture
async def client(server: tuple[str, Store, Gate], admin_key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server[0], headers={"Authorization": f"Bearer {admin_key}"},
                                 timeout=30) as c:
        yield c


async def sse_events(client: httpx.AsyncClient, method: str, url: str, *, until_end: bool = True,
                     **kwargs: Any) -> list[Any]:
    seen = []
    async with aconnect_sse(client, method, url, **kwargs) as source:
        assert source.response.status_code == 200, await source.response.aread()
        async for event in source.aiter_sse():
            if event.event == "ping":  # keepalives: how many depends on how soon the run starts (queued on
                continue  # the engine, with PostgreSQL)
            seen.append(event)
            if until_end and event.event == "message_end":
                break
    return seen


async def new_conversation(client: httpx.AsyncClient, agent: str = "adder", **fields: Any) -> dict[str, Any]:
    response = await client.post("/api/v1/chat/conversations", json={"agent": agent, **fields})
    assert response.status_code == 201, response.text
    return response.json()


# -- meta, errors and auth ---------------------------------------------------------------------------------


async def test_health_ready_and_request_ids(server: tuple[str, Store, Gate]) -> None:
    async with httpx.AsyncClient(base_url=server[0]) as c:
        health = await c.get("/healthz")
        assert health.json() == {"status": "ok"}
        assert health.headers["x-request-id"].startswith("req_")
        assert (await c.get("/readyz")).status_code == 200
        echoed = await c.get("/api/v1/agents", headers={"X-Request-Id": "trace-42"})
        assert echoed.headers["x-request-id"] == "trace-42"
        assert echoed.json()["error"]["request_id"] == "trace-42"


async def test_auth_failures_are_401_and_403(server: tuple[str, Store, Gate]) -> None:
    url, store, _ = server
    chat_only, _ = await store.keys.create("c", scopes=["chat"], realms=["blue"])
    expired, record = await store.keys.create("e", scopes=["chat"], expires_in_days=1)
    revoked, revoked_record = await store.keys.create("r", scopes=["chat"])
    await store.keys.revoke(revoked_record.id)
    async with httpx.AsyncClient(base_url=url) as c:
        missing = await c.get("/api/v1/agents")
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"]["code"] == "unauthorized"
        for bad in ("rk_nope", revoked):
            assert (await c.get("/api/v1/agents", headers={"Authorization": f"Bearer {bad}"})).status_code == 401
        async with store.engine.begin() as conn:  # expire the key
            from ringlet.store.schema import api_keys

            await conn.execute(api_keys.update().where(api_keys.c.id == record.id)
                               .values(expires_at="2000-01-01T00:00:00.000Z"))
        assert (await c.get("/api/v1/agents", headers={"Authorization": f"Bearer {expired}"})).status_code == 401
        headers = {"Authorization": f"Bearer {chat_only}"}
        no_scope = await c.post("/api/v1/triggers", headers=headers, json={"name": "t", "agent": "adder",
                                                                           "kind": "webhook"})
        assert no_scope.status_code == 403
        assert no_scope.json()["error"]["code"] == "forbidden"
        other_realm = await c.post("/api/v1/chat/conversations", headers=headers,
                                   json={"agent": "adder", "realm": "red"})
        assert other_realm.status_code == 403
        assert other_realm.json()["error"]["code"] == "realm_forbidden"
        mine = await c.post("/api/v1/chat/conversations", headers=headers, json={"agent": "adder", "realm": "blue"})
        assert mine.status_code == 201


async def test_one_key_cannot_read_another_realms_conversation(server: tuple[str, Store, Gate]) -> None:
    url, store, _ = server
    red, _ = await store.keys.create("red", scopes=["chat"], realms=["red"])
    blue, _ = await store.keys.create("blue", scopes=["chat"], realms=["blue"])
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {red}"}) as c:
        cid = (await new_conversation(c, realm="red"))["id"]
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {blue}"}) as c:
        hidden = await c.get(f"/api/v1/chat/conversations/{cid}")  # the answer for an unknown id: no oracle
        unknown = await c.get("/api/v1/chat/conversations/c_unknown")
        assert (hidden.status_code, hidden.json()["error"]["code"]) == (404, "conversation_not_found")
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "conversation_not_found")
        assert "red" not in hidden.text
        assert (await c.get("/api/v1/chat/conversations")).json()["data"] == []
        sent = await c.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "hi"})
        assert sent.status_code == 404
        for path in ("events", "context", "approvals"):
            assert (await c.get(f"/api/v1/chat/conversations/{cid}/{path}")).status_code == 404


async def test_auth_mode_none_only_on_loopback() -> None:
    from ringlet.errors import ConfigError

    ServerSettings(auth_mode="none", host="127.0.0.1").check()
    ServerSettings(auth_mode="none", host="::1").check()
    with pytest.raises(ConfigError, match="loopback"):
        ServerSettings(auth_mode="none", host="0.0.0.0").check()
    with pytest.raises(ConfigError, match="loopback"):
        create_app(ServerSettings(auth_mode="none", host="10.1.2.3"), agents=[])


async def test_errors_have_the_contract_shape(client: httpx.AsyncClient) -> None:
    invalid = await client.post("/api/v1/chat/conversations", json={"agent": ""})
    assert invalid.status_code == 422
    error = invalid.json()["error"]
    assert error["code"] == "validation_error"
    assert error["details"]["errors"][0]["loc"] == "body.agent"
    missing = await client.get("/api/v1/chat/conversations/c_nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "conversation_not_found"
    unknown_agent = await client.post("/api/v1/chat/conversations", json={"agent": "nobody"})
    assert unknown_agent.json()["error"]["code"] == "agent_not_found"
    cid = (await new_conversation(client))["id"]
    huge = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "x" * (2 << 20)})
    assert huge.status_code == 413
    assert huge.json()["error"]["code"] == "payload_too_large"
    assert (await client.get("/api/v1/runs/r_nope")).json()["error"]["code"] == "run_not_found"


# -- conversations ---------------------------------------------------------------------------------------


async def test_conversations_create_list_get_delete(client: httpx.AsyncClient) -> None:
    agents_listed = (await client.get("/api/v1/agents")).json()["data"]
    assert {a["name"] for a in agents_listed} == {"adder", "slow"}
    assert agents_listed[0].keys() == {"name", "description", "kind", "conversation_starters"}
    made = [await new_conversation(client) for _ in range(3)]
    assert made[0]["realm"] == "default"
    assert made[0]["status"] == "idle"
    assert made[0]["usage"] == {"in_tokens": 0, "out_tokens": 0, "cost_usd": None}
    first = (await client.get("/api/v1/chat/conversations", params={"limit": 2})).json()
    assert [c["id"] for c in first["data"]] == [made[2]["id"], made[1]["id"]]
    second = (await client.get("/api/v1/chat/conversations", params={"limit": 2, "cursor": first["next_cursor"]})
              ).json()
    assert [c["id"] for c in second["data"]] == [made[0]["id"]]
    assert second["next_cursor"] is None
    deleted = await client.delete(f"/api/v1/chat/conversations/{made[0]['id']}")
    assert deleted.status_code == 204
    assert (await client.get(f"/api/v1/chat/conversations/{made[0]['id']}")).status_code == 404


async def test_a_message_streams_the_run_and_everything_is_stored(client: httpx.AsyncClient) -> None:
    cid = (await new_conversation(client))["id"]
    seen = await sse_events(client, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                            json={"content": "What is 2 + 3?"})
    types = [e.event for e in seen]
    assert types[0] == "message_start"
    assert types[-1] == "message_end"
    assert "tool_call_start" in types
    assert types.index("tool_call_start") < types.index("tool_result")
    assert "".join(json.loads(e.data)["delta"] for e in seen if e.event == "content_delta") == "The sum is 5."
    ids = [int(e.id) for e in seen]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    payloads = [json.loads(e.data) for e in seen]
    assert all("run_id" in p and "ts" in p for p in payloads)
    assert payloads[-1]["finish_reason"] == "end_turn"
    detail = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()
    assert [m["role"] for m in detail["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert detail["conversation"]["title"] == "What is 2 + 3?"
    assert detail["conversation"]["status"] == "idle"
    assert detail["conversation"]["usage"]["out_tokens"] > 0
    run = (await client.get(f"/api/v1/runs/{payloads[0]['run_id']}")).json()
    assert run["status"] == "completed"
    assert run["finish_reason"] == "end_turn"
    assert run["conversation_id"] == cid
    replay = await sse_events(client, "GET", f"/api/v1/chat/conversations/{cid}/events",
                              headers={"Last-Event-ID": "0"})
    assert [(e.id, e.event, e.data) for e in replay] == [(e.id, e.event, e.data) for e in seen]


async def test_json_mode_waits_for_the_outcome(client: httpx.AsyncClient) -> None:
    cid = (await new_conversation(client))["id"]
    response = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "2+3?"},
                                 headers={"Accept": "application/json"})
    body = response.json()
    assert body["status"] == "completed"
    assert body["finish_reason"] == "end_turn"
    assert body["message"]["content"] == "The sum is 5."
    assert body["usage"]["out_tokens"] > 0


async def test_one_active_run_cancel_and_disconnect(server: tuple[str, Store, Gate],
                                                    client: httpx.AsyncClient) -> None:
    gate = server[2]
    cid = (await new_conversation(client, agent="slow"))["id"]
    async with aconnect_sse(client, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                            json={"content": "go"}) as source:
        async for event in source.aiter_sse():
            if event.event == "content_delta":
                break  # the client leaves mid-run
    await gate.entered.wait()
    busy = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "again"})
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "run_in_progress"
    assert (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["conversation"]["status"] == "running"
    # the disconnect did not cancel the run: it is still there to cancel, and ends with message_end
    async with aconnect_sse(client, "GET", f"/api/v1/chat/conversations/{cid}/events") as source:
        cancel = await client.post(f"/api/v1/chat/conversations/{cid}/cancel")
        assert cancel.status_code == 202
        seen = []
        async for event in source.aiter_sse():
            seen.append(event)
            if event.event == "message_end":
                break
    assert seen[0].event == "message_start"  # joined at the active run's start
    assert json.loads(seen[-1].data)["finish_reason"] == "cancelled"
    assert (await client.post(f"/api/v1/chat/conversations/{cid}/cancel")).status_code == 409
    messages = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    assert messages[0]["content"] == "go"


async def test_a_disconnected_client_does_not_stop_the_run(server: tuple[str, Store, Gate],
                                                           client: httpx.AsyncClient) -> None:
    gate = server[2]
    cid = (await new_conversation(client, agent="slow"))["id"]
    async with aconnect_sse(client, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                            json={"content": "go"}) as source:
        async for event in source.aiter_sse():
            if event.event == "message_start":
                run_id = json.loads(event.data)["run_id"]
                break
    await gate.entered.wait()
    async with aconnect_sse(client, "GET", f"/api/v1/chat/conversations/{cid}/events") as source:
        gate.open.set()
        async for event in source.aiter_sse():
            if event.event == "message_end":
                assert json.loads(event.data)["finish_reason"] == "end_turn"
                break
    detail = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()
    assert detail["messages"][-1]["content"] == "thinking done"
    assert (await client.get(f"/api/v1/runs/{run_id}")).json()["status"] == "completed"


async def test_replay_after_last_event_id_has_no_gap_and_no_duplicate(client: httpx.AsyncClient) -> None:
    cid = (await new_conversation(client))["id"]
    first = await sse_events(client, "POST", f"/api/v1/chat/conversations/{cid}/messages", json={"content": "1+1"})
    middle = first[len(first) // 2].id
    seen = []
    async with aconnect_sse(client, "GET", f"/api/v1/chat/conversations/{cid}/events",
                            headers={"Last-Event-ID": middle}) as source:
        events = source.aiter_sse()
        async for event in events:  # the replayed tail of the first run
            seen.append(event)
            if event.event == "message_end":
                break
        second = asyncio.create_task(sse_events(client, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                                json={"content": "2+2"}))
        async for event in events:  # then the second run, live
            if event.event == "ping":
                continue
            seen.append(event)
            if event.event == "message_end":
                break
        await second
    ids = [int(e.id) for e in seen]
    assert ids == list(range(int(middle) + 1, ids[-1] + 1))
    assert ids[-1] == int((await second)[-1].id)


async def test_pings_when_idle(client: httpx.AsyncClient) -> None:
    cid = (await new_conversation(client))["id"]
    async with aconnect_sse(client, "GET", f"/api/v1/chat/conversations/{cid}/events") as source:
        async for event in source.aiter_sse():
            assert event.event == "ping"
            assert event.data == "{}"
            assert event.id in ("", None)
            break


async def test_replay_past_retention_says_so_then_goes_live(server: tuple[str, Store, Gate],
                                                             client: httpx.AsyncClient) -> None:
    store = server[1]
    cid = (await new_conversation(client))["id"]
    await sse_events(client, "POST", f"/api/v1/chat/conversations/{cid}/messages", json={"content": "1+1"})
    assert await store.events.prune("9999-01-01T00:00:00.000Z") > 0
    async with aconnect_sse(client, "GET", f"/api/v1/chat/conversations/{cid}/events",
                            headers={"Last-Event-ID": "1"}) as source:
        events = source.aiter_sse()
        first = await anext(events)
        assert first.event == "error"
        assert json.loads(first.data)["code"] == "replay_unavailable"
        live = asyncio.create_task(sse_events(client, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                                              json={"content": "2+2"}))
        async for event in events:
            if event.event == "message_start":
                break
        await live


async def test_stream_tokens_are_one_use(server: tuple[str, Store, Gate], client: httpx.AsyncClient) -> None:
    cid = (await new_conversation(client))["id"]
    token = (await client.post("/api/v1/stream-tokens")).json()["token"]
    async with httpx.AsyncClient(base_url=server[0]) as anonymous:
        async with aconnect_sse(anonymous, "GET", f"/api/v1/chat/conversations/{cid}/events",
                                params={"stream_token": token}) as source:
            assert source.response.status_code == 200
        again = await anonymous.get(f"/api/v1/chat/conversations/{cid}/events", params={"stream_token": token})
        assert again.status_code == 401


async def test_idempotency_key_returns_the_original_run(client: httpx.AsyncClient) -> None:
    cid = (await new_conversation(client))["id"]
    url, headers = f"/api/v1/chat/conversations/{cid}/messages", {"Idempotency-Key": "k-1"}
    first = await sse_events(client, "POST", url, json={"content": "2+3"}, headers=headers)
    again = await sse_events(client, "POST", url, json={"content": "2+3"}, headers=headers)
    assert [(e.id, e.data) for e in again] == [(e.id, e.data) for e in first]
    conflict = await client.post(url, json={"content": "other"}, headers=headers)
    assert conflict.status_code == 409
    messages = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    assert [m["role"] for m in messages].count("user") == 1


async def test_context_reports_the_next_prompt(client: httpx.AsyncClient) -> None:
    cid = (await new_conversation(client))["id"]
    before = (await client.get(f"/api/v1/chat/conversations/{cid}/context")).json()
    await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "2+3?"},
                      headers={"Accept": "application/json"})
    after = (await client.get(f"/api/v1/chat/conversations/{cid}/context")).json()
    assert before["system"] > 0
    assert before["tool_definitions"] > 0
    assert before["user"] == 0
    assert after["user"] > 0
    assert after["tool_results"] > 0
    assert after["total"] == sum(after[k] for k in ("system", "tool_definitions", "user", "assistant",
                                                    "tool_results"))
    assert after["budget"] > 0


async def test_a_slow_stream_catches_up_from_the_store_without_slowing_the_run(store: Store) -> None:
    from ringlet.events import ContentDeltaEvent
    from ringlet.server.catalog import Catalog
    from ringlet.server.runs.runner import Runner

    runner = Runner(store, Catalog([]), ServerSettings())
    runner.here.hub.maxsize = 2  # a client that reads nothing while 20 events pass
    cid = (await store.conversations.create(agent="a")).id
    with runner.here.hub.subscribe(cid) as slow:
        for n in range(20):  # the publisher never waits for the slow stream
            await runner.driver.emit(cid, ContentDeltaEvent(run_id="r_1", ts="t", message_id="m", delta=str(n)))
        assert slow.lagging
        got = []
        async for item in runner.runs.items(slow, cid, after=0, backlog=False):
            assert item is not None
            got.append(int(item.id))
            if len(got) == 20:
                break
    assert got == list(range(1, 21))
    await runner.writer.close()


async def test_defensive_paths(server: tuple[str, Store, Gate], client: httpx.AsyncClient,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    store = server[1]
    cid = (await new_conversation(client))["id"]
    # client metadata may use any key without breaking the send, and cannot overwrite ringlet's markers
    sent = await client.post(f"/api/v1/chat/conversations/{cid}/messages", headers={"Accept": "application/json"},
                             json={"content": "2+3", "metadata": {"content": "x", "source": "forged", "tag": 1}})
    assert sent.status_code == 200, sent.text
    first = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"][0]
    assert (first["metadata"]["tag"], first["metadata"]["source"]) == (1, "chat")
    # a chunked body over the limit is 413 too
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"content": "'
        for _ in range(20):
            yield b"x" * 65536
        yield b'"}'
    chunked = await client.post(f"/api/v1/chat/conversations/{cid}/messages", content=chunks(),
                                headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413
    assert chunked.json()["error"]["code"] == "payload_too_large"
    # an unexpected failure is a 500 in the error shape, with the request id
    async def broken(run_id: str) -> None:
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(store.runs, "get", broken)
    failed = await client.get("/api/v1/runs/r_x", headers={"X-Request-Id": "req-500"})
    assert failed.status_code == 500
    assert failed.headers["x-request-id"] == "req-500"
    assert failed.json()["error"] == {"code": "internal_error", "request_id": "req-500",
                                      "message": failed.json()["error"]["message"]}


async def test_another_process_run_blocks_the_conversation(server: tuple[str, Store, Gate],
                                                           client: httpx.AsyncClient) -> None:
    store = server[1]
    cid = (await new_conversation(client))["id"]
    from ringlet import Message
    from ringlet.errors import ConversationBusy

    await store.runs.create("r_elsewhere", agent="adder", conversation_id=cid, lease_owner="proc_other",
                           lease_expires_at="2999-01-01T00:00:00.000Z", incoming=[Message.user("first")])
    with pytest.raises(ConversationBusy):
        await store.runs.create("r_second", agent="adder", conversation_id=cid, incoming=[Message.user("x")])
    busy = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "second"})
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "run_in_progress"
    assert [m["content"] for m in (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]] == [
        "first"]


async def test_listing_pages_only_over_the_keys_agents(server: tuple[str, Store, Gate],
                                                       client: httpx.AsyncClient) -> None:
    url, store, _ = server
    slow = [await new_conversation(client, agent="slow") for _ in range(2)]
    for _ in range(3):
        await new_conversation(client, agent="adder")  # newer, and hidden from the key below
    key, _ = await store.keys.create("slow-only", scopes=["chat"], agents=["slow"])
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
        page = (await c.get("/api/v1/chat/conversations", params={"limit": 2})).json()
        assert [x["id"] for x in page["data"]] == [slow[1]["id"], slow[0]["id"]]
        run_id = (await client.post(f"/api/v1/chat/conversations/{(await new_conversation(client))['id']}/messages",
                                    json={"content": "1+1"}, headers={"Accept": "application/json"})).json()["run_id"]
        assert (await c.get(f"/api/v1/runs/{run_id}")).status_code == 404  # another agent's run


async def test_replay_pages_through_a_long_log(client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from ringlet.server.runs import follow

    cid = (await new_conversation(client))["id"]
    seen = await sse_events(client, "POST", f"/api/v1/chat/conversations/{cid}/messages", json={"content": "2+3"})
    monkeypatch.setattr(follow, "PAGE", 2)  # the store returns two events at a time
    replay = await sse_events(client, "GET", f"/api/v1/chat/conversations/{cid}/events",
                              headers={"Last-Event-ID": "0"})
    assert [e.id for e in replay] == [e.id for e in seen]
    assert len(seen) > 4


async def test_messages_added_while_a_save_is_in_flight_are_stored_too(store: Store) -> None:
    """The run goes on while its transcript is being saved: a save must not mark later messages saved."""
    from ringlet import Message
    from ringlet.server.catalog import Catalog
    from ringlet.server.http.auth import LOCAL
    from ringlet.server.runs.runner import Runner

    go = asyncio.Event()

    async def answer(request: Any) -> Any:
        if request.messages[-1].role == "tool":
            await go.wait()  # the final answer comes while the first save is in flight
            return "The sum is 5."
        return call("add", a=2, b=3)

    save = store.conversations.append_messages

    async def slow_save(cid: str, new: Any) -> int:
        if not go.is_set():
            go.set()
            state = runner.here.active[cid].stream.state  # type: ignore[union-attr]
            for _ in range(100_000):  # let the run finish its answer during this save (yields, no timing)
                if len(state.messages) == 4:
                    break
                await asyncio.sleep(0)
        return await save(cid, new)

    store.conversations.append_messages = slow_save  # type: ignore[method-assign]
    runner = Runner(store, Catalog.of([Agent(FunctionModel(answer), name="adder", tools=[add])]), ServerSettings())
    conversation = await store.conversations.create(agent="adder")
    run = await runner.runs.start(conversation, Message.user("2+3?"), principal=LOCAL)
    async with asyncio.timeout(10):
        await run.done.wait()
    await runner.close()
    roles = [m.role for m in await store.conversations.load_messages(conversation.id)]
    assert roles == ["user", "assistant", "tool", "assistant"]


async def test_a_rejected_override_leaves_the_conversation_free(client: httpx.AsyncClient) -> None:
    cid = (await new_conversation(client))["id"]
    bad = await client.post(f"/api/v1/chat/conversations/{cid}/messages",
                            json={"content": "hi", "overrides": {"model": "nosuchprovider:x"}})
    assert bad.status_code == 403  # not among the models the agent allows
    assert bad.json()["error"]["code"] == "forbidden"
    good = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "2+3"},
                             headers={"Accept": "application/json"})
    assert good.status_code == 200, good.text
    assert good.json()["status"] == "completed"
    messages = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["2+3"]  # the rejected one was not kept


def test_a_hosted_agents_sub_agents_come_from_its_own_agents_folder(tmp_path: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from ringlet.errors import ConfigError
    from ringlet.server.catalog import sub_agents_of

    monkeypatch.setenv("RINGLET_AGENTS_DIR", str(tmp_path / "elsewhere"))  # not where the server's agents are
    (tmp_path / "agents" / "helper").mkdir(parents=True)
    (tmp_path / "agents" / "helper" / "config.yaml").write_text(
        "model: openai:m\nmodel_options: {base_url: 'http://127.0.0.1:9/v1', api_key: x}\ninstructions: Help.\n")
    assert sub_agents_of(tmp_path / "agents")("helper").name == "helper"
    with pytest.raises(ConfigError, match="no agent named 'nobody'"):
        sub_agents_of(tmp_path / "agents")("nobody")
