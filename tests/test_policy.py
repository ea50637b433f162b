"""The policy gate (issue #5, gates.md §3): real Rego files through regopy, fail-closed evaluation, the
audit log, and denials the model reads."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from helpers import of_type
from ringlet import Agent, ConfigError, Gates, tool
from ringlet.context import RunContext
from ringlet.gates import AuditLog, GateCall, NeedsApproval, PolicyGate, PolicySet
from ringlet.testing import ScriptedModel, call

POLICIES = Path(__file__).parent / "policies"
NOON = datetime(2026, 5, 1, 12, 0, tzinfo=UTC).timestamp()
NIGHT = datetime(2026, 5, 1, 23, 30, tzinfo=UTC).timestamp()


@tool(effect="destructive")
def delete_deployment(name: str) -> str:
    """Delete a deployment."""
    return f"deleted {name}"


@tool(effect="read")
def status(name: str, api_key: str = "") -> str:
    """Read a deployment's status."""
    return f"{name} is healthy"


def gate_call(tool_name: str, effect: str, *, roles: tuple[str, ...] = (), realm: str = "default",
              args: dict[str, Any] | None = None) -> GateCall:
    ctx = RunContext(run_id="r_1", agent="ops", realm=realm, user_id="u_1", org_id="o_1", roles=roles)
    return GateCall(tool_name, effect, args or {}, ctx)


@pytest.fixture(scope="module")
def policies() -> PolicySet:
    return PolicySet.load([POLICIES])


async def test_allow_deny_by_role_and_by_time_of_day(policies: PolicySet) -> None:
    audit = AuditLog()
    day = PolicyGate(policies, audit=audit, clock=lambda: NOON)
    night = PolicyGate(policies, audit=audit, clock=lambda: NIGHT)
    assert (await day.check(gate_call("status", "read"))).decision == "allow"
    denied = await day.check(gate_call("delete_deployment", "destructive"))
    assert denied.decision == "deny"
    assert denied.code == "policy_denied"  # type: ignore[union-attr]
    assert denied.extra["policy_id"] == "ringlet.ops"  # type: ignore[union-attr]
    assert denied.message == "destructive operations need the platform-admin role"  # type: ignore[union-attr]
    admin = await day.check(gate_call("delete_deployment", "destructive", roles=("platform-admin",)))
    assert admin.decision == "allow"
    assert (await day.check(gate_call("deploy", "write", realm="prod"))).decision == "allow"
    late = await night.check(gate_call("deploy", "write", realm="prod"))
    assert late.decision == "deny"
    assert late.extra["policy_id"] == "change-window"  # type: ignore[union-attr]
    assert [r["decision"] for r in audit.records] == ["allow", "deny", "allow", "allow", "deny"]
    record = audit.records[1]
    assert record["tool"] == "delete_deployment"
    assert record["policy_ids"] == ["ringlet.ops"]
    assert record["subject"] == {"user_id": "u_1", "org_id": "o_1", "roles": [], "channel": "chat"}
    assert record["policy_set_hash"] == policies.hash
    assert record["audit_id"] == denied.audit_id


async def test_require_approval_asks_for_a_human(policies: PolicySet) -> None:
    audit = AuditLog()
    decision = await PolicyGate(policies, audit=audit).check(gate_call("refund", "write"))
    assert isinstance(decision, NeedsApproval)
    assert decision.messages == ("payments need a second pair of eyes",)
    assert audit.records[0]["decision"] == "require_approval"
    assert decision.audit_id == audit.records[0]["audit_id"]


