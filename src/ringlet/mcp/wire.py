"""The session's JSON-RPC traffic, seen between the transport and the SDK's session (`Wire`), and the call
each message from the server concerns.

Whose call a server's message concerns (one toolset serves every run of an agent, every user of a hosted
one): the call the protocol names, never one guessed from which calls are open (`Wire.origin`).
- progress: its `progressToken`, which the SDK sets to the call's JSON-RPC request id; the SDK hands it to
  that call's callback, and drops it once the call is over;
- elicitation and log messages, over streamable HTTP: the response stream of the `tools/call` it came on
  (servers send a request's messages there: the Python SDK's `related_request_id`, the TypeScript SDK's
  `relatedRequestId`); the SDK does not show this to a client, but it carries the sender's context with each
  message, and ringlet marks each call's context (`CALLING`);
- the same, on any transport: a `progressToken` in the message's `_meta` naming a call;
- stdio and SSE carry no link (the SDK's `ClientRequestContext` has only the server's own request id and
  `_meta`): a server elicits only while working on a request (SEP-2260), so the message concerns the one
  request the server holds, written and not answered, when there is one, or to the run whose calls are all
  it holds (parallel calls of one run). A call ringlet gave up on (timed out, cancelled) stays held, as the
  server may still be working on it: until the server answers it or the session ends, a message there
  concerns no other run's call.
A message that names no open call (none, several, or one that is over) concerns none: an elicitation is
declined and a log message goes to Python logging only, with the reason logged.
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import Context, ContextVar
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from ringlet.context import RunContext

log = logging.getLogger("ringlet.mcp")


@dataclass(eq=False)
class InFlight:
    """A tool call the server is working on: whose run it serves, and the humans it waits for."""

    tool: str
    ctx: RunContext | None
    asking: set[asyncio.Task[Any]] = field(default_factory=set)


CALLING: ContextVar[InFlight | None] = ContextVar("ringlet_mcp_calling", default=None)
"""The call an `MCPSession._serve` task makes. The SDK's streams take a snapshot of the sender's context with
each message (`mcp.shared._context_streams`), so the `tools/call` request ringlet writes carries it, and over
streamable HTTP so does every message the server sends on that request's response stream: the transport's link
from a server's message to the request it concerns, which the SDK does not otherwise show a client."""


class WireOwner(Protocol):
    """What the wire reports to: the session (`ringlet.mcp.session.MCPSession`)."""

    name: str
    inflight: list[InFlight]

    def on_log(self, flight: InFlight | None, params: Any) -> None: ...

    async def on_elicit(self, flight: InFlight | None, why: str, params: Any) -> Any: ...

    async def on_sample(self, flight: InFlight | None, why: str, params: Any) -> Any: ...


class Wire:
    """The session's JSON-RPC traffic, seen between the transport and the SDK's session: the requests the
    server holds (written and not answered yet; one ringlet gave up on stays held, for the server may still be
    working on it, and it does not answer a request once cancelled) and the call each is; and, in wire order,
    the call each server request or log message concerns (`origin`)."""

    def __init__(self, owner: WireOwner, *, linked: bool) -> None:
        self.owner = owner
        self.linked = linked
        """The transport links a server's message to the request it concerns (streamable HTTP)."""
        self.held: dict[str, InFlight | None] = {}
        """Request id (which is also its progress token) → its call; None for other requests."""
        self.asked: dict[str, tuple[InFlight | None, str]] = {}
        """Elicitations and sampling requests read, not yet handled: the call each concerns, or None and why."""

    def origin(self, params: Any, context: Context | None) -> tuple[InFlight | None, str]:
        """The open call a server's message concerns, or None and why. Named by the response stream it came
        on (streamable HTTP) or by a `progressToken` in its `_meta`; on stdio and SSE, which carry no link,
        the one request the server holds when it holds one (it elicits only while working on a request), or
        the open call of the one run whose calls are all the server holds (the run is known, if not the call)."""
        named = context.get(CALLING) if context is not None else None
        meta = params.get("_meta") if isinstance(params, dict) else None
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        if named is None and token is not None:
            if str(token) not in self.held:
                return None, f"it names request {token!r}, which the server is not working on"
            named = self.held[str(token)]
        elif named is None and not self.linked:
            calls = [c for c in self.held.values() if c is not None]
            runs = {c.ctx.run_id if c.ctx is not None else None for c in calls}
            if len(self.held) != 1 and (len(runs) != 1 or None in runs):
                return None, f"it names no call, and the server holds {len(self.held)} requests, not one run's"
            named = next((c for c in calls if c in self.owner.inflight), calls[0] if calls else None)
        if named is None:
            return None, "it names no tool call"
        if named not in self.owner.inflight:
            return None, f"its call ({named.tool}) is over: timed out or cancelled"
        return named, ""

    def heard(self, message: Any, context: Context | None) -> None:
        """A message from the server, as it is read."""
        method, request_id = getattr(message, "method", None), getattr(message, "id", None)
        if method is None and request_id is not None:  # a response: the server is done with that request
            self.held.pop(str(request_id), None)
        elif method in ("elicitation/create", "sampling/createMessage") and request_id is not None:
            self.asked[str(request_id)] = self.origin(message.params, context)
        elif method == "notifications/message":
            self.owner.on_log(self.origin(message.params, context)[0], message.params)

    def sent(self, message: Any) -> None:
        """A message to the server, as it is written: a request is held, with its call if it is one."""
        method, request_id = getattr(message, "method", None), getattr(message, "id", None)
        if method is not None and request_id is not None:
            self.held[str(request_id)] = CALLING.get() if method == "tools/call" else None

    async def on_elicit(self, context: Any, params: Any) -> Any:
        """The session's `elicitation_callback`."""
        flight, why = self.asked.pop(str(context.request_id), (None, "it was not seen on the wire"))
        return await self.owner.on_elicit(flight, why, params)

    async def on_sample(self, context: Any, params: Any) -> Any:
        """The session's `sampling_callback`."""
        flight, why = self.asked.pop(str(context.request_id), (None, "it was not seen on the wire"))
        return await self.owner.on_sample(flight, why, params)

    def wrap(self, read: Any, write: Any) -> tuple[_Reading, _Writing]:
        return _Reading(self, read), _Writing(self, write)


class _Reading:
    """The transport's read stream, through `Wire.heard` (its `last_context` still there for the SDK)."""

    def __init__(self, wire: Wire, inner: Any) -> None:
        self.wire, self.inner = wire, inner

    @property
    def last_context(self) -> Context | None:
        return getattr(self.inner, "last_context", None)

    async def receive(self) -> Any:
        item = await self.inner.receive()
        if not isinstance(item, Exception):
            try:
                self.wire.heard(item.message, self.last_context)
            except Exception:  # never at the cost of the session's read loop
                log.exception("MCP server %r: could not place a message", self.wire.owner.name)
        return item

    def __aiter__(self) -> _Reading:
        return self

    async def __anext__(self) -> Any:
        from anyio import EndOfStream

        try:
            return await self.receive()
        except EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _Reading:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None,
                        exc_tb: TracebackType | None) -> None:
        await self.aclose()


class _Writing:
    """The transport's write stream, through `Wire.sent`."""

    def __init__(self, wire: Wire, inner: Any) -> None:
        self.wire, self.inner = wire, inner

    async def send(self, item: Any, /) -> None:
        self.wire.sent(item.message)
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _Writing:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None,
                        exc_tb: TracebackType | None) -> None:
        await self.aclose()

