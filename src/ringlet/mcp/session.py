"""The session with one MCP server: one long-lived task that owns the transport (stdio, SSE or streamable
HTTP, through the official SDK) and the SDK's `ClientSession`, so opening and closing happen in the same task
(no "cancel scope in a different task"); callers queue their requests and each is served by a child task of
it. What the server sends on its own goes to the run of the call it concerns (`wire.py`): progress and log
messages as notifications, elicitations as questions to its humans (`elicit.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

from ringlet.context import NoticeLevel, RunContext
from ringlet.errors import RingletError, ToolFailure
from ringlet.events import NotificationEvent, Progress
from ringlet.mcp.config import MCPServerConfig
from ringlet.mcp.elicit import ask_in_call, question_for, result_of
from ringlet.mcp.sampling import in_call
from ringlet.mcp.wire import CALLING, InFlight, Wire

log = logging.getLogger("ringlet.mcp")
START_TIMEOUT_S = 30.0
STDERR_TAIL = 2000


def result_text(result: Any) -> str:
    """A CallToolResult as the text the model reads: its text items, else its structured content."""
    texts = [getattr(item, "text", None) for item in result.content]
    parts = [t for t in texts if isinstance(t, str)]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    others = [item.model_dump(mode="json", exclude_none=True) for item in result.content
              if not isinstance(getattr(item, "text", None), str)]
    return "\n".join(parts + [json.dumps(o, ensure_ascii=False) for o in others])


class Disconnected(Exception):
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
"""Requests other than tool calls that callers queue (`request`)."""


class StartFailed(RingletError):
    """The server could not be started or initialised; the message ends with its stderr tail."""


_Item = tuple[str, dict[str, Any], "asyncio.Future[Any]", "RunContext | None"]
"""A request queued for the session task: the tool (or operation), its arguments, its future, its run."""


class MCPSession:
    """The session with one MCP server (started by `start`, again after it ended), serving the requests
    callers queue (`request`). `listed` gets the server's tools each time they are listed."""

    def __init__(self, name: str, config: MCPServerConfig, listed: Callable[[list[Any]], None], *,
                 auth: Any = None, start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.name = name
        self.config = config
        self.listed = listed
        self.auth = auth
        """An httpx Auth for HTTP transports (`ringlet.mcp.oauth`: one user's OAuth connection)."""
        self.start_timeout_s = start_timeout_s
        """How long starting may take (longer behind OAuth: the user may have to connect first)."""
        self.task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._queue: asyncio.Queue[_Item | None] | None = None
        self.inflight: list[InFlight] = []
        self.resources = False
        """Whether the server has resources (it advertises the capability and lists some)."""
        self.stale = False
        """The server said its tools changed: list them again before they are next taken."""
        self._starting = asyncio.Lock()
        self.error: str | None = None
        """Why the server is not available (None while it is)."""

    async def start(self) -> None:
        """Start the session (once; again after it ended) and wait until its tools are listed."""
        async with self._starting:
            if self.task is not None and not self.task.done() and self._ready is not None:
                await self._ready
                return
            loop = asyncio.get_running_loop()
            self._ready, self._queue = loop.create_future(), asyncio.Queue()
            self.task = loop.create_task(self._run(self._ready, self._queue), name=f"mcp-{self.name}")
            try:
                async with asyncio.timeout(self.start_timeout_s):
                    await asyncio.shield(self._ready)
            except TimeoutError:
                self.task.cancel()
                self.error = f"did not answer within {self.start_timeout_s:g} s"
                raise StartFailed(self.error) from None

    async def request(self, name: str, args: dict[str, Any], ctx: RunContext | None = None) -> Any:
        assert self._queue is not None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((name, args, future, ctx))
        try:
            return await future
        except asyncio.CancelledError:  # the call was cancelled (the run, a timeout): so is the request
            future.cancel()
            raise

    async def _run(self, ready: asyncio.Future[None], queue: asyncio.Queue[_Item | None]) -> None:
        """Own the transport and the session for their whole life; serve calls from `queue`."""
        from mcp import ClientSession

        errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed below
        calls: set[asyncio.Task[None]] = set()
        CALLING.set(None)  # this task makes no call (the transport's tasks start from its context)
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(errlog))
                wire = Wire(self, linked=self.config.kind == "http")
                sampling = wire.on_sample if self.config.sampling.enabled else None  # offered to the server
                session = await stack.enter_async_context(ClientSession(
                    *wire.wrap(read, write), message_handler=self._on_message, elicitation_callback=wire.on_elicit,
                    sampling_callback=sampling))
                init = await session.initialize()
                self.resources = init.capabilities.resources is not None and await self._offers(session)
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

            return sse_client(c.url, headers=c.headers or None, auth=self.auth)
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        return streamable_http_client(c.url, http_client=create_mcp_http_client(headers=c.headers or None,
                                                                                auth=self.auth))

    async def _serve(self, session: Any, name: str, args: dict[str, Any], future: asyncio.Future[Any],
                     ctx: RunContext | None) -> None:
        me = asyncio.current_task()
        future.add_done_callback(lambda f: me.cancel() if f.cancelled() and me is not None else None)
        flight = None if name in _OPS else InFlight(name, ctx)
        if flight is not None:
            self.inflight.append(flight)
            CALLING.set(flight)  # its `tools/call` request carries it (`Wire.sent`)
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
                exc = Disconnected()
            elif not isinstance(exc, ToolFailure):
                exc = ToolFailure("tool_error", f"MCP server {self.name!r}: {type(exc).__name__}: {exc}")
            if not future.done():
                future.set_exception(exc)
            return
        finally:
            if flight is not None:
                self.inflight.remove(flight)
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

    async def _call(self, session: Any, name: str, args: dict[str, Any], flight: InFlight) -> str:
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
        """List the server's tools (every page) and hand them to `listed`."""
        tools, cursor = [], None
        while True:
            page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
            tools += page.tools
            cursor = getattr(page, "next_cursor", None)
            if not cursor:
                break
        self.listed(tools)
        self.stale = False

    def _notify(self, ctx: RunContext, level: NoticeLevel, title: str, message: str = "",
                progress: tuple[float, float | None] | None = None) -> None:
        """A notification in the calling run's stream: at once while its batch runs, else with its result."""
        if ctx.emit is not None:
            ctx.emit(NotificationEvent(run_id=ctx.run_id, ts=ctx.seam.stamp(), level=level, title=title,
                                       message=message, source=self.name,
                                       progress=Progress(*progress) if progress else None))
        else:
            ctx.notify(level, title, message, progress, source=self.name)

    async def on_elicit(self, flight: InFlight | None, why: str, params: Any) -> Any:
        """`elicitation/create`: a question to the humans of the run whose call it concerns (`Wire.origin`:
        named by the protocol, never guessed from which calls are open); declined when it concerns no open
        call, or no one can answer."""
        from mcp import types

        if flight is not None and flight not in self.inflight:  # over since its request was read
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

    async def on_sample(self, flight: InFlight | None, why: str, params: Any) -> Any:
        """`sampling/createMessage`: a completion in the run whose call it concerns (`sampling.in_call`)."""
        return await in_call(flight, self.inflight, why, params, server=self.name, config=self.config.sampling)

    def on_log(self, flight: InFlight | None, params: Any) -> None:
        """`notifications/message`: Python logging, and a notification in the run of the call it concerns
        (`Wire.origin`); one that concerns no open call stays in Python logging."""
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
            self.stale = True  # listed again before the next run's tools are taken

    async def aclose(self) -> None:
        """End the session (and a stdio server's process)."""
        task, queue = self.task, self._queue
        if task is None or task.done() or queue is None:
            return
        queue.put_nowait(None)
        try:
            async with asyncio.timeout(10):
                await task
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def ended(self) -> None:
        """Wait until the session task is over (after the server closed the connection)."""
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)


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
