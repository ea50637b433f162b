"""The agents a server hosts: found on disk (`--agents DIR` plus the built-in ones) or given as `Agent`s.
A graph.yaml agent is a `HostedGraph`: built with `load_agent` on the server's store."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ringlet.agent import Agent
from ringlet.agent.config import AgentSpec, build_agent, discover, find
from ringlet.errors import ConfigError
from ringlet.gates import PolicyGate, PolicySet
from ringlet.graph.agent import load_agent
from ringlet.graph.checkpoint import Checkpoint, CheckpointStore
from ringlet.graph.mermaid import to_mermaid
from ringlet.graph.parse import load_graph
from ringlet.mcp.oauth import OAuthToolset
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError
from ringlet.store.records import AccessRequest
from ringlet.tools.catalog import Catalog as ToolCatalog

DEFAULT_REALM = "default"
"""Where a conversation lives when neither its agent, its request nor its key's realms say otherwise."""


@dataclass(eq=False)
class StoredAccess:
    """The catalog's access requests, in the server's store (`GET /api/v1/access-requests`)."""

    store: Any

    async def add(self, record: dict[str, Any]) -> dict[str, Any]:
        """The catalog's request (a dict, as the tool made it) stored, or the pending one it repeats."""
        stored = await self.store.audit.request_access(AccessRequest(**record))
        return asdict(stored)


@dataclass(eq=False)
class Hosted:
    name: str
    kind: Literal["loop", "graph"]
    description: str = ""
    conversation_starters: list[str] = field(default_factory=list)
    realm: str | None = None
    """The realm its config names: it runs only there. None: in the realm a conversation names."""
    factory: Callable[[], Agent] | None = None
    _agent: Any = None
    gates: tuple[Any, ...] = ()
    """The server's gates: every call passes them before the agent's own gates."""
    audit: Callable[[dict[str, Any]], Any] | None = None
    """Where the agent's approval decisions are audited (the server's audit log)."""
    store: Any = None
    """The server's store: agents with memory keep it there (unless given their own)."""
    model: str | None = None
    """The model its config names (None: the default model, or the given Agent's)."""
    allowed_models: tuple[str, ...] = ()
    """What a request's `overrides.model` may name besides the agent's own model (fnmatch patterns)."""
    max_concurrent_runs: int | None = None
    """At most this many of its runs execute at once (config.yaml `max_concurrent_runs`); None: no limit."""
    connections: Any = None
    """How its users connect MCP servers behind OAuth (`protocols.connections.ServerAuthorizer`)."""

    def check_model(self, name: str, model_dirs: Sequence[str]) -> None:
        """A request may switch the agent only to its own model or one `allowed_models` matches, and to a
        `local:` file only inside `model_dirs`: 403 otherwise, decided without touching the file."""
        if any(ord(c) < 32 or ord(c) == 127 for c in name):
            raise ApiError(422, "validation_error", "overrides.model: a model name has no control characters",
                           details={"errors": [{"loc": "body.overrides.model", "msg": "control character"}]})
        own = {n for n in (self.model, getattr(getattr(self.agent(), "model", None), "name", None)) if n}
        if name not in own and not any(fnmatch.fnmatchcase(name, p) for p in self.allowed_models):
            raise ApiError(403, "forbidden", f"overrides.model: agent {self.name!r} may not run on {name!r}; it "
                           f"may use {sorted(own | set(self.allowed_models))} (the operator allows more with "
                           "allowed_models in the agent's config.yaml)")
        provider, _, rest = name.partition(":")
        if provider == "local" and name not in own and _is_path(rest) and not _inside(rest, model_dirs):
            raise ApiError(403, "forbidden", "overrides.model: a local model file must lie in one of the server's "
                           "model folders (RINGLET_MODEL_DIRS)")

    def runnable_by(self, principal: Principal) -> bool:
        """Whether the key may run this agent: its agent list and, for an agent with a realm, its realms.
        Lists (agents, `/v1/models`, A2A cards) show only these."""
        return principal.may_use(self.name) and (self.realm is None or principal.sees(self.realm))

    def realm_for(self, principal: Principal, asked: str | None = None) -> str:
        """The realm a new conversation, thread, context or trigger of this agent lives in: the agent's own
        (naming another is 403: it runs only there), else the one `asked` for, else the key's only realm,
        else `default`. 403 `realm_forbidden` when the key may not use that realm."""
        if self.realm is not None and asked is not None and asked != self.realm:
            raise ApiError(403, "realm_forbidden", f"agent {self.name!r} runs only in the realm its config names, "
                           f"not in {asked!r}; leave `realm` out")
        realm = self.realm or asked or principal.only_realm or DEFAULT_REALM
        principal.check_realm(realm)
        return realm

    def check_home(self, realm: str) -> None:
        """A run of this agent in a conversation of `realm`: 403 unless the agent may run there (an agent with
        a realm runs only in it, whatever a stored conversation says)."""
        if self.realm is not None and realm != self.realm:
            raise ApiError(403, "realm_forbidden", f"agent {self.name!r} runs only in the realm its config "
                           f"names, not in {realm!r}")

    def agent(self) -> Agent:
        """The agent, built on first use; a broken config is a 503 naming the problem."""
        if self._agent is None:
            if self.factory is None:
                raise ApiError(503, "unavailable", f"agent {self.name!r} cannot run here")
            try:
                self._agent = self.factory()
            except ConfigError as exc:
                raise ApiError(503, "unavailable", f"agent {self.name!r} cannot start: {exc}") from None
        if self.gates and self._agent.gates[:len(self.gates)] != self.gates:  # the server's gates come first
            self._agent.use_gates((*self.gates, *self._agent.gates), audit=self.audit)
        if self.store is not None:
            if self._agent.memory is not None:
                self._agent.memory.attach(self.store)
            for toolset in self._agent.toolsets:  # access requests are kept in the server's database
                if isinstance(toolset, ToolCatalog) and not isinstance(toolset.access, StoredAccess):
                    toolset.access = StoredAccess(self.store)
        if self.connections is not None:  # users connect through the server's callback route
            for toolset in self._agent.toolsets:
                if isinstance(toolset, OAuthToolset):
                    self.connections.serve(toolset.connector)  # and their tokens are kept in its store
        return self._agent

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "kind": self.kind,
                "conversation_starters": self.conversation_starters}


