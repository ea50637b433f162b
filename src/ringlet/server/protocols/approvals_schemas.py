"""The bodies of the approvals and questions API (`approvals.py`). As pydantic models, they validate requests and give
`/openapi.json` its schemas."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ringlet.server.http.schemas import Body, View


class Approval(View):
    """A durable approval record (`gates.md` §4.3)."""

    approval_id: str
    run_id: str
    conversation_id: str | None
    tool_call_id: str
    agent: str | None = None
    realm: str | None = None
    tool: str
    connector: str | None = None
    args: dict[str, Any]
    effect: str
    reason: str
    requested_at: str
    expires_at: str
    timeout_s: float
    status: Literal["pending", "approved", "denied", "expired", "cancelled", "executing"]
    decided_by: str | None = None
    decided_at: str | None = None
    note: str | None = None


class ApprovalList(View):
    data: list[Approval]


class Decide(Body):
    approved: bool
    note: str | None = Field(default=None, max_length=4000)


class BatchDecision(Body):
    approval_id: str | None = Field(default=None, min_length=1)
    tool_call_id: str | None = Field(default=None, min_length=1)
    approved: bool
    note: str | None = Field(default=None, max_length=4000)


class DecideBatch(Body):
    decisions: list[BatchDecision] = Field(min_length=1, max_length=100)


class Answer(Body):
    answer: str | list[str] = Field(description="One option label, a list of labels (multi-select), or text.")


class Answered(View):
    question_id: str
    status: Literal["answered"]


class Decided(View):
    approval_id: str
    status: str
    decided_by: str
    decided_at: str


class ItemError(View):
    code: str
    message: str
    details: dict[str, Any] | None = None


class BatchItem(View):
    approval_id: str | None = None
    tool_call_id: str | None = None
    status: str | None = None
    decided_by: str | None = None
    decided_at: str | None = None
    error: ItemError | None = None


class BatchResults(View):
    results: list[BatchItem]
