"""The bodies of forking a conversation (`forks.py`). As pydantic models, they validate requests and give
`/openapi.json` its schemas."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ringlet.server.http.schemas import Body, Conversation, Pending, View, omittable


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
