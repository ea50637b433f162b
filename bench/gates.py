"""Time per tool call spent in the gates, with a 20-rule Rego policy loaded (issue #24 target: ≤ 150 µs).

Builds 20 `deny` rules in 20 packages (`ringlet.rules.r0` … `r19`, each looking at the tool, effect,
roles, realm or time of day), then times `PolicyGate.check` — input document, evaluation in the worker
thread under its deadline, the audit record — for a call that every rule lets through (the common case:
all rules evaluated, nothing short-circuits), then the approval rules (`ApprovalRules.judge` with deny
and allow patterns that do not match, so the mode decides). The set is pure, so a repeated call is answered
from its decision cache; the first call with a new input (the cache emptied before each call) is timed too.
Also times the bare evaluation (`PolicySet.evaluate`) and the first-time compile of the set. Prints medians
over several runs.

Run: `.venv/bin/python bench/gates.py [--calls 300] [--runs 7]`
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from ringlet.context import RunContext
from ringlet.gates import ApprovalRules, AuditLog, GateCall, PolicyGate, PolicySet

RULE = """package ringlet.rules.r{i}

import rego.v1

deny contains msg if {{
	input.resource.tool == "forbidden_{i}"
	input.resource.effect != "read"
	not "admin" in input.subject.roles
	input.context.realm == "prod"
	input.env.time_of_day >= "00:00"
	msg := sprintf("tool %v is forbidden outside admin roles", [input.resource.tool])
}}
"""


def policy() -> dict[str, str]:
    return {f"r{i}.rego": RULE.format(i=i) for i in range(20)}


async def main(calls: int, runs: int) -> None:
    compile_ms = []
    for _ in range(runs):
        started = time.perf_counter()
        policies = PolicySet.compile(policy())
        compile_ms.append((time.perf_counter() - started) * 1000)
    gate = PolicyGate(policies, audit=AuditLog())
    ctx = RunContext(run_id="r_1", agent="ops", realm="prod", user_id="u_1", roles=("member",))
    call = GateCall("deploy", "write", {"name": "checkout", "replicas": 3}, ctx)
    document = gate.document(call)
    for _ in range(20):  # warm up the worker thread's interpreter
        await gate.check(call)
    rules = ApprovalRules({"deploy": {"mode": "auto", "deny_patterns": [r"rm\s+-rf", "sudo", "prod-db"],
                                      "allow_patterns": [r'"name":"canary']}})
    check_us, miss_us, eval_us, judge_us = [], [], [], []
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(calls):
            policies._cache.clear()  # a first-seen input: the interpreter, in the worker thread
            await gate.check(call)
        miss_us.append((time.perf_counter() - started) / calls * 1e6)
        started = time.perf_counter()
        for _ in range(calls):
            decision = await gate.check(call)
        check_us.append((time.perf_counter() - started) / calls * 1e6)
        assert decision.decision == "allow"
        started = time.perf_counter()
        for _ in range(calls):
            verdict = rules.judge(call.tool, call.effect, call.args)
        judge_us.append((time.perf_counter() - started) / calls * 1e6)
        assert verdict.decided_by == "rule:auto"  # type: ignore[union-attr]
        started = time.perf_counter()
        for _ in range(calls):
            policies.evaluate(document)
        eval_us.append((time.perf_counter() - started) / calls * 1e6)
    print(f"20 rules in 20 packages; {calls} calls x {runs} runs; medians")
    total = statistics.median([c + j for c, j in zip(check_us, judge_us, strict=True)])
    print(f"  gates per tool call (policy + approval)     {total:8.1f} µs  (target ≤ 150 µs)")
    print(f"    policy gate (PolicyGate.check)            {statistics.median(check_us):8.1f} µs")
    print(f"    policy gate, a first-seen input (a miss)  {statistics.median(miss_us):8.1f} µs")
    print(f"      of which the Rego evaluation            {statistics.median(eval_us):8.1f} µs")
    print(f"    approval rules (ApprovalRules.judge)      {statistics.median(judge_us):8.1f} µs")
    print(f"  compiling the set (once per load/reload)    {statistics.median(compile_ms):8.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.runs))
