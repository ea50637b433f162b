"""The approval gate (`gates.md` §4): per-tool rules, approval requests and decisions, approvers.

    rules = ApprovalRules({"shell_exec": {"mode": "confirm", "deny_patterns": [r"rm\\s+-rf"]}})
    agent = Agent(model, tools=[shell_exec], approvals=rules)                # pauses for a human
    result = await agent.run("clean up")                                     # status input_required
    result = await agent.resume(result.state, {"call_1": True})              # later, any process

Rules decide first (deny patterns → allow patterns → mode → effect default); when a human is needed the
loop parks the call with an `ApprovalRequest` and the run pauses. With an `Approver` (e.g. the in-process
`ApprovalBroker`, or `AutoApprove`) the stream waits for it instead of ending.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import to_jsonable_python

from ringlet._ids import at
from ringlet.errors import ConfigError
from ringlet.tools.builtin.question import check_answer

DEFAULT_TIMEOUT_S = 300.0
Verdict = Literal["allow", "approve", "deny"]
DEFAULT_EFFECTS: dict[str, Verdict] = {"read": "allow", "write": "approve", "destructive": "approve"}
DecisionStatus = Literal["approved", "denied", "expired", "cancelled", "executing", "answered", "no_human"]
NEVER = "9999-12-31T23:59:59.000Z"
"""The `expires_at` of a request that waits indefinitely (a question with no `question_timeout_s`)."""


def _regex(pattern: str) -> str:
    try:
        re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {pattern!r}: {exc}; fix or remove the pattern") from None
    return pattern


Pattern = Annotated[str, AfterValidator(_regex)]


class ApprovalConfig(BaseModel):
    """`tools.<name>.approval`: evaluated deny_patterns → allow_patterns → mode. An invalid pattern is a
    validation error at its index."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    mode: Literal["auto", "confirm"] | None = None
    allow_patterns: list[Pattern] = Field(default_factory=list)
    deny_patterns: list[Pattern] = Field(default_factory=list)
    timeout_s: float | None = Field(default=None, gt=0)


@dataclass(frozen=True, slots=True)
class _Rule:
    mode: str | None
    allow: tuple[re.Pattern[str], ...]
    deny: tuple[re.Pattern[str], ...]
    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class Ask:
    """A human must decide: why, and within how many seconds."""

    reason: str
    timeout_s: float


@dataclass(frozen=True, slots=True)
class RuleVerdict:
    """The rules decided without a human: `allowed`, by `decided_by`, with `message` when denied."""

    allowed: bool
    decided_by: str
    message: str = ""


