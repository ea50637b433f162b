"""The catalog (`memory-and-context.md` §6): hundreds of tools behind four meta-tools.

    catalog = Catalog({"github": github_tools, "billing": billing_tools}, config=CatalogConfig())
    agent = Agent(model, tools=[catalog, *pinned])

With more tools than `threshold` (or `mode: on`), the model sees `list_connectors`,
`search_connector_tools`, `execute_connector_tool` and `request_connector_access` instead of the
connectors' tools; below it, the tools are listed directly. Search ranks `"<connector>.<tool>: <description>
(params: …)"` by SQLite FTS5 (BM25) and, with an embedding provider, by cosine similarity, fused by
reciprocal rank. `execute_connector_tool` is resolved to the inner tool before the gates run, so policy and
approval judge the real tool (its connector, name, effect and arguments).
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from ringlet._ids import new_id
from ringlet.context import RunContext
from ringlet.errors import ToolFailure
from ringlet.tools.base import ArgumentsInvalid, Tool, Toolset

log = logging.getLogger("ringlet.catalog")
RRF_K = 60
META_TOOLS = ("list_connectors", "search_connector_tools", "execute_connector_tool", "request_connector_access")


class ConnectorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = ""
    enabled: bool = True
    realms: list[str] = Field(default_factory=list)
    """Empty: every realm."""
    required_roles: list[str] = Field(default_factory=list)


class CatalogConfig(BaseModel):
    """`catalog:` in config.yaml: a mapping (automatic), or `true` / `false`."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["auto", "on", "off"] = "auto"
    threshold: int = Field(default=40, ge=1)
    show_requestable: bool = True
    connectors: dict[str, ConnectorConfig] = Field(default_factory=dict)


@dataclass(slots=True)
class Connector:
    name: str
    toolset: Toolset
    config: ConnectorConfig


