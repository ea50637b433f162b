"""MCP servers as toolsets, through the official SDK (`mcp`): stdio, SSE and streamable HTTP. Their settings
are `config.py`'s (`MCPServerConfig`, `load_servers`).

    servers = load_servers({"mcpServers": {"time": {"command": "mcp-server-time"}}}, base=Path("."))
    agent = Agent(model, tools=[MCPToolset(name, config) for name, config in servers.items()])

Each server's session lives in one long-lived task (`session.py`; its traffic is seen by `wire.py`). Tools
are listed at start and again after `notifications/tools/list_changed`. A server that dies is started again
by the next call; `aclose()` ends the session and its process.

The rest of the client side of the protocol (MCP 2025-11-25, what the SDK negotiates):
- elicitation (the capability is advertised): a server's `elicitation/create` during a call becomes a
  question to a human of that call's run, answered while the call stays open (`elicit.py`);
- resources: when the server has any (resources or templates), two more tools, `<prefix>list_resources` and
  `<prefix>read_resource` (`<server>_…` without a prefix), and `@server:uri` mentions in user messages
  (`mentions.py`); `list_resources()`, `list_resource_templates()`, `read_resource(uri)` from Python;
- prompts: `list_prompts()` and `get_prompt(name, arguments)` from Python;
- progress notifications during a call → `notification {level: progress}` events, and the server's log
  messages (`notifications/message`) → notifications at the matching level, in the calling run's stream;
- sampling (advertised unless `sampling.enabled` is false): a server's `sampling/createMessage` during a
  call is answered by the run's model through its gates (`sampling.py`).
A server behind OAuth is an `oauth.OAuthToolset`: one `MCPToolset` per user, each with that user's tokens.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ringlet.context import RunContext
from ringlet.errors import RunError, ToolFailure
from ringlet.mcp.config import MCPServerConfig
from ringlet.mcp.session import START_TIMEOUT_S, Disconnected, MCPSession, StartFailed
from ringlet.tools.base import NAME_PATTERN, Tool, Toolset, schema_validator

__all__ = ["MCPServerConfig", "MCPToolset", "StartFailed", "effect_of"]

log = logging.getLogger("ringlet.mcp")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def effect_of(annotations: Any) -> Literal["read", "write", "destructive"]:
    """`readOnlyHint` → read, `destructiveHint` → destructive, otherwise write (`gates.md` §2)."""
    if annotations is not None and getattr(annotations, "read_only_hint", None):
        return "read"
    if annotations is not None and getattr(annotations, "destructive_hint", None):
        return "destructive"
    return "write"


class MCPToolset(Toolset):
    """The tools of one MCP server."""

    def __init__(self, name: str, config: MCPServerConfig, *, auth: Any = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.name = name
        self.label = f"MCP server {name!r}"
        self.description = config.description  # what the catalog's list_connectors shows
        self.config = config
        self.session = MCPSession(name, config, self._listed, auth=auth, start_timeout_s=start_timeout_s)
        self._tools: list[Tool] = []
        self._inner: dict[str, str] = {}
        """ringlet tool name → the server's tool name"""
        self._reported: str | None = None

    @property
    def error(self) -> str | None:
        """Why the server is not available (None while it is)."""
        return self.session.error

    # -- the toolset protocol ------------------------------------------------------------------------------

    async def list_tools(self, ctx: RunContext) -> Sequence[Tool]:
        try:
            await self.start()
            if self.session.stale:
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
            await self.session.request("tools/list", {})
        except Disconnected:
            await self.session.ended()
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
                return await self.session.request(name, args, ctx)
            except StartFailed as exc:
                raise ToolFailure("tool_error", f"MCP server {self.name!r} is unavailable: {exc}") from None
            except Disconnected:
                log.warning("MCP server %r is gone; starting it again", self.name)
                await self.session.ended()
                if attempt == 2:
                    raise ToolFailure("tool_error", f"MCP server {self.name!r} closed the connection") from None
        raise AssertionError("unreachable")

    async def start(self) -> None:
        """Start the session (once; again after it ended) and wait until its tools are listed."""
        await self.session.start()

    def _listed(self, listed: list[Any]) -> None:
        """The server's tools (as the session listed them), under their ringlet names."""
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
        self._tools, self._inner = tools + self._resource_tools(), inner

    def _runner(self, name: str) -> Any:
        async def run(args: dict[str, Any], ctx: RunContext) -> Any:
            return await self.call(name, args, ctx)

        return run

    # -- resources and prompts -----------------------------------------------------------------------------

    def _resource_tools(self) -> list[Tool]:
        """`<prefix>list_resources` and `<prefix>read_resource`, when the server has resources (the
        allow-list and deny-list name them without the prefix, like the server's own tools)."""
        c = self.config
        if not self.session.resources:
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
        return self.session.resources

    async def _ask(self, op: str, args: dict[str, Any]) -> Any:
        """A request other than a tool call; the server's errors as ToolFailure."""
        return await self._send(op, args)

    async def aclose(self) -> None:
        """End the session (and a stdio server's process)."""
        await self.session.aclose()