def subject(tool: str, args: Mapping[str, Any]) -> str:
    """The text patterns are matched against: sorted keys, `,`/`:` separators, non-ASCII kept."""
    return json.dumps({"tool": tool, "parameters": to_jsonable_python(dict(args), fallback=str)},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class ApprovalRules:
    """Per-tool approval config plus the effect defaults; `judge` is the decision order of §4.2."""

    def __init__(self, tools: Mapping[str, ApprovalConfig | Mapping[str, Any]] | None = None, *,
                 defaults: Mapping[Any, str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 source: str = "approval config") -> None:
        self.defaults = dict(DEFAULT_EFFECTS)
        for effect, verdict in (defaults or {}).items():
            if effect not in DEFAULT_EFFECTS or verdict not in ("allow", "approve", "deny"):
                raise ConfigError(f"{source}: approval_defaults.{effect}: {verdict!r} is not valid; map read, "
                                  "write and destructive to allow, approve or deny")
            self.defaults[effect] = verdict  # type: ignore[assignment]
        if timeout_s <= 0:
            raise ConfigError(f"{source}: approval_timeout_s must be > 0 (got {timeout_s})")
        self.timeout_s = timeout_s
        self.rules = {name: _compile(name, config, source) for name, config in (tools or {}).items()}

    def judge(self, tool: str, effect: str, args: Mapping[str, Any], required: Sequence[str] = (), *,
              declared: str | None = None) -> RuleVerdict | Ask:
        """Deny patterns, then allow patterns, then the mode (or the effect default). A non-empty policy
        `required` (its `require_approval` messages) turns anything but a denial into a question.
        `declared` is the tool's own mode, used when the config has no rule for it."""
        rule = self.rules.get(tool) or (_Rule(declared, (), (), None) if declared else None)
        timeout = (rule.timeout_s if rule else None) or self.timeout_s
        verdict = (self._patterns(rule, tool, args) if rule else None) or self._mode(rule, tool, effect, timeout)
        if required and not (isinstance(verdict, RuleVerdict) and not verdict.allowed):
            return Ask("; ".join(required), timeout)
        return verdict

    @staticmethod
    def _patterns(rule: _Rule, tool: str, args: Mapping[str, Any]) -> RuleVerdict | None:
        if not (rule.deny or rule.allow):
            return None
        text = subject(tool, args)
        denied = next((p for p in rule.deny if p.search(text)), None)
        if denied is not None:
            return RuleVerdict(False, "rule:deny_pattern", f"blocked by approval rule '{denied.pattern}'")
        return RuleVerdict(True, "rule:allow_pattern") if any(p.search(text) for p in rule.allow) else None

    def _mode(self, rule: _Rule | None, tool: str, effect: str, timeout: float) -> RuleVerdict | Ask:
        mode = rule.mode if rule else None
        if mode == "auto":
            return RuleVerdict(True, "rule:auto")
        if mode == "confirm":
            return Ask(f"{tool} requires confirmation", timeout)
        default = self.defaults.get(effect, "approve")
        if default == "deny":
            return RuleVerdict(False, "rule:effect", f"{effect} tools are denied by approval_defaults")
        return RuleVerdict(True, "rule:effect") if default == "allow" else Ask(f"{effect} tool requires approval",
                                                                                timeout)


def _compile(tool: str, config: ApprovalConfig | Mapping[str, Any], source: str) -> _Rule:
    if not isinstance(config, ApprovalConfig):
        try:
            config = ApprovalConfig.model_validate(config)
        except ValidationError as exc:
            problems = "; ".join(f"tools.{tool}.approval.{_path(e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
                                 for e in exc.errors())
            raise ConfigError(f"{source}: {problems}") from None
    allow, deny = (tuple(re.compile(p, re.IGNORECASE) for p in ps) for ps in (config.allow_patterns,
                                                                              config.deny_patterns))
    return _Rule(config.mode, allow, deny, config.timeout_s)


def _path(loc: Sequence[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


@dataclass(slots=True)
class ApprovalRequest:
    """The durable approval record of `gates.md` §4.3."""

    approval_id: str
    run_id: str
    conversation_id: str | None
    tool_call_id: str
    tool: str
    connector: str | None
    args: dict[str, Any]
    effect: str
    reason: str
    requested_at: str
    expires_at: str
    timeout_s: float
    status: str = "pending"
    decided_by: str | None = None
    decided_at: str | None = None
    note: str | None = None
    question: dict[str, Any] | None = None
    """Set for a question (`ask_question`, a graph input node): `{question, input_type, options,
    allow_freeform}`; the record's id is then a `q_` id and its decision carries the answer."""

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at != NEVER and (time.time() if now is None else now) >= epoch(self.expires_at)

    @property
    def kind(self) -> Literal["approval", "question"]:
        return "approval" if self.question is None else "question"


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """A decision on one request. `executing` means a process started the approved call and stopped:
    it is not run again (unless the tool is idempotent)."""

    status: DecisionStatus
    decided_by: str = "user"
    note: str | None = None
    decided_at: str = field(default_factory=lambda: at(time.time()))
    answer: Any = None
    """An answered question's answer (a label, labels or text) and `freeform`: `{"answer", "freeform"}`."""

    @property
    def approved(self) -> bool:
        return self.status in ("approved", "executing")

    @classmethod
    def of(cls, value: ApprovalDecision | bool, decided_by: str = "user") -> ApprovalDecision:
        if isinstance(value, ApprovalDecision):
            return value
        return cls("approved" if value else "denied", decided_by)


def approve(note: str | None = None, decided_by: str = "user") -> ApprovalDecision:
    return ApprovalDecision("approved", decided_by, note)


def deny(note: str | None = None, decided_by: str = "user") -> ApprovalDecision:
    return ApprovalDecision("denied", decided_by, note)


def epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


class Approver(Protocol):
    """Decides requests while the run waits: returns decisions for some of `requests` (at least one),
    keyed by tool-call id. The stream stops waiting on its own at the earliest `expires_at`."""

    async def wait(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, ApprovalDecision]: ...


class AutoApprove:
    """Approves every request (the CLI's `--yes`)."""

    def __init__(self, decided_by: str = "auto") -> None:
        self.decided_by = decided_by

    async def wait(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, ApprovalDecision]:
        return {r.tool_call_id: approve(decided_by=self.decided_by) if r.question is None else
                ApprovalDecision("no_human", self.decided_by) for r in requests}


class AutoDeny:
    """Denies every request at once, with a note the model reads (e.g. the server's `approval_mode: deny`)."""

    def __init__(self, decided_by: str, note: str | None = None) -> None:
        self.decided_by, self.note = decided_by, note

    async def wait(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, ApprovalDecision]:
        return {r.tool_call_id: deny(self.note, decided_by=self.decided_by) if r.question is None else
                ApprovalDecision("no_human", self.decided_by) for r in requests}


class ApprovalBroker:
    """In-process approvals: runs wait on it, and any task decides with `decide()`.

        broker = ApprovalBroker()
        agent = Agent(model, tools=[...], approvals=ApprovalRules(), approver=broker)
        ... broker.pending  ->  broker.decide("ap_…", approved=False, note="not on Fridays")
    """

    def __init__(self) -> None:
        self.pending: dict[str, ApprovalRequest] = {}
        self._decided: dict[str, ApprovalDecision] = {}
        self._changed = asyncio.Event()
        self._added = asyncio.Event()

    async def wait_for_pending(self, count: int = 1) -> list[ApprovalRequest]:
        """Wait until at least `count` requests are pending (a UI or a test deciding them); returns them."""
        while len(self.pending) < count:
            added = self._added
            await added.wait()
        return list(self.pending.values())

    def find(self, key: str) -> ApprovalRequest | None:
        """A pending request by approval id or tool-call id."""
        return self.pending.get(key) or next((r for r in self.pending.values() if r.tool_call_id == key), None)

    def decide(self, key: str, approved: bool, note: str | None = None, decided_by: str = "user") -> None:
        """Decide the request with this approval id (or tool-call id). KeyError when nothing pends under it."""
        request = self.find(key)
        if request is None:
            raise KeyError(f"no pending approval {key!r}")
        self._settle(request, ApprovalDecision("approved" if approved else "denied", decided_by, note))

    def answer(self, key: str, answer: Any, answered_by: str = "user") -> None:
        """Answer the question with this id (or tool-call id): ValueError when the answer does not fit the
        question, KeyError when no question pends under it."""
        request = self.find(key)
        if request is None or request.question is None:
            raise KeyError(f"no pending question {key!r}")
        value, freeform = check_answer(request.question, answer)
        self._settle(request, ApprovalDecision("answered", answered_by,
                                               answer={"answer": value, "freeform": freeform}))

    def _settle(self, request: ApprovalRequest, decision: ApprovalDecision) -> None:
        del self.pending[request.approval_id]
        self._decided[request.approval_id] = decision
        self._changed.set()  # wakes every waiting run; each takes its own decisions
        self._changed = asyncio.Event()

    async def wait(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, ApprovalDecision]:
        now = time.time()
        for key in [k for k, r in self.pending.items() if r.expired(now)]:  # the run counted it as denied
            del self.pending[key]
        for r in requests:
            if r.approval_id not in self._decided and not r.expired(now):
                self.pending.setdefault(r.approval_id, r)
        self._added.set()
        self._added = asyncio.Event()
        try:
            while True:
                changed = self._changed
                got = {r.tool_call_id: self._decided.pop(r.approval_id) for r in requests
                       if r.approval_id in self._decided}
                if got:
                    break
                await changed.wait()
        except asyncio.CancelledError:  # the run was cancelled: its requests are gone
            for r in requests:
                self.pending.pop(r.approval_id, None)
            raise
        return got
