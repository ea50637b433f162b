"""Steering a working run over the native API (`mode: "steer"` / `"queue"`), over real HTTP, on SQLite (runs in
process) and PostgreSQL (runs as DBOS workflows: the steer is a DBOS message to the workflow)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from dbos import DBOS
from httpx_sse import aconnect_sse

from ringlet import Agent, tool
from ringlet.models.base import ModelRequest
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog, HostedGraph
from ringlet.server.protocols import queued
from ringlet.store import Store
from ringlet.testing import FunctionModel, call
from serving import serving
from test_graph_support import make_graph
from test_server import new_conversation
from test_server_approvals import client_for


class Gates:
    """The tool `look` waits for `tool` (set `looking` first); the model's answers wait for `answer` once
    `hold_answer` is set (set `answering` first)."""

    def __init__(self) -> None:
        self.looking, self.tool = asyncio.Event(), asyncio.Event()
        self.answering, self.answer, self.hold_answer = asyncio.Event(), asyncio.Event(), False
        self.durable = False
        self.temperatures: list[float | None] = []


def agent_of(gates: Gates) -> Agent:
    @tool(effect="read")
    async def look(topic: str) -> str:
        "Look something up."
        gates.looking.set()
        await gates.tool.wait()
        return f"notes on {topic}"

    async def model(request: ModelRequest) -> Any:
        gates.temperatures.append(request.settings.temperature)
        users = [m.text for m in request.messages if m.role == "user"]
        if users[-1] == "go" and not any(m.role == "tool" for m in request.messages):
            return call("look", {"topic": "logs"})
        if gates.hold_answer:
            gates.answering.set()
            await gates.answer.wait()
        return "seen: " + " | ".join(users)

    return Agent(FunctionModel(model), name="steered", tools=[look])


@pytest.fixture
async def served(store: Store) -> AsyncIterator[tuple[httpx.AsyncClient, Gates]]:
    gates = Gates()
    gates.durable = store.engine.dialect.name == "postgresql"  # runs as DBOS workflows there
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=[agent_of(gates)])
    async with serving(app) as url, await client_for(url, store, "ana", ["chat"]) as client:
        yield client, gates


async def events_until(client: httpx.AsyncClient, cid: str, ends: int) -> list[tuple[str, dict[str, Any]]]:
    """The conversation's events from its first, until `ends` runs have sent their `message_end`."""
    seen: list[tuple[str, dict[str, Any]]] = []
    async with aconnect_sse(client, "GET", f"/api/v1/chat/conversations/{cid}/events",
                            headers={"Last-Event-ID": "0"}) as source:
        async for event in source.aiter_sse():
            if event.event == "ping":
                continue
            seen.append((event.event, json.loads(event.data)))
            if sum(kind == "message_end" for kind, _ in seen) == ends:
                return seen
    return seen


async def send(client: httpx.AsyncClient, cid: str, content: str, **fields: Any) -> httpx.Response:
    return await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": content, **fields},
                             headers={"Accept": "application/json"})


async def test_a_steer_is_taken_at_the_next_round_boundary(served: tuple[httpx.AsyncClient, Gates],
                                                           store: Store) -> None:
    client, gates = served
    cid = (await new_conversation(client, "steered"))["id"]
    first = asyncio.create_task(send(client, cid, "go"))
    async with asyncio.timeout(30):
        await gates.looking.wait()  # the tool call runs
        steered = await send(client, cid, "only the errors", mode="steer")
    assert steered.status_code == 202, steered.text
    body = steered.json()
    assert body["mode"] == "steer"
    gates.tool.set()
    async with asyncio.timeout(60):
        outcome = (await first).json()
        seen = await events_until(client, cid, 1)
    assert outcome["run_id"] == body["run_id"]
    assert outcome["message"]["content"] == "seen: go | only the errors"
    kinds = [kind for kind, _ in seen]
    assert kinds.index("steer_queued") < kinds.index("tool_result") < kinds.index("steer_taken") \
        < kinds.index("content_delta")
    queued = next(data for kind, data in seen if kind == "steer_queued")
    taken = next(data for kind, data in seen if kind == "steer_taken")
    assert (queued["steer_id"], queued["message_id"], queued["text"]) == \
        (body["steer_id"], body["message_id"], "only the errors")
    assert (taken["steer_id"], taken["message_id"], taken["run_id"]) == (body["steer_id"], body["message_id"],
                                                                          body["run_id"])
    messages = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    assert [(m["role"], m["content"]) for m in messages if m["role"] != "assistant"] == [
        ("user", "go"), ("tool", "notes on logs"), ("user", "only the errors")]
    assert messages[3]["id"] == body["message_id"]
    assert messages[3]["run_id"] == body["run_id"]
    if gates.durable:  # the workflow received it as a DBOS message, once, at that boundary
        steps = await DBOS.list_workflow_steps_async(body["run_id"])
        received = [s["output"] for s in steps if s["function_name"] == "DBOS.recv"]
        assert [r and r["steer_id"] for r in received] == [body["steer_id"], None]
    async with await client_for(str(client.base_url), store, "root", ["admin"]) as admin:
        replayed = await admin.post(f"/api/v1/runs/{body['run_id']}/replay")  # the steer is on the run's tape
    assert replayed.status_code == 200, replayed.text
    assert replayed.json()["same"] is True, replayed.json()["divergences"]


