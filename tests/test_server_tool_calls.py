"""Direct tool calls (issue #26, server-contract.md §5): `POST …/tool-calls` runs one tool through every gate
(a real Rego policy, the approval rules, the approvals API), as channel `api`; the call joins the event log
and the transcript, out of the model's context unless asked."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from ringlet import Agent, Gates, tool
from ringlet.gates import ApprovalRules
from ringlet.messages import Message
from ringlet.server import ServerSettings, create_app
from ringlet.store import Store
from ringlet.testing import FunctionModel
from ringlet.tools.base import StaticToolset
from ringlet.tools.catalog import Catalog, CatalogConfig
from serving import serving
from test_server import new_conversation

POLICY = """package ringlet.direct

import rego.v1

deny contains {"msg": "destructive tools may not be called over the API", "policy_id": "no-direct-destruction"} if {
	input.subject.channel == "api"
	input.resource.effect == "destructive"
}
"""

# A sub-millisecond policy can still miss 250 ms when CI starves its worker thread; the deadline has its own test.
STARVED_MACHINE_MS = 10_000

done: list[str] = []
prompts: list[list[Message]] = []


@tool(effect="read")
def add(a: int, b: int) -> int:
    """Add two numbers."""
    done.append(f"add {a} {b}")
    return a + b


@tool(effect="read")
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(reason)


@tool(effect="destructive")
def wipe(target: str) -> str:
    """Delete everything in target."""
    done.append(f"wipe {target}")
    return f"wiped {target}"


@tool(effect="write")
def restart(service: str) -> str:
    """Restart a service (its approvals time out quickly)."""
    done.append(f"restart {service}")
    return f"restarted {service}"


@tool(effect="write")
def deploy(service: str) -> str:
    """Deploy a service."""
    done.append(f"deploy {service}")
    return f"deployed {service}"


def search_in(connector: str) -> Any:
    @tool(name="search", effect="read")
    def search(query: str) -> str:
        """Search issues."""
        done.append(f"{connector} search {query}")
        return f"{connector}: {query}"

    return search


@tool(effect="write")
def create_issue(title: str) -> str:
    """Open an issue (a write: it needs approval)."""
    done.append(f"issue {title}")
    return f"created {title}"


class Gate:
    """A model whose answer waits until the test opens the gate (a run that stays active)."""

    def __init__(self) -> None:
        self.entered, self.open = asyncio.Event(), asyncio.Event()

    async def stream(self, request: Any) -> AsyncIterator[str]:
        self.entered.set()
        await self.open.wait()
        yield "done"


def answering(request: Any) -> str:
    prompts.append(list(request.messages))
    return "ok"


@pytest.fixture
async def server(store: Store, tmp_path: Path) -> AsyncIterator[tuple[str, Store, Gate]]:
    done.clear()
    prompts.clear()
    (tmp_path / "direct.rego").write_text(POLICY)
    catalog = Catalog({"github": StaticToolset([search_in("github"), create_issue]),
                       "jira": StaticToolset([search_in("jira")])}, config=CatalogConfig(mode="on"))
    gate = Gate()
    agents = [Agent(FunctionModel(answering), name="ops", tools=[add, explode, wipe, deploy, restart, catalog],
                    gates=Gates(approvals=ApprovalRules({
                        "deploy": {"mode": "confirm", "timeout_s": 60, "deny_patterns": ["prod"]},
                        "restart": {"mode": "confirm", "timeout_s": 0.3}}))),
              Agent(FunctionModel(gate.stream), name="slow", tools=[add])]
    app = create_app(ServerSettings(ping_interval_s=0.2, policy_paths=[str(tmp_path / "direct.rego")],
                                    policy_eval_timeout_ms=STARVED_MACHINE_MS), store=store,
                     agents=agents)
    async with serving(app) as url:
        yield url, store, gate


async def client_for(url: str, store: Store, user: str, scopes: list[str], **options: Any) -> httpx.AsyncClient:
    key, _ = await store.keys.create(user, scopes=scopes, user_id=user, **options)
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


@pytest.fixture
async def ana(server: tuple[str, Store, Gate]) -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(server[0], server[1], "ana", ["chat", "approve", "admin"]) as client:
        yield client


async def direct(client: httpx.AsyncClient, cid: str, tool_name: str, args: dict[str, Any], **fields: Any
                 ) -> httpx.Response:
    return await client.post(f"/api/v1/chat/conversations/{cid}/tool-calls",
                             json={"tool": tool_name, "args": args, **fields})


async def logged(client: httpx.AsyncClient, cid: str, until: Callable[[str, dict[str, Any]], bool]
                 ) -> list[tuple[str, dict[str, Any]]]:
    """The conversation's event log from its start, live once replayed, up to the first event `until` accepts."""
    seen: list[tuple[str, dict[str, Any]]] = []
    async with asyncio.timeout(20), aconnect_sse(client, "GET", f"/api/v1/chat/conversations/{cid}/events",
                                                 headers={"Last-Event-ID": "0"}) as source:
        async for event in source.aiter_sse():
            if event.event == "ping":
                continue
            seen.append((event.event, json.loads(event.data)))
            if until(event.event, seen[-1][1]):
                return seen
    raise AssertionError("the stream ended early")


