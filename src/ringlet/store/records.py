"""The store's records: what its repositories hand out, one frozen dataclass per kind of row.

A record is read, never written back: a change goes through its repository (`store.conversations.set_status(…)`)
and a fresh read shows it. Records carry the fields of their row that callers use, named as the columns are;
what the HTTP API shows of each is the server's business (`ringlet.server.http.views`). JSON documents a
row keeps whole (an event's payload, a run's state, a tool call's arguments, an audit entry) stay JSON
(`Json`): their shape is the event's or the gate's, not the store's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Json = dict[str, Any]
"""A JSON object a row keeps whole (its shape belongs to whoever wrote it)."""


def _row(row: Any) -> Mapping[str, Any]:
    return row if isinstance(row, Mapping) else row._mapping


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens and cost so far; `cost_usd` None when a model without a price took part."""

    in_tokens: int = 0
    out_tokens: int = 0
    cost_usd: float | None = None

    def summary(self) -> dict[str, int | float | None]:
        """As the API and the `message_end` event show it."""
        return {"in_tokens": self.in_tokens, "out_tokens": self.out_tokens, "cost_usd": self.cost_usd}


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    agent: str
    title: str
    realm: str
    status: Literal["idle", "running", "input_required"]
    created_at: str
    updated_at: str
    usage: Usage
    org_id: str | None = None
    user_id: str | None = None
    client_id: str | None = None
    """The id its client named it by (an AG-UI threadId, an A2A contextId), when not its own."""
    parent_run_id: str | None = None
    """A sub-agent's conversation: the parent run that started it."""
    parent_conversation_id: str | None = None
    parent_tool_call_id: str | None = None
    is_sub_agent: bool = False
    forked_from_conversation_id: str | None = None
    """A fork's origin: the conversation it was forked from, and the message it was forked at (issue 44)."""
    forked_from_message_id: str | None = None

    @property
    def forked_from(self) -> dict[str, str | None] | None:
        """A fork's origin as the API shows it: `{conversation_id, message_id}`; None for any other."""
        if self.forked_from_conversation_id is None:
            return None
        return {"conversation_id": self.forked_from_conversation_id, "message_id": self.forked_from_message_id}

    @property
    def known_as(self) -> str:
        """The id its client knows it by: the one it named it with, else its own."""
        return self.client_id or self.id

    @classmethod
    def of(cls, row: Any) -> Conversation:
        r = _row(row)
        return cls(id=r["id"], agent=r["agent"], title=r["title"], realm=r["realm"], status=r["status"],
                   created_at=r["created_at"], updated_at=r["updated_at"],
                   usage=Usage(r["in_tokens"], r["out_tokens"], r["cost_usd"]), org_id=r["org_id"],
                   user_id=r["user_id"], client_id=r.get("client_id"), parent_run_id=r["parent_run_id"],
                   parent_conversation_id=r.get("parent_conversation_id"),
                   parent_tool_call_id=r.get("parent_tool_call_id"), is_sub_agent=r["parent_run_id"] is not None,
                   forked_from_conversation_id=r.get("forked_from_conversation_id"),
                   forked_from_message_id=r.get("forked_from_message_id"))


