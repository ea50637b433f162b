"""ringlet as an MCP server (`memory-and-context.md` §3, "MCP"), on the official SDK's low-level `Server`.

    tools = memory_toolset(Memory(store, tools=list(MEMORY_TOOLS))).static_tools
    server = ToolServer(tools, store.keys, agents={"helper": AgentEntry("…", build)},
                        local=Caller(org_id="default", realm="default"))
    await server.serve_stdio()                                      # as `local`
    await server.serve_http("127.0.0.1", 8765, realm=None)         # as each request's API key

Each call runs as its caller: the `--realm`/`--org` of a stdio server, or, over streamable HTTP, the
API key of the request (`KeyAuth`): its org, and its realm (a key with several realms needs `--realm`,
one of them). Tools never take a realm argument. A result is one `text` item: the tool's result as JSON
(a `run_<agent>` tool: the agent's answer); an error sets `isError` with `{"error": {"code", "message", …}}`.

This module stays below the agent layer: the CLI builds the tools and the agents and hands them in.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ringlet._ids import new_id
from ringlet.context import Caller as RunCaller
from ringlet.context import RunContext
from ringlet.errors import ConfigError, ToolFailure
from ringlet.store.keys import Keys
from ringlet.tools.base import ArgumentsInvalid, Tool, encode_result

log = logging.getLogger("ringlet.mcp")

MEMORY_TOOLS = ("store", "recall", "discover", "link", "task", "tasks")
"""The NornicDB tools served to outside clients (`remember` stays in process)."""
CALLER = "ringlet.caller"
"""Where `KeyAuth` leaves the request's `Caller` in the ASGI scope."""
_AGENT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,60}$")
_PROMPT_SCHEMA = {"type": "object", "properties": {"prompt": {"type": "string", "description": "What to ask."}},
                  "required": ["prompt"], "additionalProperties": False}


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a call runs as: every read and write is scoped to its `(org_id, realm)`."""

    org_id: str
    realm: str
    user_id: str | None = None
    agents: frozenset[str] | None = None
    """The agents it may run (`run_<agent>`); None: every one."""


class Runs(Protocol):
    """What `run_<agent>` needs of an agent (ringlet's `Agent`)."""

    async def run(self, prompt: str, **options: Any) -> Any: ...

    async def wait_background(self, timeout_s: float = 30.0) -> None: ...


@dataclass(eq=False)
class AgentEntry:
    """An agent served as `run_<name>`: built on first call (a broken config fails that call only)."""

    description: str
    build: Callable[[], Runs]
    _agent: Runs | None = field(default=None, repr=False)

    def agent(self) -> Runs:
        if self._agent is None:
            self._agent = self.build()
        return self._agent


DEFAULT_REALM = "default"
AUTH_ERROR = -32001
"""The JSON-RPC error code of a refused key (the implementation-defined server-error range)."""


def key_realm(realms: str | Iterable[str], wanted: str | None) -> str | None:
    """The realm a key's calls run in: `wanted` (`--realm`) if the key may use it; without `--realm`, the
    key's only realm, else the default realm when the key may use it (a key of every realm, or one listing
    `default`). None when there is no such realm (a key of several other realms must be given `--realm`)."""
    if wanted is not None:
        return wanted if realms == "*" or wanted in realms else None
    if realms == "*":
        return DEFAULT_REALM
    listed = list(realms)
    if len(listed) == 1:
        return listed[0]
    return DEFAULT_REALM if DEFAULT_REALM in listed else None


class KeyAuth:
    """ASGI gate: a request needs `Authorization: Bearer <API key>` (401 otherwise) whose realms allow the
    server's realm (403 otherwise); it passes on with its `Caller` in `scope[CALLER]`."""

    def __init__(self, app: ASGIApp, keys: Keys, realm: str | None) -> None:
        self.app, self.keys, self.realm = app, keys, realm

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan (the app has no websocket routes)
            await self.app(scope, receive, send)
            return
        scheme, _, key = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1").partition(" ")
        record = await self.keys.verify(key.strip()) if scheme.lower() == "bearer" and key.strip() else None
        if record is None:
            message = ("the API key is unknown, revoked or expired" if key else
                       "missing API key: send `Authorization: Bearer rk_…` (create one with `ringlet keys create`)")
            await _refuse(401, "unauthorized", message, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        realm = key_realm(record.realms, self.realm)
        if realm is None:
            choices = ", ".join(sorted(record.realms)) if record.realms != "*" else ""
            message = (f"this API key has no access to realm {self.realm!r} (the server's --realm); use a key of "
                       "that realm" if self.realm is not None else
                       f"this API key has several realms ({choices}) and the server was started without "
                       "--realm: start it with --realm naming one of them, or use a key of one realm")
            await _refuse(403, "realm_forbidden", message)(scope, receive, send)
            return
        agents = None if record.agents == "*" else frozenset(record.agents)
        scope[CALLER] = Caller(record.org_id, realm, record.user_id, agents)
        await self.app(scope, receive, send)


def _refuse(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """A refusal as a JSON-RPC error (what an MCP client shows its user: the official SDK surfaces the
    message of a JSON-RPC error in a non-2xx answer, and only "Server returned an error response" for any
    other body); ringlet's error code is in `error.data.code`."""
    error = {"code": AUTH_ERROR, "message": f"{code}: {message}", "data": {"code": code}}
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=status, headers=headers)


def _result(value: Any) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=encode_result(value))])