class AccessSink(Protocol):
    async def add(self, record: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(slots=True)
class AccessRequests:
    """Where access requests go: in memory by default; the server stores them (`add`, `pending`)."""

    items: list[dict[str, Any]] = field(default_factory=list)

    async def add(self, record: dict[str, Any]) -> dict[str, Any]:
        """Store a pending request, or return the pending one for the same connector, realm and requester."""
        for item in self.items:
            if item["status"] == "pending" and all(item[k] == record[k] for k in ("connector", "realm", "org_id")):
                return item
        self.items.append(record)
        return record


class _Index:
    """An in-memory FTS5 index of tool specs, plus cached embeddings keyed by a hash of the text."""

    def __init__(self, entries: Sequence[tuple[str, str, str]]) -> None:
        self.entries = entries  # (connector, tool, text)
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.lock = threading.Lock()
        self.db.execute("CREATE VIRTUAL TABLE specs USING fts5(text, tokenize='porter unicode61')")
        self.db.executemany("INSERT INTO specs(rowid, text) VALUES (?, ?)",
                            [(i, text) for i, (_, _, text) in enumerate(entries)])
        self.vectors: Any = None

    def keyword(self, query: str, allowed: Callable[[int], bool], limit: int) -> list[int]:
        words = [w for w in _words(query) if len(w) > 1]
        if not words:
            return []
        match = " OR ".join(f'"{w}"' for w in words)
        with self.lock:
            rows = self.db.execute("SELECT rowid FROM specs WHERE specs MATCH ? ORDER BY rank LIMIT ?",
                                   (match, limit * 4)).fetchall()
        return [r[0] for r in rows if allowed(r[0])][:limit]


def _words(text: str) -> list[str]:
    return "".join(c.lower() if c.isalnum() else " " for c in text).split()


def spec_text(connector: str, tool: Tool) -> str:
    params = ", ".join(sorted((tool.parameters.get("properties") or {}).keys()))
    return f"{connector}.{tool.name}: {tool.description} (params: {params})"


class Catalog(Toolset):
    """Connectors (named toolsets) behind the four meta-tools, or listed directly below the threshold."""

    label = "catalog"

    def __init__(self, connectors: Mapping[str, Toolset], *, config: CatalogConfig | None = None,
                 embedder: Any = None, access: AccessSink | None = None) -> None:
        self.config = config or CatalogConfig()
        self.connectors = {name: Connector(name, ts, self.config.connectors.get(name, ConnectorConfig()))
                           for name, ts in connectors.items()}
        self.embedder = embedder
        self.access: AccessSink = access or AccessRequests()
        self._tools: dict[str, dict[str, Tool]] = {}
        self._signature: tuple[Any, ...] = ()
        self._index: _Index | None = None
        self._embedded: dict[str, Any] = {}
        self._direct: dict[str, Toolset] = {}
        self._meta = [self._list_tool(), self._search_tool(), self._execute_tool(), self._request_tool()]

    # -- the toolset protocol ------------------------------------------------------------------------------

    async def list_tools(self, ctx: RunContext) -> Sequence[Tool]:
        await self._refresh(ctx)
        total = sum(len(tools) for tools in self._tools.values())
        if self.config.mode == "off" or (self.config.mode == "auto" and total <= self.config.threshold):
            self._direct = {t.name: self.connectors[c].toolset for c, tools in self._tools.items()
                            for t in tools.values()}
            return [t for tools in self._tools.values() for t in tools.values()]
        self._direct = {}
        return list(self._meta)

    def call_tool(self, tool: Tool, args: dict[str, Any], ctx: RunContext) -> Awaitable[Any]:
        owner = self._direct.get(tool.name)
        return owner.call_tool(tool, args, ctx) if owner is not None else tool.run(args, ctx)

    async def aclose(self) -> None:
        for connector in self.connectors.values():
            close = getattr(connector.toolset, "aclose", None)
            if close is not None:
                await close()

    # -- connectors, access and the index ------------------------------------------------------------------

    async def _refresh(self, ctx: RunContext) -> None:
        """List the connectors' tools; the index is rebuilt only when they changed."""
        listed = {name: await c.toolset.list_tools(ctx) for name, c in self.connectors.items()}
        signature = tuple((name, tuple(t.name for t in tools)) for name, tools in listed.items())
        if signature == self._signature:
            return
        self._signature = signature
        tools = self._tools = {name: {t.name: replace(t, connector=name) for t in ts} for name, ts in listed.items()}
        entries = [(c, t.name, spec_text(c, t)) for c, ts in tools.items() for t in ts.values()]
        self._index = _Index(entries)

    def granted(self, name: str, ctx: RunContext) -> bool:
        c = self.connectors[name].config
        return (c.enabled and (not c.realms or ctx.realm in c.realms)
                and set(c.required_roles) <= set(ctx.roles))

    def _listable(self, name: str, ctx: RunContext) -> str | None:
        if self.granted(name, ctx):
            return "granted"
        c = self.connectors[name].config
        in_realm = not c.realms or ctx.realm in c.realms
        return "requestable" if self.config.show_requestable and in_realm else None

    async def _vectors(self, index: _Index) -> Any:
        """The specs' embeddings, each computed once per distinct text (a hash of it)."""
        import numpy as np

        texts = [text for _, _, text in index.entries]
        keys = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
        missing = [(k, t) for k, t in zip(keys, texts, strict=True) if k not in self._embedded]
        for start in range(0, len(missing), 256):
            batch = missing[start:start + 256]
            vectors = await self.embedder.embed([t for _, t in batch])
            for (k, _), v in zip(batch, vectors, strict=True):
                self._embedded[k] = v
        index.vectors = np.stack([self._embedded[k] for k in keys]) if keys else None
        return index.vectors

    async def search(self, query: str, ctx: RunContext, *, top_k: int = 5,
                     connector: str | None = None) -> list[dict[str, Any]]:
        """Granted tools ranked by keywords (and vectors, with an embedder), fused by reciprocal rank."""
        await self._refresh(ctx)
        index = self._index
        if index is None or not index.entries:
            return []
        ok = {c for c in self.connectors if self.granted(c, ctx) and (connector is None or c == connector)}

        def allowed(i: int) -> bool:
            return index.entries[i][0] in ok

        pool = max(top_k * 4, 20)
        ranked = [index.keyword(query, allowed, pool)]
        if self.embedder is not None:
            try:
                vectors = index.vectors if index.vectors is not None else await self._vectors(index)
                q = (await self.embedder.embed([query]))[0]
                sims = vectors @ q
                order = [int(i) for i in (-sims).argsort() if allowed(int(i))][:pool]
                ranked.append(order)
            except Exception as exc:  # keywords alone, as without an embedder
                log.warning("catalog embeddings failed, searching by keywords: %s", exc)
                ctx.notify("warning", "embeddings unavailable", f"{exc}; searching tools by keywords only",
                           source="catalog")
        scores: dict[int, float] = {}
        for ranking in ranked:
            for rank, i in enumerate(ranking):
                scores[i] = scores.get(i, 0.0) + 1 / (RRF_K + rank + 1)
        best = sorted(scores, key=lambda i: -scores[i])[:top_k]
        out = []
        for i in best:
            c, name, _ = index.entries[i]
            tool = self._tools[c][name]
            out.append({"connector": c, "tool": name, "description": tool.description,
                        "input_schema": tool.parameters, "effect": tool.effect, "score": round(scores[i], 5)})
        return out

    def resolve(self, args: dict[str, Any], ctx: RunContext) -> tuple[Toolset, Tool, dict[str, Any]]:
        """`execute_connector_tool` → the inner tool, its toolset and validated arguments (the route stage
        of `gates.md` §1: the gates then judge the inner tool)."""
        name, tool_name, inner_args = args["connector"], args["tool"], args["args"]
        tools = self._tools.get(name)
        if tools is None:
            raise ToolFailure("unknown_tool", f"no connector {name!r}",
                              closest=difflib.get_close_matches(name, list(self.connectors), n=3, cutoff=0))
        tool = tools.get(tool_name)
        if tool is None:
            raise ToolFailure("unknown_tool", f"connector {name!r} has no tool {tool_name!r}",
                              closest=difflib.get_close_matches(tool_name, list(tools), n=3, cutoff=0))
        if not self.granted(name, ctx):
            raise ToolFailure("access_required", f"connector {name!r} is not enabled for you here; call "
                              "request_connector_access with a reason", connector=name)
        try:
            return self.connectors[name].toolset, tool, tool.validate(dict(inner_args))
        except ArgumentsInvalid as exc:
            raise ToolFailure("invalid_arguments", f"invalid arguments for {name}.{tool_name}: "
                              f"{'; '.join(exc.errors)}", errors=exc.errors) from None

    # -- the meta-tools ------------------------------------------------------------------------------------

    def _list_tool(self) -> Tool:
        async def run(args: dict[str, Any], ctx: RunContext) -> Any:
            await self._refresh(ctx)
            listed = []
            for name, c in self.connectors.items():
                access = self._listable(name, ctx)
                if access is not None:
                    description = c.config.description or getattr(c.toolset, "description", "") or name
                    listed.append({"name": name, "description": description,
                                   "tool_count": len(self._tools.get(name, {})), "access": access})
            return {"connectors": listed}

        return Tool(name="list_connectors", description="List the tool connectors you can use or request.",
                    parameters={"type": "object", "properties": {}}, run=run, effect="read", approval="auto")

    def _search_tool(self) -> Tool:
        async def run(args: dict[str, Any], ctx: RunContext) -> Any:
            found = await self.search(args["query"], ctx, top_k=int(args.get("top_k", 5)),
                                      connector=args.get("connector"))
            return {"tools": found}

        return Tool(name="search_connector_tools", run=run, effect="read", approval="auto", validate=_search_args,
                    description="Find connector tools for a task: returns their schemas, best first.",
                    parameters={"type": "object", "properties": {
                        "query": {"type": "string", "description": "What you want to do."},
                        "top_k": {"type": "integer", "minimum": 1, "maximum": 20, "default": 5},
                        "connector": {"type": "string", "description": "Only this connector."}},
                        "required": ["query"]})

    def _execute_tool(self) -> Tool:
        async def run(args: dict[str, Any], ctx: RunContext) -> Any:  # reached only if not resolved first
            toolset, tool, inner = self.resolve(args, ctx)
            return await toolset.call_tool(tool, inner, ctx)

        return Tool(name="execute_connector_tool", run=run, effect="write", validate=_execute_args,
                    resolve=self.resolve,
                    description="Run a connector tool found with search_connector_tools.",
                    parameters={"type": "object", "properties": {
                        "connector": {"type": "string"}, "tool": {"type": "string"},
                        "args": {"type": "object", "description": "The tool's arguments (its input_schema)."}},
                        "required": ["connector", "tool", "args"]})

    def _request_tool(self) -> Tool:
        async def run(args: dict[str, Any], ctx: RunContext) -> Any:
            name = args["connector"]
            if name not in self.connectors:
                raise ToolFailure("unknown_tool", f"no connector {name!r}",
                                  closest=difflib.get_close_matches(name, list(self.connectors), n=3, cutoff=0))
            record = await self.access.add({
                "request_id": new_id("acc"), "connector": name, "reason": args["reason"],
                "requested_by": ctx.user_id, "realm": ctx.realm, "org_id": ctx.org_id, "status": "pending",
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
            ctx.notify("info", "connector access requested", f"{name}: {args['reason']}", source="catalog")
            return {"request_id": record["request_id"], "status": record["status"]}

        return Tool(name="request_connector_access", run=run, effect="write", approval="auto",
                    validate=_request_args, description="Ask an admin to enable a connector for you.",
                    parameters={"type": "object", "properties": {
                        "connector": {"type": "string"}, "reason": {"type": "string", "maxLength": 1000}},
                        "required": ["connector", "reason"]})


def _require(given: dict[str, Any], **kinds: type) -> None:
    errors = [f"{k}: required ({t.__name__})" for k, t in kinds.items() if not isinstance(given.get(k), t)]
    if errors:
        raise ArgumentsInvalid(errors)


def _search_args(args: dict[str, Any]) -> dict[str, Any]:
    _require(args, query=str)
    top_k = args.get("top_k", 5)
    if not isinstance(top_k, int) or not 1 <= top_k <= 20:
        raise ArgumentsInvalid(["top_k: an integer from 1 to 20"])
    return args


def _execute_args(args: dict[str, Any]) -> dict[str, Any]:
    _require(args, connector=str, tool=str, args=dict)
    return args


def _request_args(args: dict[str, Any]) -> dict[str, Any]:
    _require(args, connector=str, reason=str)
    if len(args["reason"]) > 1000:
        raise ArgumentsInvalid(["reason: at most 1000 characters"])
    return args
