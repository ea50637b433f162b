"""An MCP server's `sampling/createMessage`: a model completion ringlet makes for the server, in the run of
the call the request concerns.

    request = sample_request(params, server="docs", config=config.sampling)   # the server's messages, ringlet's
    sampled = await ctx.sampler.sample(ctx, request)                         # gates, limit, model, usage
    return result_of(sampled)                                                # the CreateMessageResult

The request concerns the call the protocol names (`wire.Wire.origin`, as for elicitation); one that names no
open call, or comes from a call made outside a run, is declined with the protocol's error (JSON-RPC
`-32600`, as the SDK's own client declines when it does not sample), and so is one beyond the run's limit
(`sampling.max_per_run` in mcp.json), one a gate denies, or one the human declines. The run's sampler
(`RunContext.sampler`, `ringlet.loop.sampling.Sampler`) does the rest: the policy input names the server
(`action: "mcp.sampling"`, `resource.connector`), approval shows the human the prompt, the agent's model (or
`sampling.model`) answers, and its usage and cost are added to the run's.

Only text content is sampled: a request with images, audio or tool use is declined (ringlet does not
advertise `sampling.tools`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

from ringlet._ids import new_id
from ringlet.context import RunContext
from ringlet.mcp.config import SamplingConfig
from ringlet.mcp.wire import InFlight
from ringlet.messages import Message

log = logging.getLogger("ringlet.mcp")


class SamplingDeclined(Exception):
    """The request is not answered; the message says why (it is the error the server receives)."""


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """A sampling request, in ringlet's terms: whose server, what to send the model, and the server's limits."""

    server: str
    messages: tuple[Message, ...]
    system: str | None
    max_tokens: int
    temperature: float | None
    stop: tuple[str, ...]
    config: SamplingConfig

    @property
    def prompt(self) -> str:
        """The whole prompt as a human reads it before approving (the system prompt first)."""
        lines = [f"[system] {self.system}"] if self.system else []
        return "\n".join(lines + [f"[{m.role}] {m.text}" for m in self.messages])

    def policy_args(self) -> dict[str, Any]:
        """What the policy sees as `input.args` (and the approval record shows)."""
        return {"system_prompt": self.system, "messages": [{"role": m.role, "text": m.text} for m in self.messages],
                "max_tokens": self.max_tokens, "model": self.config.model}


@dataclass(frozen=True, slots=True)
class Sampled:
    """The model's answer: its text, the model that wrote it, and why it stopped (`endTurn`, `maxTokens`)."""

    text: str
    model: str
    stop_reason: str


class Sampler(Protocol):
    """What `RunContext.sampler` is (`ringlet.loop.sampling.Sampler`)."""

    async def sample(self, ctx: RunContext, request: SampleRequest) -> Sampled: ...


def sample_request(params: Any, *, server: str, config: SamplingConfig) -> SampleRequest:
    """The server's `CreateMessageRequestParams` as a SampleRequest; SamplingDeclined for content ringlet does
    not sample (anything but text)."""
    messages = []
    for m in params.messages:
        blocks = m.content if isinstance(m.content, list) else [m.content]
        kinds = {getattr(b, "type", "?") for b in blocks}
        if kinds != {"text"}:
            raise SamplingDeclined(f"only text content is sampled (this request has {', '.join(sorted(kinds))})")
        messages.append(Message(id=new_id("m"), role=m.role, content="".join(b.text for b in blocks)))
    if params.tools or params.tool_choice:
        raise SamplingDeclined("tool use in sampling is not supported")
    return SampleRequest(server=server, messages=tuple(messages), system=params.system_prompt,
                         max_tokens=min(params.max_tokens, config.max_tokens), temperature=params.temperature,
                         stop=tuple(params.stop_sequences or ()), config=config)


async def answer(ctx: RunContext | None, why: str, params: Any, *, server: str, config: SamplingConfig) -> Any:
    """The session's answer to `sampling/createMessage` for the run of the call it concerns (`ctx`; None and
    `why` when it concerns none): a CreateMessageResult, or the protocol's error when declined."""
    from mcp import types

    try:
        sampled = await _sample(ctx, why, params, server=server, config=config)
    except SamplingDeclined as exc:
        log.warning("MCP server %r asked for a completion; declined: %s", server, exc)
        return types.ErrorData(code=types.INVALID_REQUEST, message=f"sampling declined: {exc}")
    return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text=sampled.text),
                                     model=sampled.model, stop_reason=sampled.stop_reason)



async def in_call(flight: InFlight | None, open_calls: Collection[InFlight], why: str, params: Any, *,
                  server: str, config: SamplingConfig) -> Any:
    """`sampling/createMessage` as a session receives it: answered in the run of the open call it concerns
    (`answer`), declined when it concerns none. It goes when its call does (cancelled, timed out)."""
    if flight is not None and flight not in open_calls:  # over since its request was read
        flight, why = None, f"its call ({flight.tool}) is over: timed out or cancelled"
    if flight is not None and flight.ctx is None:
        flight, why = None, f"its call ({flight.tool}) was made outside a run"
    ctx = flight.ctx if flight is not None else None
    sampling = asyncio.create_task(answer(ctx, why, params, server=server, config=config))
    if flight is not None:
        flight.asking.add(sampling)
    try:
        await asyncio.wait({sampling})
    except asyncio.CancelledError:  # the session is closing
        sampling.cancel()
        raise
    finally:
        if flight is not None:
            flight.asking.discard(sampling)
    if sampling.cancelled():
        from mcp import types

        return types.ErrorData(code=types.INVALID_REQUEST, message="sampling cancelled: its call is over")
    return sampling.result()

async def _sample(ctx: RunContext | None, why: str, params: Any, *, server: str, config: SamplingConfig) -> Sampled:
    if not config.enabled:
        raise SamplingDeclined(f"sampling is turned off for MCP server {server!r}")
    if ctx is None:
        raise SamplingDeclined(f"the request concerns no run ({why or 'it came outside a tool call of a run'})")
    sampler: Sampler | None = getattr(ctx, "sampler", None)
    if sampler is None:
        raise SamplingDeclined("this run has no model to sample with")
    return await sampler.sample(ctx, sample_request(params, server=server, config=config))
