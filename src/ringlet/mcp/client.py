"""MCP servers as toolsets, through the official SDK (`mcp`): stdio, SSE and streamable HTTP. Their settings
are `config.py`'s (`MCPServerConfig`, `load_servers`).

    servers = load_servers({"mcpServers": {"time": {"command": "mcp-server-time"}}}, base=Path("."))
    agent = Agent(model, tools=[MCPToolset(name, config) for name, config in servers.items()])

Each server's session lives in one long-lived task that owns the transport and the session, so opening and
closing happen in the same task (no "cancel scope in a different task"), and calls run as children of that
task. Tools are listed at start and again after `notifications/tools/list_changed`. A server that dies is
started again by the next call; `aclose()` ends the session and its process.

The rest of the client side of the protocol (MCP 2025-11-25, what the SDK negotiates):
- elicitation (the capability is advertised): a server's `elicitation/create` during a call becomes a
  question to a human of that call's run, answered while the call stays open (`elicit.py`);
- resources: when the server has any (resources or templates), two more tools, `<prefix>list_resources` and
  `<prefix>read_resource` (`<server>_…` without a prefix), and `@server:uri` mentions in user messages
  (`mentions.py`); `list_resources()`, `list_resource_templates()`, `read_resource(uri)` from Python;
- prompts: `list_prompts()` and `get_prompt(name, arguments)` from Python;
- progress notifications during a call → `notification {level: progress}` events, and the server's log
  messages (`notifications/message`) → notifications at the matching level, in the calling run's stream.

Whose call a server's message concerns (one toolset serves every run of an agent, every user of a hosted
one): the call the protocol names, never one guessed from which calls are open (`_Wire.origin`).
- progress: its `progressToken`, which the SDK sets to the call's JSON-RPC request id; the SDK hands it to
  that call's callback, and drops it once the call is over;
- elicitation and log messages, over streamable HTTP: the response stream of the `tools/call` it came on
  (servers send a request's messages there: the Python SDK's `related_request_id`, the TypeScript SDK's
  `relatedRequestId`); the SDK does not show this to a client, but it carries the sender's context with each
  message, and ringlet marks each call's context (`_CALLING`);
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
import json
import logging
import re
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from contextvars import Context, ContextVar
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from ringlet.context import NoticeLevel, RunContext
from ringlet.errors import RingletError, RunError, ToolFailure
from ringlet.events import NotificationEvent, Progress
from ringlet.mcp.config import MCPServerConfig
from ringlet.mcp.elicit import ask_in_call, question_for, result_of
from ringlet.tools.base import NAME_PATTERN, Tool, Toolset, schema_validator

log = logging.getLogger("ringlet.mcp")
START_TIMEOUT_S = 30.0
STDERR_TAIL = 2000
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def effect_of(annotations: Any) -> Literal["read", "write", "destructive"]:
    """`readOnlyHint` → read, `destructiveHint` → destructive, otherwise write (`gates.md` §2)."""
    if annotations is not None and getattr(annotations, "read_only_hint", None):
        return "read"
    if annotations is not None and getattr(annotations, "destructive_hint", None):
        return "destructive"
    return "write"


def result_text(result: Any) -> str:
    """A CallToolResult as the text the model reads: its text items, else its structured content."""
    texts = [getattr(item, "text", None) for item in result.content]
    parts = [t for t in texts if isinstance(t, str)]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    others = [item.model_dump(mode="json", exclude_none=True) for item in result.content
              if not isinstance(getattr(item, "text", None), str)]
    return "\n".join(parts + [json.dumps(o, ensure_ascii=False) for o in others])


class _Disconnected(Exception):
    """The session's connection closed under a call (internal: `call` and `list_tools` start the server
    again)."""


def _closed(exc: BaseException) -> bool:
    from mcp.shared.exceptions import MCPError
    from mcp_types.jsonrpc import CONNECTION_CLOSED

    if isinstance(exc, MCPError):
        return exc.error.code == CONNECTION_CLOSED
    return type(exc).__name__ in ("ClosedResourceError", "BrokenResourceError", "EndOfStream")


_LEVELS: dict[str, NoticeLevel] = {"info": "info", "notice": "info", "warning": "warning", "error": "error",
                                    "critical": "error", "alert": "error", "emergency": "error"}
"""MCP log levels → notification levels (`debug` goes to Python logging only)."""
_OPS = ("tools/list", "resources/list", "resources/templates/list", "resources/read", "prompts/list",
        "prompts/get")
"""Requests other than tool calls that callers queue (`_request`)."""


@dataclass(eq=False)
class _InFlight:
    """A tool call the server is working on: whose run it serves, and the humans it waits for."""

    tool: str
    ctx: RunContext | None
    asking: set[asyncio.Task[Any]] = field(default_factory=set)


_CALLING: ContextVar[_InFlight | None] = ContextVar("ringlet_mcp_calling", default=None)
"""The call a `_serve` task makes. The SDK's streams take a snapshot of the sender's context with each message
(`mcp.shared._context_streams`), so the `tools/call` request ringlet writes carries it, and over streamable
HTTP so does every message the server sends on that request's response stream: the transport's link from a
server's message to the request it concerns, which the SDK does not otherwise show a client."""


