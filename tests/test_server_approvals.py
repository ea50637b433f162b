"""Approvals on the server (issue #5, gates.md §4, server-contract.md §5): the run pauses durably, a
decision over HTTP resumes it, timeouts deny, a second decision is a 409, a restart loses nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse
from sqlalchemy import update

from ringlet import Agent, Gates, tool
from ringlet.gates import ApprovalRules
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.store.schema import approvals
from ringlet.testing import FunctionModel, call
from serving import openai_model, serving
from test_recovery import events_until_end, free_port, paused_then_killed, ringlet_serve
from test_server import new_conversation, sse_events

deployed: list[str] = []


@tool(effect="write")
def deploy(service: str) -> str:
    """Deploy a service."""
    deployed.append(service)
    return f"deployed {service}"


def deploying(request: Any) -> Any:
    """Deploys three services in one round; then reports what the tools said."""
    results = [m for m in request.messages if m.role == "tool"]
    if results:
        return " | ".join(m.content for m in results)
    return [call("deploy", service=s, id=f"c_{s}") for s in request.messages[-1].text.split()]


@pytest.fixture
async def server(store: Store) -> AsyncIterator[tuple[str, Store]]:
    deployed.clear()
    agents = [Agent(FunctionModel(deploying), name="ops", tools=[deploy], gates=Gates(approvals=ApprovalRules(
        {"deploy": {"mode": "confirm", "timeout_s": 60, "deny_patterns": ["prod"]}}))),
        Agent(FunctionModel(deploying), name="hasty", tools=[deploy], gates=Gates(approvals=ApprovalRules(
            {"deploy": {"mode": "confirm", "timeout_s": 0.3}})))]
    app = create_app(ServerSettings(ping_interval_s=0.2), store=store, agents=agents)
    async with serving(app) as url:
        yield url, store


async def client_for(url: str, store: Store, user: str, scopes: list[str]) -> httpx.AsyncClient:
    key, _ = await store.keys.create(user, scopes=scopes, user_id=user)
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


async def until_paused(client: httpx.AsyncClient, cid: str, content: str, seen: list[Any],
                       resumed: asyncio.Event) -> None:
    """Follow the message's stream: it stays open while the run waits, and ends with message_end."""
    async with aconnect_sse(client, "POST", f"/api/v1/chat/conversations/{cid}/messages",
                            json={"content": content}) as source:
        async for event in source.aiter_sse():
            if event.event == "ping":
                continue
            seen.append(event)
            if event.event == "status" and json.loads(event.data)["state"] == "input_required":
                resumed.set()
            if event.event == "message_end":
                return


