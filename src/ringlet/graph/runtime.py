"""What a loaded graph agent brings to each of its runs: its spec and options, and the things built once
and shared by runs (an `Agent` per `llm` node, tools, MCP sessions, child agents, knowledge bases).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ringlet._ids import SYSTEM
from ringlet.agent import Agent
from ringlet.agent.settings import Execution, Gates, Limits, ModelSettings
from ringlet.errors import ConfigError
from ringlet.gates.approval import ApprovalRules
from ringlet.graph import resources
from ringlet.graph.checkpoint import CheckpointStore, MemoryCheckpoints
from ringlet.graph.spec import GraphSpec, LlmNode, RagNode
from ringlet.hooks.plugin import Plugin
from ringlet.loop import StepExecutor
from ringlet.models.base import Model
from ringlet.tools.base import Tool, Toolset

__all__ = ["GraphOptions", "Runtime"]

log = logging.getLogger("ringlet.graph")
MAX_AGENT_DEPTH = 3


@dataclass
class GraphOptions:
    """How a graph agent runs, beyond its graph.yaml."""

    model: Model | str | None = None
    """Every `llm` node's model (e.g. a test model); None: the node's, else the graph's, else the default."""
    models: Callable[[str], Model] | None = None
    """Turns a model name into a Model (default: `resolve_model`)."""
    plugins: tuple[Plugin, ...] = ()
    gates: tuple[Any, ...] = ()
    approvals: ApprovalRules | None = None
    resolver: Callable[[str], Any] | None = None
    """Agent name → an object with the `Agent.stream` surface, for `agent` nodes (default: sibling
    directories, then discovered agents, loaded with `load_agent`)."""
    checkpoints: CheckpointStore | None = None
    store: Any = None
    """Where rag knowledge bases live: a `Store` or a database URL; None: the default store."""
    script_cwd: Path | None = None
    """Scripts' working directory: None is the caller's (CLI); the server passes the agent directory."""
    python: str = field(default_factory=lambda: os.environ.get("RINGLET_GRAPH_PYTHON", "python3"))
    data_dir: Path | None = None
    on_question: Literal["pause", "fail"] = "pause"
    """With no approver to answer: pause the run (headless) or fail it (no terminal, no server)."""
    confirm_rag: Callable[[str], bool] | None = None
    """Asked before building an unbuilt knowledge base with default settings (a terminal's prompt)."""
    max_agent_depth: int = MAX_AGENT_DEPTH
    steps: StepExecutor | None = None
    """Runs the llm nodes' model requests and tool calls; its `seam` is the graph run's clock and ids.
    None: `LocalSteps(SYSTEM)`, the real ones."""