async def test_an_allowed_call_returns_its_result_with_the_policy_audit(ana: httpx.AsyncClient) -> None:
    cid = (await new_conversation(ana, "ops"))["id"]
    response = await direct(ana, cid, "add", {"a": 2, "b": 3})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"tool_call_id", "status", "result", "duration_ms", "policy"}
    assert body["tool_call_id"].startswith("tc_")
    assert (body["status"], body["result"], body["policy"]["decision"]) == ("completed", "5", "allow")
    assert body["duration_ms"] >= 0
    assert done == ["add 2 3"]
    audit = (await ana.get("/api/v1/audit", params={"tool": "add"})).json()["data"]
    assert [r["audit_id"] for r in audit] == [body["policy"]["audit_id"]]
    assert audit[0]["subject"]["channel"] == "api"
    assert audit[0]["subject"]["user_id"] == "ana"
    assert audit[0]["conversation_id"] == cid
    assert audit[0]["policy_set_hash"] is not None  # the Rego set was loaded and evaluated
    events = await logged(ana, cid, lambda kind, _: kind == "tool_result")
    assert [kind for kind, _ in events] == ["tool_call_start", "tool_result"]
    start, result = events[0][1], events[1][1]
    assert (start["tool_call_id"], start["name"]) == (body["tool_call_id"], "add")
    assert (result["result"], result["is_error"], result["policy"]) == ("5", False, body["policy"])


