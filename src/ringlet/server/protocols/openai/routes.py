"""The `/v1` routes: `GET /v1/models` lists the loop agents the key may run, and `POST /v1/chat/completions`
reads a request into a run (the `model` is the agent; system messages, client tools, the response format and
sampling settings become the run's overrides), then answers with the encoder."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response

from ringlet.errors import ConfigError
from ringlet.messages import Message
from ringlet.models.openai_format import parse_message
from ringlet.output import JsonSchema, Output
from ringlet.server.http import sse
from ringlet.server.http.auth import Bearer, Principal, authenticate
from ringlet.server.http.errors import ApiError, error_body
from ringlet.server.http.schemas import SSE_EVENT
from ringlet.server.protocols.chat import runs_of
from ringlet.server.protocols.openai.continuations import continuations, split_call_id
from ringlet.server.protocols.openai.encoder import Encoder, chunks, completion
from ringlet.server.protocols.openai.models import (
    ERRORS,
    ChatCompletion,
    ChatCompletionRequest,
    JsonSchemaFormat,
    ModelList,
)
from ringlet.server.protocols.openai.runs import stored_run, unstored_run
from ringlet.tools.base import client_tool

router = APIRouter(prefix="/v1")


async def _principal(request: Request, credentials: Any) -> Principal:
    principal = await authenticate(request, credentials)
    principal.check_scope("chat")
    return principal


@router.get("/models", response_model=ModelList, responses=ERRORS)
async def list_models(request: Request, credentials: Bearer) -> dict[str, Any]:
    principal = await _principal(request, credentials)
    created = int(request.app.state.started_at) if hasattr(request.app.state, "started_at") else 0
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": created, "owned_by": "ringlet"}
        for name, hosted in runs_of(request).catalog.hosted.items()
        if hosted.kind == "loop" and hosted.runnable_by(principal)]}


@router.post("/chat/completions", response_model=ChatCompletion, responses={**ERRORS, 200: {
    "content": {"text/event-stream": {"schema": SSE_EVENT}},
    "description": "A chat completion, or with `stream: true` its chunks (`data: {…}` lines, then `[DONE]`)."}})
async def chat_completions(body: ChatCompletionRequest, request: Request, response: Response, credentials: Bearer,
                           conversation_id: Annotated[str | None, Header(alias="X-Ringlet-Conversation-Id")] = None,
                           ) -> Any:
    """Run an agent (the `model`) on the messages; client `tools` come back as `tool_calls`."""
    principal = await _principal(request, credentials)
    runs = runs_of(request)
    hosted = runs.catalog.hosted.get(body.model)
    if hosted is None or hosted.kind != "loop":
        raise ApiError(404, "model_not_found", f"the model {body.model!r} does not exist; GET /v1/models lists "
                       "the agents you can use", param="model")
    principal.check_agent(body.model)
    realm = None if conversation_id else hosted.realm_for(principal)  # a stored conversation's: checked with it
    agent = hosted.agent()
    messages = [parse_message(m.model_dump(exclude_none=True)) for m in body.messages]
    overrides = _overrides(body, [m for m in messages if m.role == "system"])
    rest, answered = [], set()
    for m in messages:  # tool results name the run they answer: map their ids back to the run's own
        if m.role == "tool" and (found := split_call_id(m.tool_call_id))[1] is not None:
            m = replace(m, tool_call_id=found[0])  # noqa: PLW2901
            answered.add(found[1])
        if m.role != "system":
            rest.append(m)
    split = len(rest)
    while split > 0 and rest[split - 1].role in ("user", "tool"):
        split -= 1
    history, incoming = rest[:split], rest[split:]
    if not incoming:
        raise ApiError(400, "invalid_request", "the last message must be a user or tool message", param="messages")
    if conversation_id:
        source = await stored_run(runs, principal, conversation_id, hosted, incoming, overrides)
    else:
        kept = await continuations(request).take(principal.key_id, hosted.name, answered) \
            if incoming[0].role == "tool" else None
        assert realm is not None
        source = await unstored_run(runs, agent, incoming, history if kept is None else kept, hosted,
                                    principal, overrides, realm)
    encoder = Encoder(body.model, run_id=source.run_id, humans=source.humans)
    if source.cid is not None:  # the conversation the client goes on in (answering what the run asks)
        response.headers["X-Ringlet-Conversation-Id"] = source.cid
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        gone = error_body(401, "unauthorized", "the API key of this stream was revoked or has expired", openai=True)
        last = f"data: {json.dumps(gone)}\n\ndata: [DONE]\n\n".encode()
        stream = sse.chunks(chunks(encoder, source, request, principal, hosted, include_usage,
                                   runs.settings.ping_interval_s), refused=source.cancel,  # 429: the run stops
                            **sse.keyed(runs.settings, runs.records.keys, principal.key_id, last))
        if source.cid is not None:
            stream.headers["X-Ringlet-Conversation-Id"] = source.cid
        return stream
    return await completion(encoder, source, request, principal, hosted)


def _overrides(body: ChatCompletionRequest, systems: list[Message]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if systems:
        overrides["extra_instructions"] = "\n\n".join(m.text for m in systems)
    if body.tools:
        overrides["extra_tools"] = [client_tool(t.function.name, t.function.description, t.function.parameters)
                                    for t in body.tools]
    if (fmt := body.response_format) is not None and fmt.type != "text":
        spec = fmt.json_schema or JsonSchemaFormat()
        schema = spec.schema_ if fmt.type == "json_schema" else {"type": "object"}
        try:
            Output.of(JsonSchema(schema, spec.name))
        except ConfigError as exc:
            raise ApiError(400, "invalid_request", str(exc), param="response_format.json_schema.schema") from None
        overrides["output_schema"] = {"schema": schema, "name": spec.name, "description": spec.description}
    settings = {"temperature": body.temperature, "top_p": body.top_p,
                "max_output_tokens": body.max_completion_tokens or body.max_tokens}
    return overrides | {k: v for k, v in settings.items() if v is not None}
