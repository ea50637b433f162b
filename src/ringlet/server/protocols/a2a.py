"""A2A (agent-to-agent protocol 1.0, the official `a2a-sdk`): every hosted agent the key may use is an A2A agent.

    GET  /a2a/{agent}/.well-known/agent-card.json   the agent's card (Bearer key; 404 for an agent it may not use)
    POST /a2a/{agent}                               JSON-RPC: SendMessage, SendStreamingMessage (SSE), GetTask,
                                                    CancelTask, ListTasks (and the 0.3 names message/send, …)

The SDK speaks the protocol (`JsonRpcDispatcher`, `DefaultRequestHandlerV2`); ringlet only runs tasks. A task
IS a ringlet run: task id = run id, contextId = conversation id (an unknown contextId starts a conversation
with that id). `RingletExecutor.execute` starts the run through the one driver (`Runner.start`, as a chat
message does) and encodes the run's events as task updates; nothing else drives it. Tasks are read back
from ringlet's own records (`RunTasks`: run record, transcript, pending approvals), so `GetTask` answers in
every server process sharing the store, and the SDK's in-memory task copies are never the truth.

A pause for a human is `input-required`: the status message says what is asked in text, with one DataPart
per open request carrying ringlet's payload (`approval_required` / `question` event fields). The answer is
the next message of the same task (`ANSWERS` below); the run resumes and the task's stream goes on.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from a2a.helpers.proto_helpers import get_data_parts, get_message_text, new_data_part, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext, SimpleRequestContextBuilder
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.id_generator import IDGenerator, IDGeneratorContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder, create_jsonrpc_routes
from a2a.server.tasks import TaskStore
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    CancelTaskRequest,
    HTTPAuthSecurityScheme,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_1_0, TransportProtocol
from a2a.utils.errors import (
    A2AError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from fastapi import FastAPI
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.security.utils import get_authorization_scheme_param
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ringlet._ids import new_id
from ringlet.errors import ConfigError
from ringlet.messages import Message as RingletMessage
from ringlet.server.catalog import Hosted
from ringlet.server.http import sse
from ringlet.server.http.auth import Principal, authenticate
from ringlet.server.http.errors import ApiError, request_id
from ringlet.server.http.limits import Slot, hold_stream
from ringlet.server.protocols.access import client_id, named_conversation
from ringlet.server.protocols.agui import THREAD_ID
from ringlet.server.runs.follow import items
from ringlet.server.runs.runner import Runner

log = logging.getLogger("ringlet.server")
F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])
PREFIX = "/a2a/{agent}"
CARD_PATH = PREFIX + AGENT_CARD_WELL_KNOWN_PATH
ANSWER_ID = "answer"
"""The artifact holding the run's answer: streamed as chunks, then replaced by the final text."""
STATES = {"working": TaskState.TASK_STATE_WORKING, "completed": TaskState.TASK_STATE_COMPLETED,
          "failed": TaskState.TASK_STATE_FAILED, "canceled": TaskState.TASK_STATE_CANCELED,
          "input_required": TaskState.TASK_STATE_INPUT_REQUIRED}
ANSWERS = ("Answer in the next message of this task. A question: its text, or a data part {\"answer\": …}. "
           "An approval: a data part {\"approved\": true|false, \"note\"?: …} (with \"approval_id\" when several "
           "are open; without, it decides them all), or the text yes / no.")
YES, NO = frozenset({"yes", "approve", "approved"}), frozenset({"no", "deny", "denied"})
A2A_ID = "a2a_message_id"
"""The metadata key under which a prompt keeps its A2A message id (the SDK dedupes history by it)."""
IDLE_RELEASE_S = 300.0
"""A task parked in input-required keeps its SDK state in memory this long; a later answer rebuilds it."""
CANCEL_WAIT_S = 30.0
"""How long `CancelTask` waits for the cancelled run to end before it answers with the task as it stands."""


