"""What a graph's names refer to outside graph.yaml: tools, MCP servers, skills, models and sibling agents.

The validator asks these questions; the engine uses the same answers to build `llm` and `agent` nodes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from ringlet.agent.loki import mcp_config_path
from ringlet.errors import ConfigError
from ringlet.graph.spec import strip_suffix
from ringlet.tools.base import Tool
from ringlet.tools.builtin.selection import BUILTIN_TOOLS

__all__ = [
    "SKILL_NAME",
    "agent_directory",
    "agent_tools",
    "global_tool_problem",
    "installed_skills",
    "mcp_config_path",
    "mcp_servers",
    "model_known",
    "own_tools",
]

SKILL_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
"""Skill names: lowercase letters, digits and single hyphens, at most 64 characters."""


def own_tools(directory: Path) -> dict[str, Callable[[], Tool]]:
    """The agent's own tools, by name: the functions of its tools.py and the `@cmd` functions of its
    tools.sh (offered to llm nodes without being listed in global_tools, as in Loki). Values build the
    Tool on demand (tools.py is imported only when asked)."""
    from ringlet.agent import loki
    from ringlet.agent.config.tools import file_tools, tools_module  # the same module cache as config agents

    out: dict[str, Callable[[], Tool]] = {}
    if (directory / "tools.py").is_file():
        out |= {name: (lambda t=t: t) for name, t in file_tools(tools_module(directory)).items()}
    out |= {name: (lambda t=t: t) for name, t in loki.own_tools(directory, directory.name).items()}
    return out


def agent_tools(directory: Path, global_tools: Sequence[str] = ()) -> dict[str, Callable[[], Tool]]:
    """The tools a graph agent can offer, by name: the built-in tools, its own (`own_tools`), and the files
    of Loki's functions/tools that `global_tools` names (`ringlet.agent.loki`; one that is not there is
    left out: `global_tool_problems` says why)."""
    from ringlet.agent import loki

    out: dict[str, Callable[[], Tool]] = {name: (lambda t=t: t) for name, t in BUILTIN_TOOLS.items()}
    out |= own_tools(directory)
    for entry in global_tools:
        if strip_suffix(entry) not in out and global_tool_problem(entry) is None:
            env = loki.tool_env(directory, directory.name)
            out[strip_suffix(entry)] = lambda e=entry, env=env: loki.global_tool(e, env)
    return out


def global_tool_problem(entry: str) -> str | None:
    """Why a `global_tools` entry that is no built-in names no tool file, if it does not."""
    from ringlet.agent.loki import global_tool_path

    try:
        global_tool_path(entry)
    except ConfigError as exc:
        return str(exc)
    return None


def mcp_servers(directory: Path) -> dict[str, Any]:
    """The servers of the MCP config by name (empty when there is no config)."""
    path = mcp_config_path(directory)
    if path is None:
        return {}
    from ringlet.mcp.config import load_servers

    return load_servers(str(path), base=directory)


def installed_skills() -> set[str]:
    """Skills installed for this user (`ringlet.agent.loki.installed_skills`: ringlet's and Loki's)."""
    from ringlet.agent.loki import installed_skills as found

    return set(found())


@cache
def model_known(name: str) -> bool:
    """Whether an installed provider handles the `provider:` prefix of a model name (no network)."""
    from ringlet.models.providers import PROVIDERS, installed, provider_for

    provider, sep, _ = name.partition(":")
    try:
        provider = provider_for(provider, {})[0]  # Loki's names: `claude:`, a client of its config.yaml
    except ConfigError:
        return False
    return bool(sep) and provider in PROVIDERS and installed(PROVIDERS[provider])


def agent_directory(name: str, near: Path) -> Path | None:
    """The directory of agent `name`: a sibling of the graph's own directory, else a discovered agent, else
    one of Loki's agents folder."""
    sibling = near.parent / name
    if (sibling / "config.yaml").is_file() or (sibling / "graph.yaml").is_file():
        return sibling
    from ringlet.agent.config import discover

    try:
        found = discover().get(name)
    except ConfigError:
        return None
    if found is not None:
        return found.directory
    from ringlet.models.loki import loki_dir

    lokis = loki_dir() / "agents" / name  # where Loki keeps its agents
    return lokis if (lokis / "config.yaml").is_file() or (lokis / "graph.yaml").is_file() else None