async def test_a_queued_message_starts_the_next_run(served: tuple[httpx.AsyncClient, Gates]) -> None:
    client, gates = served
    cid = (await new_conversation(client, "steered"))["id"]
    first = asyncio.create_task(send(client, cid, "go"))
    async with asyncio.timeout(30):
        await gates.looking.wait()
        refused = await send(client, cid, "again")  # no mode: as always
        queued = await send(client, cid, "and then this", mode="queue", overrides={"temperature": 0.5})
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "run_in_progress"
    assert queued.status_code == 202, queued.text
    body = queued.json()
    assert (body["mode"], body["steer_id"]) == ("queue", None)
    gates.tool.set()
    async with asyncio.timeout(60):
        first_run = (await first).json()
        seen = await events_until(client, cid, 2)
    assert first_run["message"]["content"] == "seen: go"  # the running one never saw it
    assert body["run_id"] != first_run["run_id"]
    ends = [data for kind, data in seen if kind == "message_end"]
    assert [e["run_id"] for e in ends] == [first_run["run_id"], body["run_id"]]
    record = (await client.get(f"/api/v1/runs/{body['run_id']}")).json()
    assert record["status"] == "completed"
    messages = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    assert (messages[-2]["content"], messages[-2]["id"]) == ("and then this", body["message_id"])
    assert messages[-1]["content"] == "seen: go | and then this"
    assert gates.temperatures[-1] == 0.5  # the queued message's own overrides hold for its run