@dataclass(frozen=True)
class Caller:
    """Who calls which agent: put into the SDK's call context by the route, read by the executor and store."""

    runner: Runner
    principal: Principal
    hosted: Hosted


def caller(context: ServerCallContext) -> Caller:
    found = context.state.get("ringlet")
    if not isinstance(found, Caller):
        raise InvalidRequestError(message="no ringlet caller on this request")
    return found


# -- routes ------------------------------------------------------------------------------------------------


def install(app: FastAPI) -> None:
    """Add the card and JSON-RPC routes. They are plain Starlette routes: A2A documents itself by its
    cards, and a JSON-RPC envelope in the OpenAPI document would only give schemathesis an RPC to fuzz."""
    handler = RunTaskHandler(agent_executor=RingletExecutor(), task_store=RunTasks(), agent_card=_card_template(),
                             request_context_builder=SimpleRequestContextBuilder(
                                 task_id_generator=_Ids("r"), context_id_generator=_Ids("c")),
                             interrupted_task_timeout=IDLE_RELEASE_S)
    for route in create_jsonrpc_routes(handler, PREFIX, context_builder=_Contexts(), enable_v0_3_compat=True):
        assert isinstance(route, Route)
        app.router.routes.append(Route(route.path, _guarded(route.endpoint), methods=["POST"]))
    app.router.routes.append(Route(CARD_PATH, _card_route, methods=["GET"]))


async def _caller(request: Request) -> Caller:
    """The request's caller: a valid key with the `chat` scope that may use the path's agent. An agent the
    key may not use is 404, the same as an unknown one, as for conversations (nothing leaks)."""
    runner: Runner = request.app.state.ringlet.runner
    principal = await authenticate(request, _bearer(request))
    principal.check_scope("chat")
    name = request.path_params["agent"]
    hosted = runner.catalog.hosted.get(name)
    if hosted is None or not hosted.runnable_by(principal):
        raise ApiError(404, "agent_not_found", f"no agent named {name!r}; GET /api/v1/agents lists them")
    return Caller(runner, principal, hosted)


def _bearer(request: Request) -> HTTPAuthorizationCredentials | None:
    scheme, token = get_authorization_scheme_param(request.headers.get("authorization"))
    return HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if scheme.lower() == "bearer" and token \
        else None