class _Wire:
    """The session's JSON-RPC traffic, seen between the transport and the SDK's session: the requests the
    server holds (written and not answered yet; one ringlet gave up on stays held, for the server may still be
    working on it, and it does not answer a request once cancelled) and the call each is; and, in wire order,
    the call each server request or log message concerns (`origin`)."""

    def __init__(self, toolset: MCPToolset, *, linked: bool) -> None:
        self.toolset = toolset
        self.linked = linked
        """The transport links a server's message to the request it concerns (streamable HTTP)."""
        self.held: dict[str, _InFlight | None] = {}
        """Request id (which is also its progress token) → its call; None for other requests."""
        self.asked: dict[str, tuple[_InFlight | None, str]] = {}
        """Elicitations read, not yet handled: the call each concerns, or None and why."""

    def origin(self, params: Any, context: Context | None) -> tuple[_InFlight | None, str]:
        """The open call a server's message concerns, or None and why. Named by the response stream it came
        on (streamable HTTP) or by a `progressToken` in its `_meta`; on stdio and SSE, which carry no link,
        the one request the server holds when it holds one (it elicits only while working on a request), or
        the open call of the one run whose calls are all the server holds (the run is known, if not the call)."""
        named = context.get(_CALLING) if context is not None else None
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
            named = next((c for c in calls if c in self.toolset._inflight), calls[0] if calls else None)
        if named is None:
            return None, "it names no tool call"
        if named not in self.toolset._inflight:
            return None, f"its call ({named.tool}) is over: timed out or cancelled"
        return named, ""

    def heard(self, message: Any, context: Context | None) -> None:
        """A message from the server, as it is read."""
        method, request_id = getattr(message, "method", None), getattr(message, "id", None)
        if method is None and request_id is not None:  # a response: the server is done with that request
            self.held.pop(str(request_id), None)
        elif method == "elicitation/create" and request_id is not None:
            self.asked[str(request_id)] = self.origin(message.params, context)
        elif method == "notifications/message":
            self.toolset._on_log(self.origin(message.params, context)[0], message.params)

    def sent(self, message: Any) -> None:
        """A message to the server, as it is written: a request is held, with its call if it is one."""
        method, request_id = getattr(message, "method", None), getattr(message, "id", None)
        if method is not None and request_id is not None:
            self.held[str(request_id)] = _CALLING.get() if method == "tools/call" else None

    async def on_elicit(self, context: Any, params: Any) -> Any:
        """The session's `elicitation_callback`."""
        flight, why = self.asked.pop(str(context.request_id), (None, "it was not seen on the wire"))
        return await self.toolset._on_elicit(flight, why, params)

    def wrap(self, read: Any, write: Any) -> tuple[_Reading, _Writing]:
        return _Reading(self, read), _Writing(self, write)


class _Reading:
    """The transport's read stream, through `_Wire.heard` (its `last_context` still there for the SDK)."""

    def __init__(self, wire: _Wire, inner: Any) -> None:
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
                log.exception("MCP server %r: could not place a message", self.wire.toolset.name)
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
    """The transport's write stream, through `_Wire.sent`."""

    def __init__(self, wire: _Wire, inner: Any) -> None:
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


class StartFailed(RingletError):
    """The server could not be started or initialised; the message ends with its stderr tail."""


