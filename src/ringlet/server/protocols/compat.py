"""The OpenAI-compatible API (`/v1`, `server-contract.md` §7): the agent loop runs on the server and the
client sees a chat completion (or its chunks). Client-supplied tools are deferred tools: when the model
calls one, the run's other calls run, the run stops, and the calls go back to the client as `tool_calls`.
A continuation keeps the full transcript (server-side calls included) under the returned call ids until
the client sends the results.

A request with `X-Ringlet-Conversation-Id` runs in that stored conversation. One without runs with its
transcript unstored: in this process when runs execute in process (`_ephemeral_run`); on the engine
(PostgreSQL), as a durable workflow any worker executes, in a hidden conversation of its own that is
removed once the run has ended (`_transient_run`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ringlet._ids import at
from ringlet.agent import Agent
from ringlet.agent.settings import run_options
from ringlet.errors import ConfigError, ProviderError
from ringlet.loop.state import RunState
from ringlet.messages import Message
from ringlet.models.openai_format import parse_message
from ringlet.output import JsonSchema, Output
from ringlet.server.catalog import Hosted
from ringlet.server.http import sse
from ringlet.server.http.auth import Bearer, Principal, authenticate
from ringlet.server.http.errors import ApiError, error_body, request_id
from ringlet.server.http.schemas import INTEGRAL, SSE_EVENT
from ringlet.server.protocols.chat import runner_of
from ringlet.server.runs.follow import items
from ringlet.server.runs.runner import Runner
from ringlet.store import Store
from ringlet.tools.base import client_tool

router = APIRouter(prefix="/v1")
FINISH = {"end_turn": "stop", "max_iterations": "length", "empty_response": "stop"}
"""The chat completion's finish_reason for each of the run's (`ringlet.finish_reason` keeps the run's own)."""
UPSTREAM = frozenset({"stream_interrupted", "context_window",
                      *(kind("").code for kind in (ProviderError, *ProviderError.__subclasses__()))})
"""Run error codes that mean the model provider failed (after ringlet's own retries): 502 `upstream_error`."""
NO_RETRY = {"x-should-retry": "false"}
"""OpenAI's SDKs retry 408, 409, 429 and 5xx answers unless told not to. A failed run is never retried
blindly: ringlet has already retried the provider, and a run again would run its tools again."""
NAME = r"^[A-Za-z0-9_-]{1,64}$"


# -- request and response bodies -------------------------------------------------------------------------


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


# -- continuations ------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Continuations:
    """Transcripts of runs stopped on client tool calls, by run id, for `continuation_ttl_s`: stored
    (`Store.continuations`), so whichever API process gets the results continues the run, and only one.

    The call ids returned to the client are `<call id>.<run id>`: unique across runs (providers without
    call ids get `call_<n>` per run), and they name the run whose transcript continues."""

    store: Store
    ttl_s: float

    async def keep(self, key_id: str, agent: str, state: RunState) -> None:
        await self.store.continuations.keep(state.run_id, key_id=key_id, agent=agent,
                                            messages=[m.model_dump(mode="json") for m in state.messages],
                                            expires_at=at(time.time() + self.ttl_s))

    async def take(self, key_id: str, agent: str, run_ids: set[str]) -> list[Message] | None:
        """The transcript of the one run the results answer, if it is kept for this key and agent."""
        if len(run_ids) != 1:
            return None
        kept = await self.store.continuations.take(next(iter(run_ids)), key_id=key_id, agent=agent)
        return None if kept is None else [Message.validate(m) for m in kept]


def client_call_id(run_id: str, call_id: str) -> str:
    return f"{call_id}.{run_id}"


def split_call_id(client_id: str | None) -> tuple[str | None, str | None]:
    """(call id, run id) of an id from `client_call_id`; (the id, None) for any other id."""
    call_id, dot, run_id = (client_id or "").rpartition(".")
    return (call_id, run_id) if dot and run_id.startswith("r_") else (client_id, None)


def continuations(request: Request) -> Continuations:
    state = request.app.state.ringlet
    return Continuations(state.store, state.settings.continuation_ttl_s)


# -- routes -------------------------------------------------------------------------------------------------


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
        for name, hosted in runner_of(request).catalog.hosted.items()
        if hosted.kind == "loop" and hosted.runnable_by(principal)]}


@router.post("/chat/completions", response_model=ChatCompletion, responses={**ERRORS, 200: {
    "content": {"text/event-stream": {"schema": SSE_EVENT}},
    "description": "A chat completion, or with `stream: true` its chunks (`data: {…}` lines, then `[DONE]`)."}})
