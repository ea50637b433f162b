"""Request and response bodies of the native API, as pydantic models: they validate requests and give
`/openapi.json` its schemas."""

from __future__ import annotations

from typing import Annotated, Any, Literal

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


class AgentInfo(View):
    name: str
    description: str
    kind: Literal["loop", "graph"]
    conversation_starters: list[str]


class AgentList(View):
    data: list[AgentInfo]


class NewConversation(Body):
    agent: str = Field(min_length=1)
    title: str | None = Field(default=None, max_length=500)
    realm: str | None = Field(default=None, min_length=1, max_length=200)


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


class ConversationList(View):
    data: list[Conversation]
    next_cursor: str | None


class Pending(View):
    approvals: list[dict[str, Any]] = Field(default_factory=list)
    questions: list[dict[str, Any]] = Field(default_factory=list)


class ConversationDetail(View):
    conversation: Conversation
    messages: list[dict[str, Any]]
    pending: Pending


class ForkEdit(Body):
    content: str = Field(min_length=1, description="The user message's new text (its attachments are kept).")


class ForkToolResult(Body):
    content: str = Field(description="The result to store in place of the call's: it is never run.")
    tool_call_id: str | None = omittable(min_length=1, description=(
        "The call whose result it is; needed only when `at_message_id` is an assistant message with several "
        "calls (at a tool-result message it is that message's call)."))


class ForkConversation(Body):
    """Fork at `at_message_id`: alone, the copy ends with that message and no run starts; `edit` (a user message)
    sends the edited message as a new one, which starts a run; `tool_result` or `rerun` (a tool-result message,
    or the assistant message that made the call) replaces or runs again that call, then the model goes on."""

    at_message_id: str = Field(min_length=1, max_length=40)
    edit: ForkEdit | None = omittable()
    tool_result: ForkToolResult | None = omittable()
    rerun: bool = Field(False, description="Run the call again, through every gate (policy, approval).")
    tool_call_id: str | None = omittable(min_length=1, description=(
        "With `rerun`: the call to run again, when `at_message_id` is an assistant message with several."))


class Forked(View):
    """The new conversation (as `GET …/{id}` shows it), and the run it started (`run_id`; null when none)."""

    conversation: Conversation
    messages: list[dict[str, Any]]
    pending: Pending
    run_id: str | None


class Overrides(Body):
    model: str | None = Field(default=None, min_length=1, max_length=500, pattern=r"^[^\x00-\x1f\x7f]+$",
                              description="`provider:model` (no control characters); see the agent's "
                                          "allowed_models")
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_iterations: Annotated[int, Field(ge=1, le=1000), INTEGRAL] | None = None


class Attachment(Body):
    model_config = ConfigDict(json_schema_extra={"anyOf": [  # checked in the route: 422 without either
        {"required": ["data"], "properties": {"data": {"type": "string"}}},
        {"required": ["url"], "properties": {"url": {"type": "string"}}}]})

    name: str | None = None
    media_type: str
    data: str | None = None
    url: str | None = None


class SendMessage(Body):
    content: str = Field(min_length=1)
    attachments: list[Attachment] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    variables: dict[str, Any] | None = None
    overrides: Overrides | None = None


class RunOutcome(View):
    run_id: str
    status: str
    finish_reason: str | None = None
    message: dict[str, Any] | None = None
    usage: Usage
    pending: Pending | None = None


class CancelResult(View):
    run_id: str


class ResumeRun(Body):
    force: bool = Field(False, description="Resume even though graph.yaml changed since the checkpoint.")


class Resumed(View):
    run_id: str
    conversation_id: str | None
    status: Literal["working"]


class MeasuredRequest(View):
    in_tokens: int = Field(description="The prompt tokens the model reported for the conversation's last request")
    estimated: int = Field(description="What ringlet's estimator counted for that same request")


class ContextReport(View):
    system: int
    tool_definitions: int
    user: int
    assistant: int
    tool_results: int
    total: int
    context_window: int | None
    budget: int
    last_request: MeasuredRequest | None = Field(None, description=(
        "The model's own count of the last request next to the estimate of it (their ratio is how this model's "
        "tokenizer and prompt template differ from the estimator); null until a model reports its usage"))


class RunRecord(View):
    id: str
    agent: str
    realm: str | None
    conversation_id: str | None
    parent_run_id: str | None
    kind: Literal["loop", "graph", "direct"] = Field(description="`direct`: a direct tool call that waited for a "
                                                     "human (`POST …/tool-calls`)")
    status: str
    finish_reason: str | None
    usage: Usage
    started_at: str
    ended_at: str | None