class MCPToolset(Toolset):
    """The tools of one MCP server."""

    def __init__(self, name: str, config: MCPServerConfig) -> None:
        self.name = name
        self.label = f"MCP server {name!r}"
        self.description = config.description  # what the catalog's list_connectors shows
        self.config = config
        self._tools: list[Tool] = []
        self._inner: dict[str, str] = {}
        """ringlet tool name → the server's tool name"""
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._queue: asyncio.Queue[_Item | None] | None = None
        self._inflight: list[_InFlight] = []
        self._resources = False
        """Whether the server advertises the resources capability."""
        self._stale = False
        self._starting = asyncio.Lock()
        self._reported: str | None = None
        self.error: str | None = None
        """Why the server is not available (None while it is)."""

    # -- the toolset protocol ------------------------------------------------------------------------------

    async def list_tools(self, ctx: RunContext) -> Sequence[Tool]:
        try:
            await self.start()
            if self._stale:
                await self._relist()
        except StartFailed as exc:
            if self.config.required:
                raise RunError("mcp_server_unavailable", f"MCP server {self.name!r} is required but did not "
                               f"start: {exc}", details={"server": self.name}) from None
            if self._reported != str(exc):  # reported once, until the reason changes
                self._reported = str(exc)
                log.warning("MCP server %r did not start; the agent runs without its tools: %s", self.name, exc)
                ctx.notify("warning", f"MCP server {self.name} unavailable", str(exc)[-500:], source="mcp")
            return []
        return list(self._tools)

    async def _relist(self) -> None:
        """List the tools again (they changed). A server found gone is started again, which lists them."""
        try:
            await self._request("tools/list", {})
        except _Disconnected:
            if self._task is not None:
                await asyncio.gather(self._task, return_exceptions=True)
            await self.start()

    async def call(self, name: str, args: dict[str, Any], ctx: RunContext | None = None) -> Any:
        """Call one tool by its ringlet name (`ctx`: the run it serves, which hears its progress and log
        messages and whose humans answer its elicitations). A server found dead (its connection closed:
        the call never reached it) is started again and the call sent once more."""
        return await self._send(self._inner.get(name, name), args, ctx)

    async def _send(self, name: str, args: dict[str, Any], ctx: RunContext | None = None) -> Any:
        for attempt in (1, 2):
            await self.start()
            try:
                return await self._request(name, args, ctx)
            except StartFailed as exc:
                raise ToolFailure("tool_error", f"MCP server {self.name!r} is unavailable: {exc}") from None
            except _Disconnected:
                log.warning("MCP server %r is gone; starting it again", self.name)
                if self._task is not None:
                    await asyncio.gather(self._task, return_exceptions=True)
                if attempt == 2:
                    raise ToolFailure("tool_error", f"MCP server {self.name!r} closed the connection") from None
        raise AssertionError("unreachable")

    # -- the session task ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the session (once; again after it ended) and wait until its tools are listed."""
        async with self._starting:
            if self._task is not None and not self._task.done() and self._ready is not None:
                await self._ready
                return
            loop = asyncio.get_running_loop()
            self._ready, self._queue = loop.create_future(), asyncio.Queue()
            self._task = loop.create_task(self._session(self._ready, self._queue), name=f"mcp-{self.name}")
            try:
                async with asyncio.timeout(START_TIMEOUT_S):
                    await asyncio.shield(self._ready)
            except TimeoutError:
                self._task.cancel()
                self.error = f"did not answer within {START_TIMEOUT_S:g} s"
                raise StartFailed(self.error) from None

    async def _request(self, name: str, args: dict[str, Any], ctx: RunContext | None = None) -> Any:
        assert self._queue is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((name, args, future, ctx))
        try:
            return await future
        except asyncio.CancelledError:  # the call was cancelled (the run, a timeout): so is the request
            future.cancel()
            raise

    async def _session(self, ready: asyncio.Future[None], queue: asyncio.Queue[_Item | None]) -> None:
        """Own the transport and the session for their whole life; serve calls from `queue`."""
        from mcp import ClientSession

        errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed below
        calls: set[asyncio.Task[None]] = set()
        _CALLING.set(None)  # this task makes no call (the transport's tasks start from its context)
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(errlog))
                wire = _Wire(self, linked=self.config.kind == "http")
                session = await stack.enter_async_context(ClientSession(
                    *wire.wrap(read, write), message_handler=self._on_message, elicitation_callback=wire.on_elicit))
                init = await session.initialize()
                self._resources = init.capabilities.resources is not None and await self._offers(session)
                await self._list(session)
                self.error = None
                ready.set_result(None)
                while (item := await queue.get()) is not None:
                    task = asyncio.create_task(self._serve(session, *item))
                    calls.add(task)
                    task.add_done_callback(calls.discard)
                for task in calls:
                    task.cancel()
                await asyncio.gather(*calls, return_exceptions=True)
        except Exception as exc:
            leaf = _leaf(exc)
            reason = f"{type(leaf).__name__}: {leaf}".strip()
            tail = _tail(errlog)
            self.error = f"{reason}; stderr: {tail}" if tail else reason
            if not ready.done():
                ready.set_exception(StartFailed(self.error))
            log.warning("MCP server %r stopped: %s", self.name, self.error)
        finally:
            errlog.close()
            while not queue.empty():  # calls that never reached the server
                item = queue.get_nowait()
                if item is not None and not item[2].done():
                    item[2].set_exception(StartFailed(self.error or "the server stopped"))
            for task in calls:
                task.cancel()

    def _transport(self, errlog: Any) -> Any:
        c = self.config
        if c.kind == "stdio":
            from mcp import StdioServerParameters, stdio_client

            assert c.command is not None
            return stdio_client(StdioServerParameters(command=c.command, args=c.args, env=c.env or None, cwd=c.cwd),
                                errlog=errlog)
        assert c.url is not None
        if c.kind == "sse":
            from mcp.client.sse import sse_client

            return sse_client(c.url, headers=c.headers or None)
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        return streamable_http_client(c.url, http_client=create_mcp_http_client(headers=c.headers or None))

    async def _serve(self, session: Any, name: str, args: dict[str, Any], future: asyncio.Future[Any],
                     ctx: RunContext | None) -> None:
        me = asyncio.current_task()
        future.add_done_callback(lambda f: me.cancel() if f.cancelled() and me is not None else None)
        flight = None if name in _OPS else _InFlight(name, ctx)
        if flight is not None:
            self._inflight.append(flight)
            _CALLING.set(flight)  # its `tools/call` request carries it (`_Wire.sent`)
        try:
            result = await self._op(session, name, args) if flight is None else \
                await self._call(session, name, args, flight)
        except asyncio.CancelledError:
            if flight is not None:
                for asking in flight.asking:  # its questions go with it (cancelled, the server told `cancel`)
                    asking.cancel()
            raise
        except Exception as exc:
            if _closed(exc):  # the server is gone: end this session; the caller starts a new one
                assert self._queue is not None
                self._queue.put_nowait(None)
                exc = _Disconnected()
            elif not isinstance(exc, ToolFailure):
                exc = ToolFailure("tool_error", f"MCP server {self.name!r}: {type(exc).__name__}: {exc}")
            if not future.done():
                future.set_exception(exc)
            return
        finally:
            if flight is not None:
                self._inflight.remove(flight)
        if not future.done():
            future.set_result(result)

    async def _offers(self, session: Any) -> bool:
        """Whether the server has any resource or template (many declare the capability with none: then no
        resource tools are offered to the model)."""
        try:
            return bool((await session.list_resources()).resources or
                        (await session.list_resource_templates()).resource_templates)
        except Exception as exc:  # a server that declares resources it cannot list
            log.info("MCP server %r: cannot list its resources (%s); no resource tools", self.name, exc)
            return False

    async def _op(self, session: Any, name: str, args: dict[str, Any]) -> Any:
        """A request that is not a tool call: list tools, resources or prompts, read one, get one."""
        from mcp import types

        if name == "tools/list":
            return await self._list(session)
        if name == "resources/read":
            return await session.read_resource(args["uri"])
        if name == "prompts/get":
            return await session.get_prompt(args["name"], args.get("arguments") or None)
        lister, key = {"resources/list": (session.list_resources, "resources"),
                       "resources/templates/list": (session.list_resource_templates, "resource_templates"),
                       "prompts/list": (session.list_prompts, "prompts")}[name]
        listed, cursor = [], None
        while True:
            page = await (lister(params=types.PaginatedRequestParams(cursor=cursor)) if cursor else lister())
            listed += getattr(page, key)
            cursor = getattr(page, "next_cursor", None)
            if not cursor:
                return listed

    async def _call(self, session: Any, name: str, args: dict[str, Any], flight: _InFlight) -> str:
        """One tool call; an `isError` result is a ToolFailure the model reads. Its progress notifications
        reach the calling run as `notification {level: progress}` events."""
        ctx = flight.ctx

        async def progress(current: float, total: float | None, message: str | None) -> None:
            if ctx is not None:
                self._notify(ctx, "progress", ctx.tool_name or name, message or "", (current, total))

        outcome = await session.call_tool(name, args, read_timeout_seconds=self.config.timeout_s,
                                          progress_callback=progress)
        text = result_text(outcome)
        if outcome.is_error:
            raise ToolFailure("tool_error", text or f"{name} failed", server=self.name)
        return text

    async def _list(self, session: Any) -> None:
        listed, cursor = [], None
        while True:
            page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
            listed += page.tools
            cursor = getattr(page, "next_cursor", None)
            if not cursor:
                break
        c, tools, inner = self.config, [], {}
        for t in listed:
            if (c.tools is not None and t.name not in c.tools) or t.name in c.exclude_tools:
                continue
            name = f"{c.prefix or ''}{t.name}"
            if not NAME_PATTERN.match(name):
                name = _UNSAFE.sub("_", name)[:64]
            inner[name] = t.name
            schema = dict(t.input_schema)
            tools.append(Tool(name=name, description=t.description or "", parameters=schema,
                              run=self._runner(name), validate=schema_validator(schema),
                              effect=effect_of(t.annotations), timeout_s=c.timeout_s, takes_context=True,
                              emits=True))
        self._tools, self._inner, self._stale = tools + self._resource_tools(), inner, False

    def _runner(self, name: str) -> Any:
        async def run(args: dict[str, Any], ctx: RunContext) -> Any:
            return await self.call(name, args, ctx)

        return run

    # -- resources and prompts -----------------------------------------------------------------------------

    def _resource_tools(self) -> list[Tool]:
        """`<prefix>list_resources` and `<prefix>read_resource`, when the server has resources (the
        allow-list and deny-list name them without the prefix, like the server's own tools)."""
        c = self.config
        if not self._resources:
            return []
        keep = [n for n in ("list_resources", "read_resource")
                if (c.tools is None or n in c.tools) and n not in c.exclude_tools]
        prefix = c.prefix if c.prefix is not None else f"{self.name}_"
        out = []
        for base in keep:
            name = _UNSAFE.sub("_", f"{prefix}{base}")[:64]
            if base == "list_resources":
                schema: dict[str, Any] = {"type": "object", "properties": {}}
                about = (f"List the resources of MCP server {self.name} (documents, files, data it offers): "
                         "their URIs, names and types, and URI templates. Read one with its read_resource tool.")
                run = self._list_resources_tool
            else:
                schema = {"type": "object", "properties": {"uri": {
                    "type": "string", "description": "The resource's URI (from list_resources, or a template "
                    "filled in)."}}, "required": ["uri"]}
                about = f"Read a resource of MCP server {self.name} by its URI; returns its text."
                run = self._read_resource_tool
            out.append(Tool(name=name, description=about, parameters=schema, run=run,
                            validate=schema_validator(schema), effect="read", timeout_s=c.timeout_s,
                            takes_context=True))
        return out

    async def _list_resources_tool(self, args: dict[str, Any], ctx: RunContext) -> Any:
        resources = await self.list_resources()
        templates = await self.list_resource_templates()
        return {"resources": [r.model_dump(mode="json", exclude_none=True, include={
                    "uri", "name", "title", "description", "mime_type"}) for r in resources],
                "templates": [t.model_dump(mode="json", exclude_none=True, include={
                    "uri_template", "name", "title", "description", "mime_type"}) for t in templates]}

    async def _read_resource_tool(self, args: dict[str, Any], ctx: RunContext) -> Any:
        return await self.read_resource(args["uri"])

    async def list_resources(self) -> list[Any]:
        """The server's resources (`mcp.types.Resource`: uri, name, title, description, mime_type)."""
        return await self._ask("resources/list", {}) if await self._has_resources() else []

    async def list_resource_templates(self) -> list[Any]:
        """The server's resource templates (`mcp.types.ResourceTemplate`: uri_template, name, …)."""
        return await self._ask("resources/templates/list", {}) if await self._has_resources() else []

    async def read_resource(self, uri: str) -> str:
        """A resource's contents as text: text contents as they are, binary ones described (type, size).
        ToolFailure when the server has no resources or cannot read it."""
        if not await self._has_resources():
            raise ToolFailure("tool_error", f"MCP server {self.name!r} has no resources")
        result = await self._ask("resources/read", {"uri": uri})
        parts = []
        for item in result.contents:
            text = getattr(item, "text", None)
            if isinstance(text, str):
                parts.append(text)
            else:
                size = len(getattr(item, "blob", "") or "") * 3 // 4
                parts.append(f"[binary resource {item.uri}: {item.mime_type or 'unknown type'}, about {size} bytes]")
        return "\n".join(parts)

    async def list_prompts(self) -> list[Any]:
        """The server's prompts (`mcp.types.Prompt`: name, title, description, arguments)."""
        await self.start()
        return await self._ask("prompts/list", {})

    async def get_prompt(self, name: str, arguments: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """A prompt filled in with `arguments`: its messages as `[{role, content}]`, text content as a string
        (other content, e.g. an embedded resource, as its JSON)."""
        result = await self._ask("prompts/get", {"name": name, "arguments": dict(arguments or {})})
        out = []
        for m in result.messages:
            content = m.content
            text = getattr(content, "text", None)
            out.append({"role": m.role, "content": text if isinstance(text, str) else
                        content.model_dump(mode="json", exclude_none=True)})
        return out

    async def _has_resources(self) -> bool:
        await self.start()
        return self._resources

    async def _ask(self, op: str, args: dict[str, Any]) -> Any:
        """A request other than a tool call; the server's errors as ToolFailure."""
        return await self._send(op, args)

    # -- what the server sends -----------------------------------------------------------------------------

    def _notify(self, ctx: RunContext, level: NoticeLevel, title: str, message: str = "",
                progress: tuple[float, float | None] | None = None) -> None:
        """A notification in the calling run's stream: at once while its batch runs, else with its result."""
        if ctx.emit is not None:
            ctx.emit(NotificationEvent(run_id=ctx.run_id, ts=ctx.seam.stamp(), level=level, title=title,
                                       message=message, source=self.name,
                                       progress=Progress(*progress) if progress else None))
        else:
            ctx.notify(level, title, message, progress, source=self.name)

    async def _on_elicit(self, flight: _InFlight | None, why: str, params: Any) -> Any:
        """`elicitation/create`: a question to the humans of the run whose call it concerns (`_Wire.origin`:
        named by the protocol, never guessed from which calls are open); declined when it concerns no open
        call, or no one can answer."""
        from mcp import types

        if flight is not None and flight not in self._inflight:  # over since its request was read
            flight, why = None, f"its call ({flight.tool}) is over: timed out or cancelled"
        if flight is None or flight.ctx is None:
            log.warning("MCP server %r asked for input; declined: %s", self.name, why or "no run to ask")
            return types.ElicitResult(action="decline")
        question = question_for(params, server=self.name)
        asking = asyncio.create_task(ask_in_call(flight.ctx, question, tool=flight.ctx.tool_name or flight.tool,
                                                 connector=self.name))
        flight.asking.add(asking)
        try:
            await asyncio.wait({asking})
        except asyncio.CancelledError:  # the session is closing
            asking.cancel()
            raise
        finally:
            flight.asking.discard(asking)
        if asking.cancelled():
            return types.ElicitResult(action="cancel")
        if (failure := asking.exception()) is not None:
            log.warning("MCP server %r: could not ask its question: %s", self.name, failure)
            return types.ElicitResult(action="cancel")
        return types.ElicitResult.model_validate(result_of(question, *asking.result()))

    def _on_log(self, flight: _InFlight | None, params: Any) -> None:
        """`notifications/message`: Python logging, and a notification in the run of the call it concerns
        (`_Wire.origin`); one that concerns no open call stays in Python logging."""
        params = params if isinstance(params, dict) else {}
        data = params.get("data")
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
        log.info("MCP server %r [%s] %s", self.name, params.get("level"), text[:500])
        level = _LEVELS.get(str(params.get("level")))
        if level is not None and flight is not None and flight.ctx is not None:
            self._notify(flight.ctx, level, str(params.get("logger") or f"{self.name} log"), text[:2000])

    async def _on_message(self, message: Any) -> None:
        method = getattr(getattr(message, "root", message), "method", None)
        if method == "notifications/tools/list_changed":
            self._stale = True  # listed again before the next run's tools are taken

    async def aclose(self) -> None:
        """End the session (and a stdio server's process)."""
        task, queue = self._task, self._queue
        if task is None or task.done() or queue is None:
            return
        queue.put_nowait(None)
        try:
            async with asyncio.timeout(10):
                await task
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


_Item = tuple[str, dict[str, Any], "asyncio.Future[Any]", "RunContext | None"]
"""A request queued for the session task: the tool (or operation), its arguments, its future, its run."""


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (possibly nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _tail(errlog: Any) -> str:
    try:
        errlog.flush()
        errlog.seek(0)
        return " ".join(errlog.read()[-STDERR_TAIL:].split())
    except (OSError, ValueError):
        return ""
