"""A thread's new messages, and the run they start.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ag_ui.core import Message as AgMessage
from ag_ui.core import RunAgentInput, ToolMessage, UserMessage

from ringlet._ids import new_id
from ringlet.errors import ConfigError
from ringlet.messages import AudioPart, FilePart, ImagePart, Message, Part, TextPart
from ringlet.server.catalog import Hosted
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError
from ringlet.server.protocols.agui.inputs import overrides
from ringlet.server.runs.service import Runs
from ringlet.store.records import Conversation


async def start(runs: Runs, principal: Principal, conversation: Conversation, hosted: Hosted,
                body: RunAgentInput) -> str | None:
    """Store the new user messages and start a run on them, as `POST …/messages` does; its run id, or None
    when `messages` holds nothing the thread has not stored."""
    cid = conversation.id
    stored = await runs.records.conversations.load_messages(cid)
    known = {m.id for m in stored} | {m.metadata.get("ag_ui_id") for m in stored}
    incoming = [_ringlet_message(m, stored) for m in _new_messages(body.messages, known)]
    if not incoming:
        return None
    if conversation.status == "input_required":
        waiting = [r.approval_id for r in await runs.records.approvals.list(conversation_id=cid,
                                                                               status="pending")]
        raise ApiError(409, "input_required", f"thread {cid} waits on interrupts {', '.join(waiting)}; answer "
                       "them with `resume`", details={"interrupts": waiting})
    run_id = new_id("r")
    try:
        await runs.start(conversation, incoming, principal=principal, overrides=overrides(hosted, body),
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