async def test_decisions_over_http_resume_the_waiting_stream(server: tuple[str, Store]) -> None:
    url, store = server
    async with await client_for(url, store, "ana", ["chat", "approve", "admin"]) as ana, \
            await client_for(url, store, "viewer", ["chat"]) as viewer:
        cid = (await new_conversation(ana, "ops"))["id"]
        seen: list[Any] = []
        paused = asyncio.Event()
        stream = asyncio.create_task(until_paused(ana, cid, "api web prod", seen, paused))
        await paused.wait()
        required = [json.loads(e.data) for e in seen if e.event == "approval_required"]
        assert sorted(r["tool_call_id"] for r in required) == ["c_api", "c_web"]  # prod: denied by rule, no human
        required.sort(key=lambda r: r["tool_call_id"])
        assert required[0]["reason"] == "deploy requires confirmation"
        assert required[0]["args"] == {"service": "api"}
        detail = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()
        assert detail["conversation"]["status"] == "input_required"
        assert sorted(a["tool_call_id"] for a in detail["pending"]["approvals"]) == ["c_api", "c_web"]
        busy = await ana.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "x"},
                              headers={"Accept": "application/json"})
        assert busy.status_code == 409
        assert busy.json()["error"]["code"] == "run_in_progress"
        by_id = {r["tool_call_id"]: r["approval_id"] for r in required}
        forbidden = await viewer.post(f"/api/v1/chat/conversations/{cid}/approvals/{by_id['c_api']}",
                                      json={"approved": True})
        assert forbidden.status_code == 403
        listed = (await ana.get("/api/v1/approvals")).json()["data"]
        assert {a["approval_id"] for a in listed} >= set(by_id.values())
        # the batch form, by tool-call id, decided differently; the decider is the key's user
        batch = await ana.post(f"/api/v1/chat/conversations/{cid}/approvals", json={"decisions": [
            {"tool_call_id": "c_web", "approved": False, "note": "web is frozen"},
            {"approval_id": by_id["c_api"], "approved": True}, {"tool_call_id": "c_nope", "approved": True}]})
        assert batch.status_code == 200, batch.text
        results = batch.json()["results"]
        assert [(r.get("status"), r.get("decided_by")) for r in results[:2]] == [("denied", "ana"), ("approved", "ana")]
        assert results[2]["error"]["code"] == "approval_not_found"
        await stream
        assert [e.event for e in seen].count("message_end") == 1
        answer = "".join(json.loads(e.data)["delta"] for e in seen if e.event == "content_delta")
        assert answer.startswith("deployed api | ")
        assert "denied by ana: web is frozen" in answer
        assert "blocked by approval rule 'prod'" in answer
        assert deployed == ["api"]
        again = await ana.post(f"/api/v1/chat/conversations/{cid}/approvals/{by_id['c_api']}",
                               json={"approved": False})
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "approval_already_decided"
        assert again.json()["error"]["details"]["status"] == "approved"
        audit = (await ana.get("/api/v1/audit", params={"decision": "denied"})).json()["data"]
        assert {(r["tool_call_id"], r["decided_by"], r["note"]) for r in audit} == {
            ("c_prod", "rule:deny_pattern", None), ("c_web", "ana", "web is frozen")}
        conversation = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()
        assert conversation["conversation"]["status"] == "idle"
        assert conversation["pending"]["approvals"] == []
        statuses = {a["tool_call_id"]: a["status"]
                    for a in (await ana.get(f"/api/v1/chat/conversations/{cid}/approvals")).json()["data"]}
        assert statuses == {"c_api": "approved", "c_web": "denied"}


async def test_a_timeout_denies_and_a_late_decision_is_a_409(server: tuple[str, Store]) -> None:
    url, store = server
    async with await client_for(url, store, "bo", ["chat", "approve"]) as bo:
        cid = (await new_conversation(bo, "hasty"))["id"]
        events = await sse_events(bo, "POST", f"/api/v1/chat/conversations/{cid}/messages", json={"content": "api"})
        required = next(json.loads(e.data) for e in events if e.event == "approval_required")
        result = next(json.loads(e.data) for e in events if e.event == "tool_result")
        assert result["error"]["code"] == "approval_timeout"
        assert result["error"]["message"] == "no decision within 0.3 s"
        late = await bo.post(f"/api/v1/chat/conversations/{cid}/approvals/{required['approval_id']}",
                             json={"approved": True})
        assert late.status_code == 409
        assert late.json()["error"]["code"] == "approval_expired"
        record = (await bo.get(f"/api/v1/chat/conversations/{cid}/approvals")).json()["data"][0]
        assert (record["status"], record["decided_by"]) == ("expired", "system:timeout")
        assert deployed == []


async def test_cancelling_a_paused_run_cancels_its_approvals(server: tuple[str, Store]) -> None:
    url, store = server
    async with await client_for(url, store, "cy", ["chat", "approve"]) as cy:
        cid = (await new_conversation(cy, "ops"))["id"]
        paused = await cy.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "api"},
                               headers={"Accept": "application/json"})
        assert paused.json()["status"] == "input_required"
        assert [a["tool_call_id"] for a in paused.json()["pending"]["approvals"]] == ["c_api"]
        run_id = paused.json()["run_id"]
        assert (await cy.post(f"/api/v1/chat/conversations/{cid}/cancel")).json() == {"run_id": run_id}
        log = await sse_events(cy, "GET", f"/api/v1/chat/conversations/{cid}/events",
                               headers={"Last-Event-ID": "0"})
        assert json.loads(log[-1].data)["finish_reason"] == "cancelled"
        result = next(json.loads(e.data) for e in log if e.event == "tool_result")
        assert result["error"]["code"] == "cancelled"
        record = (await cy.get(f"/api/v1/chat/conversations/{cid}/approvals")).json()["data"][0]
        assert record["status"] == "cancelled"
        assert deployed == []
        assert (await cy.get(f"/api/v1/runs/{run_id}")).json()["status"] == "canceled"


