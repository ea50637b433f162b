"""A run's events as OpenAI's answers: `chunks` streams `chat.completion.chunk`s (`data:` lines, then
`[DONE]`), `completion` answers one `chat.completion`. The run's own events are read by the shared
`RunReader` (`protocols/events.py`); this maps what it reads: each piece of text is chunk content, a new
assistant message after server-side tool calls starts with a blank line, the run's finish reason and usage
become the completion's, client tool calls become `tool_calls`, and a failed run an OpenAI-shaped error.
A run that waits for a human ends the response at once: the answer so far, then an assistant message that
says what is asked and where to answer (`asks.say`), `finish_reason: "stop"`, and the open requests in
`ringlet.pending` (`ringlet.finish_reason: "input_required"`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from ringlet.errors import ProviderError
from ringlet.loop.state import RunState
from ringlet.server.catalog import Hosted
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import error_body
from ringlet.server.protocols.events import Retraction, RunError, RunReader, Usage, pauses
from ringlet.server.protocols.openai.asks import ask_of, say
from ringlet.server.protocols.openai.continuations import client_call_id, continuations
from ringlet.server.protocols.openai.runs import Source

FINISH = {"end_turn": "stop", "max_iterations": "length", "length": "length", "empty_response": "stop"}
"""The chat completion's finish_reason for each of the run's (`ringlet.finish_reason` keeps the run's own: an
answer cut at the token cap is the run's `length` too, so the two agree)."""
UPSTREAM = frozenset({"stream_interrupted", "context_window",
                      *(kind("").code for kind in (ProviderError, *ProviderError.__subclasses__()))})
"""Run error codes that mean the model provider failed (after ringlet's own retries): 502 `upstream_error`."""
NO_RETRY = {"x-should-retry": "false"}
"""OpenAI's SDKs retry 408, 409, 429 and 5xx answers unless told not to. A failed run is never retried
blindly: ringlet has already retried the provider, and a run again would run its tools again."""
CANCELLED = RunError("cancelled", "the run was cancelled")
"""What a run that ended without an error (or without its end) failed of."""
RETRACTED = ("answer_retracted", "the worker writing this answer stopped, and the answer is being written "
             "again: the text streamed so far is withdrawn. Send the request again (with a conversation, read "
             "its answer there)")
"""The stream's last error when text it sent was retracted (`retracted`, `durable/attempts.py`): retryable."""
BREAK = "\n\n"
"""Between the answer's assistant messages (one per model round that streamed text)."""


@dataclass(eq=False)
class Encoder:
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    run: RunReader = field(default_factory=RunReader)
    withdrawn: bool = False
    """Text this encoder had was retracted (the attempt that wrote it was abandoned, and the model asked
    again) and the new attempt says something else: a stream that sent it ends with `RETRACTED`; a
    completion simply leaves it out."""
    owed: str | None = None
    """The retracted text the client has, while the new attempt's text (`again`) has not gone past it."""
    again: str = ""
    run_id: str | None = None
    """The run's id before its first event has come (a reply that answered nothing has none)."""
    asks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The open requests (approvals and questions, a sub-agent's included) by tool-call id."""
    paused: bool = False
    """The run (or a sub-agent) said it waits for a human."""
    humans: bool = True
    """Whether the run asks humans at all (not when `/v1` runs of its agent deny at once)."""
    spent: Usage | None = None
    """The run's usage so far, when the response ends while it waits (`asking`: no `message_end` yet)."""

    @property
    def id(self) -> str:
        """The completion's id, from the run's id once its first event has come ("" before)."""
        started = self.run.started
        run_id = started["run_id"] if started is not None else self.run_id
        return "" if run_id is None else "chatcmpl-" + run_id

    @property
    def waiting(self) -> bool:
        """The run waits for a human's answer to open requests: the response ends now (`asks.py`)."""
        return self.humans and self.paused and bool(self.asks)

    def feed(self, kind: str, payload: dict[str, Any]) -> str | None:
        """The content this event adds (None for events the client does not see, sub-agents' included). Text
        withdrawn (`retracted`) sets `withdrawn`: a stream cannot take back what it sent."""
        if kind in ("approval_required", "question"):
            self.asks[payload["tool_call_id"]] = ask_of(kind, payload)
        elif kind == "tool_result":
            self.asks.pop(payload.get("tool_call_id", ""), None)
        elif kind == "status":
            self.paused = pauses(kind, payload)
        delta = self.run.feed(kind, payload)
        if isinstance(delta, Retraction):
            if delta.text and self.owed is None:
                self.owed = delta.text
            self.again = ""
            return None
        if delta is None:
            if self.owed is not None and kind in ("tool_call_start", "message_end", "error") and self.run.own(payload):
                self.withdrawn = self.again != self.owed  # the new attempt said less than the client has
                self.owed = None
            return None
        if self.owed is not None:
            return self._again(delta.text)
        return BREAK + delta.text if delta.opens else delta.text  # a new message after server-side tool calls

    def _again(self, text: str) -> str | None:
        """The new attempt's text after a retraction: what the client has already is not sent twice, what
        goes beyond it is; once they differ, the stream cannot go on (`withdrawn`)."""
        assert self.owed is not None
        self.again += text
        if self.owed.startswith(self.again):
            return None
        if not self.again.startswith(self.owed):
            self.withdrawn = True
            return None
        beyond, self.owed = self.again[len(self.owed):], None
        return beyond

    def content(self) -> str | None:
        return BREAK.join(self.run.messages) or None

    def finish_reason(self, state: RunState) -> str:
        if state.deferred_calls and state.status == "input_required":
            return "tool_calls"
        return FINISH.get(self.run.finish_reason or "error", "stop")

    @property
    def _spent(self) -> Usage:
        """What the run has used: as its `message_end` says, or so far while it waits."""
        return self.spent if self.run.end is None and self.spent is not None else self.run.usage

    def usage(self) -> dict[str, int]:
        u = self._spent
        return {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
                "total_tokens": u.total_tokens}

    def ringlet(self) -> dict[str, Any]:
        end = self.run.end or {}
        return {"run_id": end.get("run_id", self.id.removeprefix("chatcmpl-")),
                "finish_reason": self.run.finish_reason or "error", "cost_usd": self._spent.cost_usd}

    async def asking(self, source: Source, request: Request) -> tuple[str, dict[str, Any]] | None:
        """When the run waits for a human (or a reply did not fit what it waits for): the message that ends
        the response, and its `ringlet` field; the run is left to wait, or stopped (`Source.paused`)."""
        if source.asks is None and not self.waiting:
            return None
        asks = source.asks if source.asks is not None else list(self.asks.values())
        if source.spent is not None:  # what it has used so far (asked before `paused` may let it go on)
            self.spent = await source.spent()
        if source.asks is None and source.paused is not None:
            await source.paused(asks)
        text = say(asks, str(request.base_url), source.cid, problem=source.problem)
        return text, {**self.ringlet(), "finish_reason": "input_required", "pending": asks}

    def failure(self) -> tuple[int, dict[str, Any], dict[str, str]] | None:
        """The error answer of a failed run: status, OpenAI-shaped body and headers; None if it did not fail.

        The provider failing is 502 `upstream_error` (its code says how: `network_error`, `server_error`,
        `rate_limit_error`, …); anything else is 500 `server_error`. Neither is worth a blind retry."""
        if self.run.end is not None and self.run.finish_reason not in ("error", "cancelled"):
            return None
        e = self.run.error or CANCELLED
        status = 502 if e.code in UPSTREAM else 500
        return status, error_body(status, e.code, e.message, openai=True), NO_RETRY

    def chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


def tool_calls(state: RunState) -> list[dict[str, Any]]:
    return [{"id": client_call_id(state.run_id, c.id), "type": "function",
             "function": {"name": c.name, "arguments": c.raw_arguments or "{}"}}
            for c in state.deferred_calls]


async def chunks(encoder: Encoder, source: Source, request: Request, principal: Principal, hosted: Hosted,
                 include_usage: bool, ping_s: float) -> AsyncIterator[str]:
    started, clock = False, asyncio.get_running_loop().time
    last_sent = clock()
    try:
        async for item in source.events:
            content = encoder.feed(*item) if item is not None else None
            if item is not None and not started and encoder.id:
                started, last_sent = True, clock()
                yield encoder.chunk({"role": "assistant", "content": ""})
            if encoder.withdrawn:  # never splice a second attempt onto the first: the client asks again
                yield f"data: {json.dumps(error_body(503, *RETRACTED, openai=True))}\n\n"
                yield "data: [DONE]\n\n"
                return
            if content:
                last_sent = clock()
                yield encoder.chunk({"content": content})
            elif clock() - last_sent >= ping_s:  # busy with server-side work the client does not see
                last_sent = clock()
                yield ": ping\n\n"
            if encoder.waiting:  # a human must answer: the response ends now, saying so
                break
        async for line in _ending(encoder, source, request, principal, hosted, include_usage, started):
            yield line
    finally:
        source.leave()  # an ephemeral run ends with its client (unless left to wait); a stored one is not touched


async def _ending(encoder: Encoder, source: Source, request: Request, principal: Principal, hosted: Hosted,
                  include_usage: bool, started: bool) -> AsyncIterator[str]:
    """The stream's last chunks: the message asking a human (`Encoder.asking`), the run's error, or its
    client tool calls and finish reason; then usage and `[DONE]`."""
    asked = await encoder.asking(source, request)
    if asked is not None:
        if not started:
            yield encoder.chunk({"role": "assistant", "content": ""})
        yield encoder.chunk({"content": (BREAK if encoder.content() else "") + asked[0]})
        yield encoder.chunk({}, "stop", ringlet=asked[1])
        if include_usage:
            yield _usage_chunk(encoder, asked[1])
        yield "data: [DONE]\n\n"
        return
    state = await source.final_state()
    failure = encoder.failure()
    if failure is not None:
        yield f"data: {json.dumps(failure[1])}\n\n"
        yield "data: [DONE]\n\n"
        return
    finish = encoder.finish_reason(state)
    if finish == "tool_calls":
        await continuations(request).keep(principal.key_id, hosted.name, state)
        calls = [{"index": i, **c} for i, c in enumerate(tool_calls(state))]
        yield encoder.chunk({"tool_calls": calls})
    yield encoder.chunk({}, finish, ringlet=encoder.ringlet())
    if include_usage:
        yield _usage_chunk(encoder, encoder.ringlet())
    yield "data: [DONE]\n\n"


def _usage_chunk(encoder: Encoder, ringlet: dict[str, Any]) -> str:
    body = {"id": encoder.id, "object": "chat.completion.chunk", "created": encoder.created,
            "model": encoder.model, "choices": [], "usage": encoder.usage(), "ringlet": ringlet}
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


async def completion(encoder: Encoder, source: Source, request: Request, principal: Principal,
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
            if encoder.waiting:  # a human must answer: the response ends now, saying so
                break
        asked = await encoder.asking(source, request)
        state = await source.final_state() if asked is None else None
    finally:
        watcher.cancel()
        source.leave()
    if asked is not None:
        message = {"role": "assistant", "content": BREAK.join([*encoder.run.messages, asked[0]])}
        return {"id": encoder.id, "object": "chat.completion", "created": encoder.created, "model": encoder.model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": encoder.usage(), "ringlet": asked[1]}
    assert state is not None
    failure = encoder.failure()
    if failure is not None:
        return JSONResponse(failure[1], failure[0], headers=failure[2])
    finish = encoder.finish_reason(state)
    message: dict[str, Any] = {"role": "assistant", "content": encoder.content()}
    if finish == "tool_calls":
        await continuations(request).keep(principal.key_id, hosted.name, state)
        message["tool_calls"] = tool_calls(state)
    return {"id": encoder.id, "object": "chat.completion", "created": encoder.created, "model": encoder.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": encoder.usage(), "ringlet": encoder.ringlet()}