RunStatus = Literal["working", "input_required", "completed", "failed", "canceled"]


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: str
    agent: str
    kind: str
    """`loop`, `graph`, or `direct` (a direct tool call waiting for a human)."""
    status: RunStatus
    started_at: str
    usage: Usage
    conversation_id: str | None = None
    realm: str | None = None
    parent_run_id: str | None = None
    finish_reason: str | None = None
    ended_at: str | None = None
    lease_owner: str | None = None
    """The process that holds it (working), or that has not logged its end yet (ended)."""
    lease_expires_at: str | None = None
    key_id: str | None = None
    """The API key that caused it: it counts against that key's active runs."""
    state: Json | None = None
    """Its stored state: on the engine, from its start until it first pauses, its workflow's input
    (`{"spec": …}`: recovery enqueues from it a run whose process died before enqueueing it); the
    continuation while paused; the final state once ended."""

    @property
    def ended(self) -> bool:
        return self.status in ("completed", "failed", "canceled")

    def to_json(self) -> Json:
        """As a durable step records it (`from_json` reads it back)."""
        return {**{f: getattr(self, f) for f in self.__dataclass_fields__ if f != "usage"},
                "usage": self.usage.summary()}

    @classmethod
    def from_json(cls, given: Json) -> RunRecord:
        """A record written by `to_json` (or, by an older ringlet, the fields a continuation needs)."""
        fields = {f: given[f] for f in cls.__dataclass_fields__ if f in given and f != "usage"}
        fields.setdefault("status", "working")
        fields.setdefault("started_at", "")
        fields.setdefault("kind", "loop")
        return cls(**fields, usage=Usage(**(given.get("usage") or {})))

    @classmethod
    def of(cls, row: Any) -> RunRecord:
        r = _row(row)
        return cls(id=r["id"], agent=r["agent"], kind=r["kind"], status=r["status"], started_at=r["started_at"],
                   usage=Usage(r["in_tokens"], r["out_tokens"], r["cost_usd"]),
                   conversation_id=r["conversation_id"], realm=r["realm"], parent_run_id=r["parent_run_id"],
                   finish_reason=r["finish_reason"], ended_at=r["ended_at"], lease_owner=r["lease_owner"],
                   lease_expires_at=r["lease_expires_at"], key_id=r.get("key_id"), state=r.get("state"))


@dataclass(frozen=True, slots=True)
class Approval:
    """A call waiting for a human's decision, or a question waiting for an answer (`kind`), and how it ended."""

    approval_id: str
    run_id: str
    tool_call_id: str
    tool: str
    args: Json
    effect: str
    reason: str
    requested_at: str
    expires_at: str
    timeout_s: float
    status: str
    """pending, approved, executing, denied, expired, cancelled, answered."""
    kind: Literal["approval", "question"] = "approval"
    conversation_id: str | None = None
    agent: str | None = None
    realm: str | None = None
    connector: str | None = None
    decided_by: str | None = None
    decided_at: str | None = None
    note: str | None = None
    question: Json | None = None
    """A question's text, input type, options, …, as `ask_question` (or a graph node) asked it."""
    answer: Json | None = None
    """A question's answer: `{answer, freeform}`."""

    @classmethod
    def of(cls, row: Any) -> Approval:
        r = _row(row)
        return cls(approval_id=r["approval_id"], run_id=r["run_id"], tool_call_id=r["tool_call_id"], tool=r["tool"],
                   args=r["args"], effect=r["effect"], reason=r["reason"], requested_at=r["requested_at"],
                   expires_at=r["expires_at"], timeout_s=r["timeout_s"], status=r["status"], kind=r["kind"],
                   conversation_id=r["conversation_id"], agent=r["agent"], realm=r["realm"],
                   connector=r["connector"], decided_by=r["decided_by"], decided_at=r["decided_at"], note=r["note"],
                   question=r["question"], answer=r["answer"])


@dataclass(frozen=True, slots=True)
class AccessRequest:
    """A run's request for a connector it may not use yet (`request_connector_access`)."""

    request_id: str
    connector: str
    reason: str
    realm: str
    status: str
    created_at: str
    requested_by: str | None = None
    org_id: str | None = None

    @classmethod
    def of(cls, row: Any) -> AccessRequest:
        r = _row(row)
        return cls(request_id=r["request_id"], connector=r["connector"], reason=r["reason"], realm=r["realm"],
                   status=r["status"], created_at=r["created_at"], requested_by=r.get("requested_by"),
                   org_id=r.get("org_id"))


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One gate decision in the append-only audit log: its position, and the gate's record."""

    position: int
    record: Json


@dataclass(frozen=True, slots=True)
class KeptRequest:
    """The first answer to an idempotent request (its `Idempotency-Key`)."""

    route: str
    body_hash: str
    response: Json
    created_at: str


