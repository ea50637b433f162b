"""From a loop agent's `AgentConfig` to its `Agent`: instructions with their variables, loop settings,
model, tools, MCP servers, plugins, gates and sub-agents."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from ringlet.agent.config.discovery import AgentSpec, find
from ringlet.agent.config.schema import AgentConfig, PromptCache
from ringlet.agent.config.tools import agent_skills, approval_rules, builtin_names, builtins, catalogued, resolve_tools
from ringlet.agent.subagents import SubAgentSettings
from ringlet.errors import ConfigError
from ringlet.guardrails.config import build_guardrails
from ringlet.hooks.plugin import Plugin, PrePromptContext
from ringlet.loop.settings import LoopSettings
from ringlet.memory.settings import MemoryConfig
from ringlet.tools.base import Tool, Toolset
from ringlet.tools.builtin.selection import SPAWN_NAMES

_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def render_instructions(config: AgentConfig, values: dict[str, str] | None = None,
                        tools: Sequence[Tool] = ()) -> str | None:
    """`{{variable}}` in the instructions, from `values` or the variables' defaults; Loki's special
    variables (`{{__os__}}`, `{{__now__}}`, `{{__tools__}}` listing `tools`, …) get their values. The
    instructions of the agent's skills follow (their special variables filled, other text as written)."""
    skills = agent_skills(config) if config.inject_skill_instructions else []
    if config.instructions is None and not skills:
        return None
    known: dict[str, str | None] = {v.name: v.default for v in config.variables} | (values or {})
    text = config.instructions or ""
    special: dict[str, str] = {}
    if "{{__" in text or skills:
        from ringlet.agent.loki import special_variables

        special = special_variables(tools)
        known = {**special, **known}

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if known.get(name) is None:
            raise ConfigError(f"instructions use {{{{{name}}}}} but no value was given; add a default to "
                              f"variables or pass it at run time")
        return str(known[name])

    text = _VAR.sub(sub, text)
    if skills:
        from ringlet.agent.loki import skills_prompt

        block = _VAR.sub(lambda m: special.get(m.group(1), m.group(0)),
                         skills_prompt(skills, config.skill_instructions))
        text = f"{text}\n\n{block}" if text else block
    return text


