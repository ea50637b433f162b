"""Forking a transcript at one of its messages (issue 44): what a new run keeps of it (`history`) and what it
takes as input (`prompt`), so that `agent.run(fork.prompt, history=fork.history)` goes on from there.

    at any message                  history: up to and including it; prompt: nothing (no run)
    at a user message, `edit`       history: everything before it; prompt: the user message with the new text
    at a tool call, `tool_result`   history: everything before the assistant message that made the call;
                                    prompt: a copy of that message, the other calls' results as they were,
                                    and the given result in place of the call's (it is never run): the
                                    model goes on from there
    at a tool call, `rerun`         the same, with no result for the call: the run runs it first, through
                                    every gate (policy, approval), then the model goes on

A tool call is named by its result message, or by the assistant message that made it (with `tool_call_id`
when that message made several). Nothing of the original is run again unless `rerun` asks: the other calls
of the same batch keep their results, and one that never had a result gets a `not_run` error result.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ringlet._ids import SYSTEM
from ringlet.errors import RingletError
from ringlet.loop.next_step import RERUN
from ringlet.messages import Message, Part, TextPart, ToolCall


class ForkError(RingletError, ValueError):
    """A fork the transcript cannot make. `code`: `message_not_found`, `tool_call_not_found`,
    `not_a_user_message`, `not_a_tool_call` or `invalid_fork`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Fork:
    """A transcript forked at `at`: run `agent.run(fork.prompt, history=fork.history)` to go on from there
    (`prompt` empty: nothing to run, the fork is `history`)."""

    history: list[Message]
    prompt: list[Message]
    at: Message

    @property
    def runs(self) -> bool:
        """Whether the fork has input to run (an edited message, a replaced or re-run tool call)."""
        return bool(self.prompt)

    @property
    def messages(self) -> list[Message]:
        """The fork's transcript before its run: history, then its input."""
        return [*self.history, *self.prompt]


def fork_at(messages: Sequence[Message], at: str | int, *, edit: str | None = None,
            tool_result: str | None = None, tool_call_id: str | None = None, rerun: bool = False) -> Fork:
    """Fork `messages` at the message `at` (its id, or its index). `edit`: the new text of that user message;
    `tool_result`: the result to use in place of a tool call's; `rerun`: run that tool call again.
    `tool_call_id` names the call when `at` is an assistant message with several. Raises ForkError."""
    index = _index(messages, at)
    message = messages[index]
    if tool_result is not None and rerun:
        raise ForkError("invalid_fork", "give either `tool_result` (a result in place of the call's) or `rerun` "
                                        "(run the call again), not both")
    if edit is not None:
        if tool_result is not None or rerun or tool_call_id is not None:
            raise ForkError("invalid_fork", "`edit` changes a user message; `tool_result`, `rerun` and "
                                            "`tool_call_id` are for a tool call: give one kind")
        if message.role != "user":
            raise ForkError("not_a_user_message", f"message {message.id} is not a user message (its role is "
                                                  f"{message.role}): only a user message can be edited; fork at "
                                                  "it without `edit`")
        return Fork(list(messages[:index]), [_edited(message, edit)], message)
    if tool_result is None and not rerun:
        if tool_call_id is not None:
            raise ForkError("invalid_fork", "`tool_call_id` names the call to replace or re-run: give "
                                            "`tool_result` or `rerun` with it")
        return Fork(list(messages[:index + 1]), [], message)
    return _at_call(messages, index, _call_id(message, tool_call_id), tool_result)


def _index(messages: Sequence[Message], at: str | int) -> int:
    if isinstance(at, int):
        if not -len(messages) <= at < len(messages):
            raise ForkError("message_not_found", f"no message at index {at} (the transcript has {len(messages)})")
        return at % len(messages)
    found = next((i for i, m in enumerate(messages) if m.id == at), None)
    if found is None:
        raise ForkError("message_not_found", f"message {at!r} is not in this transcript")
    return found


def _edited(message: Message, text: str) -> Message:
    """A new user message: `message` with its text replaced (its attachments kept)."""
    content: str | tuple[Part, ...] = text
    if not isinstance(message.content, str):
        content = (TextPart(text=text), *(p for p in message.content if not isinstance(p, TextPart)))
    meta = {k: v for k, v in message.metadata.items() if k not in ("is_persisted", "copied_from")}
    return Message(id=SYSTEM.new_id("m"), role="user", content=content, metadata={**meta, "edited_from": message.id})


def _call_id(message: Message, tool_call_id: str | None) -> str:
    """The tool call a fork at `message` replaces or re-runs."""
    if message.role == "tool" and message.tool_call_id:
        if tool_call_id is not None and tool_call_id != message.tool_call_id:
            raise ForkError("invalid_fork", f"message {message.id} is the result of call "
                                            f"{message.tool_call_id}, not of {tool_call_id}")
        return message.tool_call_id
    if message.role == "assistant" and message.tool_calls:
        if tool_call_id is not None:
            return tool_call_id
        if len(message.tool_calls) == 1:
            return message.tool_calls[0].id
        raise ForkError("invalid_fork", f"message {message.id} made {len(message.tool_calls)} tool calls: name "
                                        "one with `tool_call_id`, or fork at that call's result message")
    raise ForkError("not_a_tool_call", f"message {message.id} ({message.role}) is no tool call: fork at a tool "
                                       "result, or at the assistant message that made the call")


def _at_call(messages: Sequence[Message], index: int, call_id: str, tool_result: str | None) -> Fork:
    """The fork at one tool call, its result replaced (`tool_result`) or to be run again (None)."""
    asked = next((i for i in range(index, -1, -1) if messages[i].role == "assistant"
                  and any(c.id == call_id for c in messages[i].tool_calls)), None)
    if asked is None:
        raise ForkError("tool_call_not_found", f"no assistant message up to {messages[index].id} made tool call "
                                               f"{call_id!r}")
    request = messages[asked]
    results: dict[str, Message] = {}
    for m in messages[asked + 1:]:  # the batch's results follow the message that made the calls
        if m.role != "tool":
            break
        results.setdefault(m.tool_call_id or "", m)
    meta = {k: v for k, v in request.metadata.items() if k not in ("is_persisted", RERUN)}
    if tool_result is None:
        meta[RERUN] = [call_id]
    prompt = [replace(request, id=SYSTEM.new_id("m"), run_id=None, conversation_id=None,
                      metadata={**meta, "copied_from": request.id})]
    for call in request.tool_calls:
        if call.id == call_id:
            if tool_result is not None:
                given = Message.tool(call.id, call.name, tool_result, replaced=True)
                if (stored := results.get(call.id)) is not None:
                    given.metadata["replaces"] = stored.id
                prompt.append(given)
        elif (stored := results.get(call.id)) is not None:
            prompt.append(copy(stored))
        else:
            prompt.append(_not_run(call))
    return Fork(list(messages[:asked]), prompt, messages[index])


def copy(message: Message) -> Message:
    """`message` under a new id, outside any run or conversation (`copied_from` names the original)."""
    meta = {k: v for k, v in message.metadata.items() if k != "is_persisted"}
    return replace(message, id=SYSTEM.new_id("m"), run_id=None, conversation_id=None,
                   metadata={**meta, "copied_from": message.metadata.get("copied_from", message.id)})


def _not_run(call: ToolCall) -> Message:
    error = {"code": "not_run", "message": "this call had no result when the conversation was forked; it was "
                                           "not run in the fork"}
    return Message.tool(call.id, call.name, json.dumps({"error": error}), is_error=True)