async def chat_completions(body: ChatCompletionRequest, request: Request, credentials: Bearer,
                           conversation_id: Annotated[str | None, Header(alias="X-Ringlet-Conversation-Id")] = None,
                           ) -> Any:
    """Run an agent (the `model`) on the messages; client `tools` come back as `tool_calls`."""
    principal = await _principal(request, credentials)
    runner = runner_of(request)
    hosted = runner.catalog.hosted.get(body.model)
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
        source = await _stored_run(runner, principal, conversation_id, hosted, incoming, overrides)
    else:
        kept = await continuations(request).take(principal.key_id, hosted.name, answered) \
            if incoming[0].role == "tool" else None
        assert realm is not None
        source = await _unstored_run(runner, agent, incoming, history if kept is None else kept, hosted,
                                     principal, overrides, realm)
    encoder = _Encoder(body.model)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        gone = error_body(401, "unauthorized", "the API key of this stream was revoked or has expired", openai=True)
        last = f"data: {json.dumps(gone)}\n\ndata: [DONE]\n\n".encode()
        return sse.chunks(_chunks(encoder, source, request, principal, hosted, include_usage,
                                  runner.settings.ping_interval_s), refused=source.cancel,  # 429: the run stops
                          **sse.keyed(runner.settings, runner.store.keys, principal.key_id, last))
    return await _completion(encoder, source, request, principal, hosted)


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


# -- event sources: (type, payload) pairs and None for "ping now" ---------------------------------------------


@dataclass(eq=False)
class Source:
    events: AsyncIterator[tuple[str, dict[str, Any]] | None]
    final_state: Any
    """Awaitable giving the run's RunState once the events are done."""
    cancel: Any
    """Stops the run: for runs without a conversation, when the client leaves."""
    run_id: str | None = None
    """The run's id (known once it has started)."""


async def _unstored_run(runner: Runner, agent: Agent, incoming: list[Message], history: list[Message],
                        hosted: Hosted, principal: Principal, overrides: dict[str, Any], realm: str) -> Source:
    """A run whose transcript is not kept (in `realm`): in this process when runs execute in process, else a
    durable workflow like every run on the engine."""
    if runner.engine is None:
        return await _ephemeral_run(runner, agent, incoming, history, hosted, principal, overrides, realm)
    return await _transient_run(runner, incoming, history, hosted, principal, overrides, realm)


async def _ephemeral_run(runner: Runner, agent: Agent, incoming: list[Message], history: list[Message],
                         hosted: Hosted, principal: Principal, overrides: dict[str, Any], realm: str) -> Source:
    """A run whose transcript is not stored (its run record, status, usage and cost are), driven by the
    server's one driver like any other; it ends when its client leaves."""
    try:
        stream = agent.stream(incoming, history=history, realm=realm, user_id=principal.user_id,
                              org_id=principal.org_id, roles=principal.roles, channel="api",
                              request_id=request_id.get() or None, approver=runner.approver(hosted.name, realm),
                              **run_options(agent, overrides))
    except ConfigError as exc:
        raise ApiError(400, "invalid_request", str(exc), param="tools") from None
    run = await runner.start_unstored(hosted.name, stream, principal=principal, realm=realm)
    listener, ping_s = run.listener, runner.settings.ping_interval_s
    assert listener is not None

    async def events() -> AsyncIterator[tuple[str, dict[str, Any]] | None]:
        while True:
            try:
                async with asyncio.timeout(ping_s):
                    item = await listener.get()
            except TimeoutError:
                yield None
                continue
            if item is None:
                return
            yield item.type, json.loads(item.data)

    async def final_state() -> RunState:
        await run.done.wait()
        return stream.state

    return Source(events(), final_state, lambda: runner.stop(run), run.run_id)


async def _stored_run(runner: Runner, principal: Principal, cid: str, hosted: Hosted, incoming: list[Message],
                      overrides: dict[str, Any]) -> Source:
    conversation = await runner.store.get_conversation(cid)
    if conversation is None or not principal.sees(conversation["realm"]) or \
            not principal.may_use(conversation["agent"]):  # the same 404 as an unknown id: no existence oracle
        raise ApiError(404, "conversation_not_found", f"no conversation {cid!r}", param="X-Ringlet-Conversation-Id")
    if conversation["agent"] != hosted.name:
        raise ApiError(400, "invalid_request", f"conversation {cid} belongs to agent {conversation['agent']!r}, "
                       f"not {hosted.name!r}", param="model")
    return await _followed(runner, principal, conversation, hosted, incoming, overrides)