async def test_a_tool_that_raises_is_a_200_error(ana: httpx.AsyncClient) -> None:
    cid = (await new_conversation(ana, "ops"))["id"]
    response = await direct(ana, cid, "explode", {"reason": "boom"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "error"
    assert body["error"] == {"code": "tool_error", "message": "RuntimeError: boom"}
    assert body["tool_call_id"].startswith("tc_")
    assert body["policy"]["decision"] == "allow"


async def test_a_call_the_policy_denies_is_403_with_its_policy_and_audit_ids(ana: httpx.AsyncClient) -> None:
    cid = (await new_conversation(ana, "ops"))["id"]
    response = await direct(ana, cid, "wipe", {"target": "db"})
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "policy_denied"
    assert error["message"] == "destructive tools may not be called over the API"
    assert error["details"]["policy_id"] == "no-direct-destruction"
    assert done == []
    audit = (await ana.get("/api/v1/audit", params={"tool": "wipe"})).json()["data"]
    assert [(r["audit_id"], r["decision"], r["subject"]["channel"]) for r in audit] == [
        (error["details"]["audit_id"], "deny", "api")]
    result = (await logged(ana, cid, lambda kind, _: kind == "tool_result"))[-1][1]
    assert result["error"]["code"] == "policy_denied"
    assert result["error"]["audit_id"] == error["details"]["audit_id"]


async def test_a_call_needing_approval_is_202_and_its_result_follows_the_decision(
        server: tuple[str, Store, Gate], ana: httpx.AsyncClient) -> None:
    cid = (await new_conversation(ana, "ops"))["id"]
    response = await direct(ana, cid, "deploy", {"service": "api"})
    assert response.status_code == 202, response.text
    body = response.json()
    assert set(body) == {"tool_call_id", "status", "approval_id"}
    assert body["status"] == "pending_approval"
    assert done == []
    detail = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()
    assert [(a["approval_id"], a["tool_call_id"], a["args"]) for a in detail["pending"]["approvals"]] == [
        (body["approval_id"], body["tool_call_id"], {"service": "api"})]
    assert body["approval_id"] in {a["approval_id"] for a in (await ana.get("/api/v1/approvals")).json()["data"]}
    assert detail["conversation"]["status"] == "idle"  # a message may still be sent meanwhile
    follow = asyncio.create_task(logged(ana, cid, lambda kind, _: kind == "tool_result"))
    decided = await ana.post(f"/api/v1/chat/conversations/{cid}/approvals/{body['approval_id']}",
                             json={"approved": True, "note": "go"})
    assert decided.status_code == 200, decided.text
    events = await follow
    assert [kind for kind, _ in events] == ["tool_call_start", "approval_required", "tool_result"]
    result = events[-1][1]
    assert (result["tool_call_id"], result["result"], result["is_error"]) == (body["tool_call_id"], "deployed api",
                                                                              False)
    assert result["policy"]["decision"] == "allow"  # the re-check after the human's approval
    assert done == ["deploy api"]
    records = (await ana.get(f"/api/v1/chat/conversations/{cid}/approvals")).json()["data"]
    assert [(r["status"], r["decided_by"]) for r in records] == [("approved", "ana")]
    assert (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()["pending"]["approvals"] == []
    decisions = (await ana.get("/api/v1/audit", params={"tool": "deploy"})).json()["data"]
    assert {(r["action"], r["decision"]) for r in decisions} >= {("approval.decide", "approved")}
    # a denial is the call's result too; a rule's denial needs no human and answers at once
    denied = (await direct(ana, cid, "deploy", {"service": "web"})).json()
    await ana.post(f"/api/v1/chat/conversations/{cid}/approvals/{denied['approval_id']}",
                   json={"approved": False, "note": "frozen"})
    events = await logged(ana, cid, lambda kind, e: kind == "tool_result"
                          and e["tool_call_id"] == denied["tool_call_id"])
    assert events[-1][1]["error"]["message"] == "denied by ana: frozen"
    blocked = await direct(ana, cid, "deploy", {"service": "prod"})
    assert blocked.status_code == 200
    assert blocked.json()["error"]["code"] == "approval_denied"
    assert done == ["deploy api"]


async def test_an_undecided_call_times_out_and_a_late_decision_is_409(ana: httpx.AsyncClient) -> None:
    cid = (await new_conversation(ana, "ops"))["id"]
    pending = (await direct(ana, cid, "restart", {"service": "api"})).json()
    assert pending["status"] == "pending_approval"
    events = await logged(ana, cid, lambda kind, _: kind == "tool_result")
    assert events[-1][1]["error"]["code"] == "approval_timeout"
    assert events[-1][1]["error"]["approval_id"] == pending["approval_id"]
    late = await ana.post(f"/api/v1/chat/conversations/{cid}/approvals/{pending['approval_id']}",
                          json={"approved": True})
    assert (late.status_code, late.json()["error"]["code"]) == (409, "approval_expired")
    record = (await ana.get(f"/api/v1/chat/conversations/{cid}/approvals")).json()["data"][0]
    assert (record["status"], record["decided_by"]) == ("expired", "system:timeout")
    messages = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    assert [m["role"] for m in messages] == ["assistant", "tool"]
    assert json.loads(messages[1]["content"])["error"]["code"] == "approval_timeout"
    assert done == []


async def test_keys_without_the_conversations_realm_or_scope_are_refused(server: tuple[str, Store, Gate],
                                                                         ana: httpx.AsyncClient) -> None:
    url, store, _ = server
    cid = (await new_conversation(ana, "ops"))["id"]
    async with await client_for(url, store, "blue", ["chat"], realms=["blue"]) as blue, \
            await client_for(url, store, "approver", ["approve"]) as approver, \
            await client_for(url, store, "other", ["chat"], agents=["slow"]) as other:
        for refused in (await direct(blue, cid, "add", {"a": 1, "b": 1}),  # not its realm: it does not exist
                        await direct(other, cid, "add", {"a": 1, "b": 1})):  # nor for a key of other agents
            assert (refused.status_code, refused.json()["error"]["code"]) == (404, "conversation_not_found")
        scopeless = await direct(approver, cid, "add", {"a": 1, "b": 1})
        assert (scopeless.status_code, scopeless.json()["error"]["code"]) == (403, "forbidden")
    missing = await direct(ana, "c_nope", "add", {"a": 1, "b": 1})
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "conversation_not_found")
    assert done == []


async def test_bad_arguments_are_422_naming_the_field_and_unknown_tools_404(ana: httpx.AsyncClient) -> None:
    cid = (await new_conversation(ana, "ops"))["id"]
    missing = await direct(ana, cid, "add", {"a": 2})
    assert missing.status_code == 422, missing.text
    assert missing.json()["error"]["code"] == "validation_error"
    assert missing.json()["error"]["details"]["errors"] == [{"loc": "args.b", "msg": "Field required"}]
    wrong = (await direct(ana, cid, "add", {"a": "two", "b": 1})).json()["error"]
    assert wrong["details"]["errors"][0]["loc"] == "args.a"
    assert wrong["message"].startswith("args.a: ")
    unknown = await direct(ana, cid, "ad", {"a": 2, "b": 3})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "tool_not_found"
    assert "add" in unknown.json()["error"]["details"]["closest"]
    shapeless = await ana.post(f"/api/v1/chat/conversations/{cid}/tool-calls", json={"tool": "add", "args": [1]})
    assert shapeless.status_code == 422
    assert done == []
    messages = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    assert messages == []  # nothing ran, nothing is stored


async def test_the_transcript_keeps_direct_calls_out_of_the_prompt_unless_asked(ana: httpx.AsyncClient) -> None:
    cid = (await new_conversation(ana, "ops"))["id"]
    hidden = (await direct(ana, cid, "add", {"a": 1, "b": 2})).json()
    shown = (await direct(ana, cid, "add", {"a": 3, "b": 4}, include_in_context=True)).json()
    messages = (await ana.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
    assert [(m["role"], m["metadata"]["source"], m["metadata"].get("duration")) for m in messages] == [
        ("assistant", "direct", 0), ("tool", "direct", 0), ("assistant", "direct", None), ("tool", "direct", None)]
    assert [c["id"] for c in messages[0]["tool_calls"]] == [hidden["tool_call_id"]]
    assert (messages[1]["tool_call_id"], messages[1]["content"]) == (hidden["tool_call_id"], "3")
    assert (messages[3]["tool_call_id"], messages[3]["content"]) == (shown["tool_call_id"], "7")
    sent = await ana.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "what did I add?"},
                          headers={"Accept": "application/json"})
    assert sent.json()["status"] == "completed", sent.text
    assert len(prompts) == 1
    seen = [(m.role, m.tool_call_id or (m.tool_calls[0].id if m.tool_calls else None)) for m in prompts[0]]
    assert seen == [("assistant", shown["tool_call_id"]), ("tool", shown["tool_call_id"]), ("user", None)]


async def test_connector_picks_a_tool_behind_the_catalog(ana: httpx.AsyncClient) -> None:
    cid = (await new_conversation(ana, "ops"))["id"]
    picked = await direct(ana, cid, "search", {"query": "bug"}, connector="jira")
    assert picked.status_code == 200, picked.text
    assert picked.json()["result"] == "jira: bug"
    assert done == ["jira search bug"]
    audit = (await ana.get("/api/v1/audit", params={"tool": "search"})).json()["data"]
    assert [(r["connector"], r["tool"]) for r in audit] == [("jira", "search")]  # the gates judged the inner tool
    ambiguous = await direct(ana, cid, "search", {"query": "bug"})
    assert ambiguous.status_code == 422
    assert ambiguous.json()["error"]["details"]["connectors"] == ["github", "jira"]
    assert (await direct(ana, cid, "search", {"query": "bug"}, connector="gitlab")).status_code == 404
    bad = await direct(ana, cid, "search", {}, connector="github")
    assert bad.json()["error"]["details"]["errors"] == [{"loc": "args.query", "msg": "Field required"}]
    assert done == ["jira search bug"]
    # a connector's write tool waits for a human; once approved, the inner tool is re-checked and runs
    pending = (await direct(ana, cid, "create_issue", {"title": "crash"})).json()
    assert pending["status"] == "pending_approval"
    decided = await ana.post(f"/api/v1/approvals/{pending['approval_id']}", json={"approved": True})
    assert decided.status_code == 200, decided.text
    events = await logged(ana, cid, lambda kind, e: kind == "tool_result"
                          and e["tool_call_id"] == pending["tool_call_id"])
    assert events[-1][1]["result"] == "created crash"
    assert done == ["jira search bug", "issue crash"]
    checks = (await ana.get("/api/v1/audit", params={"tool": "create_issue"})).json()["data"]
    assert {(r["connector"], r["approval_granted"]) for r in checks if r["action"] == "tool.execute"} == {
        ("github", False), ("github", True)}


async def test_a_call_during_an_active_run_is_409(server: tuple[str, Store, Gate], ana: httpx.AsyncClient) -> None:
    gate = server[2]
    cid = (await new_conversation(ana, "slow"))["id"]
    run = asyncio.create_task(ana.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "hi"},
                                       headers={"Accept": "application/json"}))
    await gate.entered.wait()
    busy = await direct(ana, cid, "add", {"a": 1, "b": 1})
    assert (busy.status_code, busy.json()["error"]["code"]) == (409, "run_in_progress")
    gate.open.set()
    assert (await run).json()["status"] == "completed"
    assert (await direct(ana, cid, "add", {"a": 1, "b": 1})).status_code == 200
    assert done == ["add 1 1"]