class Catalog:
    def __init__(self, hosted: Iterable[Hosted]) -> None:
        self.hosted = {h.name: h for h in hosted}

    @classmethod
    def from_dir(cls, root: Path | None = None) -> Catalog:
        return cls(_from_spec(spec, root) for spec in discover(root).values())

    @classmethod
    def of(cls, agents: Iterable[Agent]) -> Catalog:
        return cls(Hosted(a.name, "loop", realm=a.realm, _agent=a) for a in agents)

    def serve_on(self, store: Any, settings: Any, policies: PolicySet) -> PolicyGate:
        """Gate and store the hosted agents as a server does: its policy gate (`policies`, auditing to `store`)
        in front of each agent's own gates, approval decisions audited to `store`, memory kept in it. What
        `ringlet serve` runs is built so, and so is what `ringlet replay` replays (a run takes an audit
        record's id and time from its seam: an agent built otherwise is not the run's). The gate (its
        policies reload in place)."""
        policy = PolicyGate(policies, audit=store.audit.append, timeout_ms=settings.policy_eval_timeout_ms,
                            timezone=settings.policy_timezone, redact_keys=settings.policy_redact_keys)
        self.use_gates([policy], audit=store.audit.append, store=store)
        return policy

    def use_gates(self, gates: Iterable[Any], *, audit: Callable[[dict[str, Any]], Any] | None = None,
                  store: Any = None) -> None:
        """Put these gates in front of every hosted agent's own; audit approval decisions to `audit`; keep
        agents' memory in `store`."""
        for hosted in self.hosted.values():
            hosted.gates, hosted.audit, hosted.store = tuple(gates), audit, store

    def connect_with(self, authorizer: Any) -> None:
        """Users of the hosted agents' MCP servers behind OAuth connect through `authorizer`."""
        for hosted in self.hosted.values():
            hosted.connections = authorizer

    async def aclose(self) -> None:
        """Close the agents that were started (their MCP sessions and server processes)."""
        for hosted in self.hosted.values():
            if hosted._agent is not None:
                await hosted._agent.aclose()

    def get(self, name: str) -> Hosted:
        hosted = self.hosted.get(name)
        if hosted is None:
            raise ApiError(404, "agent_not_found", f"no agent named {name!r}; GET /api/v1/agents lists them")
        return hosted


