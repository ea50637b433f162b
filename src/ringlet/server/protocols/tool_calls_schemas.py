"""The bodies of a direct tool call (`tool_calls.py`). As pydantic models, they validate requests and give
`/openapi.json` its schemas."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ringlet.server.http.schemas import Body, View


class DirectToolCall(Body):
    """`POST …/tool-calls`: run one of the agent's tools directly, through every gate."""

    tool: str = Field(min_length=1, max_length=200, description="The tool's name (a connector's tool by its own name).")
    connector: str | None = Field(default=None, min_length=1, max_length=200, description=(
        "The MCP server or catalog connector that owns `tool`, when names clash (or the tool sits behind the "
        "catalog's meta-tools)."))
    args: dict[str, Any] = Field(description="The tool's arguments, checked against its schema.")
    include_in_context: bool = Field(default=False, description=(
        "Send the call and its result to the model in later turns; otherwise they are shown only "
        "(`duration: 0`)."))


class PolicyOutcome(View):
    decision: str = Field(description="The policy gate's decision: allow, require_approval, deny or error.")
    audit_id: str | None


class ToolCallCompleted(View):
    tool_call_id: str
    status: Literal["completed"]
    result: str = Field(description="The tool's result as the model reads it (JSON text for structured values), "
                                    "as in the `tool_result` event.")
    duration_ms: float
    policy: PolicyOutcome | None


class ToolCallFailed(View):
    tool_call_id: str
    status: Literal["error"]
    error: dict[str, Any] = Field(description="`{code, message, …}` as in the `tool_result` event (`gates.md` §1).")
    duration_ms: float
    policy: PolicyOutcome | None


class ToolCallPending(View):
    tool_call_id: str
    status: Literal["pending_approval"]
    approval_id: str = Field(description="Decide it with `POST …/approvals/{approval_id}`; the result then arrives "
                                         "as a `tool_result` event on the conversation's stream.")