def _error(code: str, message: str, **extra: Any) -> types.CallToolResult:
    error = {"code": code, "message": message, **extra}
    return types.CallToolResult(content=[types.TextContent(text=json.dumps({"error": error}, ensure_ascii=False))],
                                is_error=True)


class ToolServer:
    """ringlet `Tool`s (and agents, as `run_<agent>`) behind an MCP server. `local` is the caller of
    requests that did not pass `KeyAuth` (stdio); without it such requests are refused."""

    def __init__(self, tools: Iterable[Tool], keys: Keys, *, agents: Mapping[str, AgentEntry] | None = None,
                 local: Caller | None = None, name: str = "ringlet-memory", version: str = "") -> None:
        self.tools = {t.name: t for t in tools}
        self.agents: dict[str, tuple[str, AgentEntry]] = {}
        for agent, entry in (agents or {}).items():
            if not _AGENT_NAME.match(agent):
                log.warning("agent %r is not served: its name cannot make a tool name", agent)
                continue
            self.agents[f"run_{agent}"] = (agent, entry)
        self.keys, self.local = keys, local
        self.sdk: Server[Any] = Server(name, version=version, on_list_tools=self._list_tools,
                                       on_call_tool=self._call_tool)

    # -- what a caller sees and calls -----------------------------------------------------------------------

    def listing(self, caller: Caller) -> list[types.Tool]:
        listed = [types.Tool(name=t.name, description=t.description, input_schema=t.parameters)
                  for t in self.tools.values()]
        for tool_name, (agent, entry) in self.agents.items():
            if caller.agents is None or agent in caller.agents:
                listed.append(types.Tool(name=tool_name, input_schema=_PROMPT_SCHEMA, description=entry.description
                                         or f"Ask the agent {agent!r}; returns its final answer."))
        return listed

    async def call(self, name: str, arguments: Mapping[str, Any], caller: Caller) -> types.CallToolResult:
        """Run one tool as `caller`: its result, or a coded error (never an exception)."""
        try:
            if name in self.tools:
                return _result(await self._run_tool(self.tools[name], dict(arguments), caller))
            if name in self.agents:
                return _result(await self._run_agent(*self.agents[name], dict(arguments), caller))
            return _error("unknown_tool", f"no tool {name!r}", available=sorted([*self.tools, *self.agents]))
        except ArgumentsInvalid as exc:
            return _error("invalid_arguments", f"invalid arguments for {name!r}: {'; '.join(exc.errors)}",
                          errors=exc.errors)
        except ToolFailure as exc:
            return _error(exc.code, exc.message, **exc.extra)
        except Exception as exc:
            log.exception("tool %r failed", name)
            return _error("tool_error", f"{type(exc).__name__}: {exc}")

    async def _run_tool(self, tool: Tool, arguments: dict[str, Any], caller: Caller) -> Any:
        ctx = RunContext(run_id=new_id("r"), agent="mcp", realm=caller.realm, org_id=caller.org_id,
                         user_id=caller.user_id, channel="api", tool_call_id=new_id("call"), tool_name=tool.name)
        args = tool.validate(arguments)
        try:
            async with asyncio.timeout(tool.timeout_s or None):
                value = await tool.run(args, ctx)
        except TimeoutError:
            ctx.cancelled.set()
            raise ToolFailure("tool_timeout", f"tool {tool.name!r} timed out after {tool.timeout_s:g} s") from None
        for notice in ctx.notices:
            log.warning("%s: %s %s", notice.source, notice.title, notice.message)
        return value

    @staticmethod
    async def _run_agent(agent: str, entry: AgentEntry, arguments: dict[str, Any], caller: Caller) -> str:
        prompt = arguments.pop("prompt", None)
        unexpected = [f"{k}: unexpected argument" for k in sorted(arguments)]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ArgumentsInvalid(["prompt: a non-empty string is required", *unexpected])
        if unexpected:
            raise ArgumentsInvalid(unexpected)
        if caller.agents is not None and agent not in caller.agents:
            raise ToolFailure("forbidden", f"this API key may not use agent {agent!r}")
        try:
            instance = entry.agent()
        except ConfigError as exc:
            raise ToolFailure("unavailable", f"agent {agent!r} cannot start: {exc}") from None
        result = await instance.run(prompt, caller=RunCaller(realm=caller.realm, org_id=caller.org_id,
                                                             user_id=caller.user_id, channel="api"))
        await instance.wait_background()
        if result.status == "input_required":
            raise ToolFailure("input_required", f"agent {agent!r} paused for approvals, which MCP cannot give",
                              run_id=result.run_id)
        if result.error is not None:
            raise ToolFailure(result.error["code"], result.error["message"], run_id=result.run_id)
        return result.output

    # -- the SDK's handlers ------------------------------------------------------------------------------------

    def _caller(self, ctx: ServerRequestContext[Any, Any]) -> Caller | None:
        request = ctx.request
        scope = getattr(request, "scope", None)
        if isinstance(scope, Mapping):
            caller = scope.get(CALLER)
            return caller if isinstance(caller, Caller) else None
        return self.local

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        caller = self._caller(ctx)
        return types.ListToolsResult(tools=self.listing(caller) if caller else [])

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        caller = self._caller(ctx)
        if caller is None:
            return _error("unauthorized", "no caller: this request did not come with an API key")
        return await self.call(params.name, params.arguments or {}, caller)

    # -- transports --------------------------------------------------------------------------------------------

    async def serve_stdio(self) -> None:
        """Serve one client on stdin/stdout until it hangs up, as `local`."""
        async with stdio_server() as (read, write):
            await self.sdk.run(read, write, self.sdk.create_initialization_options())

    def http_app(self, *, realm: str | None, host: str = "127.0.0.1") -> ASGIApp:
        """The streamable-HTTP app (at `/mcp`) behind `KeyAuth`. Call once: its session manager runs once."""
        return KeyAuth(self.sdk.streamable_http_app(host=host), self.keys, realm)

    async def serve_http(self, host: str, port: int, *, realm: str | None,
                         ready: Callable[[str], None] | None = None) -> None:
        """Serve streamable HTTP until SIGINT/SIGTERM. `ready` gets the endpoint's URL once the socket
        listens (connections made from then on wait in the backlog until the app has started)."""
        import uvicorn

        ipv6 = ":" in host
        try:
            sock = socket.create_server((host, port), family=socket.AF_INET6 if ipv6 else socket.AF_INET,
                                        backlog=2048)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from None
        config = uvicorn.Config(self.http_app(realm=realm, host=host), log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=5)
        try:
            if ready is not None:
                ready(f"http://{f'[{host}]' if ipv6 else host}:{sock.getsockname()[1]}/mcp")
            await uvicorn.Server(config).serve(sockets=[sock])
        finally:
            sock.close()