async def _followed(runner: Runner, principal: Principal, conversation: dict[str, Any], hosted: Hosted,
                    incoming: list[Message], overrides: dict[str, Any]) -> Source:
    """Start a run in a stored conversation and follow its events (from its log and live, wherever it
    executes); leaving does not touch it."""
    cid = conversation["id"]
    try:
        deny = runner.approver(hosted.name, conversation["realm"]) if runner.settings.approval_mode == "deny" else None
        run = await runner.start(conversation, incoming, principal=principal, channel="api", overrides=overrides,
                                 approver=deny)  # `wait`: the stored run pauses durably, this request follows it
    except ConfigError as exc:
        raise ApiError(400, "invalid_request", str(exc), param="tools") from None

    async def events() -> AsyncIterator[tuple[str, dict[str, Any]] | None]:
        with runner.hub.subscribe(cid) as subscriber:
            async for item in items(runner, subscriber, cid, after=0, run_id=run.run_id):
                yield None if item is None else (item.type, json.loads(item.data))

    async def final_state() -> RunState:  # after message_end: the run may have paused and resumed meanwhile
        await run.done.wait()
        if run.result is not None:
            return run.result.state
        state = await runner.store.run_state(run.run_id)
        assert state is not None, "a run that ended has its state stored"
        return RunState.from_json(json.dumps(state))

    return Source(events(), final_state, lambda: None, run.run_id)


async def _transient_run(runner: Runner, incoming: list[Message], history: list[Message], hosted: Hosted,
                         principal: Principal, overrides: dict[str, Any], realm: str) -> Source:
    """A run without a conversation on the engine (PostgreSQL): a durable workflow like every other run,
    executed by whichever worker takes it from the queue while this process streams its events. It runs in
    a conversation of its own that no route lists or shows (`Store.create_conversation(transient=True)`),
    holding the request's history; once the run has ended that conversation goes, with its transcript and
    events (`Store.purge_conversation`), before the answer is sent, and the run's record (status, usage,
    cost) stays. It ends when its client leaves, wherever it executes (`_Transient.cancel`)."""
    store = runner.store
    conversation = await store.create_conversation(agent=hosted.name, realm=realm, org_id=principal.org_id,
                                                   user_id=principal.user_id, transient=True)
    try:
        await store.append_messages(conversation["id"], history)
        followed = await _followed(runner, principal, conversation, hosted, incoming, overrides)
    except BaseException:
        await asyncio.shield(store.purge_conversation(conversation["id"]))  # no run started in it
        raise
    assert followed.run_id is not None
    transient = _Transient(runner, conversation["id"], followed.run_id)

    async def final_state() -> RunState:
        state = await followed.final_state()
        await asyncio.shield(transient.purge(ended=True))  # the transcript goes before the answer is sent
        return state

    return Source(followed.events, final_state, transient.cancel, followed.run_id)


@dataclass(eq=False)
class _Transient:
    """The conversation of a run without one on the engine (`_transient_run`), removed once the run ended."""

    runner: Runner
    cid: str
    run_id: str
    purging: asyncio.Task[None] | None = None

    def purge(self, *, ended: bool) -> asyncio.Task[None]:
        """Remove the conversation once the run has ended (`ended`: it has), once."""
        if self.purging is None:
            self.purging = self.runner.spawn(self._purge(ended))
        return self.purging

    async def _purge(self, ended: bool) -> None:
        runner = self.runner
        if not ended:  # follow the run to its end (its message_end is in the log by then)
            with runner.hub.subscribe(self.cid) as subscriber:
                async for _ in items(runner, subscriber, self.cid, after=0, run_id=self.run_id):
                    pass
        await runner.store.purge_conversation(self.cid)

    def cancel(self) -> None:
        """The client left before the run ended: stop it wherever it executes, and remove its conversation
        once it has ended (cancelled)."""
        if self.purging is not None:  # it has ended, or is stopping already
            return
        self.runner.spawn(self._stop())
        self.purge(ended=False)

    async def _stop(self) -> None:
        runner = self.runner
        run = runner.active.get(self.cid)
        if run is not None and run.run_id == self.run_id:  # executing here, or followed here (executing elsewhere:
            runner.stop(run)  # the engine's cancel reaches its worker)
            await run.done.wait()  # it ended, or paused before the cancel reached it
        elif runner.engine is not None:  # it went on elsewhere after a pause
            await runner.engine.cancel(self.run_id)
        await runner.cancel_paused(self.cid)  # a paused run: its approvals are cancelled and it ends