# -- the real thing: restart the server while an approval is pending ------------------------------------------


def deploy_then_quote(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A `deploy` call first, then a text answer quoting the result."""
    last = messages[-1]
    if last["role"] == "tool":
        return [{"role": "assistant", "content": f"Result: {last['content']}"}]
    return [{"role": "assistant", "tool_calls": [{"index": 0, "id": "call_d", "type": "function", "function": {
        "name": "deploy", "arguments": '{"service": "api"}'}}]}]


@pytest.mark.slow
async def test_a_pending_approval_survives_a_server_restart(tmp_path: Path) -> None:
    async with serving(openai_model(deploy_then_quote)) as model_url:
        agent = tmp_path / "agents" / "ops"
        agent.mkdir(parents=True)
        marker = tmp_path / "deployed.txt"
        (agent / "tools.py").write_text(
            "def deploy(service: str) -> str:\n    \"\"\"Deploy a service.\"\"\"\n"
            f"    with open({str(marker)!r}, 'a') as f:\n        f.write(service + '\\n')\n"
            "    return f'deployed {service}'\n")
        (agent / "config.yaml").write_text(
            f"model: openai:m\nmodel_options: {{base_url: '{model_url}/v1', api_key: x}}\n"
            "tools:\n  deploy:\n    approval: {mode: confirm, timeout_s: 600}\n")
        port, db = free_port(), tmp_path / "ringlet.db"
        base = f"http://127.0.0.1:{port}"
        cid, received = await paused_then_killed(port, db, tmp_path / "agents", "ops", "Deploy the api")
        approval = next(json.loads(e.data) for e in received if e.event == "approval_required")
        async with ringlet_serve(port, db, tmp_path / "agents"), httpx.AsyncClient(base_url=base) as c:
            detail = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()
            assert detail["conversation"]["status"] == "input_required"
            assert [a["approval_id"] for a in detail["pending"]["approvals"]] == [approval["approval_id"]]
            decided = await c.post(f"/api/v1/chat/conversations/{cid}/approvals/{approval['approval_id']}",
                                   json={"approved": True})
            assert decided.status_code == 200, decided.text
            rest = await events_until_end(c, cid, received[-1].id)
            kinds = [e.event for e in rest]
            assert kinds[0] == "status"
            assert kinds[-1] == "message_end"
            assert "tool_result" in kinds
            assert json.loads(rest[-1].data)["finish_reason"] == "end_turn"
            assert {json.loads(e.data)["run_id"] for e in rest} == {json.loads(received[0].data)["run_id"]}
            assert kinds.count("message_start") == 0  # the same run, continued
            messages = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
            assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
            assert messages[-1]["content"] == "Result: deployed api"
            assert marker.read_text() == "api\n"  # executed exactly once


# -- the OpenAI-compatible API: approval_mode wait | deny --------------------------------------------------


@pytest.mark.parametrize("mode", ["wait", "deny"])
async def test_compat_approval_mode(store: Store, mode: str) -> None:
    deployed.clear()
    agent = Agent(FunctionModel(deploying), name="ops", tools=[deploy], gates=Gates(approvals=ApprovalRules()))
    app = create_app(ServerSettings(approval_mode=mode, ping_interval_s=0.2), store=store, agents=[agent])
    async with serving(app) as url, await client_for(url, store, "dee", ["chat", "approve"]) as c:
        completion = asyncio.create_task(c.post("/v1/chat/completions", json={
            "model": "ops", "messages": [{"role": "user", "content": "api"}]}))
        if mode == "wait":  # the response ends at once, naming where to decide; the run waits there
            answer = (await completion).json()["choices"][0]["message"]["content"]
            pending = (await c.get("/api/v1/approvals")).json()["data"]
            assert f"/api/v1/approvals/{pending[0]['approval_id']}" in answer
            decided = await c.post(f"/api/v1/approvals/{pending[0]['approval_id']}",
                                   json={"approved": False, "note": "use the canary"})
            assert decided.json()["decided_by"] == "dee"
        else:
            answer = (await completion).json()["choices"][0]["message"]["content"]
            assert "denied by system:approval_mode" in answer
        assert deployed == []


async def test_approvals_that_expired_while_stopped_are_swept_before_serving(store: Store) -> None:
    deployed.clear()

    def agents() -> list[Agent]:
        return [Agent(FunctionModel(deploying), name="ops", tools=[deploy], gates=Gates(approvals=ApprovalRules()))]

    async with serving(create_app(ServerSettings(), store=store, agents=agents())) as url, \
            await client_for(url, store, "eve", ["chat", "approve"]) as c:
        cid = (await new_conversation(c, "ops"))["id"]
        paused = (await c.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "api"},
                               headers={"Accept": "application/json"})).json()
        approval_id = paused["pending"]["approvals"][0]["approval_id"]
    async with store.db.begin() as conn:  # the server was down past the deadline
        await conn.execute(update(approvals).where(approvals.c.approval_id == approval_id)
                           .values(expires_at="2000-01-01T00:00:00.000Z"))
    async with serving(create_app(ServerSettings(), store=store, agents=agents())) as url, \
            await client_for(url, store, "eve", ["chat", "approve"]) as c:
        assert (await c.get("/readyz")).status_code == 200
        record = (await c.get(f"/api/v1/chat/conversations/{cid}/approvals")).json()["data"][0]
        assert (record["status"], record["decided_by"]) == ("expired", "system:timeout")
        log = await sse_events(c, "GET", f"/api/v1/chat/conversations/{cid}/events",
                               headers={"Last-Event-ID": "0"})
        result = next(json.loads(e.data) for e in log if e.event == "tool_result")
        assert result["error"]["code"] == "approval_timeout"
        assert (await c.get(f"/api/v1/runs/{paused['run_id']}")).json()["status"] == "completed"
        assert deployed == []


async def test_a_stored_decision_is_never_a_429_its_run_waits_its_turn(store: Store) -> None:
    """The key's active runs are at their cap and others wait for a place: a decision is still stored and
    answered 200; the run it resumes waits its turn behind them, then goes on (`Pauses.resume`)."""
    deployed.clear()
    agents = [Agent(FunctionModel(deploying), name="ops", tools=[deploy], gates=Gates(approvals=ApprovalRules(
        {"deploy": {"mode": "confirm", "timeout_s": 60}})))]
    app = create_app(ServerSettings(ping_interval_s=0.2, max_runs_per_key=1), store=store, agents=agents)
    async with serving(app) as url:
        secret, key = await store.keys.create("dee", scopes=["chat", "approve"], user_id="dee")
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as dee:
            cid = (await new_conversation(dee, "ops"))["id"]
            paused = (await dee.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "api"},
                                     headers={"Accept": "application/json"})).json()
            assert paused["status"] == "input_required", paused
            [approval] = paused["pending"]["approvals"]
            runs = app.state.ringlet.runner.here.limits.runs
            other = runs.hold(key.id)  # another run of the key holds its one place
            queued = asyncio.create_task(runs.acquire(key.id, "fire"))  # and a fire of the key waits for it
            await asyncio.sleep(0)  # (the task's first step, which queues it)
            assert runs.waiting.get(key.id)
            runs.limit = 2  # a place is free, but the fire was there first: a new run would wait (or get 429)
            decided = await dee.post(f"/api/v1/chat/conversations/{cid}/approvals/{approval['approval_id']}",
                                     json={"approved": True})
            assert decided.status_code == 200, decided.text
            assert decided.json()["status"] == "approved"
            if not app.state.ringlet.durable:  # it waits its turn (a durable run's workflow may find the
                status = (await dee.get(f"/api/v1/runs/{paused['run_id']}")).json()["status"]  # decision first:
                assert (status, deployed) == ("input_required", [])  # caps across processes are the engine's)
            other.release()
            (await queued).release()  # the fire ran and ended: the resumed run's turn
            log = await sse_events(dee, "GET", f"/api/v1/chat/conversations/{cid}/events",
                                   headers={"Last-Event-ID": "0"})
            assert json.loads(log[-1].data)["finish_reason"] == "end_turn"
            assert deployed == ["api"]
            assert (await dee.get(f"/api/v1/runs/{paused['run_id']}")).json()["status"] == "completed"