@dataclass(frozen=True, slots=True)
class Claim:
    """An idempotent request's key, to be stored with the work it starts (`Runs.create(claim=…)`): both
    are stored, or neither is."""

    principal: str
    key: str
    route: str
    body_hash: str
    response: Json


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key's record (the key itself is never stored, only its SHA-256)."""

    id: str
    name: str
    prefix: str
    user_id: str
    org_id: str
    roles: list[str]
    scopes: list[str]
    realms: list[str] | Literal["*"]
    agents: list[str] | Literal["*"]
    created_at: str
    expires_at: str | None = None
    revoked_at: str | None = None

    @classmethod
    def of(cls, row: Any) -> ApiKey:
        r = _row(row)
        return cls(id=r["id"], name=r["name"], prefix=r["prefix"], user_id=r["user_id"], org_id=r["org_id"],
                   roles=r["roles"], scopes=r["scopes"], realms=r["realms"], agents=r["agents"],
                   created_at=r["created_at"], expires_at=r["expires_at"], revoked_at=r["revoked_at"])


@dataclass(frozen=True, slots=True)
class Trigger:
    """A webhook or cron trigger (`server-contract.md` §6)."""

    id: str
    name: str
    agent: str
    kind: Literal["webhook", "cron"]
    timezone: str
    realm: str
    enabled: bool
    created_at: str
    updated_at: str
    cron: str | None = None
    message_template: str | None = None
    conversation_id: str | None = None
    next_fire_at: str | None = None
    last_fired_at: str | None = None
    firing: str | None = None
    """Its last fire that ran: that fire's workflow id."""
    created_by_key: str | None = None
    """The API key that made it: its cron fires count against that key."""
    has_secret: bool = False
    secret: str | None = None
    """Only when read `with_secret` (to check a webhook's signature)."""

    @classmethod
    def of(cls, row: Any, *, with_secret: bool = False) -> Trigger:
        r = _row(row)
        return cls(id=r["id"], name=r["name"], agent=r["agent"], kind=r["kind"], timezone=r["timezone"],
                   realm=r["realm"], enabled=r["enabled"], created_at=r["created_at"], updated_at=r["updated_at"],
                   cron=r["cron"], message_template=r["message_template"], conversation_id=r["conversation_id"],
                   next_fire_at=r["next_fire_at"], last_fired_at=r["last_fired_at"], firing=r["firing"],
                   created_by_key=r.get("created_by_key"), has_secret=r["secret"] is not None,
                   secret=r["secret"] if with_secret else None)


@dataclass(frozen=True, slots=True)
class Schedule:
    """An agent's schedule (`alarm_clock`, `schedule_task`) in one conversation."""

    schedule_id: str
    realm: str
    conversation_id: str
    agent: str
    kind: Literal["at", "interval", "cron"]
    spec: Json
    """`at` / `interval_minutes` / `cron`, `timezone`, `until`, `max_runs`."""
    message: str
    runs: int
    status: Literal["active", "done"]
    slot: int
    """The number of its pending wake-up."""
    created_at: str
    updated_at: str
    org_id: str | None = None
    next_run_at: str | None = None
    firing: str | None = None
    """Its last fire that ran: that wake-up's workflow id."""
    created_by: str | None = None
    created_by_key: str | None = None

    @classmethod
    def of(cls, row: Any) -> Schedule:
        r = _row(row)
        return cls(schedule_id=r["schedule_id"], realm=r["realm"], conversation_id=r["conversation_id"],
                   agent=r["agent"], kind=r["kind"], spec=r["spec"], message=r["message"], runs=r["runs"],
                   status=r["status"], slot=r["slot"], created_at=r["created_at"], updated_at=r["updated_at"],
                   org_id=r["org_id"], next_run_at=r["next_run_at"], firing=r["firing"], created_by=r["created_by"],
                   created_by_key=r.get("created_by_key"))
