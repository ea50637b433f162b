"""AG-UI (`POST /ag-ui/{agent}`): the protocol CopilotKit and other front-ends speak, as one more encoder of
the run's event stream (DESIGN §1: never a second driver). A request is AG-UI's `RunAgentInput`; the answer
is an SSE stream of AG-UI events, one `data:` line each (the `ag_ui` package's own encoder), with `: ping`
comments while the run is busy.

**Threads.** `threadId` (1–40 characters of `[A-Za-z0-9_.:-]`) names a conversation of the agent: one the key
may see under that id (a conversation id the server gave out; of another agent: 400 `invalid_request`), else
the thread the key's realm knows by that name, made on first use, owned by the key's user and org
(`chat.named_conversation`: its id is derived from realm, agent and threadId, so a threadId used in one realm
neither shows nor blocks another's). Events name the thread by the client's threadId. The stored
transcript is the truth: of `messages`, only the
trailing user messages not stored yet (by AG-UI id) start a run, exactly as `POST …/messages` does; the
rest is history the thread already has. RUN_STARTED and RUN_FINISHED/RUN_ERROR name the input's `runId`; their
`metadata.ringlet.run_id` is the ringlet run behind it (a resumed run keeps its ringlet id).
A request with no new user message (and no `resume`) runs nothing: RUN_STARTED (the input's `runId`),
MESSAGES_SNAPSHOT and RUN_FINISHED, with the thread's pending interrupts when it waits (a client reconnecting).

**Input fields.** `tools`: the front-end's own tools, offered to a loop agent's model beside the agent's
tools. A call of one is not run on the server: its TOOL_CALL_START/ARGS/END are sent and the run finishes
(RUN_FINISHED) once the server's own calls of that round are done; the client runs it and sends the next
`RunAgentInput` with a `tool` message (`toolCallId`, `content`, or `error`) after the history, and the run
goes on from there (as `/v1` does with `tool_calls`). A graph agent takes none (422). `context`: for a
loop agent each entry joins the run's instructions (`extra_instructions`, as `/v1` system messages do);
a graph agent ignores it. `state`: for a graph agent, its entries whose key is a declared graph variable
are the run's `variables`; anything else in it is ignored. `forwardedProps` is ignored.

**Events** (ringlet event → AG-UI):

    (start of the stream)           RUN_STARTED {threadId, runId, metadata.ringlet.run_id}
    content_delta                   TEXT_MESSAGE_START (first delta of a message id) + TEXT_MESSAGE_CONTENT;
                                    TEXT_MESSAGE_END when the message's round ends
    tool_call_start / _delta        TOOL_CALL_START {parentMessageId: the round's message} / TOOL_CALL_ARGS
    tool_result                     TOOL_CALL_END (every open call of the round, first) + TOOL_CALL_RESULT
    approval_required / question    CUSTOM {name: "ringlet.approval_required" | "ringlet.question",
                                    value: the ringlet payload}
    status input_required           RUN_FINISHED {outcome: {type: "interrupt", interrupts: [...]}}
    node_start / node_end           STEP_STARTED / STEP_FINISHED {stepName: node id}; a graph run's state
                                    is read from its checkpoint: STATE_SNAPSHOT first, then STATE_DELTA
                                    (JSON Patch) whenever it changed (at each node_start and at the end)
    notification                    CUSTOM {name: "ringlet.notification"}
    error + message_end             MESSAGES_SNAPSHOT + RUN_ERROR {message, code}
    message_end                     MESSAGES_SNAPSHOT + RUN_FINISHED {outcome: success | cancelled, usage}

Events of sub-agents (`agent_path`) and inside graph nodes (`node_id`) are not shown as text or tool calls,
only their approvals and questions (the graph's End output is its answer). Ringlet's models stream no
reasoning, so there are no REASONING_* events.

**Interrupts.** A run that waits for approvals or answers ends its AG-UI run with `RUN_FINISHED` whose
outcome is `{"type": "interrupt", "interrupts": [Interrupt]}`: one per pending approval or question of the
run, `id` the `approval_id` / `question_id`, `reason` `"approval_required"` or `"question"`, `toolCallId`,
`expiresAt`, a `responseSchema` of the answer, and `metadata.ringlet` the ringlet payload. The client
continues with the next `RunAgentInput` on the same thread carrying `resume`:

    {"interruptId": "ap_…", "status": "resolved", "payload": {"approved": true, "note": "ok"}}
    {"interruptId": "ap_…", "status": "cancelled"}                       (the call is denied)
    {"interruptId": "q_…",  "status": "resolved", "payload": {"answer": "red"}}   (or a list of labels)
    {"interruptId": "q_…",  "status": "cancelled"}                       (the paused run is cancelled)

Deciding approvals needs the `approve` scope (403 otherwise), as in the native API; an answer is checked
against its question (422); an id not in the thread is 404 `interrupt_not_found`, one decided already 409. With
`resume`, `messages` are history only. The stream then follows the same ringlet run from where it paused, to
its end or its next interrupt. A new message to a thread that waits on interrupts is 409 `input_required`.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    CustomEvent,
    FunctionCall,
    Interrupt,
    MessagesSnapshotEvent,
    ResumeEntry,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    SystemMessage,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCall,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)
from ag_ui.core import Message as AgMessage
from ag_ui.encoder import EventEncoder
from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError

from ringlet._ids import new_id
from ringlet.errors import ConfigError
from ringlet.messages import AudioPart, FilePart, ImagePart, Message, Part, TextPart
from ringlet.server.catalog import Hosted
from ringlet.server.http import schemas as s
from ringlet.server.http import sse
from ringlet.server.http.auth import Principal, need
from ringlet.server.http.errors import ApiError
from ringlet.server.http.limits import Slot, hold_stream
from ringlet.server.http.schemas import ERRORS
from ringlet.server.protocols.access import named_conversation
from ringlet.server.runs.follow import items
from ringlet.server.runs.runner import Runner, runner_of
from ringlet.tools.base import NAME_PATTERN, client_tool

router = APIRouter(prefix="/ag-ui")
Chat = Annotated[Principal, Depends(need("chat"))]
THREAD_ID = re.compile(r"[A-Za-z0-9_.:-]{1,40}")
PING = b": ping\n\n"
_ENCODER = EventEncoder()
_STREAM = {"content": {"text/event-stream": {"schema": s.SSE_EVENT}},
           "description": "The run's AG-UI events (https://docs.ag-ui.com), each one `data:` line of its JSON, no "
                          "event name; `: ping` comments keep the stream open."}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERRORS, 200: _STREAM,
    400: {"model": s.ErrorBody, "description": "The thread belongs to another agent"},
    409: {"model": s.ErrorBody, "description": "A run is active, the thread waits on interrupts, or an "
                                               "interrupt was decided already"}}
_APPROVAL_SCHEMA = {"type": "object", "required": ["approved"],
                    "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}}}




def _documented_input() -> dict[str, Any]:
    """`RunAgentInput`'s JSON Schema from the package, inlined (an operation cannot add components) and made
    as strict as its validation: a union's discriminator (`role`, `type`) is required in each member (the
    package leaves it optional since it has a default, yet validation needs it), `threadId` has ringlet's
    pattern, and a tool's name and parameters what `_check_input` takes."""
    schema = RunAgentInput.model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, list):
            return [inline(n) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return inline(defs[node["$ref"].rsplit("/", 1)[1]])
        out = {k: inline(v) for k, v in node.items() if k != "discriminator"}
        tag = (node.get("discriminator") or {}).get("propertyName")
        for member in out.get("oneOf", ()) if tag else ():
            member["required"] = list(dict.fromkeys([*member.get("required", []), tag]))
        return out

    documented = inline(schema)
    documented["properties"]["threadId"] |= {"pattern": f"^{THREAD_ID.pattern}$"}
    tool = documented["properties"]["tools"]["anyOf"][0]["items"]["properties"]
    tool["name"] |= {"pattern": NAME_PATTERN.pattern}
    tool["parameters"] = {"anyOf": [{"type": "object", "properties": {"type": {"const": "object"}}},
                                    {"type": "null"}], "default": None,
                          "description": "The JSON Schema of the tool's arguments (an object)"}
    return documented


@router.post("/{agent}", responses=_RESPONSES, openapi_extra={"requestBody": {
    "required": True, "content": {"application/json": {"schema": _documented_input()}}}})
async def run_agent(agent: str, request: Request, principal: Chat) -> Any:
    """Run `agent` on the thread's new user messages, or resume its interrupts; stream AG-UI events."""
    runner = runner_of(request)
    hosted = runner.catalog.get(agent)  # 404 agent_not_found
    principal.check_agent(agent)
    body = _parsed(await request.body())
    _check_input(body)
    conversation = await named_conversation(runner, principal, hosted, body.thread_id)
    assert conversation is not None
    slot = hold_stream()  # 429 over the key's streams, before a run starts or resumes
    try:
        if body.resume:
            run_id, after = await _resume(runner, principal, conversation, body.resume)
        else:
            run_id, after = await _start(runner, principal, conversation, hosted, body), 0
    except BaseException:
        if slot is not None:
            slot.release()
        raise
    if run_id is None:  # nothing new to run: the thread as it stands (a client reconnecting)
        return _authorized(request, principal, _synced(runner, conversation["id"], body.thread_id, body.run_id),
                           slot)
    frames = _frames(runner, conversation["id"], body.thread_id, run_id, body.run_id, after,
                     graph=hosted.kind == "graph")
    return _authorized(request, principal, frames, slot)


# -- the thread and its input ------------------------------------------------------------------------------------


def _parsed(raw: bytes) -> RunAgentInput:
    """The body as AG-UI's model; 400 when it is not JSON, 422 naming the first invalid field (the error shape
    of every native route, `errors.install`)."""
    try:
        return RunAgentInput.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise ApiError(400, "invalid_request", "the body is not JSON") from None
        errors = [{"loc": ".".join(["body", *(str(p) for p in e["loc"])]), "msg": e["msg"]} for e in exc.errors()]
        raise ApiError(422, "validation_error", f"{errors[0]['loc']}: {errors[0]['msg']}",
                       details={"errors": errors}) from None


def _check_input(body: RunAgentInput) -> None:
    if not THREAD_ID.fullmatch(body.thread_id):
        raise ApiError(422, "validation_error", "body.threadId: 1-40 characters of letters, digits and _.:-",
                       details={"errors": [{"loc": "body.threadId", "msg": "not a thread id ringlet can store"}]})
    for i, t in enumerate(body.tools or ()):
        problem = None if NAME_PATTERN.match(t.name) else "the name must be 1-64 letters, digits, _ or -"
        if problem is None and t.parameters is not None and (
                not isinstance(t.parameters, dict) or t.parameters.get("type", "object") != "object"):
            problem = "parameters must be a JSON Schema of an object"
        if problem is not None:
            raise ApiError(422, "validation_error", f"body.tools.{i}: {problem}",
                           details={"errors": [{"loc": f"body.tools.{i}", "msg": problem}]})


async def _start(runner: Runner, principal: Principal, conversation: dict[str, Any], hosted: Hosted,
                 body: RunAgentInput) -> str | None:
    """Store the new user messages and start a run on them, as `POST …/messages` does; its run id, or None
    when `messages` holds nothing the thread has not stored."""
    cid = conversation["id"]
    stored = await runner.store.load_messages(cid)
    known = {m.id for m in stored} | {m.metadata.get("ag_ui_id") for m in stored}
    incoming = [_ringlet_message(m, stored) for m in _new_messages(body.messages, known)]
    if not incoming:
        return None
    if conversation["status"] == "input_required":
        waiting = [r["approval_id"] for r in await runner.store.list_approvals(conversation_id=cid,
                                                                               status="pending")]
        raise ApiError(409, "input_required", f"thread {cid} waits on interrupts {', '.join(waiting)}; answer "
                       "them with `resume`", details={"interrupts": waiting})
    run_id = new_id("r")
    try:
        await runner.start(conversation, incoming, principal=principal, overrides=_overrides(hosted, body),
                           run_id=run_id)
    except ConfigError as exc:
        raise ApiError(422, "validation_error", str(exc)) from None
    return run_id


def _new_messages(messages: Sequence[AgMessage], known: set[Any]) -> list[UserMessage | ToolMessage]:
    """The trailing user messages, and results of client-side tools, the thread has not stored yet."""
    trailing: list[UserMessage | ToolMessage] = []
    for message in reversed(messages):
        if not isinstance(message, UserMessage | ToolMessage) or message.id in known:
            break
        trailing.append(message)
    return trailing[::-1]


def _ringlet_message(message: UserMessage | ToolMessage, stored: Sequence[Message]) -> Message:
    if isinstance(message, ToolMessage):
        return _tool_result(message, stored)
    content = message.content
    if isinstance(content, str):
        return Message.user(content, source="ag-ui", ag_ui_id=message.id)
    parts: list[Part] = []
    for part in content:
        if part.type == "text":
            parts.append(TextPart(text=part.text))
            continue
        source = part.source
        url, data = (source.value, None) if source.type in ("url", "file") else (None, source.value)
        media_type = source.mime_type
        if part.type == "image":
            parts.append(ImagePart(url=url, data=data, media_type=media_type))
        elif part.type == "audio":
            parts.append(AudioPart(url=url, data=data, media_type=media_type))
        else:
            parts.append(FilePart(url=url, data=data, media_type=media_type))
    return Message.user(tuple(parts), source="ag-ui", ag_ui_id=message.id)


def _tool_result(message: ToolMessage, stored: Sequence[Message]) -> Message:
    """A client-side tool's result, for a call the thread's run handed to the client; 422 for any other."""
    asked = next((c for m in reversed(stored) if m.role == "assistant" for c in m.tool_calls
                  if c.id == message.tool_call_id), None)
    answered = any(m.role == "tool" and m.tool_call_id == message.tool_call_id for m in stored)
    if asked is None or answered:
        why = "already has its result" if answered else "is not a call of this thread"
        raise ApiError(422, "validation_error", f"body.messages: tool call {message.tool_call_id!r} {why}",
                       details={"errors": [{"loc": "body.messages", "msg": f"toolCallId {why}"}]})
    content = message.content if isinstance(message.content, str) else \
        "\n".join(getattr(p, "text", "") for p in message.content)
    text = message.error if message.error else content
    return Message.tool(asked.id, asked.name, text, is_error=bool(message.error), source="ag-ui",
                        ag_ui_id=message.id)


def _overrides(hosted: Hosted, body: RunAgentInput) -> dict[str, Any]:
    """`context` as instructions for a loop agent, and its client-side `tools` (deferred: a call of one ends
    the run and goes to the client, whose result comes back as a tool message); `state` entries that are
    declared graph variables."""
    if hosted.kind == "graph":
        if body.tools:
            raise ApiError(422, "validation_error", "body.tools: a graph agent takes no client-side tools",
                           details={"errors": [{"loc": "body.tools", "msg": "must be empty for a graph agent"}]})
        declared = {v.name for v in getattr(getattr(hosted.agent(), "spec", None), "variables", ())}
        state = body.state if isinstance(body.state, dict) else {}
        variables = {k: v for k, v in state.items() if k in declared}
        return {"variables": variables} if variables else {}
    overrides: dict[str, Any] = {}
    if body.context:
        notes = "\n".join(f"- {c.description}: {c.value}" for c in body.context)
        overrides["extra_instructions"] = f"Context from the client:\n{notes}"
    if body.tools:
        overrides["extra_tools"] = [client_tool(t.name, t.description, t.parameters or {"type": "object",
                                                                                      "properties": {}})
                                    for t in body.tools]
    return overrides


# -- resuming interrupts ------------------------------------------------------------------------------------------


async def _resume(runner: Runner, principal: Principal, conversation: dict[str, Any],
                  entries: Sequence[ResumeEntry]) -> tuple[str, int]:
    """Decide or answer each interrupt, then resume the run once; (its run id, the event id it resumes
    after)."""
    cid = conversation["id"]
    records = [await _interrupt(runner, cid, entry) for entry in entries]
    if any(r["kind"] == "approval" for r in records):
        principal.check_scope("approve")
    run_ids = {r["run_id"] for r in records}
    if len(run_ids) != 1:
        raise ApiError(422, "validation_error", "body.resume: interrupts of one run only")
    run_id = run_ids.pop()
    mark, _ = await runner.store.event_marks(cid)
    decisions = [(r, _decision(i, e)) for i, (e, r) in enumerate(zip(entries, records, strict=True))
                 if r["kind"] == "approval"]  # every payload checked before anything is decided
    answers = [(r, _CANCEL if e.status == "cancelled" else _answer(i, e))
               for i, (e, r) in enumerate(zip(entries, records, strict=True)) if r["kind"] != "approval"]
    try:
        for record, (approved, note) in decisions:
            await runner.decide(record, approved=approved, note=note, decided_by=principal.user_id, resume=False)
        for record, answer in answers:
            if answer is _CANCEL:
                await runner.cancel_paused(cid)
            else:
                await runner.answer(record, answer, answered_by=principal.user_id)
    finally:
        if decisions:  # every decision first, so the run resumes once with all of them (also when a later
            await runner.resume(run_id)  # answer is refused: what was decided is not left waiting)
    return await _followed_run(runner, cid, run_id), mark


async def _followed_run(runner: Runner, cid: str, run_id: str) -> str:
    """The thread's run whose events tell how `run_id` goes on: itself, or for a sub-agent's request (stored
    under the root conversation, its run a child's) the root run it works inside."""
    run = await runner.store.get_run(run_id)
    if run is not None and run["conversation_id"] == cid:
        return run_id
    active = runner.active.get(cid)
    if active is not None:
        return active.run_id
    working = [r["id"] for r in await runner.store.working_runs() if r["conversation_id"] == cid]  # elsewhere
    return working[0] if working else await runner.store.paused_run_of(cid) or run_id


_CANCEL = object()
"""A question's `cancelled` resume entry: the paused run is cancelled."""


async def _interrupt(runner: Runner, cid: str, entry: ResumeEntry) -> dict[str, Any]:
    record = await runner.store.get_approval(entry.interrupt_id)
    if record is None or record["conversation_id"] != cid:
        raise ApiError(404, "interrupt_not_found", f"no interrupt {entry.interrupt_id!r} in thread {cid}")
    if record["status"] != "pending":
        raise ApiError(409, "interrupt_not_pending", f"interrupt {entry.interrupt_id!r} is {record['status']} "
                       "already; send the thread's next message instead")
    return record


def _decision(index: int, entry: ResumeEntry) -> tuple[bool, str | None]:
    payload = entry.payload if isinstance(entry.payload, dict) else {}
    note = payload.get("note") if isinstance(payload.get("note"), str) else None
    if entry.status == "cancelled":
        return False, note or "cancelled by the client"
    if not isinstance(payload.get("approved"), bool):
        loc = f"body.resume.{index}.payload.approved"
        raise ApiError(422, "validation_error", f"{loc}: an approval is resolved with {{\"approved\": bool}}",
                       details={"errors": [{"loc": loc, "msg": "a boolean is required"}]})
    return payload["approved"], note


def _answer(index: int, entry: ResumeEntry) -> Any:
    payload = entry.payload
    if not isinstance(payload, dict) or "answer" not in payload:
        loc = f"body.resume.{index}.payload.answer"
        raise ApiError(422, "validation_error", f"{loc}: a question is resolved with {{\"answer\": …}}",
                       details={"errors": [{"loc": loc, "msg": "field required"}]})
    return payload["answer"]


# -- the stream ----------------------------------------------------------------------------------------------------


def _frame(event: BaseEvent) -> bytes:
    return _ENCODER.encode(event).encode()


def _authorized(request: Request, principal: Principal, frames: AsyncIterator[bytes], slot: Slot | None) -> Any:
    """The SSE response, rechecking the key every `auth_recheck_s` like the native streams (chat.py); a
    revoked or expired key ends it with RUN_ERROR `unauthorized`."""
    gone = _frame(RunErrorEvent(message="the API key of this stream was revoked or has expired", code="unauthorized"))
    runner = runner_of(request)
    return sse.response(frames, slot, **sse.keyed(runner.settings, runner.store.keys, principal.key_id, gone))


async def _frames(runner: Runner, cid: str, thread_id: str, run_id: str, client_run: str, after: int, *,
                  graph: bool) -> AsyncIterator[bytes]:
    """RUN_STARTED, the run's events translated (from the log and live), then the transcript and the end."""
    encoder = Translator(thread_id=thread_id, run_id=run_id, client_run=client_run)
    state = GraphState(runner, run_id) if graph else None
    yield _frame(RunStartedEvent(thread_id=thread_id, run_id=client_run, metadata=ringlet_run(run_id)))
    with runner.hub.subscribe(cid) as subscriber:
        async for item in items(runner, subscriber, cid, after=after, run_id=run_id):
            if item is None:
                yield PING
                continue
            payload = json.loads(item.data)
            if state is not None and item.type == "node_start" and "agent_path" not in payload:
                for event in await state.sync():
                    yield _frame(event)
            for event in encoder.feed(item.type, payload):
                yield _frame(event)
            if encoder.ending is not None:
                break
    if state is not None:
        for event in await state.sync():
            yield _frame(event)
    yield _frame(MessagesSnapshotEvent(messages=transcript(await runner.store.load_messages(cid))))
    yield _frame(await encoder.end(runner))


async def _synced(runner: Runner, cid: str, thread_id: str, run_id: str) -> AsyncIterator[bytes]:
    """A run with nothing new to do: the thread's transcript, and its pending interrupts if it waits."""
    yield _frame(RunStartedEvent(thread_id=thread_id, run_id=run_id))
    yield _frame(MessagesSnapshotEvent(messages=transcript(await runner.store.load_messages(cid))))
    pending = await runner.store.list_approvals(conversation_id=cid, status="pending")
    interrupts = [interrupt_of(*_record_payload(r)) for r in pending]
    outcome = RunFinishedInterruptOutcome(interrupts=interrupts) if interrupts else None
    yield _frame(RunFinishedEvent(thread_id=thread_id, run_id=run_id, outcome=outcome))


@dataclass(eq=False)
class Translator:
    """Ringlet events of one run into AG-UI events. A ringlet run has one message_start/message_end around
    every model round; each round's text is its own AG-UI text message (ringlet's message id), and its tool
    calls are ended (TOOL_CALL_END) once the round's streaming is over, before their results."""

    thread_id: str
    run_id: str
    """ringlet's run."""
    client_run: str
    """The AG-UI run (the input's `runId`), which the run's AG-UI events name."""
    text: str | None = None
    """The open text message."""
    round_id: str | None = None
    """The message id of the current model round, once known."""
    first_id: str | None = None
    """The run's message_start id: the first round's message."""
    calls: list[str] = field(default_factory=list)
    """Tool calls started and not ended yet."""
    interrupts: dict[str, Interrupt] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    ending: dict[str, Any] | None = None
    """What ended the stream: the message_end payload, or the input_required status."""
    results: int = 0

    def feed(self, kind: str, payload: dict[str, Any]) -> list[BaseEvent]:
        if kind in ("approval_required", "question"):
            return [*self._close(), self._interrupt(kind, payload)]
        if kind == "notification" and "agent_path" not in payload:
            return [CustomEvent(name="ringlet.notification", value=payload)]
        if "agent_path" in payload:
            return []  # a sub-agent's own work
        if kind in ("node_start", "node_end"):
            step = StepStartedEvent if kind == "node_start" else StepFinishedEvent
            return [*self._close(), step(step_name=payload["node_id"])]
        if "node_id" in payload:
            return []  # inside a graph node: its answer is the graph's output
        handler = getattr(self, "_" + kind, None)
        return handler(payload) if handler is not None else []

    def _message_start(self, payload: dict[str, Any]) -> list[BaseEvent]:
        self.first_id = self.first_id or payload["message_id"]
        return []

    def _content_delta(self, payload: dict[str, Any]) -> list[BaseEvent]:
        message_id, out = payload["message_id"], []
        if self.text != message_id:
            out = [*self._close(), TextMessageStartEvent(message_id=message_id, role="assistant")]
            self.text = self.round_id = message_id
        if payload["delta"]:
            out.append(TextMessageContentEvent(message_id=message_id, delta=payload["delta"]))
        return out

    def _tool_call_start(self, payload: dict[str, Any]) -> list[BaseEvent]:
        out = self._end_text()
        if self.round_id is None:  # a round that streamed no text: its message id is not in the events
            self.round_id = self.first_id if self.results == 0 and self.first_id else new_id("m")
        self.calls.append(payload["tool_call_id"])
        return [*out, ToolCallStartEvent(tool_call_id=payload["tool_call_id"], tool_call_name=payload["name"],
                                         parent_message_id=self.round_id)]

    def _tool_call_delta(self, payload: dict[str, Any]) -> list[BaseEvent]:
        if not payload["args_delta"]:
            return []
        return [ToolCallArgsEvent(tool_call_id=payload["tool_call_id"], delta=payload["args_delta"])]

    def _tool_result(self, payload: dict[str, Any]) -> list[BaseEvent]:
        out = self._close()
        self.round_id, self.results = None, self.results + 1
        value = payload.get("error") if payload.get("is_error") else payload.get("result")
        content = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return [*out, ToolCallResultEvent(message_id=new_id("m"), tool_call_id=payload["tool_call_id"],
                                          content=content, role="tool")]

    def _status(self, payload: dict[str, Any]) -> list[BaseEvent]:
        if payload["state"] == "input_required":
            self.ending = payload
            return self._close()
        return []

    def _error(self, payload: dict[str, Any]) -> list[BaseEvent]:
        self.error = payload
        return self._close()

    def _message_end(self, payload: dict[str, Any]) -> list[BaseEvent]:
        self.ending = payload
        return self._close()

    def _interrupt(self, kind: str, payload: dict[str, Any]) -> BaseEvent:
        interrupt = interrupt_of(kind, payload)
        self.interrupts[interrupt.id] = interrupt
        return CustomEvent(name=f"ringlet.{kind}", value=payload)

    def _end_text(self) -> list[BaseEvent]:
        if self.text is None:
            return []
        ended, self.text = self.text, None
        return [TextMessageEndEvent(message_id=ended)]

    def _close(self) -> list[BaseEvent]:
        """End the open text message and every open tool call (their round's streaming is over)."""
        ended: list[BaseEvent] = [ToolCallEndEvent(tool_call_id=c) for c in self.calls]
        self.calls = []
        return [*self._end_text(), *ended]

    def _finished(self, **fields: Any) -> RunFinishedEvent:
        return RunFinishedEvent(thread_id=self.thread_id, run_id=self.client_run, metadata=ringlet_run(self.run_id),
                                **fields)

    async def end(self, runner: Runner) -> BaseEvent:
        """The run's last AG-UI event: RUN_ERROR, or RUN_FINISHED (an interrupt, cancelled, or success)."""
        end = self.ending or {}
        if self.error is not None or end.get("finish_reason") == "error" or not end:
            error = self.error or {"code": "interrupted", "message": "the run ended without its end event"}
            return RunErrorEvent(message=error["message"], code=error["code"])
        if end.get("state") == "input_required":
            pending = await runner.store.list_approvals(run_id=self.run_id, status="pending")
            for record in pending:  # also those asked before this stream began (a partly decided batch)
                if record["approval_id"] not in self.interrupts:
                    interrupt = interrupt_of(*_record_payload(record))
                    self.interrupts[interrupt.id] = interrupt
            live = {r["approval_id"] for r in pending}
            interrupts = [i for i in self.interrupts.values() if i.id in live] or list(self.interrupts.values())
            if not interrupts:  # paused on nothing it can name here (e.g. decided meanwhile): resend to see
                return self._finished()
            return self._finished(outcome=RunFinishedInterruptOutcome(interrupts=interrupts))
        if end.get("finish_reason") == "cancelled":
            return self._finished(outcome=RunFinishedCancelledOutcome())
        usage = end.get("usage") or {}
        tokens = TokenUsage(input_tokens=usage.get("in_tokens", 0), output_tokens=usage.get("out_tokens", 0),
                            total_tokens=usage.get("in_tokens", 0) + usage.get("out_tokens", 0))
        return self._finished(usage=[tokens])


def ringlet_run(run_id: str) -> dict[str, Any]:
    """The metadata naming the ringlet run behind an AG-UI run (`GET /api/v1/runs/{id}`, the event log)."""
    return {"ringlet": {"run_id": run_id}}


def interrupt_of(kind: str, payload: dict[str, Any]) -> Interrupt:
    """The AG-UI interrupt of a ringlet `approval_required` or `question` payload."""
    if kind == "approval_required":
        return Interrupt(id=payload["approval_id"], reason="approval_required", tool_call_id=payload["tool_call_id"],
                         message=f"Approve {payload['tool']}? {payload['reason']}".strip(),
                         response_schema=_APPROVAL_SCHEMA, expires_at=payload.get("expires_at"),
                         metadata={"ringlet": payload})
    return Interrupt(id=payload["question_id"], reason="question", tool_call_id=payload.get("tool_call_id"),
                     message=payload["question"], response_schema=_answer_schema(payload),
                     metadata={"ringlet": payload})


def _answer_schema(question: dict[str, Any]) -> dict[str, Any]:
    labels = [o["label"] for o in question.get("options") or []]
    one: dict[str, Any] = {"type": "string"}
    if labels and not question.get("allow_freeform"):
        one["enum"] = labels
    answer = {"type": "array", "items": one} if question.get("input_type") == "multi-select" else one
    return {"type": "object", "required": ["answer"], "properties": {"answer": answer}}


def _record_payload(record: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A stored approval or question as the payload its event had."""
    if record["kind"] == "question":
        q = record["question"] or {}
        return "question", {**q, "question_id": record["approval_id"], "tool_call_id": record["tool_call_id"]}
    return "approval_required", {k: record[k] for k in ("approval_id", "tool_call_id", "tool", "args", "effect",
                                                          "reason", "expires_at")}


# -- a graph run's state --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class GraphState:
    """A graph run's state as AG-UI state events. Graph state is not in the event stream: it is read from
    the run's checkpoint, which is saved after every super-step, so at a node_start it holds every step
    before it (and at the end, the last)."""

    runner: Runner
    run_id: str
    sent: Any = None
    started: bool = False

    async def sync(self) -> list[BaseEvent]:
        checkpoint = await self.runner.store.checkpoints.load(self.run_id)
        if checkpoint is None:
            return []
        state = checkpoint["state"]
        if not self.started:
            self.started, self.sent = True, state
            return [StateSnapshotEvent(snapshot=state)]
        patch = json_patch(self.sent, state)
        self.sent = state
        return [StateDeltaEvent.model_validate({"delta": patch})] if patch else []


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """An RFC 6902 patch from `old` to `new`: objects key by key, anything else replaced whole."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [{"op": "replace", "path": path, "value": new}]
    ops: list[dict[str, Any]] = [{"op": "remove", "path": f"{path}/{_pointer(k)}"}
                                 for k in sorted(old.keys() - new.keys())]
    for key, value in new.items():
        where = f"{path}/{_pointer(key)}"
        ops += json_patch(old[key], value, where) if key in old else [{"op": "add", "path": where, "value": value}]
    return ops


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


# -- the transcript -------------------------------------------------------------------------------------------------


def transcript(messages: Sequence[Message]) -> list[AgMessage]:
    """The stored transcript in AG-UI's message shapes (user messages keep the id the client gave them)."""
    out: list[AgMessage] = []
    for m in messages:
        if m.role == "user":
            out.append(UserMessage(id=m.metadata.get("ag_ui_id") or m.id, content=m.text))
        elif m.role == "assistant":
            calls = [ToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.raw_arguments or "{}"))
                     for c in m.tool_calls]
            out.append(AssistantMessage(id=m.id, content=m.text or None, tool_calls=calls or None))
        elif m.role == "tool" and m.tool_call_id:
            out.append(ToolMessage(id=m.id, content=m.text, tool_call_id=m.tool_call_id))
        elif m.role == "system":
            out.append(SystemMessage(id=m.id, content=m.text))
    return out