class Runtime:
    """The shared services of one graph agent."""

    def __init__(self, spec: GraphSpec, options: GraphOptions, *, name: str | None = None,
                 load: Callable[..., Any] | None = None) -> None:
        self.spec, self.options = spec, options
        self._load = load
        """Loads an agent directory of any kind (`ringlet.graph.load_agent`, handed in by the graph agent)."""
        self.name = name or spec.directory.name
        self.checkpoints: CheckpointStore = \
            options.checkpoints if options.checkpoints is not None else MemoryCheckpoints()
        self.graph_hash = hashlib.sha256(spec.source.text.encode()).hexdigest()
        self.seam = options.steps.seam if options.steps is not None else SYSTEM
        """Where the graph's runs read the clocks and get ids."""
        self._agents: dict[str, Agent] = {}
        self._tools: dict[str, Callable[[], Tool]] | None = None
        self._provided: list[str] | None = None
        self._servers: dict[str, Toolset] = {}
        self._children: dict[str, Any] = {}
        self._kbs: dict[str, Any] = {}
        self._memory: Any = None
        self._prepared: asyncio.Lock | None = None
        self.ready = False
        self._warmed = False
        base = Path(os.environ.get("RINGLET_DATA_DIR", "~/.local/share/ringlet")).expanduser()
        self.data_dir = options.data_dir or base / "agents" / self.name

    # -- llm nodes ------------------------------------------------------------------------------------------

    def model_for(self, node: LlmNode) -> Model:
        chosen = self.options.model or node.model or self.spec.model
        if not isinstance(chosen, str) and chosen is not None:
            return chosen
        from ringlet.models.providers import default_model, resolve_model

        name = chosen or default_model()
        if self.options.models is not None:
            return self.options.models(name)
        effort = node.reasoning_effort or self.spec.reasoning_effort
        if effort and name.split(":", 1)[0] in ("openai", "ollama"):
            return resolve_model(name, extra_body={"reasoning_effort": effort})
        return resolve_model(name)

    def default_model(self) -> Model:
        """The graph's own model (for repairs of agent-node output): the override, the graph's, the default."""
        chosen = self.options.model or self.spec.model
        if chosen is not None and not isinstance(chosen, str):
            return chosen
        from ringlet.models.providers import default_model, resolve_model

        name = chosen or default_model()
        return self.options.models(name) if self.options.models is not None else resolve_model(name)

    def node_tools(self, node: LlmNode) -> list[Tool | Toolset]:
        """The tools an llm node lists, and only those."""
        out: list[Tool | Toolset] = []
        for name in node.tools:
            if name.startswith("mcp:"):
                out.append(self._server(name[4:]))
                continue
            tools = self._available()
            if self._provided is None:  # tools.sh is parsed once per agent, not once per node or attempt
                self._provided = [*self.spec.tool_names, *resources.own_tools(self.spec.directory)]
            provided = self._provided
            if name not in provided or name not in tools:
                offered = ", ".join([*provided, *(f"mcp:{s}" for s in self.spec.mcp_servers)]) or "(nothing)"
                raise ConfigError(f"llm node references unknown tool '{name}'. Agent '{self.name}' provides: "
                                  f"{offered}")
            out.append(tools[name]())
        return [*out, *self._granted(node, set(node.tools))]

    def node_skills(self, node: LlmNode) -> list[Any]:
        """The Loki skills an llm node runs with (`ringlet.agent.loki.Skill`): its `enabled_skills`, else the
        graph's, unless `skills_enabled` is false (the node's, else the graph's)."""
        spec = self.spec
        enabled = node.skills_enabled if node.skills_enabled is not None else spec.skills_enabled
        names = node.enabled_skills if node.enabled_skills is not None else spec.enabled_skills
        if enabled is False or not names:
            return []
        from ringlet.agent.loki import load_skill

        return [load_skill(name) for name in names]

    def skills_prompt(self, node: LlmNode) -> str | None:
        """The skills' instructions for a node's system prompt, or None (none, or injection turned off)."""
        skills = self.node_skills(node)
        inject = node.inject_skill_instructions if node.inject_skill_instructions is not None else \
            self.spec.inject_skill_instructions
        if not skills or not inject:
            return None
        from ringlet.agent.loki import skills_prompt

        return skills_prompt(skills, node.skill_instructions or self.spec.skill_instructions)

    def _granted(self, node: LlmNode, listed: set[str]) -> list[Tool]:
        """The tools a node's skills grant (`enabled_tools` of SKILL.md) that it does not list itself: the
        agent's tools by name, else files of Loki's functions/tools."""
        from ringlet.agent.loki import global_tool, tool_env
        from ringlet.graph.spec import strip_suffix

        out: list[Tool] = []
        for skill in self.node_skills(node):
            for entry in skill.tools:
                name = strip_suffix(entry)
                if name in listed:
                    continue
                listed.add(name)
                available = self._available()
                out.append(available[name]() if name in available else
                           global_tool(entry, tool_env(self.spec.directory, self.name)))
        return out

    def _available(self) -> dict[str, Callable[[], Tool]]:
        if self._tools is None:
            self._tools = resources.agent_tools(self.spec.directory, self.spec.global_tools)
        return self._tools

    def _server(self, name: str) -> Toolset:
        if name not in self._servers:
            if name not in self.spec.mcp_servers:
                raise ConfigError(f"llm node references unknown MCP server '{name}' (mcp:{name}); declared: "
                                  f"{', '.join(self.spec.mcp_servers) or 'none'}")
            servers = resources.mcp_servers(self.spec.directory)
            if name not in servers:
                raise ConfigError(f"MCP server '{name}' is not defined in the MCP config")
            from ringlet.mcp.oauth import toolset_for

            self._servers[name] = toolset_for(name, servers[name])
        return self._servers[name]

    def node_agent(self, node_id: str, node: LlmNode) -> Agent:
        """The Agent an llm node runs on: its model, its tools only, the graph's plugins and gates; no
        terminal tool, no compaction, and max_iterations is an error rather than a graceful answer."""
        agent = self._agents.get(node_id)
        if agent is None:
            temperature = node.temperature if node.temperature is not None else self.spec.temperature
            top_p = node.top_p if node.top_p is not None else self.spec.top_p
            agent = Agent(self.model_for(node), name=f"{self.name}.{node_id}", tools=self.node_tools(node),
                          model_settings=ModelSettings(temperature=temperature, top_p=top_p),
                          limits=Limits(max_iterations=node.max_iterations, on_max_iterations="error",
                                        max_blank_stops=1, terminal_tool=None, compaction=False),
                          execution=Execution(plugins=self.options.plugins, steps=self.options.steps),
                          gates=Gates(policies=self.options.gates, approvals=self.options.approvals))
            self._agents[node_id] = agent
        return agent

    def repair_agent(self, model: Model) -> Agent:
        """A tool-less agent on `model`, for the one output_schema repair request."""
        return Agent(model, name=f"{self.name}.repair",
                     limits=Limits(max_iterations=1, max_blank_stops=1, terminal_tool=None, compaction=False),
                     execution=Execution(plugins=self.options.plugins, steps=self.options.steps))

    def use_gates(self, gates: Iterable[Any], audit: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.options.gates = tuple(gates)
        for agent in self._agents.values():
            agent.use_gates(self.options.gates, audit=audit)

    # -- agent nodes ------------------------------------------------------------------------------------------

    def child(self, name: str) -> Any:
        if name not in self._children:
            resolver = self.options.resolver or self._default_resolver
            self._children[name] = resolver(name)
        return self._children[name]

    def _default_resolver(self, name: str) -> Any:
        directory = resources.agent_directory(name, self.spec.directory)
        if directory is None:
            raise ConfigError(f"Agent '{name}' not found")
        if self._load is None:
            raise ConfigError(f"Agent '{name}': this graph was given no agent loader (ringlet.graph.load_agent)")
        if self.options.steps is None:
            return self._load(directory, checkpoints=self.checkpoints)
        return self._load(directory, checkpoints=self.checkpoints, steps=self.options.steps)  # the graph's seam

    # -- rag nodes --------------------------------------------------------------------------------------------

    def _memory_for(self, node: RagNode) -> Any:
        from ringlet.memory import Memory
        from ringlet.store import Store

        store = self.options.store
        if isinstance(store, Store | str) or store is None:
            return Memory(store, embeddings=node.embedding_model)
        raise ConfigError(f"the graph's store must be a Store or a database URL, not {type(store).__name__}")

    def knowledge(self, node_id: str) -> Any:
        kb = self._kbs.get(node_id)
        if kb is None:
            from ringlet.memory.documents import KnowledgeBase

            node = self.spec.nodes[node_id]
            assert isinstance(node, RagNode)
            kb = self._kbs[node_id] = KnowledgeBase(self.name, node_id, node, self.spec.directory,
                                                    self._memory_for(node))
        return kb

    async def prepare(self) -> None:
        """Build the rag knowledge bases (once; again when their documents changed)."""
        if self.ready:
            return
        self._prepared = self._prepared or asyncio.Lock()
        async with self._prepared:
            if self.ready:
                return
            for node_id, node in self.spec.nodes.items():
                if isinstance(node, RagNode):
                    await self.knowledge(node_id).ensure_built(self.options.confirm_rag)
            self.ready = True

    async def warm(self) -> None:
        """Load the in-process models of the llm nodes (`LocalModel.warm`, once) before a run sends its first
        event. llama.cpp silences the whole process while it loads a model (llama-cpp-python points file
        descriptors 1 and 2 at /dev/null), so whatever the run printed meanwhile was lost: the CLI's `▸ … start`
        line of the llm node that loaded it, `--events` lines. Best effort: a model that cannot be built or
        loaded fails its node, as before."""
        if self._warmed:
            return
        self._warmed = True
        from ringlet.models.providers import default_model

        done: set[Any] = set()
        for node in self.spec.nodes.values():
            if not isinstance(node, LlmNode):
                continue
            chosen = self.options.model or node.model or self.spec.model
            if (chosen is None or isinstance(chosen, str)) and (
                    self.options.models is not None or not (chosen or default_model()).startswith("local:")):
                continue  # only the embedded models are built here, and never through the caller's factory
            try:
                model: Any = self.model_for(node)
            except ConfigError:
                continue
            while getattr(model, "inner", None) is not None:  # RetryingModel and other wrappers
                model = model.inner
            warm, key = getattr(model, "warm", None), getattr(model, "path", None)
            if callable(warm) and key not in done:
                done.add(key)
                try:
                    await asyncio.to_thread(warm)
                except Exception:
                    log.debug("graph %s: warming %s failed", self.name, getattr(model, "name", model), exc_info=True)

    async def aclose(self) -> None:
        for agent in self._agents.values():
            await agent.aclose()
        for server in self._servers.values():
            close = getattr(server, "aclose", None)
            if close is not None:
                await close()
        for kb in self._kbs.values():
            await kb.memory.close()
        for child in self._children.values():
            close = getattr(child, "aclose", None)
            if close is not None:
                await close()