@dataclass(eq=False)
class HostedGraph(Hosted):
    """A graph.yaml agent, built on first use with `load_agent`: its checkpoints and rag knowledge bases in
    the server's store, its scripts running in its own directory (`graph-workflows.md` §6), the server's
    gates in front of its llm nodes. `options` go to `load_agent` as well (a test's `model`)."""

    directory: Path = Path()
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def at(cls, directory: Path | str, **options: Any) -> HostedGraph:
        """The graph agent of `directory`, described by its graph.yaml."""
        directory = Path(directory)
        try:
            spec = load_graph(directory / "graph.yaml", agent=directory.name)
            about, starters = spec.description, list(spec.conversation_starters)
            limit = spec.settings.max_concurrent_runs
        except ConfigError:  # described by nothing; building it reports the problem (503)
            about, starters, limit = "", [], None
        return cls(directory.name, "graph", about, starters, directory=directory, options=options,
                   max_concurrent_runs=limit)

    def mermaid(self) -> str:
        """The graph as a Mermaid flowchart (what `ringlet graph show` prints)."""
        try:
            return to_mermaid(load_graph(self.directory / "graph.yaml", agent=self.name))
        except ConfigError as exc:
            raise ApiError(503, "unavailable", f"agent {self.name!r} cannot be drawn: {exc}") from None

    def agent(self) -> Any:
        """The GraphAgent, built on first use; a broken graph.yaml is a 503 naming the problem."""
        if self._agent is None:
            options: dict[str, Any] = {"script_cwd": self.directory, "gates": self.gates}
            if self.store is not None:
                options |= {"store": self.store, "checkpoints": checkpoints_of(self.store)}
            try:
                self._agent = load_agent(self.directory, **(options | self.options))
            except ConfigError as exc:
                raise ApiError(503, "unavailable", f"agent {self.name!r} cannot start: {exc}") from None
        return self._agent


def checkpoints_of(store: Any) -> CheckpointStore:
    """The server store's checkpoint table, loading `Checkpoint`s."""
    return store.checkpoints.decoding(Checkpoint.from_json)


def _is_path(name: str) -> bool:
    return any(c in name for c in "/\\") or name.startswith("~") or name.lower().endswith(".gguf")


def _inside(name: str, folders: Sequence[str]) -> bool:
    path = Path(os.path.expanduser(name)).resolve()  # symlinks and `..` resolved; the file need not exist
    return any(path.is_relative_to(Path(os.path.expanduser(f)).resolve()) for f in folders)


def sub_agents_of(root: Path | None) -> Callable[[str], Any]:
    """How hosted agents find their sub-agents by name: among the agents hosted beside them (`root`), else
    wherever `find` looks (`RINGLET_AGENTS_DIR`)."""

    def child(name: str) -> Any:
        here = root / name if root is not None else None
        return load_agent(here if here is not None and here.is_dir() else find(name))

    return child


def _from_spec(spec: AgentSpec, root: Path | None) -> Hosted:
    if spec.kind == "graph":
        return HostedGraph.at(spec.directory)
    config = spec.config
    child = sub_agents_of(root)

    return Hosted(spec.name, spec.kind, spec.description,
                  list(config.conversation_starters) if config else [],
                  realm=config.realm if config else None,
                  factory=lambda: build_agent(spec, children=child), model=config.primary_model if config else None,
                  allowed_models=tuple(config.allowed_models) if config else (),
                  max_concurrent_runs=config.max_concurrent_runs if config else None)