def _guarded(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """The SDK's JSON-RPC endpoint behind ringlet's auth: 401/403/404 come as the native API's errors."""

    async def guarded(request: Request) -> Any:
        request.state.ringlet_a2a = await _caller(request)
        try:
            call = json.loads(await request.body())
        except RecursionError:  # the SDK would answer 500: it is bad input, said as JSON-RPC says it
            return JSONResponse({"jsonrpc": "2.0", "id": None, "error": {
                "code": -32700, "message": "Parse error: the request is nested too deeply"}}, status_code=400)
        except ValueError:
            call = None  # not JSON: the SDK answers with its parse error
        streams = isinstance(call, dict) and call.get("method") in STREAMING
        slot = hold_stream() if streams else None  # 429 before any run starts
        try:
            response = await endpoint(request)
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if slot is None:
            return response
        gone = {"jsonrpc": "2.0", "id": call.get("id") if isinstance(call, dict) else None, "error": {
            "code": -32600, "message": "unauthorized: the API key of this stream was revoked or has expired"}}
        found: Caller = request.state.ringlet_a2a
        return _Held(response, slot, **sse.keyed(found.runner.settings, found.runner.store.keys, found.principal.key_id,
                                                 sse.encode("message", json.dumps(gone))))

    return guarded


STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask", "message/stream", "tasks/resubscribe"})
"""The JSON-RPC methods answered with an SSE stream (held among the key's open streams, as the native ones)."""


@dataclass(eq=False)
class _Held:
    """A streamed response that holds a place among its key's open streams until it has been sent, however it
    ends; with `still_valid` it ends with that frame once its key is revoked or expires (`sse.keyed`), as
    every other stream does."""

    response: Response
    slot: Slot
    still_valid: Callable[[], Awaitable[bytes | None]] | None = None
    every: float = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if self.still_valid is None:
                await self.response(scope, receive, send)
                return
            await self._checked(scope, receive, send, self.still_valid)
        finally:
            self.slot.release()

    async def _checked(self, scope: Scope, receive: Receive, send: Send,
                       still_valid: Callable[[], Awaitable[bytes | None]]) -> None:
        started = False

        async def sending(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        sent = asyncio.ensure_future(self.response(scope, receive, sending))
        try:
            while not (await asyncio.wait({sent}, timeout=self.every))[0]:
                last = await still_valid()
                if last is not None and started:
                    sent.cancel()
                    await asyncio.gather(sent, return_exceptions=True)
                    await send({"type": "http.response.body", "body": last, "more_body": False})
                    return
            sent.result()
        finally:
            sent.cancel()


class _Contexts(DefaultServerCallContextBuilder):
    """The SDK's call context, carrying the route's `Caller`."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["ringlet"] = request.state.ringlet_a2a
        return context


@dataclass(frozen=True)
class _Ids(IDGenerator):
    """New task ids are run ids, new context ids conversation ids (kept in `ISSUED` until used: a context
    the server named is made under that very id)."""

    prefix: str

    def generate(self, context: IDGeneratorContext) -> str:
        made = new_id(self.prefix)
        if self.prefix == "c":
            ISSUED[made] = None
            while len(ISSUED) > ISSUED_MAX:
                ISSUED.popitem(last=False)
        return made


ISSUED: OrderedDict[str, None] = OrderedDict()
"""Context ids this process generated for messages that named none, not used yet."""
ISSUED_MAX = 10_000


async def _card_route(request: Request) -> Response:
    found = await _caller(request)
    rpc = f"{public_base(request)}/a2a/{found.hosted.name}"
    return JSONResponse(agent_card_to_dict(agent_card(found.hosted, rpc)))


def public_base(request: Request) -> str:
    """Where clients reach this server: the `public_url` setting, else the local address the request arrived
    on (the socket's, which a client cannot forge, unlike the `Host` header)."""
    configured = request.app.state.ringlet.settings.public_url
    if configured:
        return configured.rstrip("/")
    host, port = request.scope.get("server") or ("127.0.0.1", 80)
    host = f"[{host}]" if ":" in host else host
    scheme = request.scope.get("scheme", "http")
    default = (scheme, port) in (("http", 80), ("https", 443))
    return f"{scheme}://{host}" + ("" if default else f":{port}")


def _card_template() -> AgentCard:
    """What the SDK's handler checks of a card (streaming on, push notifications off)."""
    return agent_card(Hosted("ringlet", "loop", "ringlet agents"), PREFIX)


def agent_card(hosted: Hosted, rpc_url: str) -> AgentCard:
    """The agent's card: its JSON-RPC endpoint, one skill from its description and starters, streaming,
    and ringlet API keys as bearer tokens."""
    about = hosted.description or f"the ringlet agent {hosted.name}"
    return AgentCard(
        name=hosted.name, description=about, version=_version(),
        supported_interfaces=[AgentInterface(url=rpc_url, protocol_binding=TransportProtocol.JSONRPC.value,
                                             protocol_version=PROTOCOL_VERSION_1_0)],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        security_schemes={"bearer": SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="bearer", bearer_format="ringlet API key (rk_…)",
            description="An API key from `ringlet keys create`, with the chat scope (approve to decide approvals)"))},
        security_requirements=[SecurityRequirement(schemes={"bearer": StringList(list=[])})],
        default_input_modes=["text/plain", "application/json"], default_output_modes=["text/plain"],
        skills=[AgentSkill(id=hosted.name, name=hosted.name, description=about, tags=["ringlet", hosted.kind],
                           examples=list(hosted.conversation_starters))])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ringlet")
    except PackageNotFoundError:
        return "0"


# -- tasks read from ringlet's records ---------------------------------------------------------------------


def _hidden(method: F) -> F:
    """A handler method whose unexpected failures answer as the native API's 500 does: logged with the
    request id, which the client is given to quote; never the exception's text (the SDK would send it, SQL
    and all, as the JSON-RPC error's message)."""

    @functools.wraps(method)
    async def hidden(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except (A2AError, asyncio.CancelledError):
            raise
        except Exception:
            rid = request_id.get()
            log.exception("A2A request %s failed", rid)
            raise InternalError(message=f"the server failed to handle this request; quote request id {rid} when "
                                "reporting it") from None

    return cast(F, hidden)


class RunTasks(TaskStore):
    """Tasks as ringlet stores them: a task is its run (record, transcript, pending requests). Saving is a
    no-op: the runner already stored everything a task says, in the store every process shares."""

    async def save(self, task: Task, context: ServerCallContext) -> None:
        return None

    @_hidden
    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        found = caller(context)
        record = await _visible_run(found, task_id)
        return None if record is None else await task_of(found.runner, record)

    @_hidden
    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """Only the tasks of one context (its conversation's runs) are listed: a store-wide list is not kept."""
        if not params.context_id:
            raise UnsupportedOperationError(message="ListTasks needs a contextId (a conversation id)")
        found = caller(context)
        try:
            conversation = await named_conversation(found.runner, found.principal, found.hosted, params.context_id,
                                                    create=False)
        except ApiError:  # another agent's conversation
            conversation = None
        if conversation is None:
            return ListTasksResponse()
        messages = await found.runner.store.load_messages(conversation["id"])
        run_ids = list(dict.fromkeys(m.run_id for m in messages if m.run_id))
        tasks = [await task_of(found.runner, r) for rid in run_ids if (r := await found.runner.store.get_run(rid))]
        return ListTasksResponse(tasks=tasks, total_size=len(tasks), page_size=len(tasks))

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        raise UnsupportedOperationError(message="a ringlet run is never deleted through A2A")


async def _conversation(found: Caller, context_id: str) -> dict[str, Any]:
    """The task's conversation: the one its contextId names for this key (`chat.named_conversation`: a
    contextId of another realm names another conversation, so it neither leaks nor blocks), made on first use."""
    if not THREAD_ID.fullmatch(context_id):
        raise InvalidParamsError(message="contextId: 1-40 characters of letters, digits and _.:-")
    if ISSUED.pop(context_id, False) is None:  # a context the server named just now: the conversation's own id
        try:
            return await found.runner.store.create_conversation(
                agent=found.hosted.name, realm=found.hosted.realm_for(found.principal),
                org_id=found.principal.org_id, user_id=found.principal.user_id, conversation_id=context_id)
        except ApiError as exc:
            raise _a2a_error(exc) from None
    try:
        conversation = await named_conversation(found.runner, found.principal, found.hosted, context_id)
    except ApiError as exc:
        raise _a2a_error(exc) from None
    assert conversation is not None
    return conversation


async def _visible_conversation(found: Caller, cid: str) -> dict[str, Any] | None:
    conversation = await found.runner.store.get_conversation(cid)
    if conversation is None or conversation["agent"] != found.hosted.name or \
            not found.principal.sees(conversation["realm"]):
        return None
    return conversation


async def _visible_run(found: Caller, run_id: str) -> dict[str, Any] | None:
    """The run of this agent, in a conversation the key sees; None for anything else (not found)."""
    record = await found.runner.store.get_run(run_id)
    if record is None or record["conversation_id"] is None or record["agent"] != found.hosted.name:
        return None
    return record if await _visible_conversation(found, record["conversation_id"]) is not None else None


async def task_of(runner: Runner, record: dict[str, Any]) -> Task:
    """The A2A task of a run: its state and `ringlet` metadata (run, finish reason, usage); once it has ended,
    its answer as the final status message and as the `answer` artifact; its other user and assistant
    messages as history; while it waits, what it asks as the status message."""
    cid, run_id = record["conversation_id"], record["id"]
    conversation = await runner.store.get_conversation(cid)
    context = client_id(conversation) if conversation is not None else cid  # the contextId its client named
    mine = [m for m in await runner.store.load_messages(cid)
            if m.run_id == run_id and m.role in ("user", "assistant") and m.text.strip()]
    ended = record["status"] in ("completed", "failed", "canceled")
    final = mine[-1] if ended and mine and mine[-1].role == "assistant" else None
    task = Task(id=run_id, context_id=context, history=[_message(m, context, run_id) for m in mine if m is not final],
                status=TaskStatus(state=STATES.get(record["status"], TaskState.TASK_STATE_WORKING)),
                metadata=run_metadata(record))
    if record["status"] == "input_required":
        task.status.message.CopyFrom(asking(await pending_asks(runner, record), context, run_id))
    if final is not None:
        task.status.message.CopyFrom(_message(final, context, run_id))
        task.artifacts.append(Artifact(artifact_id=ANSWER_ID, name="answer", parts=[new_text_part(final.text)]))
    return task


def run_metadata(record: dict[str, Any]) -> Any:
    """`metadata.ringlet` of a task: the run's id, conversation, finish reason and usage."""
    return _struct({"ringlet": {"run_id": record["id"], "conversation_id": record["conversation_id"],
                                "finish_reason": record["finish_reason"], "usage": record["usage"]}})


def _message(m: RingletMessage, cid: str, run_id: str) -> Message:
    """A transcript message in a task's history; a prompt keeps the id its A2A message had."""
    return Message(message_id=m.metadata.get(A2A_ID) or m.id, context_id=cid, task_id=run_id,
                   parts=[new_text_part(m.text)], role=Role.ROLE_USER if m.role == "user" else Role.ROLE_AGENT)


def _struct(data: dict[str, Any]) -> Any:
    from google.protobuf import json_format, struct_pb2

    return json_format.ParseDict(json.loads(json.dumps(data, default=str)), struct_pb2.Struct())


async def pending_asks(runner: Runner, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's open approvals and questions, as the `approval_required` / `question` events describe them."""
    rows = await runner.store.list_approvals(run_id=record["id"], status="pending")
    if not rows and record["conversation_id"]:  # a sub-agent's, answered through this conversation
        rows = await runner.store.list_approvals(conversation_id=record["conversation_id"], status="pending")
    return [_ask(r) for r in rows]


def _ask(row: dict[str, Any]) -> dict[str, Any]:
    if row["kind"] == "question":
        q = row["question"] or {}
        return {"kind": "question", "question_id": row["approval_id"], "tool_call_id": row["tool_call_id"],
                "question": q.get("question"), "input_type": q.get("input_type"), "options": q.get("options") or [],
                "allow_freeform": q.get("allow_freeform", False)}
    return {"kind": "approval", "approval_id": row["approval_id"], "tool_call_id": row["tool_call_id"],
            "tool": row.get("tool"), "args": row.get("args"), "effect": row.get("effect"),
            "reason": row.get("reason"), "expires_at": row.get("expires_at")}


def asking(asks: list[dict[str, Any]], cid: str, run_id: str, *, problem: str | None = None) -> Message:
    """The input-required status message: what is asked, in text, then one DataPart per open request."""
    lines = [problem] if problem else []
    for ask in asks:
        if ask["kind"] == "question":
            options = ", ".join(o["label"] for o in ask["options"])
            lines.append(f"Question: {ask['question']}" + (f" (options: {options})" if options else ""))
        else:
            lines.append(f"Approval needed: {ask['tool']}({json.dumps(ask['args'], ensure_ascii=False)})"
                         + (f" — {ask['reason']}" if ask.get("reason") else ""))
    lines.append(ANSWERS)
    return Message(message_id=new_id("m"), context_id=cid, task_id=run_id, role=Role.ROLE_AGENT,
                   parts=[new_text_part("\n".join(lines)),
                          *(new_data_part(json.loads(json.dumps(a, default=str))) for a in asks)])


# -- the handler and the executor --------------------------------------------------------------------------


class RunTaskHandler(DefaultRequestHandler):  # type: ignore[misc]
    """The SDK's handler, but a task is cancelled the way the native API cancels its run (in whichever
    process holds it, from any process), then read back from the store."""

    @_hidden
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        found = caller(context)
        record = await _visible_run(found, params.id)
        if record is None:
            raise TaskNotFoundError
        if record["status"] in ("completed", "failed", "canceled"):
            raise TaskNotCancelableError(message=f"task {params.id} has ended ({record['status']})")
        await cancel_run(found.runner, record)
        ended = await found.runner.store.get_run(params.id)
        assert ended is not None
        return await task_of(found.runner, ended)


async def cancel_run(runner: Runner, record: dict[str, Any]) -> None:
    """`POST …/cancel` for the run's conversation, then wait for the run's end (its `message_end`), at most
    `CANCEL_WAIT_S`; the task is then read back as it stands."""
    cid, run_id = record["conversation_id"], record["id"]
    with runner.hub.subscribe(cid) as subscriber:
        if (runner.cancel(cid) or await runner.cancel_paused(cid)) != run_id:
            raise TaskNotCancelableError(message=f"task {run_id} is not active in any process that can cancel it")
        try:  # bounded: a run that another process must end (or a closing server) never holds the request
            async with asyncio.timeout(CANCEL_WAIT_S):
                async for _ in items(runner, subscriber, cid, after=0, run_id=run_id):
                    pass
        except TimeoutError:
            log.warning("task %s: cancelled, but its run had not ended after %g s", run_id, CANCEL_WAIT_S)


@dataclass(eq=False)
class _Follow:
    """One execute's view of the run it follows: what it has streamed and what the run asks."""

    queue: EventQueue
    run_id: str
    cid: str
    """The run's conversation."""
    context_id: str
    """The contextId its client knows that conversation by (`chat.named_conversation`)."""
    streamed: bool = False
    asks: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


class RingletExecutor(AgentExecutor):
    """Runs a task as a ringlet run: a new task starts one; a message to a task waiting for input answers it."""

    @_hidden
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        found = caller(context.call_context)
        assert context.task_id is not None
        assert context.context_id is not None
        assert context.message is not None
        if context.current_task is not None:
            await self._answer(found, context, event_queue)
            return
        conversation = await _conversation(found, context.context_id)
        prompt = RingletMessage.user(_prompt_text(context.message), source="a2a")
        prompt = replace(prompt, metadata={**prompt.metadata, A2A_ID: context.message.message_id},
                         run_id=context.task_id, conversation_id=conversation["id"])  # in the task's history
        try:  # the run is the task: once it is stored, the task is there (`RunTasks.get`) for every process
            run = await found.runner.start(conversation, prompt, principal=found.principal, run_id=context.task_id)
        except (ApiError, ConfigError) as exc:
            raise _a2a_error(exc) from None
        await self._follow(found.runner, _Follow(event_queue, run.run_id, conversation["id"], context.context_id),
                           after=0)

    @_hidden
    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        found = caller(context.call_context)
        record = await _visible_run(found, context.task_id or "")
        if record is not None and record["status"] not in ("completed", "failed", "canceled"):
            await cancel_run(found.runner, record)

    async def _answer(self, found: Caller, context: RequestContext, queue: EventQueue) -> None:
        """A message to an existing task answers what its run asks; a bad answer asks again, saying why."""
        runner, run_id = found.runner, context.task_id or ""
        record = await _visible_run(found, run_id)
        if record is None:
            raise TaskNotFoundError
        cid, context_id = record["conversation_id"], context.context_id or record["conversation_id"]
        asks = await pending_asks(runner, record)
        if not asks:
            raise UnsupportedOperationError(message=f"task {run_id} is not waiting for input ({record['status']})")
        mark, _ = await runner.store.event_marks(cid)
        try:
            await answer(runner, found.principal, asks, context.message or Message())
        except (ApiError, ValueError) as exc:
            why = exc.message if isinstance(exc, ApiError) else str(exc)
            await _status(queue, run_id, context_id, TaskState.TASK_STATE_INPUT_REQUIRED,
                          asking(await pending_asks(runner, record) or asks, context_id, run_id,
                                 problem=f"The answer was not taken: {why}"))
            return
        await self._follow(runner, _Follow(queue, run_id, cid, context_id), after=mark)

    async def _follow(self, runner: Runner, follow: _Follow, *, after: int) -> None:
        """Encode the run's events as task updates until it pauses for a human or ends."""
        await _status(follow.queue, follow.run_id, follow.context_id, TaskState.TASK_STATE_WORKING)
        with runner.hub.subscribe(follow.cid) as subscriber:
            async for item in items(runner, subscriber, follow.cid, after=after, run_id=follow.run_id):
                if item is None:
                    continue
                if await self._encode(runner, follow, item.type, json.loads(item.data), nested=item.nested):
                    return

    async def _encode(self, runner: Runner, follow: _Follow, kind: str, payload: dict[str, Any], *,
                      nested: bool) -> bool:
        """One ringlet event as task updates; True once the task is input-required or has ended."""
        queue, run_id, cid = follow.queue, follow.run_id, follow.context_id
        if kind == "content_delta" and not nested:
            await queue.enqueue_event(TaskArtifactUpdateEvent(
                task_id=run_id, context_id=cid, append=follow.streamed,
                artifact=Artifact(artifact_id=ANSWER_ID, name="answer", parts=[new_text_part(payload["delta"])])))
            follow.streamed = True
        elif kind == "error" and not nested:
            follow.error = payload.get("message")
        elif kind == "status" and payload.get("state") == "input_required":
            record = await runner.store.get_run(run_id)
            asks = await pending_asks(runner, record) if record else []
            if asks:
                await _status(queue, run_id, cid, TaskState.TASK_STATE_INPUT_REQUIRED, asking(asks, cid, run_id))
                return True
        elif kind == "message_end" and not nested:
            await self._end(runner, follow)
            return True
        return False

    async def _end(self, runner: Runner, follow: _Follow) -> None:
        """The final answer (replacing the streamed chunks) and the task's last state, as `task_of` reads them
        from the stored run."""
        record = await runner.store.get_run(follow.run_id)
        if record is None:
            raise InternalError(message=f"run {follow.run_id} ended without a record")
        task = await task_of(runner, record)
        for artifact in task.artifacts:
            await follow.queue.enqueue_event(TaskArtifactUpdateEvent(
                task_id=follow.run_id, context_id=follow.context_id, artifact=artifact, append=False,
                last_chunk=True))
        note = task.status.message if task.status.HasField("message") else None
        if note is None and task.status.state == TaskState.TASK_STATE_FAILED:
            note = Message(message_id=new_id("m"), context_id=follow.context_id, task_id=follow.run_id,
                           role=Role.ROLE_AGENT,
                           parts=[new_text_part(f"The run failed: {follow.error or 'see the run'}")])
        await _status(follow.queue, follow.run_id, follow.context_id, task.status.state, note, metadata=task.metadata)


async def _status(queue: EventQueue, run_id: str, cid: str, state: Any, message: Message | None = None, *,
                  metadata: Any = None) -> None:
    status = TaskStatus(state=state)
    if message is not None:
        status.message.CopyFrom(message)
    await queue.enqueue_event(TaskStatusUpdateEvent(task_id=run_id, context_id=cid, status=status, metadata=metadata))


def _prompt_text(message: Message) -> str:
    """The user message's text; data parts follow as JSON (ringlet prompts are text here)."""
    text = get_message_text(message)
    data = get_data_parts(list(message.parts))
    if data:
        text += "".join(f"\n\n```json\n{json.dumps(d, ensure_ascii=False, indent=2)}\n```" for d in data)
    if not text.strip():
        raise InvalidParamsError(message="the message has no text or data part")
    return text


def _a2a_error(exc: ApiError | ConfigError) -> A2AError:
    if isinstance(exc, ConfigError):
        return InvalidParamsError(message=str(exc))
    return InvalidRequestError(message=f"{exc.code}: {exc.message}") if exc.status != 422 else \
        InvalidParamsError(message=exc.message)


# -- answers -----------------------------------------------------------------------------------------------


async def answer(runner: Runner, principal: Principal, asks: list[dict[str, Any]], message: Message) -> None:
    """Apply the message to the open requests (`ANSWERS`), as the native routes would: approvals are all
    decided first and their run resumed once (as a batch decision); an answer resumes it itself. ApiError
    (403 without `approve`, 409, 422) or ValueError when the message does not fit."""
    data = [d for d in get_data_parts(list(message.parts)) if isinstance(d, dict)]
    text = get_message_text(message).strip()
    questions = [a for a in asks if a["kind"] == "question"]
    approvals = [a for a in asks if a["kind"] == "approval"]
    decided: set[str] = set()
    try:
        for item in data or [{}]:
            if "approved" in item or (not questions and not item and text):
                decided |= await _decide(runner, principal, approvals, item, text)
            else:
                decided |= await _reply(runner, principal, questions, item, text)
    finally:  # what was decided goes on even when a later part is refused: it never waits for a decision made
        for run_id in {a["run_id"] for a in await _records(runner, decided)}:
            await runner.resume(run_id)


async def _decide(runner: Runner, principal: Principal, approvals: list[dict[str, Any]], item: dict[str, Any],
                  text: str) -> set[str]:
    principal.check_scope("approve")
    approved = item.get("approved")
    if approved is None:
        word = text.lower()
        if word not in YES | NO:
            raise ValueError(f"an approval takes a data part {{\"approved\": true|false}} or the text yes / no, "
                             f"not {text!r}")
        approved = word in YES
    if not isinstance(approved, bool):
        raise ValueError("`approved` must be true or false")
    chosen = [a for a in approvals if item.get("approval_id") in (None, a["approval_id"])]
    if not chosen:
        raise ValueError(f"no open approval {item.get('approval_id')!r} in this task")
    note = item.get("note") if isinstance(item.get("note"), str) else None
    for ask in chosen:
        record = await runner.store.get_approval(ask["approval_id"])
        assert record is not None
        await runner.decide(record, approved=approved, note=note, decided_by=principal.user_id, resume=False)
    return {a["approval_id"] for a in chosen}


async def _reply(runner: Runner, principal: Principal, questions: list[dict[str, Any]], item: dict[str, Any],
                 text: str) -> set[str]:
    wanted = item.get("question_id")
    chosen = [q for q in questions if wanted in (None, q["question_id"])]
    if len(chosen) != 1:
        raise ValueError("name the question (`question_id`): several are open" if chosen else
                         f"no open question {wanted!r} in this task" if wanted else "this task asks no question")
    given = item.get("answer", text)
    if given in ("", None):
        raise ValueError("the answer is empty")
    record = await runner.store.get_approval(chosen[0]["question_id"])
    assert record is not None
    await runner.answer(record, given, answered_by=principal.user_id)  # checked (422), and the run resumes
    return set()


async def _records(runner: Runner, ids: set[str]) -> list[dict[str, Any]]:
    found = [await runner.store.get_approval(i) for i in sorted(ids)]
    return [r for r in found if r is not None]
