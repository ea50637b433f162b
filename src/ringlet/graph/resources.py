"""What a graph's names refer to outside graph.yaml: tools, MCP servers, skills, models and sibling agents.

The validator asks these questions; the engine uses the same answers to build `llm` and `agent` nodes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from ringlet.errors import ConfigError
from ringlet.tools.base import Tool
from ringlet.tools.builtin import BUILTIN_TOOLS
from ringlet.tools.function import function_tool

__all__ = [
    "SKILL_NAME",
    "agent_directory",
    "agent_tools",
    "installed_skills",
    "mcp_config_path",
    "mcp_servers",
    "model_known",
]

SKILL_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
"""Skill names: lowercase letters, digits and single hyphens, at most 64 characters."""


def agent_tools(directory: Path) -> dict[str, Callable[[], Tool]]:
    """The tools a graph agent can offer, by name: the built-in tools and the functions of its tools.py.
    Values build the Tool on demand (tools.py is imported only when asked)."""
    out: dict[str, Callable[[], Tool]] = {name: (lambda t=t: t) for name, t in BUILTIN_TOOLS.items()}
    if (directory / "tools.py").is_file():
        from ringlet.agent.config import _tools_module  # the same module cache as config agents

        module = _tools_module(directory)
        for name, value in vars(module).items():
            if name.startswith("_"):
                continue
            if isinstance(value, Tool):
                out[name] = lambda v=value: v
            elif callable(value) and getattr(value, "__module__", None) == module.__name__ \
                    and not isinstance(value, type):
                out[name] = lambda v=value: function_tool(v)
    return out


def mcp_config_path(directory: Path) -> Path | None:
    """The MCP config (`mcp.json`, `mcpServers` shape) a graph's `mcp_servers` names come from: the agent
    directory's, then the agents folder's, then `RINGLET_MCP_CONFIG`, then ~/.config/ringlet/mcp.json."""
    candidates = [directory / "mcp.json", directory.parent / "mcp.json"]
    if os.environ.get("RINGLET_MCP_CONFIG"):
        candidates.append(Path(os.environ["RINGLET_MCP_CONFIG"]).expanduser())
    candidates.append(Path("~/.config/ringlet/mcp.json").expanduser())
    return next((p for p in candidates if p.is_file()), None)


def mcp_servers(directory: Path) -> dict[str, Any]:
    """The servers of the MCP config by name (empty when there is no config)."""
    path = mcp_config_path(directory)
    if path is None:
        return {}
    from ringlet.mcp.client import load_servers

    return load_servers(str(path), base=directory)


def skills_dir() -> Path:
    return Path(os.environ.get("RINGLET_SKILLS_DIR", "~/.config/ringlet/skills")).expanduser()


def installed_skills() -> set[str]:
    """Skills installed for this user: folders of the skills directory that hold a SKILL.md."""
    root = skills_dir()
    if not root.is_dir():
        return set()
    return {p.name for p in root.iterdir() if (p / "SKILL.md").is_file()}


@cache
def model_known(name: str) -> bool:
    """Whether an installed provider handles the `provider:` prefix of a model name (no network)."""
    from ringlet.models.providers import PROVIDERS, installed

    provider, sep, _ = name.partition(":")
    return bool(sep) and provider in PROVIDERS and installed(PROVIDERS[provider])


def agent_directory(name: str, near: Path) -> Path | None:
    """The directory of agent `name`: a sibling of the graph's own directory, else a discovered agent."""
    sibling = near.parent / name
    if (sibling / "config.yaml").is_file() or (sibling / "graph.yaml").is_file():
        return sibling
    from ringlet.agent.config import discover

    try:
        found = discover().get(name)
    except ConfigError:
        return None
    return found.directory if found is not None else None