# -- encoding ---------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Encoder:
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    text: list[str] = field(default_factory=list)
    message_id: str | None = None
    end: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    def feed(self, kind: str, payload: dict[str, Any]) -> str | None:
        """The content this event adds (None for events the client does not see, sub-agents' included)."""
        if "agent_path" in payload:
            return None
        if kind == "message_start" and not self.id:
            self.id = "chatcmpl-" + payload["run_id"]
        elif kind == "content_delta":
            delta = payload["delta"]
            if self.message_id not in (None, payload["message_id"]) and self.text:
                delta = "\n\n" + delta  # a new assistant message after server-side tool calls
            self.message_id = payload["message_id"]
            self.text.append(delta)
            return delta
        elif kind == "message_end":
            self.end = payload
        elif kind == "error":
            self.error = payload
        return None

    def finish_reason(self, state: RunState) -> str:
        if state.deferred_calls and state.status == "input_required":
            return "tool_calls"
        return FINISH.get(self.end["finish_reason"] if self.end else "error", "stop")

    def usage(self) -> dict[str, int]:
        u = (self.end or {}).get("usage") or {}
        prompt, completion = u.get("in_tokens", 0), u.get("out_tokens", 0)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def ringlet(self) -> dict[str, Any]:
        end = self.end or {}
        return {"run_id": end.get("run_id", self.id.removeprefix("chatcmpl-")),
                "finish_reason": end.get("finish_reason", "error"),
                "cost_usd": (end.get("usage") or {}).get("cost_usd")}

    def failure(self) -> tuple[int, dict[str, Any], dict[str, str]] | None:
        """The error answer of a failed run: status, OpenAI-shaped body and headers; None if it did not fail.

        The provider failing is 502 `upstream_error` (its code says how: `network_error`, `server_error`,
        `rate_limit_error`, …); anything else is 500 `server_error`. Neither is worth a blind retry."""
        if self.end and self.end.get("finish_reason") not in ("error", "cancelled"):
            return None
        e = self.error or {"code": "cancelled", "message": "the run was cancelled", "retryable": False}
        status = 502 if e["code"] in UPSTREAM else 500
        return status, error_body(status, e["code"], e["message"], openai=True), NO_RETRY

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _tool_calls(state: RunState) -> list[dict[str, Any]]:
    return [{"id": client_call_id(state.run_id, c.id), "type": "function",
             "function": {"name": c.name, "arguments": c.raw_arguments or "{}"}}
            for c in state.deferred_calls]


async def _chunks(encoder: _Encoder, source: Source, request: Request, principal: Principal, hosted: Hosted,
                  include_usage: bool, ping_s: float) -> AsyncIterator[str]:
    started, clock = False, asyncio.get_running_loop().time
    last_sent = clock()
    try:
        async for item in source.events:
            content = encoder.feed(*item) if item is not None else None
            if item is not None and not started and encoder.id:
                started, last_sent = True, clock()
                yield encoder.chunk({"role": "assistant", "content": ""})
            if content:
                last_sent = clock()
                yield encoder.chunk({"content": content})
            elif clock() - last_sent >= ping_s:  # busy with server-side work the client does not see
                last_sent = clock()
                yield ": ping\n\n"
        state = await source.final_state()
        failure = encoder.failure()
        if failure is not None:
            yield f"data: {json.dumps(failure[1])}\n\n"
            yield "data: [DONE]\n\n"
            return
        finish = encoder.finish_reason(state)
        if finish == "tool_calls":
            await continuations(request).keep(principal.key_id, hosted.name, state)
            calls = [{"index": i, **c} for i, c in enumerate(_tool_calls(state))]
            yield encoder.chunk({"tool_calls": calls})
        yield encoder.chunk({}, finish, ringlet=encoder.ringlet())
        if include_usage:
            body = {"id": encoder.id, "object": "chat.completion.chunk", "created": encoder.created,
                    "model": encoder.model, "choices": [], "usage": encoder.usage(), "ringlet": encoder.ringlet()}
            yield f"data: {json.dumps(body, separators=(',', ':'))}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        source.cancel()  # an ephemeral run ends with its client; a stored one is not touched


async def _completion(encoder: _Encoder, source: Source, request: Request, principal: Principal,
                      hosted: Hosted) -> Any:
    async def watch() -> None:  # the client leaving cancels an ephemeral run (a stored one goes on)
        while (await request.receive())["type"] != "http.disconnect":
            pass
        source.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        async for item in source.events:
            if item is not None:
                encoder.feed(*item)
        state = await source.final_state()
    finally:
        watcher.cancel()
        source.cancel()
    failure = encoder.failure()
    if failure is not None:
        return JSONResponse(failure[1], failure[0], headers=failure[2])
    finish = encoder.finish_reason(state)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(encoder.text) or None}
    if finish == "tool_calls":
        await continuations(request).keep(principal.key_id, hosted.name, state)
        message["tool_calls"] = _tool_calls(state)
    return {"id": encoder.id, "object": "chat.completion", "created": encoder.created, "model": encoder.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": encoder.usage(), "ringlet": encoder.ringlet()}
