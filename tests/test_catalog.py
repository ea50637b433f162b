"""The catalog meta-tools (issue #7, memory-and-context.md §6) over a 1,000-tool synthetic catalog."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import of_type
from ringlet import Agent, Gates
from ringlet.context import Caller, RunContext
from ringlet.gates import Allow, ApprovalRules, AutoApprove, GateCall
from ringlet.testing import ScriptedModel, call
from ringlet.tools.base import StaticToolset, Tool, schema_validator
from ringlet.tools.catalog import META_TOOLS, AccessRequests, Catalog, CatalogConfig, ConnectorConfig

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
from catalog_data import catalog_tools, connectors, labelled_queries


class Recorder:
    """A gate that records what it judged."""

    def __init__(self) -> None:
        self.calls: list[GateCall] = []

    async def check(self, c: GateCall) -> Allow:
        self.calls.append(c)
        return Allow()


def offered(request: Any) -> list[str]:
    """The tool names a request offered, without the run's terminal tool."""
    return [d.name for d in request.tools if d.name != "summary"]


def catalog(**config: Any) -> Catalog:
    return Catalog(connectors(), config=CatalogConfig(connectors={
        "vault": ConnectorConfig(required_roles=["security"], description="Secrets"),
        "legal": ConnectorConfig(enabled=False)}, **config))


async def test_an_agent_with_1000_tools_works_through_the_meta_tools() -> None:
    gate = Recorder()
    model = ScriptedModel([
        [call("list_connectors", id="c1"),
         call("search_connector_tools", query="create a new refund in billing", id="c2")],
        call("execute_connector_tool", connector="billing", tool="create_refund", args={"refund_id": "r-9"}, id="c3"),
        "Refund created."])
    agent = Agent(model, tools=[catalog()], gates=Gates(policies=[gate]))
    stream = agent.stream("Please refund order 9")
    events = [e async for e in stream]
    assert offered(model.requests[0]) == list(META_TOOLS)  # 4 definitions, not 1,000
    results = {e.tool_call_id: e for e in of_type(events, "tool_result")}
    listed = json.loads(results["c1"].result)["connectors"]
    access = {c["name"]: c["access"] for c in listed}
    assert access["billing"] == "granted"
    assert access["vault"] == "requestable"  # needs a role this caller lacks
    assert "legal" in access  # disabled: shown as requestable (show_requestable)
    assert len(listed) == 40
    found = json.loads(results["c2"].result)["tools"]
    assert ("billing", "create_refund") in [(t["connector"], t["tool"]) for t in found]
    assert set(found[0]) == {"connector", "tool", "description", "input_schema", "effect", "score"}
    assert results["c3"].result == "ok"
    judged = [c for c in gate.calls if c.tool == "create_refund"]
    assert [(c.connector, c.effect, dict(c.args)) for c in judged] == [("billing", "write", {"refund_id": "r-9"})]
    assert stream.result is not None
    assert stream.result.output == "Refund created."


async def test_errors_access_requests_and_validation() -> None:
    model = ScriptedModel([[
        call("execute_connector_tool", connector="biling", tool="create_refund", args={}, id="e1"),
        call("execute_connector_tool", connector="billing", tool="create_refnd", args={}, id="e2"),
        call("execute_connector_tool", connector="vault", tool="get_token", args={}, id="e3"),
        call("execute_connector_tool", connector="billing", tool="get_invoice", args={"invoice_id": 5}, id="e4"),
        call("request_connector_access", connector="vault", reason="rotate the CI token", id="e5"),
        call("request_connector_access", connector="vault", reason="again", id="e6")], "ok"])
    cat = catalog()
    events = [e async for e in Agent(model, tools=[cat]).stream("go", caller=Caller(user_id="ada", realm="blue"))]
    results = {e.tool_call_id: e for e in of_type(events, "tool_result")}
    assert results["e1"].error["code"] == "unknown_tool"
    assert results["e1"].error["closest"][0] == "billing"
    assert results["e2"].error["closest"][0] == "create_refund"
    assert results["e3"].error["code"] == "access_required"
    assert "request_connector_access" in results["e3"].error["message"]
    assert results["e4"].error["code"] == "invalid_arguments"  # the inner tool's schema, checked
    first, second = json.loads(results["e5"].result), json.loads(results["e6"].result)
    assert first["status"] == "pending"
    assert second["request_id"] == first["request_id"]  # one pending request per connector
    assert isinstance(cat.access, AccessRequests)
    assert cat.access.items[0]["requested_by"] == "ada"
    assert any(e.title == "connector access requested" for e in of_type(events, "notification"))


async def test_a_role_grants_the_connector() -> None:
    model = ScriptedModel([call("execute_connector_tool", connector="vault", tool="get_token", args={}), "ok"])
    events = [e async for e in Agent(model, tools=[catalog()]).stream("go", caller=Caller(roles=["security"]))]
    assert of_type(events, "tool_result")[0].result == "ok"


async def test_few_tools_are_listed_directly() -> None:
    tools = catalog_tools()["billing"][:3]
    model = ScriptedModel([call(tools[0].name, invoice_id="i-1"), "done"])
    result = await Agent(model, tools=[Catalog({"billing": StaticToolset(tools)})]).run("go")
    assert offered(model.requests[0]) == [t.name for t in tools]
    assert result.messages[2].content == "ok"
    forced = ScriptedModel(["x"])
    await Agent(forced, tools=[Catalog({"billing": StaticToolset(tools)}, config=CatalogConfig(mode="on"))]).run("go")
    assert offered(forced.requests[0]) == list(META_TOOLS)


