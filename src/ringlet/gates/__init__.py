"""Tool-call gates (`gates.md`): decisions are values (`Allow | Deny`), never bools.

    gate = PolicyGate(PolicySet.load(["policies/"]), audit=AuditLog())
    agent = Agent(model, tools=[...], gates=Gates(policies=[gate]))

Every call that passes validation and `pre_execute` goes through each gate in order before its backend
runs; a `Deny` becomes the call's error result (the model reads it and the run goes on). `PolicyGate`
evaluates the Rego policies off the event loop under a deadline, fails closed, and appends one audit
record per decision to its `AuditSink`.

A policy's `require_approval` is `NeedsApproval`: the approval gate (`ringlet.gates.approval`) then asks
a human whatever the tool's own rules say. `approve(note)` and `deny(note)` are the human's decisions
given to `agent.resume(state, {call_id: deny("not on Fridays")})` (not to be confused with `Deny`, a
gate's decision).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from pydantic_core import to_jsonable_python

from ringlet._ids import at
from ringlet.context import RunContext
from ringlet.gates.approval import (
    ApprovalBroker,
    ApprovalDecision,
    ApprovalRequest,
    ApprovalRules,
    Approver,
    AutoApprove,
    approve,
    deny,
)
from ringlet.gates.policy import PolicyError, PolicySet, Verdict

__all__ = ["Allow", "ApprovalBroker", "ApprovalDecision", "ApprovalRequest", "ApprovalRules", "Approver", "AuditLog",
           "AutoApprove", "Decision", "Deny", "Gate", "GateCall", "NeedsApproval", "PolicyGate", "PolicySet", "approve",
           "deny", "redact"]

DEFAULT_REDACT = r"(?i)pass|secret|token|key|authorization"
QUEUE_LIMIT_S = 5.0
"""How long a call may wait for a free policy worker before it is denied (fail closed)."""
log = logging.getLogger("ringlet.gates")


def _pool() -> ThreadPoolExecutor:
    """One worker: its interpreter stays hot (measured: a pool of several threads, taking turns, costs
    ~0.6 ms more per evaluation here); a worker stuck past the deadline is replaced (`_evaluate`)."""
    return ThreadPoolExecutor(1, thread_name_prefix="ringlet-policy")


@dataclass(frozen=True, slots=True)
class GateCall:
    """The call a gate judges: the (inner) tool, its effect and arguments, and the run's context."""

    tool: str
    effect: str
    args: Mapping[str, Any]
    ctx: RunContext
    connector: str | None = None
    approval_granted: bool = False
    action: str = "tool.execute"
    """What is asked: `tool.execute`, or `mcp.sampling` (an MCP server asks for a completion: `connector`
    names the server, `args` hold the prompt)."""


@dataclass(frozen=True, slots=True)
class Allow:
    audit_id: str | None = None
    decision: str = "allow"


@dataclass(frozen=True, slots=True)
class Deny:
    """Refuse the call: `code` and `message` reach the model in the error result, with `extra`.
    `decision` is what the audit log recorded (`deny`, `error`, `require_approval`)."""

    code: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)
    audit_id: str | None = None
    decision: str = "deny"


@dataclass(frozen=True, slots=True)
class NeedsApproval:
    """The policy allows the call only if a human approves it (`require_approval`); `messages` say why."""

    messages: tuple[str, ...]
    audit_id: str | None = None
    decision: str = "require_approval"


Decision = Allow | Deny | NeedsApproval


class Gate(Protocol):
    async def check(self, call: GateCall) -> Decision: ...


AuditSink = Callable[[dict[str, Any]], Awaitable[None] | None]


