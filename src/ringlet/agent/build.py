"""How an `Agent` is put together: its tools grouped into toolsets, its settings groups made the loop's one
`LoopSettings`, its compaction, and the config of a run that differs from the agent's (`RunSettings`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from ringlet.agent.settings import (
    DEFAULT_EXECUTION,
    DEFAULT_LIMITS,
    DEFAULT_MODEL_SETTINGS,
    Execution,
    Limits,
    RunSettings,
    SubAgents,
    ToolLike,
)
from ringlet.errors import ConfigError
from ringlet.hooks.dispatch import PluginActions
from ringlet.hooks.plugin import Plugin
from ringlet.loop import LoopConfig, LoopSettings
from ringlet.loop.settings import DEFAULT_SETTINGS
from ringlet.memory.compaction import CompactionConfig
from ringlet.memory.settings import MemoryConfig
from ringlet.models.base import ModelSettings
from ringlet.models.pricing import DEFAULT_PRICING
from ringlet.models.providers import resolve_model
from ringlet.output import Output
from ringlet.tools.base import StaticToolset, Tool, Toolset
from ringlet.tools.function import function_tool
from ringlet.tools.registry import check_unique, origin_of

LIMIT_FIELDS = ("max_iterations", "on_max_iterations", "max_tokens_per_turn", "max_cost_usd_per_run",
                "max_blank_stops", "blank_stop_nudge", "max_repeated_tool_errors", "terminal_tool",
                "question_timeout_s")
EXECUTION_FIELDS = ("hook_timeout_s", "strict_plugins", "parallel_tools", "max_tool_concurrency", "batch_timeout_s",
                    "tool_result_max_chars")


def for_run(config: LoopConfig, agent: AgentGroups, run: RunSettings) -> tuple[LoopConfig, LoopSettings]:
    """The config and settings of one run: another model, more instructions and tools, other settings."""
    changes: dict[str, Any] = {}
    model = run.model
    if isinstance(model, str):  # the agent's own model by name is the agent's own instance
        model = config.model if model == config.model.name else resolve_model(model)
    if model is not None:
        changes["model"] = model
    if run.instructions:
        own = config.instructions
        changes["instructions"] = f"{own}\n\n{run.instructions}" if own else run.instructions
    extra = toolsets_of(run.tools, ()) if run.tools else ()
    if extra:
        toolsets = (*config.toolsets, *extra)
        check_unique((t.name, origin_of(ts)) for ts in toolsets for t in ts.static_tools or ())
        changes |= {"toolsets": toolsets, "registry": None}
    settings = config.settings
    if run.model_settings is not None or run.limits is not None:
        settings = loop_settings(run.limits or agent.limits, agent.execution,
                                 run.model_settings or agent.model_settings)
        if run.limits is not None:
            changes |= {"pricing": run.limits.pricing or DEFAULT_PRICING, **compaction(run.limits.compaction)}
    return replace(config, **changes, settings=settings), settings


class AgentGroups(Protocol):
    """The settings groups of an agent that a run's own `limits` or `model_settings` complete."""

    @property
    def limits(self) -> Limits: ...

    @property
    def execution(self) -> Execution: ...

    @property
    def model_settings(self) -> ModelSettings: ...


_DEFAULT_COMPACTION = CompactionConfig.model_construct()  # valid defaults: no schema built at import


def loop_settings(limits: Limits, execution: Execution, sampling: ModelSettings) -> LoopSettings:
    """The loop's one validated settings value, from the agent's groups."""
    if limits is DEFAULT_LIMITS and execution is DEFAULT_EXECUTION and sampling is DEFAULT_MODEL_SETTINGS:
        return DEFAULT_SETTINGS
    values = {f: getattr(limits, f) for f in LIMIT_FIELDS} | {f: getattr(execution, f) for f in EXECUTION_FIELDS}
    values |= {"temperature": sampling.temperature, "top_p": sampling.top_p, "max_output_tokens": sampling.max_tokens,
               "prompt_cache": sampling.prompt_cache, "cache_points": sampling.cache_points,
               "cache_key": sampling.cache_key}
    return LoopSettings.build(**{k: v for k, v in values.items() if v != LoopSettings.model_fields[k].default})


def capabilities(tools: Iterable[Any]) -> tuple[list[Any], Any, SubAgents | None]:
    """The agent's tools apart from the capabilities among them: its memory (a `Memory` or a
    `MemoryConfig`) and its `SubAgents`."""
    plain: list[Any] = []
    memory, sub_agents = None, None
    for t in tools:
        if isinstance(t, SubAgents):
            sub_agents = t
        elif isinstance(t, MemoryConfig) or any(f"{c.__module__}.{c.__qualname__}" == "ringlet.memory.core.Memory"
                                                 for c in type(t).__mro__):
            memory = t  # (Memory is not imported to check: it brings the store)
        else:
            plain.append(t)
    return plain, memory, sub_agents


def check_output_name(output: Output | None, toolsets: Sequence[Toolset]) -> None:
    """Tool mode's final-result tool needs a name no tool of the agent has."""
    if output is not None and output.mode == "tool" and any(
            t.name == output.name for ts in toolsets for t in ts.static_tools or ()):
        raise ConfigError(f"the output tool's name {output.name!r} is taken by a tool of the agent; give the "
                          "output another name: ToolOutput(type, name=...)")


def compaction(value: CompactionConfig | bool) -> dict[str, Any]:
    """`compaction=`: True (the defaults, one shared instance), False (never), or a CompactionConfig."""
    config = _DEFAULT_COMPACTION if value is True else value or None
    if config is None or not config.enabled:
        return {"compaction": None}
    return {"compaction": config, "compaction_model": resolve_model(config.model) if config.model else None}


def toolsets_of(tools: Iterable[ToolLike], plugins: Sequence[Plugin]) -> tuple[Toolset, ...]:
    """Group loose tools and functions into one toolset, add plugin actions, reject duplicate names."""
    loose: list[Tool] = []
    sets: list[Toolset] = []
    for t in tools:
        if isinstance(t, Tool):
            loose.append(t)
        elif isinstance(t, Toolset):
            sets.append(t)
        elif callable(t):
            loose.append(function_tool(t))
        else:
            raise ConfigError(f"tools must be @tool functions, Tool objects or Toolsets, got {t!r}")
    if loose:
        sets.insert(0, StaticToolset(loose))
    sets += [PluginActions(p) for p in plugins if p.actions]
    check_unique((t.name, origin_of(ts)) for ts in sets for t in ts.static_tools or ())
    return tuple(sets)