class RunList(View):
    data: list[RunRecord] = Field(description="Newest first; `status` is the stored one (`GET /api/v1/runs/{id}` "
                                              "tells a `working` run that waits for a slot as `queued`)")
    next_cursor: str | None


class StreamToken(View):
    token: str
    expires_in: int


class Health(View):
    status: str


class NewTrigger(Body):
    model_config = ConfigDict(json_schema_extra={"allOf": [  # checked in the route: 422 otherwise
        {"if": {"properties": {"kind": {"const": "cron"}}},
         "then": {"required": ["cron"], "properties": {"cron": {"type": "string"}}}},
        {"if": {"properties": {"kind": {"const": "webhook"}}},
         "then": {"properties": {"cron": {"type": ["string", "null"], "maxLength": 0}}}}]})

    name: str = Field(min_length=1, max_length=200)
    agent: str = Field(min_length=1)
    kind: Literal["webhook", "cron"]
    cron: str | None = None
    timezone: str = "UTC"
    message_template: str | None = Field(default=None, max_length=20_000)
    conversation_id: str | None = None
    realm: str | None = None
    secret: str | None = Field(default=None, min_length=16, max_length=200)
    enabled: bool = True


class TriggerChanges(Body):
    """The fields to change; null clears `message_template`, `conversation_id` and `secret`."""

    name: str = omittable(min_length=1, max_length=200)
    cron: str = omittable()
    timezone: str = omittable()
    message_template: str | None = Field(default=None, max_length=20_000)
    conversation_id: str | None = None
    secret: str | None = Field(default=None, min_length=16, max_length=200)
    enabled: bool = omittable()


class Trigger(View):
    id: str
    name: str
    agent: str
    kind: Literal["webhook", "cron"]
    cron: str | None
    timezone: str
    message_template: str | None
    conversation_id: str | None
    realm: str
    has_secret: bool
    enabled: bool
    next_fire_at: str | None
    last_fired_at: str | None
    created_at: str
    updated_at: str


class TriggerList(View):
    data: list[Trigger]


class Fired(View):
    run_id: str
    conversation_id: str | None
    """None only while a concurrent delivery with the same Idempotency-Key is still starting the run."""


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


class CompactResult(View):
    compacted: bool
    event: dict[str, Any] | None = None
    """The `compaction` event (also sent on the conversation's stream)."""


class GraphDiagram(View):
    mermaid: str = Field(description="A Mermaid flowchart of the graph agent (`ringlet graph show`).")


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


ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody, "description": "Not found"}}
"""The routes' own error responses; 401, 403, 422, 429 … come from the app's layers (`errors.document`)."""


# -- a graph run's checkpoints, and forking it from one (`server/protocols/checkpoints.py`, issue 44) --------


class CheckpointSummary(View):
    step: int = Field(description="The super-steps completed when it was saved (0: before the first).")
    status: Literal["working", "input_required", "completed", "failed", "canceled"]
    frontier: list[str] = Field(description="The nodes its next super-step runs: where a fork from it starts. Empty "
                                            "at the run's end, which cannot be forked.")
    saved_at: float = Field(description="When it was saved (epoch seconds).")


class CheckpointList(View):
    run_id: str
    agent: str
    graph_changed: bool = Field(description="graph.yaml changed since these were saved: a fork needs `force`.")
    data: list[CheckpointSummary] = Field(description="One per super-step, oldest first.")


class CheckpointDetail(CheckpointSummary):
    run_id: str
    graph_changed: bool
    state: dict[str, Any] = Field(description="The graph state after `step` super-steps.")
    visit_counts: dict[str, int]
    reducers: dict[str, str] = Field(description="The graph's reducers by state key: what a patched key must hold.")


class ForkRun(Body):
    checkpoint: Annotated[int, Field(ge=0, description="The step of the checkpoint to start from."), INTEGRAL]
    state_patch: dict[str, Any] | None = Field(default=None, description=(
        "Top-level state keys to replace before the fork runs, checked against the graph's state (declared keys, "
        "reducers, output_schema properties): a misfit is a 422 naming the key and the fix."))
    force: bool = Field(False, description="Fork even though graph.yaml changed since the checkpoint.")
    title: str | None = Field(default=None, max_length=200, description="The new conversation's title.")


class ForkOrigin(View):
    run_id: str
    conversation_id: str | None
    step: int


class ForkedRun(View):
    run_id: str
    conversation_id: str = Field(description="The fork's own new conversation: follow its events there.")
    conversation: Conversation
    forked_from: ForkOrigin
    status: Literal["working"]