async def test_keyword_search_finds_the_labelled_tools() -> None:
    cat, ctx = Catalog(connectors()), RunContext(run_id="r", agent="a")
    queries = labelled_queries()
    hits = 0
    for query, expected in queries:
        found = await cat.search(query, ctx, top_k=5)
        hits += expected in [(f["connector"], f["tool"]) for f in found]
    assert len(queries) >= 100
    assert hits / len(queries) >= 0.9


@pytest.mark.slow
async def test_hybrid_search_with_a_real_embedding_model(local_embeddings: Any) -> None:
    cat, ctx = Catalog(connectors(), embedder=local_embeddings), RunContext(run_id="r", agent="a")
    queries = labelled_queries()
    hits = 0
    for query, expected in queries:
        found = await cat.search(query, ctx, top_k=5)
        hits += expected in [(f["connector"], f["tool"]) for f in found]
    assert hits / len(queries) >= 0.9


@pytest.mark.slow
async def test_access_requests_are_stored_and_listed_by_the_server(store: Any, tmp_path: Path) -> None:
    import httpx
    from typer.testing import CliRunner

    from ringlet.cli import app as cli
    from ringlet.server import ServerSettings, create_app
    from serving import serving

    model = ScriptedModel([call("request_connector_access", connector="vault", reason="need the CI token"), "ok"])
    agent = Agent(model, name="ops", tools=[catalog()])
    async with serving(create_app(ServerSettings(auth_mode="none"), store=store, agents=[agent])) as url, \
            httpx.AsyncClient(base_url=url, timeout=30) as c:
        cid = (await c.post("/api/v1/chat/conversations", json={"agent": "ops", "realm": "blue"})).json()["id"]
        done = await c.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "go"},
                            headers={"Accept": "application/json"})
        assert done.json()["status"] == "completed"
        listed = (await c.get("/api/v1/access-requests")).json()["data"]
    assert [(r["connector"], r["realm"], r["reason"], r["status"]) for r in listed] == [
        ("vault", "blue", "need the CI token", "pending")]
    if store.engine.dialect.name == "sqlite":
        import asyncio

        result = await asyncio.to_thread(CliRunner().invoke, cli, ["access", "list", "--db", str(store.engine.url)])
        assert result.exit_code == 0, result.output
        assert "vault" in result.stdout  # the table wraps the reason
        assert "CI token" in result.stdout


# -- approvals of connector calls (gates.md §4: the gates judge the inner tool, before and after approval) --------


def refunds() -> tuple[Catalog, list[dict[str, Any]]]:
    """A catalog (meta-tools forced on) whose one connector's write tool records each run."""
    ran: list[dict[str, Any]] = []
    schema = {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"],
              "additionalProperties": False}

    async def refund(args: dict[str, Any], ctx: RunContext) -> str:
        ran.append(dict(args))
        return f"refunded {args['order']}"

    tool = Tool("create_refund", "Refund an order.", schema, refund, effect="write",
                validate=schema_validator(schema))
    return Catalog({"billing": StaticToolset([tool])}, config=CatalogConfig(mode="on")), ran


def refund_model() -> ScriptedModel:
    return ScriptedModel([call("execute_connector_tool", connector="billing", tool="create_refund",
                               args={"order": "o-7"}, id="c1"), "Refunded."])


def judged(gate: Recorder) -> list[tuple[str, str | None, str, dict[str, Any], bool]]:
    return [(c.tool, c.connector, c.effect, dict(c.args), c.approval_granted) for c in gate.calls]


@pytest.mark.parametrize("how", ["approver", "resumed from JSON"])
async def test_an_approved_connector_call_runs_its_inner_tool_once(how: str) -> None:
    """The resume path re-checks the policy on the connector's tool and runs it with its own arguments
    (not the wrapper `execute_connector_tool` with the inner arguments: `KeyError 'connector'`)."""
    cat, ran = refunds()
    gate, model = Recorder(), refund_model()
    if how == "approver":
        agent = Agent(model, tools=[cat],
                      gates=Gates(policies=[gate], approvals=ApprovalRules(), approver=AutoApprove("ana")))
        result = await agent.run("refund o-7")
    else:
        agent = Agent(model, tools=[cat], gates=Gates(policies=[gate], approvals=ApprovalRules()))
        paused = await agent.run("refund o-7")
        assert paused.status == "input_required"
        request = paused.pending_approvals["c1"]
        assert (request.tool, request.connector, request.args) == ("create_refund", "billing", {"order": "o-7"})
        assert ran == []
        again, ran = refunds()  # another process: a new catalog, the run state as JSON
        later = Agent(model, tools=[again], gates=Gates(policies=[gate], approvals=ApprovalRules()))
        result = await later.resume(paused.state.to_json(), {"c1": True})
    assert ran == [{"order": "o-7"}]
    [tool_result] = [m for m in result.messages if m.role == "tool"]
    assert (tool_result.content, tool_result.metadata["is_error"]) == ("refunded o-7", False)
    assert result.output == "Refunded."
    assert judged(gate) == [("create_refund", "billing", "write", {"order": "o-7"}, False),
                            ("create_refund", "billing", "write", {"order": "o-7"}, True)]
