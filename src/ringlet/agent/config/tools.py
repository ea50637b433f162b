"""The tools of a config agent: its own (`tools:`, tools.py, Loki's tools.sh and global tools, its skills'
tools), its built-ins, each with its `tools.<name>` settings, the catalog in front of connectors, and the
approval rules its settings make."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from ringlet.agent.config.schema import AgentConfig, ToolSettings
from ringlet.errors import ConfigError
from ringlet.gates.approval import ApprovalConfig, ApprovalRules
from ringlet.memory.settings import MemoryConfig
from ringlet.tools.base import StaticToolset, Tool, Toolset
from ringlet.tools.builtin.selection import BUILTIN_NAMES, DEFAULT_BUILTINS, SPAWN_NAMES, builtin_tool
from ringlet.tools.builtin.web import WebFetchSettings
from ringlet.tools.catalog import CatalogConfig
from ringlet.tools.function import function_tool


def file_tools(module: Any) -> dict[str, Tool]:
    """The tools a tools.py defines: its `@tool`s and the public functions defined in it (not imported)."""
    out: dict[str, Tool] = {}
    members = cast("dict[str, Any]", vars(module))
    for name, value in members.items():
        if name.startswith("_"):
            continue
        if isinstance(value, Tool):
            out[name] = value
        elif callable(value) and getattr(value, "__module__", None) == module.__name__ and not isinstance(value, type):
            out[name] = function_tool(value)
    return out


def resolve_tools(config: AgentConfig, directory: Path, *, name: str = "",
                  variables: Mapping[str, str] | None = None) -> dict[str, Tool]:
    """The agent's own tools: those named under `tools:` (`module:function`, functions of the directory's
    tools.py; built-in names there are settings of built-in tools, `builtins`), or every function of tools.py
    when there is no `tools:` (as Loki offers them); the `@cmd` functions of tools.sh; the `global_tools`
    (`ringlet.agent.loki`). `tools.<name>` settings apply to each."""
    from ringlet.agent import loki

    local = tools_module(directory) if (directory / "tools.py").is_file() else None
    out: dict[str, Tool] = {}
    if local is not None and "tools" not in config.model_fields_set:
        out |= {ref: _configured(tool, _settings(config, ref)) for ref, tool in file_tools(local).items()}
    own = loki.own_tools(directory, name or directory.name, variables)
    granted = [e for skill in agent_skills(config) for e in skill.tools if Path(e).stem not in own]
    for entry in [*config.global_tools, *granted]:
        if Path(entry).stem not in BUILTIN_NAMES and Path(entry).stem not in own:
            own[Path(entry).stem] = loki.global_tool(entry, loki.tool_env(directory, name or directory.name,
                                                                          variables))
    out |= {ref: _configured(tool, _settings(config, ref)) for ref, tool in own.items()}
    for ref in config.tools:
        if ref in out:
            continue
        if ref in BUILTIN_NAMES:
            continue
        module_name, sep, attr = ref.partition(":")
        if sep:
            try:
                target = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as exc:
                raise ConfigError(f"{directory / 'config.yaml'}: tool {ref!r} cannot be imported: {exc}") from None
        elif local is not None and hasattr(local, ref):
            target = getattr(local, ref)
        else:
            options = sorted(BUILTIN_NAMES) + sorted(n for n in dir(local or object()) if not n.startswith("_"))
            hint = difflib.get_close_matches(ref, options, n=1)
            raise ConfigError(f"{directory / 'config.yaml'}: unknown tool {ref!r}"
                              f"{f'; did you mean {hint[0]!r}?' if hint else ''} (use a built-in name, "
                              "module:function, or a function in the agent directory's tools.py)")
        out[ref] = _configured(target if isinstance(target, Tool) else function_tool(target), _settings(config, ref))
    return out


def agent_skills(config: AgentConfig) -> list[Any]:
    """The agent's Loki skills (`ringlet.agent.loki.Skill`), loaded (a missing one is a ConfigError)."""
    if config.skills_enabled is False or not config.enabled_skills:
        return []
    from ringlet.agent.loki import load_skill

    return [load_skill(name) for name in config.enabled_skills]


def builtin_names(config: AgentConfig) -> list[str]:
    """The built-in tools an agent gets: its `builtin_tools:` (or the default set), the sub-agent tools
    with `can_spawn_agents`, and the built-ins it names under `tools:`."""
    names = list(DEFAULT_BUILTINS if config.builtin_tools is None else config.builtin_tools)
    if config.can_spawn_agents:
        names += config.sub_agents.tool_names
    names += [ref for ref in config.tools if ref in BUILTIN_NAMES]
    names += [Path(entry).stem for entry in config.global_tools if Path(entry).stem in BUILTIN_NAMES]
    return list(dict.fromkeys(names))


def builtins(config: AgentConfig) -> list[Tool]:
    """The built-in tools of `builtin_names` that are tools of their own (not `summary`, which the loop
    handles, nor the sub-agent tools, which `build_agent` adds), each with its `tools.<name>` settings."""
    web = WebFetchSettings(config.web_fetch.allow_private, frozenset(config.web_fetch.allow_hosts))
    return [_configured(builtin_tool(n, web_fetch=web), _settings(config, n)) for n in builtin_names(config)
            if n != "summary" and n not in SPAWN_NAMES]


def _settings(config: AgentConfig, ref: str) -> ToolSettings | None:
    return config.tools.get(ref)


def _configured(tool: Tool, settings: ToolSettings | None) -> Tool:
    """The tool with its `effect`, `idempotent` and `timeout_s` overrides."""
    if settings is None:
        return tool
    changes = {k: v for k in ("effect", "idempotent", "timeout_s") if (v := getattr(settings, k)) is not None}
    return dataclasses.replace(tool, **changes) if changes else tool


def catalogued(config: AgentConfig, pinned: list[Tool], own: list[Tool], servers: list[Toolset]) -> list[Any]:
    """Built-in tools stay pinned; the agent's own tools (connector `tools`) and each MCP server (a connector
    by its name) go behind the catalog, which lists them directly while they are few."""
    catalog = config.catalog if isinstance(config.catalog, CatalogConfig) else \
        CatalogConfig(mode="on" if config.catalog else "off")
    if catalog.mode == "off":
        return [*pinned, *own, *servers]
    from ringlet.tools.catalog import Catalog

    connectors: dict[str, Toolset] = {"tools": StaticToolset(own)} if own else {}
    connectors |= {getattr(s, "name", f"server{i}"): s for i, s in enumerate(servers)}
    embedder = None
    memory = config.memory if isinstance(config.memory, MemoryConfig) else None
    if memory is not None and memory.embeddings is not None:
        from ringlet.memory.embeddings import resolve_embedder

        embedder = resolve_embedder(memory.embeddings)
    return [*pinned, Catalog(connectors, config=catalog, embedder=embedder)] if connectors else pinned


def approval_rules(config: AgentConfig, own: dict[str, Tool], path: Path) -> ApprovalRules:
    """The approval gate of a config agent: `tools.<name>.approval`, `approval_defaults`,
    `approval_timeout_s` (an invalid pattern is a load error naming the tool, field, index and pattern)."""
    per_tool: dict[str, ApprovalConfig] = {}
    for ref, settings in config.tools.items():
        if settings is not None and settings.approval is not None:
            per_tool[own[ref].name if ref in own else ref] = settings.approval
    return ApprovalRules(per_tool, defaults=config.approval_defaults, timeout_s=config.approval_timeout_s,
                         source=str(path))


def tools_module(directory: Path) -> Any:
    from ringlet.agent.loki import import_file

    return import_file(directory / "tools.py")