class AuditLog:
    """An in-memory, append-only audit log (the server writes to its store instead)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def __call__(self, record: dict[str, Any]) -> None:
        self.records.append(record)


def redact(value: Any, pattern: re.Pattern[str]) -> Any:
    """`value` with every entry whose key matches `pattern` replaced by "***", at any depth."""
    if isinstance(value, Mapping):
        return {k: "***" if pattern.search(str(k)) else redact(v, pattern) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, pattern) for v in value]
    return value


class PolicyGate:
    """Rego policies: `deny` refuses the call (`policy_denied`); evaluation errors and timeouts fail closed."""

    def __init__(self, policies: PolicySet, *, audit: AuditSink | None = None, timeout_ms: float = 250,
                 timezone: str = "UTC", redact_keys: str = DEFAULT_REDACT,
                 clock: Callable[[], float] | None = None) -> None:
        self.policies = policies
        self.audit = audit or AuditLog()
        self.timeout_s = timeout_ms / 1000
        self.zone = ZoneInfo(timezone)
        self.timezone = timezone
        self.redact_keys = re.compile(redact_keys)
        self.clock = clock
        """The time policies see (None: the run's seam, like every reading a replay gives back)."""
        self._pool = _pool()
        self._abandoned = 0

    def reload(self, paths: Iterable[str | Path]) -> PolicySet:
        """Load the files and swap the whole set at once; a bad file raises ConfigError and the current set
        stays active."""
        self.policies = PolicySet.load(paths)
        return self.policies

    def document(self, call: GateCall) -> dict[str, Any]:
        """The input document of `gates.md` §3."""
        ctx = call.ctx
        now = self.clock() if self.clock is not None else ctx.seam.now()
        local = datetime.fromtimestamp(now, self.zone)
        return {
            "subject": {"user_id": ctx.user_id, "org_id": ctx.org_id, "roles": list(ctx.roles),
                        "channel": ctx.channel},
            "action": call.action,
            "resource": {"connector": call.connector, "tool": call.tool, "effect": call.effect},
            "args": to_jsonable_python(dict(call.args), fallback=str),  # dates, UUIDs, models as JSON
            "context": {"realm": ctx.realm, "request_id": ctx.request_id,
                        "conversation_id": ctx.conversation_id, "run_id": ctx.run_id, "agent": ctx.agent,
                        "approval_granted": call.approval_granted},
            "env": {"now": at(now), "time_of_day": local.strftime("%H:%M"),
                    "weekday": local.strftime("%a").lower(), "tz": self.timezone},
        }

    async def check(self, call: GateCall) -> Decision:
        policies, document, started = self.policies, self.document(call), time.perf_counter()
        verdict, failure = Verdict(), None
        if policies.hash is not None and (hit := policies.cached(document)) is not None:
            verdict = hit  # an equal input (on the paths the pure policies read) was judged before
        elif policies.hash is not None:
            try:
                verdict = await self._evaluate(policies, document)
            except TimeoutError:
                failure = f"timed out after {self.timeout_s * 1000:g} ms"  # a late result is discarded
            except Exception as exc:  # any engine failure fails closed; the run goes on
                failure = str(exc) if isinstance(exc, PolicyError) else f"{type(exc).__name__}: {exc}"
        audit_id = call.ctx.seam.new_id("au")
        if failure is not None:
            decision, messages, ids = "error", [f"policy evaluation failed: {failure}"], []
        elif verdict.deny:
            decision, messages, ids = "deny", [m for m, _ in verdict.deny], [p for _, p in verdict.deny]
        elif verdict.require_approval:
            decision = "require_approval"
            messages, ids = [m for m, _ in verdict.require_approval], [p for _, p in verdict.require_approval]
        else:
            decision, messages, ids = "allow", [], []
        await self._audit(call, document, audit_id=audit_id, decision=decision, messages=messages, ids=ids,
                          started=started, policy_hash=policies.hash)
        if decision == "allow":
            return Allow(audit_id)
        if decision == "require_approval":
            return NeedsApproval(tuple(messages), audit_id)
        return Deny("policy_denied", "; ".join(messages),
                    {"policy_id": ids[0] if ids else None, "messages": messages, "audit_id": audit_id}, audit_id,
                    decision)

    async def _evaluate(self, policies: PolicySet, document: dict[str, Any]) -> Verdict:
        """Evaluate in a worker thread. The deadline counts from when a worker starts the job (waiting in
        the queue behind other calls is not the policy being slow, and has its own, longer limit). A
        worker stuck past the deadline is left to finish alone: the pool is replaced, so it cannot hold
        up later calls. The common case (a fast evaluation) costs one thread hand-off each way."""
        loop = asyncio.get_running_loop()
        started: list[float] = []

        def job() -> Verdict:
            started.append(time.monotonic())
            return policies.evaluate(document)

        pool = self._pool
        future = loop.run_in_executor(pool, job)
        queue_deadline = time.monotonic() + QUEUE_LIMIT_S
        while True:
            wait = (started[0] + self.timeout_s if started else queue_deadline) - time.monotonic()
            if wait <= 0:
                break
            done, _ = await asyncio.wait([future], timeout=wait)
            if done:
                return future.result()
        future.cancel()  # the result, if it ever comes, is discarded
        if started and pool is self._pool:
            self._abandoned += 1
            log.warning("a policy evaluation ran past %s ms; replacing the worker pool (%d so far)",
                        self.timeout_s * 1000, self._abandoned)
            self._pool = _pool()
            pool.shutdown(wait=False, cancel_futures=True)
        raise TimeoutError

    async def _audit(self, call: GateCall, document: dict[str, Any], *, audit_id: str, decision: str,
                     messages: list[str], ids: list[str], started: float, policy_hash: str | None) -> None:
        ctx = call.ctx
        record = {"audit_id": audit_id, "at": document["env"]["now"],
                  "request_id": document["context"]["request_id"], "run_id": ctx.run_id,
                  "conversation_id": ctx.conversation_id, "org_id": ctx.org_id, "realm": ctx.realm,
                  "subject": document["subject"], "action": call.action, "connector": call.connector,
                  "tool": call.tool, "effect": call.effect,
                  "agent": ctx.agent,
                  "args_redacted": redact(document["args"], self.redact_keys),
                  "decision": decision, "messages": messages, "policy_ids": ids,
                  "approval_granted": call.approval_granted,
                  "duration_ms": round((time.perf_counter() - started) * 1000, 3), "policy_set_hash": policy_hash}
        written = self.audit(record)
        if inspect.isawaitable(written):
            await written