@pytest.mark.parametrize(("name", "expected"), [
    ("syntax.rego", r"syntax\.rego:6:\d+: "),
    ("package.rego", r"package\.rego:1: package 'company\.rules' is not ringlet"),
    ("v0.rego", r"v0\.rego:3: `deny\[msg\] \{ … \}` is Rego v0 syntax.*deny contains msg if"),
])
def test_bad_policy_files_are_load_errors(name: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        PolicySet.load([POLICIES / "broken" / name])


async def test_reload_swaps_the_set_and_a_failed_reload_keeps_it(policies: PolicySet) -> None:
    gate = PolicyGate(policies)
    with pytest.raises(ConfigError):
        gate.reload([POLICIES / "broken" / "syntax.rego"])
    assert gate.policies is policies
    fresh = gate.reload([POLICIES / "roles.rego"])
    assert gate.policies is fresh
    assert fresh.packages == ("ringlet.ops",)


async def test_the_input_document_has_exactly_the_spec_keys() -> None:
    from datetime import date

    gate = PolicyGate(PolicySet.empty(), clock=lambda: NOON, timezone="Europe/Berlin")
    document = gate.document(gate_call("deploy", "write", realm="prod", args={"day": date(2026, 5, 1)}))
    assert document == {
        "subject": {"user_id": "u_1", "org_id": "o_1", "roles": [], "channel": "chat"},
        "action": "tool.execute",
        "resource": {"connector": None, "tool": "deploy", "effect": "write"},
        "args": {"day": "2026-05-01"},
        "context": {"realm": "prod", "request_id": None, "conversation_id": None, "run_id": "r_1",
                    "agent": "ops", "approval_granted": False},
        "env": {"now": "2026-05-01T12:00:00.000Z", "time_of_day": "14:00", "weekday": "fri",
                "tz": "Europe/Berlin"},
    }


async def test_a_rule_without_a_value_and_unusual_arguments_are_handled(policies: PolicySet) -> None:
    import uuid
    from datetime import date

    sometimes = PolicySet.compile({"s.rego": 'package ringlet.s\nimport rego.v1\n'
                                            'deny := {"flagged"} if { input.args.flag }\n',
                                   "o.rego": 'package ringlet.o\nimport rego.v1\n'
                                            'deny contains "o says no" if { input.args.other }\n'})
    gate = PolicyGate(sometimes)
    assert (await gate.check(gate_call("t", "write", args={"flag": False}))).decision == "allow"
    flagged = await gate.check(gate_call("t", "write", args={"flag": True, "other": True}))
    assert flagged.message == "o says no; flagged"  # type: ignore[union-attr]  # packages in name order
    odd = await PolicyGate(policies).check(gate_call("status", "read", args={"on": date(2026, 1, 1),
                                                                             "id": uuid.uuid4()}))
    assert odd.decision == "allow"


@pytest.mark.parametrize(("source", "expected"), [
    ('package ringlet\nimport rego.v1\nops.deny contains "x" if { true }\n', "dotted rule name"),
    ('package ringlet\nimport rego.v1\ndefault ops.require_approval := set()\n', "dotted rule name"),
])
def test_rules_ringlet_would_not_query_are_load_errors(source: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        PolicySet.compile({"p.rego": source})


def test_v0_detection_reads_rule_heads_only() -> None:
    body_reference = ('package ringlet.x\nimport rego.v1\n# deny[msg] { old }\nallowed if {\n'
                      '  deny["x"]\n}\ndeny contains "x" if { input.a }\n')
    assert PolicySet.compile({"x.rego": body_reference}).packages == ("ringlet.x",)


async def test_a_stuck_evaluation_fails_closed_and_does_not_hold_up_later_calls() -> None:
    slow = PolicySet.compile({"slow.rego": 'package ringlet\nimport rego.v1\ndeny contains "never" if {\n'
                                           '  count(numbers.range(1, 3000000)) < 0\n}\n'})
    audit = AuditLog()
    gate = PolicyGate(slow, audit=audit, timeout_ms=50)
    stuck_pool = gate._pool
    decision = await gate.check(gate_call("t", "write"))  # fails closed, and says why
    assert decision.decision == "error"
    assert decision.code == "policy_denied"  # type: ignore[union-attr]
    assert decision.message == "policy evaluation failed: timed out after 50 ms"  # type: ignore[union-attr]
    assert decision.extra["policy_id"] is None  # type: ignore[union-attr]
    assert gate._pool is not stuck_pool  # the stuck worker is left behind with its old pool
    gate.policies = PolicySet.load([POLICIES / "roles.rego"])
    for _ in range(4):  # more calls than workers: none waits behind the abandoned evaluation
        assert (await gate.check(gate_call("status", "read"))).decision == "allow"
    assert [r["decision"] for r in audit.records] == ["error", "allow", "allow", "allow", "allow"]


async def test_a_rule_that_is_not_a_set_fails_closed() -> None:
    odd = PolicySet.compile({"odd.rego": 'package ringlet\nimport rego.v1\ndeny := {"a": 1}\n'})
    decision = await PolicyGate(odd).check(gate_call("status", "read"))
    assert decision.code == "policy_denied"  # type: ignore[union-attr]
    assert "not a set" in decision.message  # type: ignore[union-attr]


async def test_no_policy_allows_and_is_audited_without_a_hash() -> None:
    audit = AuditLog()
    assert (await PolicyGate(PolicySet.empty(), audit=audit).check(gate_call("x", "write"))).decision == "allow"
    assert audit.records[0]["policy_set_hash"] is None


async def test_evaluation_reuses_the_compiled_set(policies: PolicySet, monkeypatch: pytest.MonkeyPatch) -> None:
    import regopy

    def no_parsing(*args: Any) -> None:
        raise AssertionError("an evaluation parsed a module again")

    monkeypatch.setattr(regopy.Interpreter, "add_module", no_parsing)
    for _ in range(3):
        assert policies.evaluate({"resource": {"effect": "read"}}).deny == ()


async def test_the_model_reads_the_denial_and_the_stream_carries_the_decision(policies: PolicySet) -> None:
    audit = AuditLog()
    model = ScriptedModel([[call("delete_deployment", name="checkout"), call("status", name="checkout",
                                                                             api_key="sk-123")],
                           "I may not delete it; it is healthy."])
    agent = Agent(model, tools=[delete_deployment, status],
                  gates=Gates(policies=[PolicyGate(policies, audit=audit, clock=lambda: NOON)]))
    events = [e async for e in agent.stream("clean up checkout")]
    results = {e.name: e for e in of_type(events, "tool_result")}
    records = {r["tool"]: r for r in audit.records}  # the two calls ran in parallel: any order
    assert results["delete_deployment"].is_error
    assert results["delete_deployment"].error["code"] == "policy_denied"
    assert results["delete_deployment"].policy == {"decision": "deny",
                                                   "audit_id": records["delete_deployment"]["audit_id"]}
    assert results["status"].policy == {"decision": "allow", "audit_id": records["status"]["audit_id"]}
    tool_messages = [m for m in model.requests[1].messages if m.role == "tool"]
    denial = json.loads(tool_messages[0].text)["error"]
    assert denial["message"] == "destructive operations need the platform-admin role"
    assert denial["audit_id"] == records["delete_deployment"]["audit_id"]
    assert records["status"]["args_redacted"] == {"name": "checkout", "api_key": "***"}


async def test_the_server_applies_its_policy_and_serves_the_audit_log(tmp_path: Path) -> None:
    import httpx

    from ringlet.server import ServerSettings, create_app
    from ringlet.store import Store
    from serving import CLIENT_TIMEOUT_S, serving

    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    model = ScriptedModel([call("delete_deployment", name="checkout"), "Not allowed, sorry."])
    agent = Agent(model, name="ops", tools=[delete_deployment])
    settings = ServerSettings(auth_mode="none", policy_paths=[str(POLICIES)],
                              policy_eval_timeout_ms=10_000)  # not this test's subject; CI can starve a thread
    async with serving(create_app(settings, store=store, agents=[agent])) as url, \
            httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S) as client:
        cid = (await client.post("/api/v1/chat/conversations", json={"agent": "ops"})).json()["id"]
        await client.post(f"/api/v1/chat/conversations/{cid}/messages", json={"content": "delete checkout"},
                          headers={"Accept": "application/json", "X-Request-Id": "req-audit"})
        messages = (await client.get(f"/api/v1/chat/conversations/{cid}")).json()["messages"]
        assert json.loads(messages[2]["content"])["error"]["code"] == "policy_denied"
        audit = (await client.get("/api/v1/audit", params={"decision": "deny"})).json()["data"]
        assert [(r["tool"], r["decision"], r["request_id"], r["conversation_id"]) for r in audit] == [
            ("delete_deployment", "deny", "req-audit", cid)]
    await store.close()
    with pytest.raises(ConfigError, match=r"syntax\.rego"):
        create_app(ServerSettings(auth_mode="none", policy_paths=[str(POLICIES / "broken" / "syntax.rego")]),
                   agents=[])


async def test_the_server_reloads_its_policies_and_rejects_a_broken_set(tmp_path: Path) -> None:
    import shutil

    import httpx

    from ringlet.server import ServerSettings, create_app
    from ringlet.store import Store
    from serving import CLIENT_TIMEOUT_S, serving

    folder = tmp_path / "policies"
    folder.mkdir()
    shutil.copy(POLICIES / "roles.rego", folder)
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'r.db'}")
    app = create_app(ServerSettings(auth_mode="none", policy_paths=[str(folder)]), store=store, agents=[])
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S) as client:
        assert (await client.get("/readyz")).status_code == 200  # serving() yields once the app has started
        state = app.state.ringlet
        first = state.policy.policies
        shutil.copy(POLICIES / "broken" / "syntax.rego", folder)
        assert state.reload_policies() is False
        assert state.policy.policies is first  # the broken set was rejected whole
        (folder / "syntax.rego").unlink()
        shutil.copy(POLICIES / "hours.rego", folder)
        assert state.reload_policies() is True
        assert state.policy.policies.packages == ("ringlet.hours", "ringlet.ops")
    await store.close()