def loop_settings(config: AgentConfig, path: Path) -> dict[str, Any]:
    """The loop settings of a config: `max_iterations`, `temperature`, `top_p` and the `limits` block."""
    settings = {"max_iterations": config.max_iterations, **config.limits}
    if config.max_tool_result_chars is not None:
        settings.setdefault("tool_result_max_chars", config.max_tool_result_chars)
    for key in ("temperature", "top_p"):
        if getattr(config, key) is not None:
            settings[key] = getattr(config, key)
    cache = config.prompt_cache
    if cache != PromptCache():
        settings |= {"prompt_cache": cache.enabled, "cache_points": tuple(cache.points), "cache_key": cache.key}
    unknown = set(config.limits) - set(LoopSettings.model_fields)
    if unknown:
        key = sorted(unknown)[0]
        hint = difflib.get_close_matches(key, LoopSettings.model_fields, n=1)
        raise ConfigError(f"{path}: unknown limit {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
    return settings


def build_agent(spec: AgentSpec, *, model: Any = None, variables: dict[str, str] | None = None,
                children: Callable[[str], Any] | None = None) -> Any:
    """The `Agent` of an agent directory; `model` (a Model or `provider:model`) overrides the config's.
    `children` builds the agents its `spawn_agent` may start, by name (default: loop agents found by
    `find`, this one itself; `load_agent` passes one that builds every registered kind)."""
    from ringlet.agent import Agent
    from ringlet.agent.settings import Execution, Gates, Limits, ModelSettings, grouped
    from ringlet.models.pricing import Pricing
    from ringlet.models.providers import default_model, resolve_model

    if spec.kind == "graph" or spec.config is None:
        raise ConfigError(f"{spec.directory}: {spec.name!r} is a graph agent (graph.yaml); load it with "
                          "load_agent, not build_agent")
    config, path = spec.config, spec.directory / "config.yaml"
    values = {v.name: v.default for v in config.variables if v.default is not None} | (variables or {})
    if config.dynamic_instructions:
        from ringlet.agent.loki import dynamic_instructions

        config = config.model_copy(update={"instructions": dynamic_instructions(spec.directory, spec.name,
                                                                                values)})
    chosen = model or config.model or default_model()
    options = config.model_options if isinstance(chosen, str | list) and chosen == config.model else {}
    try:
        instance = resolve_model(cast("str | list[str]", chosen), **options) if isinstance(chosen, str | list) \
            else chosen
    except TypeError as exc:  # an option the provider does not take
        raise ConfigError(f"{path}: model_options for {chosen!r}: {exc}") from None
    prices = {name: p.model_dump(exclude_none=True) for name, p in config.pricing.items()}
    own = resolve_tools(config, spec.directory, name=spec.name, variables=values)
    servers: list[Toolset] = []
    if config.mcp_servers:
        from ringlet.mcp.config import load_servers
        from ringlet.mcp.oauth import toolset_for

        servers = [toolset_for(name, c) for name, c in _servers(config, spec.directory, load_servers).items()]
    names = builtin_names(config)
    settings = loop_settings(config, path)
    if "summary" not in names:
        settings.setdefault("terminal_tool", None)
    limits, execution, sampling = grouped(settings)
    plugins: list[Plugin] = []
    if mentioned := [s for s in servers if hasattr(s, "read_resource")]:  # `@server:uri` mentions in user
        plugins.append(MCPMentions(mentioned))  # messages get the resource's text (not behind OAuth: no user yet)
    if config.documents:
        from ringlet.agent.loki import AgentDocuments
        from ringlet.memory.documents import missing

        problems = [p for entry in config.documents if (p := missing(entry, spec.directory)) is not None]
        if problems:
            raise ConfigError(f"{path}: documents: {'; '.join(problems)}")

        plugins.append(AgentDocuments(spec.name, spec.directory, config.documents))
    if plugins:
        execution["plugins"] = [*execution.get("plugins", ()), *plugins]
    memory = [MemoryConfig() if config.memory is True else config.memory] if config.memory else []
    pinned = builtins(config)
    agent = Agent(instance, name=spec.name, instructions=render_instructions(config, variables,
                                                                           [*pinned, *own.values()]),
                  tools=[*catalogued(config, pinned, list(own.values()), servers), *memory],
                  output_type=_output(config), model_settings=ModelSettings(**sampling),
                  limits=Limits(**limits, pricing=Pricing(prices) if prices else None, compaction=config.compaction,
                                output_retries=config.output_retries),
                  execution=Execution(**execution) if execution else None,
                  gates=Gates(approvals=approval_rules(config, own, path), realm=config.realm,
                              guardrails=build_guardrails(config.guardrails, where=str(path))))
    spawn = [n for n in names if n in SPAWN_NAMES]
    if spawn:
        agent.enable_sub_agents(_children(agent, spec, children), SubAgentSettings(
            allowed=tuple(config.spawnable_agents or config.sub_agents.allowed or (spec.name,)),
            max_agent_depth=config.max_agent_depth,
            max_concurrent_agents=config.max_concurrent_agents, timeout_s=config.sub_agents.timeout_s), spawn)
    setattr(agent, "v1_approvals", config.v1_approvals)  # noqa: B010  read by the server's `/v1`
    return agent


def _servers(config: AgentConfig, directory: Path, load: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The agent's MCP servers: given in config.yaml, or (a list) named from the MCP config."""
    if not isinstance(config.mcp_servers, list):
        return load(config.mcp_servers, base=directory)
    from ringlet.agent.loki import mcp_config_path

    path = mcp_config_path(directory)
    defined = load(str(path), base=directory) if path is not None else {}
    missing = [n for n in config.mcp_servers if n not in defined]
    if missing:
        raise ConfigError(f"{directory / 'config.yaml'}: mcp_servers: {', '.join(missing)} not defined in "
                          f"{path or 'any MCP config'} (mcpServers of mcp.json in the agent directory, the agents "
                          "folder, RINGLET_MCP_CONFIG, or Loki's functions/mcp.json)")
    return {n: defined[n] for n in config.mcp_servers}


class MCPMentions(Plugin):
    """`@server:uri` in a user message attaches that MCP resource's text to it in the prompt
    (`ringlet.mcp.mentions`); each resource is read once per run."""

    name = "mcp_mentions"

    def __init__(self, servers: Sequence[Any]) -> None:
        self.servers = {s.name: s for s in servers}

    async def pre_prompt(self, ctx: PrePromptContext) -> None:
        from ringlet.mcp.mentions import expand

        ctx.messages[:] = await expand(ctx.messages, self.servers, ctx.plugin_data.setdefault(self.name, {}))


def _output(config: AgentConfig) -> Any:
    """`output_schema:` in its `output_mode`, or None (the answer is text)."""
    from ringlet.output import JsonSchema, NativeOutput, PromptedOutput, ToolOutput

    if config.output_schema is None:
        return None
    mode = {"tool": ToolOutput, "native": NativeOutput, "prompted": PromptedOutput}[config.output_mode]
    return mode(JsonSchema(config.output_schema))  # type: ignore[arg-type]


def _children(agent: Any, spec: AgentSpec, children: Callable[[str], Any] | None) -> Callable[[str], Any]:
    """Builds each child agent once: this agent itself by its own name, others by `children` or `find`."""
    built: dict[str, Any] = {spec.name: agent}

    def resolve(name: str) -> Any:
        if name not in built:
            built[name] = children(name) if children is not None else build_agent(find(name))
        return built[name]

    return resolve
