"""Any kind of agent directory: `load_agent` builds a config.yaml agent itself and other kinds with the loader
registered for them (`register_kind`): `ringlet.graph.agent` registers "graph" when it is imported
(`ringlet.graph.load_agent` does that; the CLI and the server import it), so the agent layer never imports the
graph layer."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ringlet.agent.config.build import build_agent
from ringlet.agent.config.discovery import AgentSpec, find, load_spec
from ringlet.errors import ConfigError


class AgentLoader(Protocol):
    """Builds the agent of an `AgentSpec` of one kind: `model` overrides the model its file names,
    `variables` are its variables' values, `options` are the kind's own (a graph's `checkpoints`, …)."""

    def __call__(self, spec: AgentSpec, /, *, model: Any = None, variables: Mapping[str, str] | None = None,
                 **options: Any) -> Any: ...


_LOADERS: dict[str, AgentLoader] = {}


def register_kind(kind: str, loader: AgentLoader) -> None:
    """Let `load_agent` (and so a loop agent's sub-agents) build agents of `kind` (`AgentSpec.kind`)."""
    _LOADERS[kind] = loader


def load_agent(spec: AgentSpec | Path | str, *, model: Any = None, variables: Mapping[str, str] | None = None,
               **options: Any) -> Any:
    """The agent of a directory: an `Agent` for config.yaml (`build_agent`; `options` do not apply, and its
    sub-agents are loaded here, so they may be of any kind), else what the loader registered for its kind
    builds. `spec` is an `AgentSpec`, a directory, or its config.yaml/graph.yaml."""
    if not isinstance(spec, AgentSpec):
        path = Path(spec)
        spec = load_spec(path.parent if path.is_file() else path)
    if spec.kind == "loop":
        return build_agent(spec, model=model, variables=dict(variables or {}),
                           children=lambda name: load_agent(find(name)))
    loader = _LOADERS.get(spec.kind)
    if loader is None:
        raise ConfigError(f"{spec.directory}: {spec.name!r} is a {spec.kind} agent and nothing here loads "
                          f"{spec.kind} agents; import ringlet.graph.agent first (ringlet.graph.load_agent does)")
    return loader(spec, model=model, variables=variables, **options)