PURE = """package ringlet.cache

import rego.v1

deny contains "no writes at night" if {
	input.resource.effect != "read"
	input.env.time_of_day >= "22:00"
}

deny contains msg if {
	some k, _ in input.args
	k == "danger"
	msg := sprintf("argument %v refused (input[...] in a message is not a read)", [k])
}
"""


async def test_a_pure_set_caches_decisions_on_the_inputs_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    policies = PolicySet.compile({"cache.rego": PURE})
    assert policies.reads == (("args",), ("env", "time_of_day"), ("resource", "effect"))
    evaluated: list[dict[str, Any]] = []
    real = PolicySet.evaluate

    def counting(self: PolicySet, document: dict[str, Any]) -> Any:
        evaluated.append(document)
        return real(self, document)

    monkeypatch.setattr(PolicySet, "evaluate", counting)
    audit = AuditLog()
    day, night = (PolicyGate(policies, audit=audit, clock=lambda t=t: t) for t in (NOON, NIGHT))
    assert (await day.check(gate_call("deploy", "write", args={"n": 1}))).decision == "allow"
    other_run = gate_call("deploy", "write", args={"n": 1}, roles=("admin",))  # roles: not read by the set
    assert (await day.check(other_run)).decision == "allow"
    assert len(evaluated) == 1  # the second call was answered from the cache
    assert (await night.check(gate_call("deploy", "write", args={"n": 1}))).decision == "deny"  # another hour
    assert (await day.check(gate_call("deploy", "write", args={"danger": 1}))).decision == "deny"  # other args
    assert len(evaluated) == 3
    assert len(audit.records) == 4  # every call is audited, cached or not
    reloaded = PolicySet.compile({"cache.rego": PURE})
    assert reloaded.cached(day.document(gate_call("deploy", "write", args={"n": 1}))) is None  # a fresh set


