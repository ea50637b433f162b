"""What every protocol's request and response bodies share: the `View` and `Body` bases, `INTEGRAL` and
`omittable` for fields, the error body, usage, a conversation as every API shows it, and the SSE event schema.
Each protocol's own bodies live beside it (`protocols/chat_schemas.py`, `firing/triggers_schemas.py`, …); as
pydantic models, they validate requests and give `/openapi.json` its schemas."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


class View(BaseModel):
    """A response: built from a dict, or read from a store record's attributes (`ringlet.store.records`)."""

    model_config = ConfigDict(from_attributes=True)


class Body(BaseModel):
    """A request body: no unknown fields, and each value of its JSON type (no `"5"` or `true` for a number)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _integral(value: Any) -> Any:
    """JSON Schema's integers include `1.0`, which strict validation refuses: take an integral float as its int."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


INTEGRAL = BeforeValidator(_integral)
"""The last metadata of an integer field of a request body: `Annotated[int, Field(ge=1), INTEGRAL]` (`Body` is
strict, which would refuse `1.0`; after the constraints, so that the schema shows them)."""


def omittable(**constraints: Any) -> Any:
    """A field a body may leave out but not send as null: its schema names no null and no default."""
    return Field(default=None, json_schema_extra=_no_default, **constraints)


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


SSE_EVENT: dict[str, Any] = {
    "type": "object", "required": ["data"], "properties": {
        "event": {"type": "string"}, "data": {"type": "string"}, "id": {"type": "string"},
        "retry": {"type": "integer", "minimum": 0}},
    "description": "One server-sent event as an SSE parser reads it: `event` names it (no name under `/v1`) and "
                   "`data` is its JSON (`x-sse-events` has one schema per event; `[DONE]` ends a `/v1` stream)."}
"""The schema of each event of a `text/event-stream` response (OpenAPI 3.1: `schema` describes one event)."""


class ErrorDetail(View):
    code: str
    message: str
    details: dict[str, Any] | None = None
    request_id: str


class ErrorBody(View):
    error: ErrorDetail


class Usage(View):
    in_tokens: int
    out_tokens: int
    cost_usd: float | None


class ForkedFrom(View):
    conversation_id: str
    message_id: str | None = Field(description="The message it was forked at (a graph run's fork: the run's "
                                               "prompt; null when the origin kept none)")


class Conversation(View):
    id: str
    agent: str
    title: str
    realm: str
    created_at: str
    updated_at: str
    usage: Usage
    status: Literal["idle", "running", "input_required"]
    client_id: str | None = None
    """The id its client named it by (an AG-UI threadId, an A2A contextId), when not its own id."""
    is_sub_agent: bool = False
    parent_conversation_id: str | None = None
    parent_run_id: str | None = None
    parent_tool_call_id: str | None = None
    forked_from: ForkedFrom | None = None
    """A fork's origin (`POST …/fork`); null for a conversation that was not forked."""


class Pending(View):
    approvals: list[dict[str, Any]] = Field(default_factory=list)
    questions: list[dict[str, Any]] = Field(default_factory=list)


class Health(View):
    status: str


ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody, "description": "Not found"}}
"""The routes' own error responses; 401, 403, 422, 429 … come from the app's layers (`errors.document`)."""