async def test_steer_queued_is_sent_before_the_run_can_take_the_steer(served: tuple[httpx.AsyncClient, Gates],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The run may take a steer the moment it has it: it is handed over only once `steer_queued` is sent, so
    no `steer_taken` comes before its `steer_queued` (a client showing the steer would miss it). Here the
    run reaches its next boundary while the steer's fallback is being stored."""
    client, gates = served
    enqueue = queued.enqueue

    async def slow_enqueue(plan: Any) -> None:  # the run goes on meanwhile: its tool ends, its answer begins
        gates.tool.set()
        await gates.answering.wait()
        await enqueue(plan)

    monkeypatch.setattr(queued, "enqueue", slow_enqueue)
    cid = (await new_conversation(client, "steered"))["id"]
    gates.hold_answer = True
    first = asyncio.create_task(send(client, cid, "go"))
    async with asyncio.timeout(30):
        await gates.looking.wait()
        steered = await send(client, cid, "only the errors", mode="steer")
    assert steered.status_code == 202, steered.text
    body = steered.json()
    gates.hold_answer = False
    gates.answer.set()
    async with asyncio.timeout(60):  # handed over only once told, the run was answering: not taken by it
        await first
        seen = [kind for kind, _ in await events_until(client, cid, 1)]
    assert seen.count("steer_queued") == 1, seen
    assert "steer_taken" not in seen, seen  # the old order: taken at the boundary, before it was told
    async with asyncio.timeout(60):  # so it started the next run
        events = await events_until(client, cid, 2)
    assert [data["run_id"] for kind, data in events if kind == "message_end"][1] == body["next_run_id"]


async def test_a_steer_sent_again_with_its_idempotency_key_is_steered_once(
        served: tuple[httpx.AsyncClient, Gates]) -> None:
    """A client that retries a steer (its answer lost, say) with the same `Idempotency-Key` gets the first
    answer back, and the run takes the message once."""
    client, gates = served
    cid = (await new_conversation(client, "steered"))["id"]
    first = asyncio.create_task(send(client, cid, "go"))
    async with asyncio.timeout(30):
        await gates.looking.wait()
    headers = {"Idempotency-Key": "steer-1", "Accept": "application/json"}
    sent = [await client.post(f"/api/v1/chat/conversations/{cid}/messages", headers=headers,
                              json={"content": "only the errors", "mode": "steer"}) for _ in range(2)]
    assert [r.status_code for r in sent] == [202, 202], sent[1].text
    assert sent[1].json() == sent[0].json()
    gates.tool.set()
    async with asyncio.timeout(60):
        await first
        seen = await events_until(client, cid, 1)
    assert [kind for kind, _ in seen].count("steer_queued") == 1
    assert [kind for kind, _ in seen].count("steer_taken") == 1
    messages = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["go", "only the errors"]


async def test_a_steer_after_the_last_round_starts_the_next_run(served: tuple[httpx.AsyncClient, Gates]) -> None:
    client, gates = served
    cid = (await new_conversation(client, "steered"))["id"]
    gates.tool.set()
    gates.hold_answer = True  # the answer (the run's last round) waits
    first = asyncio.create_task(send(client, cid, "go"))
    async with asyncio.timeout(30):
        await gates.answering.wait()
        steered = await send(client, cid, "one more thing", mode="steer")
    assert steered.status_code == 202, steered.text
    body = steered.json()
    assert body["mode"] == "steer"
    gates.hold_answer = False
    gates.answer.set()
    async with asyncio.timeout(60):
        first_run = (await first).json()
        seen = await events_until(client, cid, 2)
    assert first_run["message"]["content"] == "seen: go"
    assert "steer_taken" not in [kind for kind, _ in seen]  # the run had no round left to take it
    ends = [data["run_id"] for kind, data in seen if kind == "message_end"]
    assert ends[0] == first_run["run_id"]
    assert ends[1] == body["next_run_id"] != ends[0]  # the run the answer named
    messages = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    steer = next(m for m in messages if m["id"] == body["message_id"])  # nothing lost: it started the next run
    assert steer["content"] == "one more thing"
    assert messages[-1]["content"] == "seen: go | one more thing"


async def test_mode_is_checked_and_starts_a_run_when_none_works(served: tuple[httpx.AsyncClient, Gates]) -> None:
    client, gates = served
    cid = (await new_conversation(client, "steered"))["id"]
    bad = await send(client, cid, "hi", mode="nudge")
    assert bad.status_code == 422
    assert "mode" in bad.text
    gates.tool.set()
    started = await send(client, cid, "hello", mode="steer")  # nothing works: a run as usual
    assert started.status_code == 200, started.text
    assert started.json()["message"]["content"] == "seen: hello"


GRAPH = """
name: drafter
start: draft
nodes:
  draft: {type: llm, prompt: "Draft: {{initial_prompt}}", state_updates: {note: "{{output}}"}, next: done}
  done: {type: end, output: "{{note}}"}
"""


async def test_a_graph_run_takes_no_steer_but_a_queued_message(store: Store, tmp_path: Path) -> None:
    drafting, release = asyncio.Event(), asyncio.Event()

    async def draft(request: ModelRequest) -> str:
        drafting.set()
        await release.wait()
        return "note on " + request.messages[-1].text.removeprefix("Draft: ")

    catalog = Catalog([HostedGraph.at(make_graph(tmp_path, GRAPH, name="drafter"), model=FunctionModel(draft))])
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=catalog)
    async with serving(app) as url, await client_for(url, store, "ana", ["chat"]) as client:
        cid = (await new_conversation(client, "drafter"))["id"]
        first = asyncio.create_task(send(client, cid, "one"))
        async with asyncio.timeout(30):
            await drafting.wait()
            refused = await send(client, cid, "two", mode="steer")
            queued = await send(client, cid, "two", mode="queue")
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "run_in_progress"
        assert "queue" in refused.json()["error"]["message"]
        assert queued.status_code == 202, queued.text
        release.set()
        async with asyncio.timeout(60):
            await first
            seen = await events_until(client, cid, 2)
        ends = [data["run_id"] for kind, data in seen if kind == "message_end"]
        assert ends[1] == queued.json()["run_id"]
        record = (await client.get(f"/api/v1/runs/{ends[1]}")).json()
        assert record["status"] == "completed"
