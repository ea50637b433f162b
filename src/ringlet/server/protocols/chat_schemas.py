"""The native API's own request and response bodies (`chat.py`: agents, conversations, messages, runs). As
pydantic models, they validate requests and give `/openapi.json` its schemas."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from ringlet.server.http.schemas import INTEGRAL, Body, Conversation, Pending, Usage, View


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


class ConversationList(View):
    data: list[Conversation]
    next_cursor: str | None


class ConversationDetail(View):
    conversation: Conversation
    messages: list[dict[str, Any]]
    pending: Pending


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
    mode: Literal["steer", "queue"] | None = Field(None, description=(
        "While a run works: `steer` queues the message into it (taken at its next round boundary; a run with "
        "no round left ends without it, and it starts the next run), `queue` starts it as the next run once "
        "this one ends; both answer 202. Left out: 409 `run_in_progress`. With no run working, either starts "
        "a run as usual."))


class Steered(View):
    mode: Literal["steer", "queue"] = Field(description="What became of the message: `queue` also when a steer "
                                            "found a run that could no longer take it")
    run_id: str = Field(description="`steer`: the working run it was sent to; `queue`: the run it will start")
    steer_id: str | None = Field(description="The id in `steer_queued` and `steer_taken` (`steer` only)")
    message_id: str
    next_run_id: str = Field(description="The run the message starts once the working run ends, unless that run "
                                         "took it (`steer_taken`): for `queue`, `run_id` again")


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
    cache_read_tokens: int | None = Field(None, description="Of `in_tokens`, those the provider read from its "
                                          "prompt cache (null when it reported none)")


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


class CompactResult(View):
    compacted: bool
    event: dict[str, Any] | None = None
    """The `compaction` event (also sent on the conversation's stream)."""


class GraphDiagram(View):
    mermaid: str = Field(description="A Mermaid flowchart of the graph agent (`ringlet graph show`).")
