"""The request `useChat` sends (`DefaultChatTransport`): `{"id", "messages", "trigger", "messageId", …}`,
parsed and checked; which of its messages are new, as ringlet messages; and the approval responses its last
assistant message carries.

**Chats.** The chat `id` (1–40 characters of `[A-Za-z0-9_.:-]`, as an AG-UI threadId) names a conversation of
the agent with the same realm rules as AG-UI threads (`access.named_conversation`): a conversation id the key
may see is taken as it is; any other id stands, in the key's realm, for the conversation derived from realm,
agent and id, made on first use. The stored transcript is the truth: of `messages`, only the trailing user
messages not stored yet (by their UI message id) start a run; the rest is history the conversation has.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ringlet.messages import AudioPart, FilePart, ImagePart, Message, Part, TextPart
from ringlet.server.http.errors import ApiError
from ringlet.server.protocols.agui.inputs import THREAD_ID


class UIMessage(BaseModel):
    """A UI message as the client sends it: only what ringlet reads is checked."""

    model_config = ConfigDict(extra="allow")
    id: str
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, Any]] = Field(default_factory=list)


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str = Field(description="The chat's id: the conversation it stands for")
    messages: list[UIMessage]
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None


def documented_input() -> dict[str, Any]:
    schema = ChatRequest.model_json_schema()
    schema["properties"]["id"] |= {"pattern": f"^{THREAD_ID.pattern}$"}
    return schema


def _invalid(loc: str, msg: str, status: int = 422) -> ApiError:
    return ApiError(status, "validation_error", f"{loc}: {msg}", details={"errors": [{"loc": loc, "msg": msg}]})


def parsed(raw: bytes) -> ChatRequest:
    """The body; 400 when it is not JSON, 422 naming the first invalid field."""
    try:
        body = ChatRequest.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise ApiError(400, "invalid_request", "the body is not JSON") from None
        errors = [{"loc": ".".join(["body", *(str(p) for p in e["loc"])]), "msg": e["msg"]} for e in exc.errors()]
        raise ApiError(422, "validation_error", f"{errors[0]['loc']}: {errors[0]['msg']}",
                       details={"errors": errors}) from None
    if not THREAD_ID.fullmatch(body.id):
        raise _invalid("body.id", "1-40 characters of letters, digits and _.:- (the chat id names a conversation)")
    if body.trigger == "regenerate-message":
        raise _invalid("body.trigger", "regenerating a message is not supported; send a new message instead")
    return body


def new_messages(body: ChatRequest, stored: Sequence[Message]) -> list[Message]:
    """The trailing user messages the conversation has not stored yet, as ringlet messages."""
    known = {m.id for m in stored} | {m.metadata.get("ai_sdk_id") for m in stored}
    trailing: list[tuple[int, UIMessage]] = []
    for index in range(len(body.messages) - 1, -1, -1):
        message = body.messages[index]
        if message.role != "user" or message.id in known:
            break
        trailing.append((index, message))
    return [_user(index, message) for index, message in reversed(trailing)]


def _user(index: int, message: UIMessage) -> Message:
    parts: list[Part] = []
    for i, part in enumerate(message.parts):
        loc = f"body.messages.{index}.parts.{i}"
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(TextPart(text=part["text"]))
        elif kind == "file" and isinstance(part.get("url"), str) and isinstance(part.get("mediaType"), str):
            parts.append(_file(loc, part["url"], part["mediaType"], part.get("filename")))
        else:
            raise _invalid(loc, "a user message takes text parts ({type: text, text}) and file parts "
                           "({type: file, mediaType, url})")
    if not parts:
        raise _invalid(f"body.messages.{index}.parts", "a user message needs at least one part")
    return Message.user(tuple(parts), source="ai-sdk", ai_sdk_id=message.id)


def _file(loc: str, url: str, media_type: str, filename: Any) -> Part:
    """A file part: by URL, or its data when the URL is a base64 `data:` URL."""
    data: str | None = None
    link: str | None = url
    if url.startswith("data:"):
        head, _, payload = url.partition(",")
        if not head.endswith(";base64"):
            raise _invalid(f"{loc}.url", "a data: URL must be base64 (data:<type>;base64,<data>)")
        try:
            base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise _invalid(f"{loc}.url", "the data: URL's data is not base64") from None
        link, data = None, payload
    if media_type.startswith("image/"):
        return ImagePart(url=link, data=data, media_type=media_type)
    if media_type.startswith("audio/"):
        return AudioPart(url=link, data=data, media_type=media_type)
    name = filename if isinstance(filename, str) else None
    return FilePart(url=link, data=data, media_type=media_type, filename=name)


def approval_responses(body: ChatRequest) -> list[tuple[str, bool, str | None]]:
    """The approval responses of the last message, when it is the assistant's: (approval id, approved,
    reason) of each tool part in state `approval-responded` (what `addToolApprovalResponse` sets)."""
    if not body.messages or body.messages[-1].role != "assistant":
        return []
    found = []
    for part in body.messages[-1].parts:
        approval = part.get("approval")
        if part.get("state") != "approval-responded" or not isinstance(approval, dict):
            continue
        if isinstance(approval.get("id"), str) and isinstance(approval.get("approved"), bool):
            reason = approval.get("reason")
            found.append((approval["id"], approval["approved"], reason if isinstance(reason, str) else None))
    return found