async def test_an_idempotency_key_answers_a_retry_with_the_first_response(ana: httpx.AsyncClient) -> None:
    cid = (await new_conversation(ana, "ops"))["id"]
    url, key = f"/api/v1/chat/conversations/{cid}/tool-calls", {"Idempotency-Key": "k-1"}
    first = await ana.post(url, json={"tool": "add", "args": {"a": 1, "b": 1}}, headers=key)
    again = await ana.post(url, json={"tool": "add", "args": {"a": 1, "b": 1}}, headers=key)
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json() == first.json()
    assert done == ["add 1 1"]
    other = await ana.post(url, json={"tool": "add", "args": {"a": 5, "b": 1}}, headers=key)
    assert (other.status_code, other.json()["error"]["code"]) == (409, "idempotency_key_reused")
    denied = await ana.post(url, json={"tool": "wipe", "args": {"target": "x"}}, headers={"Idempotency-Key": "k-2"})
    replay = await ana.post(url, json={"tool": "wipe", "args": {"target": "x"}}, headers={"Idempotency-Key": "k-2"})
    assert (denied.status_code, replay.status_code) == (403, 403)
    assert replay.json()["error"]["details"]["audit_id"] == denied.json()["error"]["details"]["audit_id"]


@pytest.mark.slow
async def test_a_call_waiting_for_a_human_is_closed_when_its_server_dies(tmp_path: Path) -> None:
    import signal

    from test_recovery import free_port, ringlet_serve

    agent = tmp_path / "agents" / "ops"
    agent.mkdir(parents=True)
    marker = tmp_path / "deployed.txt"
    (agent / "tools.py").write_text(
        "def deploy(service: str) -> str:\n    \"\"\"Deploy a service.\"\"\"\n"
        f"    with open({str(marker)!r}, 'a') as f:\n        f.write(service + '\\n')\n"
        "    return f'deployed {service}'\n")
    (agent / "config.yaml").write_text("model: openai:m\nmodel_options: {base_url: 'http://127.0.0.1:9/v1', "
                                       "api_key: x}\ntools:\n  deploy:\n"
                                       "    approval: {mode: confirm, timeout_s: 600}\n")
    port, db = free_port(), tmp_path / "ringlet.db"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
        async with ringlet_serve(port, db, tmp_path / "agents") as first:
            cid = (await c.post("/api/v1/chat/conversations", json={"agent": "ops"})).json()["id"]
            pending = await c.post(f"/api/v1/chat/conversations/{cid}/tool-calls",
                                   json={"tool": "deploy", "args": {"service": "api"}})
            assert pending.status_code == 202, pending.text
            body = pending.json()
            run_id = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()["pending"]["approvals"][0]["run_id"]
            assert (await c.get(f"/api/v1/runs/{run_id}")).json()["kind"] == "direct"
            first.send_signal(signal.SIGKILL)  # the process holding the call is gone
            await first.wait()
        async with ringlet_serve(port, db, tmp_path / "agents"):
            async with aconnect_sse(c, "GET", f"/api/v1/chat/conversations/{cid}/events",
                                    headers={"Last-Event-ID": "0"}) as source:
                async for event in source.aiter_sse():
                    if event.event == "tool_result":
                        result = json.loads(event.data)
                        break
            assert (result["tool_call_id"], result["error"]["code"]) == (body["tool_call_id"], "interrupted")
            detail = (await c.get(f"/api/v1/chat/conversations/{cid}")).json()
            assert detail["pending"]["approvals"] == []
            assert [m["metadata"].get("source") for m in detail["messages"]] == ["direct", "direct"]
            assert detail["messages"][1]["metadata"]["interrupted"] is True
            late = await c.post(f"/api/v1/chat/conversations/{cid}/approvals/{body['approval_id']}",
                                json={"approved": True})
            assert late.status_code == 409  # cancelled: the decision is refused, never applied to nothing
            assert (await c.get(f"/api/v1/runs/{run_id}")).json()["status"] == "failed"
    assert not marker.exists()  # the tool never ran