@pytest.mark.parametrize("body", ["t := time.now_ns()\n\tt > 0", "x := input\n\tx.resource.tool == \"a\"",
                                  "input.resource.tool == \"a\" with input.resource.tool as \"a\""])
def test_an_impure_set_or_a_whole_input_read_is_never_cached(body: str) -> None:
    source = f"package ringlet.impure\n\nimport rego.v1\n\ndeny contains \"x\" if {{\n\t{body}\n}}\n"
    policies = PolicySet.compile({"impure.rego": source})
    assert policies.reads is None
    document = PolicyGate(policies).document(gate_call("a", "write"))
    policies.evaluate(document)
    assert policies.cached(document) is None


async def test_a_served_app_has_started_before_its_first_request() -> None:
    """`serving` (the tests' server) yields once the app's startup is over, so a first `/readyz` never waits in the
    socket's backlog behind a slow startup and meets the client's connect timeout (a busy machine's flake)."""
    import asyncio
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette

    from serving import serving

    state = {"started": False}
    go = asyncio.Event()

    @asynccontextmanager
    async def lifespan(_app: object):
        await go.wait()  # a startup that takes as long as the test says
        state["started"] = True
        yield

    asyncio.get_running_loop().call_soon(go.set)
    async with serving(Starlette(lifespan=lifespan)):
        assert state["started"]
