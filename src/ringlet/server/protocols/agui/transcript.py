"""The stored transcript as AG-UI's MESSAGES_SNAPSHOT shows it."""

from __future__ import annotations

from collections.abc import Sequence

from ag_ui.core import AssistantMessage, FunctionCall, SystemMessage, ToolCall, ToolMessage, UserMessage
from ag_ui.core import Message as AgMessage

from ringlet.messages import Message


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
