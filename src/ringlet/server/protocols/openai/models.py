"""The `/v1` request and response bodies, as OpenAI documents them: a request is checked field by field in
its JSON types (strict) and keeps the fields ringlet does not read (`extra="allow"`); the responses are what
the OpenAPI document shows."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ringlet.server.http.schemas import INTEGRAL

NAME = r"^[A-Za-z0-9_-]{1,64}$"


class Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # each known field of its JSON type, as documented


class FunctionCall(Open):
    name: str
    arguments: str = "{}"


class ToolCallIn(Open):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionDef(Open):
    name: str = Field(pattern=NAME)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolDef(Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(Open):
    include_usage: bool = False


class JsonSchemaFormat(Open):
    name: str = Field(default="final_result", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None


class ResponseFormat(Open):
    """`text` (the default), `json_object` (any JSON object) or `json_schema`: the answer is JSON, checked
    the way typed outputs are (`ringlet.output`); one that never validates fails the run (500
    `output_validation_failed`)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(Open):
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    tools: list[ToolDef] | None = None
    tool_choice: Any = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    n: Annotated[int, Field(ge=1, le=1), INTEGRAL] | None = Field(default=None, description=(
        "Only 1: a run gives one answer (`n > 1` is 400)."))


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class RingletInfo(BaseModel):
    run_id: str
    finish_reason: str
    cost_usd: float | None
    pending: list[dict[str, Any]] | None = Field(default=None, description=(
        "With `finish_reason: input_required`: the approvals and questions the run waits for (the message says "
        "how to answer them)"))


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    ringlet: RingletInfo


class ModelInfo(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelInfo]


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": OpenAIError, "description": text} for code, text in (
    (400, "Invalid request"), (401, "Missing or bad API key"), (403, "The key may not use this model"),
    (404, "Unknown model"))}
