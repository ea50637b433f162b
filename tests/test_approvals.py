"""The approval gate in the library (issue #5, gates.md §4): rules, pauses with pending approvals, resume
in this or another process, the in-process broker, timeouts, the policy re-check and the audit."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from helpers import of_type, types
from ringlet import Agent, ConfigError, Gates, tool
from ringlet.gates import (
    Allow,
    ApprovalBroker,
    ApprovalRules,
    AuditLog,
    AutoApprove,
    GateCall,
    PolicyGate,
    PolicySet,
)
from ringlet.gates.approval import ApprovalDecision, Ask, RuleVerdict, approve, deny, subject
from ringlet.loop import RunState
from ringlet.testing import ScriptedModel, call

POLICIES = Path(__file__).parent / "policies"
ran: list[str] = []


@tool(effect="read")
def lookup(name: str) -> str:
    """Read a record."""
    ran.append(f"lookup {name}")
    return f"{name}: ok"


@tool(effect="write")
def deploy(service: str) -> str:
    """Deploy a service."""
    ran.append(f"deploy {service}")
    return f"deployed {service}"


@tool(effect="destructive", idempotent=True)
def restart(service: str) -> str:
    """Restart a service (safe to repeat)."""
    ran.append(f"restart {service}")
    return f"restarted {service}"


def _decoded(content: str) -> Any:
    return json.loads(content) if content.startswith("{") else content


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


# -- the rules (§4.1, §4.2) --------------------------------------------------------------------------------

def test_matching_subject_is_sorted_compact_json_with_unicode_kept() -> None:
    assert subject("shell", {"cmd": "ls é", "a": 1}) == '{"parameters":{"a":1,"cmd":"ls é"},"tool":"shell"}'


def test_every_rule_path() -> None:
    rules = ApprovalRules({
        "shell": {"mode": "confirm", "allow_patterns": [r'"cmd":"ls\b'], "deny_patterns": [r"rm\s+-rf", "SUDO"],
                  "timeout_s": 30},
        "search": {"mode": "auto"},
        "mail": {"allow_patterns": ["@example.com"]},
    }, defaults={"destructive": "deny"}, timeout_s=120)
    # 1. a deny pattern wins, case-insensitively, with no human
    assert rules.judge("shell", "write", {"cmd": "sudo ls"}) == RuleVerdict(
        False, "rule:deny_pattern", "blocked by approval rule 'SUDO'")
    assert rules.judge("shell", "write", {"cmd": "rm  -rf /"}).decided_by == "rule:deny_pattern"  # type: ignore[union-attr]
    # 2. an allow pattern allows, unless the policy requires approval
    assert rules.judge("shell", "write", {"cmd": "ls -l"}) == RuleVerdict(True, "rule:allow_pattern")
    assert rules.judge("shell", "write", {"cmd": "ls"}, ["payments need review"]) == Ask("payments need review", 30)
    # 3. the mode: confirm asks (with the tool's timeout), auto allows unless the policy requires approval
    assert rules.judge("shell", "write", {"cmd": "cat x"}) == Ask("shell requires confirmation", 30)
    assert rules.judge("search", "write", {}) == RuleVerdict(True, "rule:auto")
    assert rules.judge("search", "write", {}, ["why"]) == Ask("why", 120)
    # no mode: the effect default (allow / approve / deny), after the patterns
    assert rules.judge("mail", "write", {"to": "a@example.com"}) == RuleVerdict(True, "rule:allow_pattern")
    assert rules.judge("mail", "write", {"to": "a@evil.com"}) == Ask("write tool requires approval", 120)
    assert rules.judge("other", "read", {}) == RuleVerdict(True, "rule:effect")
    assert rules.judge("other", "read", {}, ["policy says so"]) == Ask("policy says so", 120)
    assert rules.judge("other", "destructive", {}) == RuleVerdict(
        False, "rule:effect", "destructive tools are denied by approval_defaults")


def test_the_defaults_are_read_allow_write_and_destructive_approve() -> None:
    rules = ApprovalRules()
    assert rules.judge("t", "read", {}) == RuleVerdict(True, "rule:effect")
    assert rules.judge("t", "write", {}) == Ask("write tool requires approval", 300)
    assert rules.judge("t", "destructive", {}) == Ask("destructive tool requires approval", 300)


@pytest.mark.parametrize(("config", "expected"), [
    ({"shell": {"deny_patterns": ["ok", "rm[ -rf"]}},
     r"tools\.shell\.approval\.deny_patterns\[1\]: invalid regular expression 'rm\[ -rf': unterminated"),
    ({"shell": {"allow_patterns": ["(ls"]}}, r"tools\.shell\.approval\.allow_patterns\[0\]: .*'\(ls'"),
    ({"shell": {"mode": "sometimes"}}, r"tools\.shell\.approval\.mode: Input should be 'auto' or 'confirm'"),
])
def test_invalid_rules_are_load_errors(config: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        ApprovalRules(config, source="agents/ops/config.yaml")


# -- pausing and resuming ---------------------------------------------------------------------------------

def three_calls() -> ScriptedModel:
    return ScriptedModel([
        [call("deploy", service="api", id="c_a"), call("deploy", service="web", id="c_b"),
         call("restart", service="db", id="c_c"), call("lookup", name="x", id="c_d")],
        "done",
    ])


async def test_three_approvals_in_one_round_decided_differently() -> None:
    model, audit = three_calls(), AuditLog()
    agent = Agent(model, tools=[lookup, deploy, restart], gates=Gates(approvals=ApprovalRules(), audit=audit))
    stream = agent.stream("ship it")
    events = [e async for e in stream]
    # every request is emitted before the run waits; the read call ran at once; no message_end yet
    assert types(events)[-5:] == ["approval_required", "approval_required", "approval_required", "tool_result",
                                  "status"] or types(events).count("approval_required") == 3
    assert events[-1].type == "status"
    assert events[-1].state == "input_required"
    assert "message_end" not in types(events)
    assert ran == ["lookup x"]
    paused = stream.result
    assert paused is not None
    assert paused.status == "input_required"
    assert paused.finish_reason is None
    assert sorted(paused.pending_approvals) == ["c_a", "c_b", "c_c"]
    required = {e.tool_call_id: e for e in of_type(events, "approval_required")}
    assert required["c_c"].effect == "destructive"
    assert required["c_c"].reason == "destructive tool requires approval"
    assert required["c_a"].args == {"service": "api"}

    # the state goes through JSON (another process would load it); decisions come in any order
    saved = paused.state.to_json()
    expired = RunState.from_json(saved)
    expired.awaiting["c_c"].request.expires_at = "2000-01-01T00:00:00.000Z"
    first = await agent.resume(expired, {"c_b": deny("not on Fridays", decided_by="ana")})
    assert first.status == "input_required"
    assert sorted(first.pending_approvals) == ["c_a"]
    assert ran == ["lookup x"]
    stream = agent.resume_stream(first.state, {first.pending_approvals["c_a"].approval_id: True})
    events = [e async for e in stream]
    assert ran == ["lookup x", "deploy api"]
    assert types(events)[0] == "status"
    assert types(events).count("message_end") == 1
    done = stream.result
    assert done is not None
    assert done.status == "completed"
    assert done.output == "done"
    assert done.run_id == paused.run_id
    # the model's next request has one result per call, in call order, with the human's note
    results = {m.tool_call_id: _decoded(m.content) for m in model.requests[1].messages if m.role == "tool"}
    assert list(results) == ["c_a", "c_b", "c_c", "c_d"]
    assert results["c_a"] == "deployed api"
    assert results["c_b"] == {"error": {"code": "approval_denied", "message": "denied by ana: not on Fridays",
                                        "decided_by": "ana", "note": "not on Fridays"}}
    assert results["c_c"]["error"]["code"] == "approval_timeout"
    assert results["c_c"]["error"]["message"] == "no decision within 300 s"
    assert results["c_d"] == "x: ok"
    decisions = [(r["tool_call_id"], r["decision"], r["decided_by"]) for r in audit.records]
    assert decisions == [("c_b", "denied", "ana"), ("c_c", "expired", "system:timeout"), ("c_a", "approved", "user")]
    assert all(r["action"] == "approval.decide" and r["approval_id"].startswith("ap_") for r in audit.records)
    model.assert_complete()


async def test_rule_denials_reach_the_model_without_a_human() -> None:
    model = ScriptedModel([[call("deploy", service="prod-db", id="c_1")], "ok"])
    rules = ApprovalRules({"deploy": {"mode": "auto", "deny_patterns": ["prod-"]}})
    result = await Agent(model, tools=[deploy], gates=Gates(approvals=rules)).run("go")
    assert result.status == "completed"
    assert ran == []
    error = json.loads(model.requests[1].messages[-1].content)["error"]
    assert error == {"code": "approval_denied", "message": "blocked by approval rule 'prod-'",
                     "decided_by": "rule:deny_pattern", "note": None}


async def test_an_interrupted_approved_call_is_not_run_again_unless_idempotent() -> None:
    model = ScriptedModel([[call("deploy", service="a", id="c_1"), call("restart", service="b", id="c_2")], "ok"])
    agent = Agent(model, tools=[deploy, restart], gates=Gates(approvals=ApprovalRules()))
    paused = await agent.run("go")
    interrupted = ApprovalDecision("executing", "ana")  # a process started both calls, then died
    done = await agent.resume(paused.state, {"c_1": interrupted, "c_2": interrupted})
    assert done.status == "completed"
    assert ran == ["restart b"]
    results = [_decoded(m.content) for m in model.requests[1].messages if m.role == "tool"]
    assert results[0] == {"error": {"code": "tool_error", "message": "interrupted by restart; not retried"}}
    assert results[1] == "restarted b"


async def test_policy_is_asked_again_after_approval() -> None:
    seen: list[bool] = []

    class Recorder:
        async def check(self, call: GateCall) -> Allow:
            seen.append(call.approval_granted)
            return Allow()

    model = ScriptedModel([[call("deploy", service="a", id="c_1")], "ok"])
    agent = Agent(model, tools=[deploy], gates=Gates(policies=[Recorder()], approvals=ApprovalRules()))
    paused = await agent.run("go")
    assert seen == [False]
    await agent.resume(paused.state, {"c_1": True})
    assert seen == [False, True]
    assert ran == ["deploy a"]


async def test_policy_require_approval_pauses_even_without_approval_rules() -> None:
    @tool(effect="read")
    def refund(order: str) -> str:
        """Refund an order."""
        return f"refunded {order}"

    model = ScriptedModel([[call("refund", order="o1", id="c_1")], "ok"])
    agent = Agent(model, tools=[refund], gates=Gates(policies=[PolicyGate(PolicySet.load([POLICIES / "review.rego"]))]))
    paused = await agent.run("go")
    assert paused.status == "input_required"
    assert paused.pending_approvals["c_1"].reason == "payments need a second pair of eyes"
    done = await agent.resume(paused.state, {"c_1": approve(decided_by="cfo")})
    assert model.requests[1].messages[-1].content == "refunded o1"
    assert done.output == "ok"


async def test_a_broker_lets_the_stream_wait_for_decisions() -> None:
    model = three_calls()
    broker = ApprovalBroker()
    agent = Agent(model, tools=[lookup, deploy, restart], gates=Gates(approvals=ApprovalRules(), approver=broker))

    async def human() -> None:  # another task decides, as a UI would
        await broker.wait_for_pending(3)
        assert sorted(r.tool_call_id for r in broker.pending.values()) == ["c_a", "c_b", "c_c"]
        broker.decide("c_c", approved=True)  # by tool-call id
        ids = {r.tool_call_id: k for k, r in broker.pending.items()}
        broker.decide(ids["c_a"], approved=False, note="no", decided_by="bo")
        broker.decide(ids["c_b"], approved=True)

    decider = asyncio.create_task(human())
    stream = agent.stream("go")
    events = [e async for e in stream]
    await decider
    assert types(events).count("message_end") == 1
    assert types(events).count("message_start") == 1
    assert stream.result is not None
    assert stream.result.status == "completed"
    assert sorted(ran) == ["deploy web", "lookup x", "restart db"]
    with pytest.raises(KeyError):
        broker.decide("c_a", approved=True)  # nothing pends any more


async def test_cancelling_while_waiting_still_ends_the_run() -> None:
    model = ScriptedModel([[call("deploy", service="a", id="c_1")]])
    broker = ApprovalBroker()
    agent = Agent(model, tools=[deploy], gates=Gates(approvals=ApprovalRules(), approver=broker))
    stream = agent.stream("go")
    events: list[Any] = []

    async def consume() -> None:
        async for event in stream:
            events.append(event)  # noqa: PERF401 - one by one: what came before the cancellation is kept

    task = asyncio.create_task(consume())
    await broker.wait_for_pending()  # the run waits on the broker now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events[-1].type == "message_end"
    assert events[-1].finish_reason == "cancelled"
    result = of_type(events, "tool_result")[0]
    assert result.error == {"code": "cancelled"}
    assert ran == []


async def test_auto_approve_approves_everything() -> None:
    model = ScriptedModel([[call("deploy", service="a", id="c_1")], "ok"])
    agent = Agent(model, tools=[deploy], gates=Gates(approvals=ApprovalRules(), approver=AutoApprove("cli:--yes")))
    result = await agent.run("go")
    assert result.status == "completed"
    assert ran == ["deploy a"]


@pytest.mark.slow
def test_resume_from_stored_state_in_another_process(tmp_path: Path) -> None:
    script = tmp_path / "ops.py"
    script.write_text(textwrap.dedent('''
        import asyncio, json, sys
        from ringlet import Agent, Gates, tool
        from ringlet.gates import ApprovalRules
        from ringlet.gates.approval import deny
        from ringlet.testing import ScriptedModel, call

        @tool(effect="write")
        def deploy(service: str) -> str:
            return f"deployed {service}"

        async def main(phase: str, path: str) -> None:
            model = ScriptedModel([[call("deploy", service="a", id="c_1"), call("deploy", service="b", id="c_2")]]
                                  if phase == "start" else ["all set"])
            agent = Agent(model, name="ops", tools=[deploy], gates=Gates(approvals=ApprovalRules()))
            if phase == "start":
                result = await agent.run("ship")
                open(path, "wb").write(result.state.to_json())
            else:
                result = await agent.resume(open(path, "rb").read(), {"c_1": True, "c_2": deny("later", "ana")})
                seen = [m.content for m in model.requests[0].messages if m.role == "tool"]
                print(json.dumps({"status": result.status, "output": result.output, "seen": seen,
                                  "run_id": result.run_id}))
            print(json.dumps({"pending": sorted(result.pending_approvals), "status": result.status}),
                  file=sys.stderr)

        asyncio.run(main(sys.argv[1], sys.argv[2]))
    '''))
    state = tmp_path / "state.json"
    start = subprocess.run([sys.executable, str(script), "start", str(state)], capture_output=True, text=True,
                           timeout=60, check=True)
    assert json.loads(start.stderr.strip().splitlines()[-1]) == {"pending": ["c_1", "c_2"],
                                                                 "status": "input_required"}
    resumed = subprocess.run([sys.executable, str(script), "resume", str(state)], capture_output=True,
                             text=True, timeout=60, check=True)
    out = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert out["status"] == "completed"
    assert out["output"] == "all set"
    assert out["run_id"] == json.loads(state.read_text())["run_id"]
    assert out["seen"][0] == "deployed a"
    assert json.loads(out["seen"][1])["error"]["message"] == "denied by ana: later"


def test_the_decisions_resume_takes_are_exported_from_ringlet_gates() -> None:
    """The README's `from ringlet.gates import deny` (issue 27)."""
    import ringlet.gates

    assert {"approve", "deny"} <= set(ringlet.gates.__all__)
    denial = ringlet.gates.deny("not on Fridays")
    assert (denial.status, denial.decided_by, denial.note) == ("denied", "user", "not on Fridays")
    assert ringlet.gates.approve().approved
    assert not ringlet.gates.deny().approved
