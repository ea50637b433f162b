"""Finding agents on disk: an agent directory holds `config.yaml` (a loop agent) or `graph.yaml` (a graph
agent), never both. `discover` lists the built-in agents and those of `RINGLET_AGENTS_DIR`; `find` takes a
name or a path."""

from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from ringlet.agent.config.parse import load_config
from ringlet.agent.config.schema import AgentConfig
from ringlet.errors import ConfigError

log = logging.getLogger("ringlet.agent")

BUILTIN_DIR = Path(__file__).parent.parent / "builtin"


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """An agent found on disk: its name, kind, directory and (for loop agents) its config."""

    name: str
    kind: Literal["loop", "graph"]
    directory: Path
    config: AgentConfig | None
    builtin: bool = False

    @property
    def description(self) -> str:
        """The config's description, or a graph's (`description:` of graph.yaml; "" when it cannot be read:
        listing agents never fails on one, `ringlet graph validate` says what is wrong)."""
        if self.config is not None:
            return self.config.description
        try:
            data = yaml.safe_load((self.directory / "graph.yaml").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return ""
        return str(cast("dict[str, Any]", data).get("description") or "") if isinstance(data, dict) else ""


def agents_dir() -> Path:
    return Path(os.environ.get("RINGLET_AGENTS_DIR", "~/.config/ringlet/agents")).expanduser()


def _kind(directory: Path) -> Literal["loop", "graph"]:
    has_config, has_graph = (directory / "config.yaml").is_file(), (directory / "graph.yaml").is_file()
    if has_config and has_graph:
        raise ConfigError(f"{directory}: has both config.yaml and graph.yaml; an agent is one or the other, "
                          "so remove one of them")
    if not (has_config or has_graph):
        raise ConfigError(f"Agent '{directory.name}' has neither a config.yaml nor a graph.yaml at '{directory}'")
    return "loop" if has_config else "graph"


def load_spec(directory: Path, *, builtin: bool = False) -> AgentSpec:
    kind = _kind(directory)
    config = load_config(directory / "config.yaml") if kind == "loop" else None
    name = (config.name if config and config.name else None) or directory.name
    return AgentSpec(name, kind, directory, config, builtin)


def discover(root: Path | None = None) -> dict[str, AgentSpec]:
    """Every agent by name: the built-in ones, then those of `root` (default `RINGLET_AGENTS_DIR`), which
    win on a clash. A broken agent directory is reported (logged) and left out of the list."""
    found: dict[str, AgentSpec] = {}
    for folder, builtin in ((BUILTIN_DIR, True), (root or agents_dir(), False)):
        if not folder.is_dir():
            continue
        for directory in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            try:
                spec = load_spec(directory, builtin=builtin)
            except ConfigError as exc:
                log.warning("skipping agent: %s", exc)
                continue
            found[spec.name] = spec
    return found


def find(ref: str) -> AgentSpec:
    """An agent by name, or by the path of its directory or its config.yaml."""
    path = Path(ref).expanduser()
    if path.is_file() and path.name in ("config.yaml", "graph.yaml"):
        return load_spec(path.parent)
    if path.is_dir():
        return load_spec(path)
    agents = discover()
    if ref in agents:
        return agents[ref]
    from ringlet.models.loki import loki_dir

    lokis = loki_dir() / "agents" / ref  # a sub-agent a Loki agent names, where Loki keeps its agents
    if (lokis / "config.yaml").is_file() or (lokis / "graph.yaml").is_file():
        return load_spec(lokis)
    hint = difflib.get_close_matches(ref, agents, n=1)
    suggestion = f"did you mean {hint[0]!r}? " if hint else ""
    raise ConfigError(f"no agent named {ref!r}; {suggestion}known agents: {', '.join(sorted(agents)) or '(none)'} "
                      f"(agents live in {agents_dir()} or are given as a directory path)")
