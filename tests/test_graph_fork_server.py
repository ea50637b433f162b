"""Forking a graph run over HTTP (issue 44): `GET /api/v1/runs/{id}/checkpoints[/{step}]` and
`POST /api/v1/runs/{id}/fork`, in process on SQLite and as a durable DBOS run on PostgreSQL (the `store`
fixture's two engines). Gates, realms and keys hold as for new runs; the original run stays untouched."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, text

from helpers import eventually
from ringlet import Agent
from ringlet.server import ServerSettings, create_app
from ringlet.server.catalog import Catalog, HostedGraph
from ringlet.store import Store
from ringlet.store.schema import conversations
from ringlet.testing import ScriptedModel
from serving import serving
from test_graph_fork import FILES, GRAPH
from test_graph_support import make_graph
from test_recovery import events_until_end
from test_server import new_conversation
from test_server_approvals import client_for

JSON = {"Accept": "application/json"}


@pytest.fixture
async def server(store: Store, tmp_path: Path) -> AsyncIterator[tuple[str, Store, Path]]:
    agents = tmp_path / "agents"
    # its scripts log to chain/side.log
    chain = make_graph(agents, GRAPH.replace("name: g", "name: chain"), name="chain", files=FILES)
    plain = Agent(ScriptedModel(["plain answer"] * 3), name="plain")
    catalog = Catalog([HostedGraph.at(chain), *Catalog.of([plain]).hosted.values()])
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=catalog)
    async with serving(app) as url:
        yield url, store, chain


async def _run(client: httpx.AsyncClient, agent: str, content: str = "go") -> tuple[str, str]:
    cid = (await new_conversation(client, agent))["id"]
    sent = await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": content}, headers=JSON)
    assert sent.status_code == 200, sent.text
    assert sent.json()["status"] == "completed", sent.text
    return cid, sent.json()["run_id"]


def _side(chain: Path) -> list[str]:
    return (chain / "side.log").read_text().split()


def _data(event: Any) -> dict[str, Any]:
    return json.loads(event.data)


async def test_a_run_is_forked_from_a_checkpoint_with_its_state_edited(server: tuple[str, Store, Path]) -> None:
    url, store, chain = server
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        cid, run_id = await _run(ana, "chain")
        listed = (await ana.get(f"/api/v1/runs/{run_id}/checkpoints")).json()
        assert (listed["run_id"], listed["agent"], listed["graph_changed"]) == (run_id, "chain", False)
        assert [(c["step"], c["status"], c["frontier"]) for c in listed["data"]] == [
            (0, "working", ["a"]), (1, "working", ["b"]), (2, "working", ["c"]), (3, "working", ["z"]),
            (4, "completed", [])]
        one = (await ana.get(f"/api/v1/runs/{run_id}/checkpoints/2")).json()
        assert (one["state"], one["frontier"], one["reducers"]) == (
            {"n": 1, "city": "Paris", "initial_prompt": "go", "trail": ["a", "b"]}, ["c"], {"trail": "append"})
        assert _side(chain) == ["a", "b", "c"]

        forked = await ana.post(f"/api/v1/runs/{run_id}/fork", json={"checkpoint": 2, "state_patch": {"city": "Oslo"}})

        assert forked.status_code == 201, forked.text
        body = forked.json()
        assert body["forked_from"] == {"run_id": run_id, "conversation_id": cid, "step": 2}
        new_cid, new_run = body["conversation_id"], body["run_id"]
        assert (body["conversation"]["id"], body["conversation"]["agent"]) == (new_cid, "chain")
        original = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert body["conversation"]["forked_from"] == {"conversation_id": cid, "message_id": original[0]["id"]}
        assert original[0]["role"] == "user"  # the prompt the forked run answers again
        assert new_cid != cid
        assert new_run != run_id
        seen = await events_until_end(ana, new_cid, "0")
        assert [_data(e)["node_id"] for e in seen if e.event == "node_start"] == ["c", "z"]  # from step 2 on
        assert _data(seen[-1])["finish_reason"] == "end_turn"
        assert _side(chain) == ["a", "b", "c", "c"]  # a and b did not run again
        detail = (await ana.get(f"/api/v1/chat/conversations/{new_cid}")).json()
        assert [(m["role"], m["content"]) for m in detail["messages"]] == [
            ("user", "go"), ("assistant", 'Oslo 11 ["a","b"]')]
        run = (await ana.get(f"/api/v1/runs/{new_run}")).json()
        assert (run["kind"], run["status"], run["conversation_id"]) == ("graph", "completed", new_cid)
        async with store.db.connect() as conn:
            origin = (await conn.execute(select(conversations.c.forked_from_conversation_id)
                                         .where(conversations.c.id == new_cid))).scalar()
        assert origin == cid
        if store.engine.dialect.name == "postgresql":  # there the fork ran as a durable DBOS workflow
            async def workflow() -> str:
                async with store.db.connect() as conn:
                    return (await conn.execute(text("SELECT status FROM dbos.workflow_status WHERE workflow_uuid "
                                                    "= :id"), {"id": new_run})).scalar()

            async def ended() -> bool:  # DBOS records the workflow's end just after the run's record ends
                return await workflow() != "PENDING"

            await eventually(ended, seconds=30)
            assert await workflow() == "SUCCESS"
        again = (await ana.get(f"/api/v1/runs/{run_id}/checkpoints")).json()
        assert again == listed  # the original is untouched
        mine = (await ana.get(f"/api/v1/runs/{new_run}/checkpoints")).json()["data"]
        assert [(c["step"], c["frontier"]) for c in mine] == [(2, ["c"]), (3, ["z"]), (4, [])]
        state = (await ana.get(f"/api/v1/runs/{new_run}/checkpoints/2")).json()["state"]
        assert state["city"] == "Oslo"


async def test_forks_that_cannot_start_say_why(server: tuple[str, Store, Path]) -> None:
    url, store, chain = server
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        _, run_id = await _run(ana, "chain")
        path = f"/api/v1/runs/{run_id}/fork"
        bad = await ana.post(path, json={"checkpoint": 2, "state_patch": {"citty": "Oslo", "trail": "x"}})
        assert bad.status_code == 422, bad.text
        errors = bad.json()["error"]["details"]["errors"]
        assert [e["loc"] for e in errors] == [["body", "state_patch", "citty"], ["body", "state_patch", "trail"]]
        assert "declare it in initial_state" in errors[0]["msg"]
        assert "give an array" in errors[1]["msg"]
        for step, status, code in ((9, 404, "checkpoint_not_found"), (4, 409, "checkpoint_ended")):
            refused = await ana.post(path, json={"checkpoint": step})
            assert (refused.status_code, refused.json()["error"]["code"]) == (status, code), refused.text
        missing = await ana.get(f"/api/v1/runs/{run_id}/checkpoints/9")
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "checkpoint_not_found")
        _, loop_run = await _run(ana, "plain")
        for response in (await ana.get(f"/api/v1/runs/{loop_run}/checkpoints"),
                         await ana.post(f"/api/v1/runs/{loop_run}/fork", json={"checkpoint": 0})):
            assert (response.status_code, response.json()["error"]["code"]) == (409, "not_a_graph_run")
        listed = (await ana.get("/api/v1/chat/conversations", params={"agent": "chain"})).json()["data"]
        assert len(listed) == 1  # no conversation was made for a fork that did not start
        assert _side(chain) == ["a", "b", "c"]  # nothing ran


async def test_realms_agents_and_scopes_hold_for_forks(server: tuple[str, Store, Path]) -> None:
    url, store, _ = server
    async with await client_for(url, store, "ana", ["chat"]) as ana:
        _, run_id = await _run(ana, "chain")
    outsiders = [await store.keys.create("eve", scopes=["chat"], user_id="eve", realms=["elsewhere"]),
                 await store.keys.create("bob", scopes=["chat"], user_id="bob", agents=["plain"])]
    for key, _ in outsiders:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as client:
            for response in (await client.get(f"/api/v1/runs/{run_id}/checkpoints"),
                             await client.get(f"/api/v1/runs/{run_id}/checkpoints/1"),
                             await client.post(f"/api/v1/runs/{run_id}/fork", json={"checkpoint": 1})):
                assert (response.status_code, response.json()["error"]["code"]) == (404, "run_not_found")
    key, _ = await store.keys.create("ro", scopes=["approve"], user_id="ro")
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as client:
        refused = await client.post(f"/api/v1/runs/{run_id}/fork", json={"checkpoint": 1})
        assert refused.status_code == 403
