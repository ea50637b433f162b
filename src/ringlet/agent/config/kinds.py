"""Any kind of agent directory: `load_agent` builds a config.yaml agent itself and other kinds with the loaders
it is handed (`kinds`): `ringlet.graph.load_agent` is this one with graph agents among them (what the CLI and
the server call), so the agent layer never imports the graph layer."""

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


def load_agent(spec: AgentSpec | Path | str, *, model: Any = None, variables: Mapping[str, str] | None = None,
               kinds: Mapping[str, AgentLoader] | None = None, **options: Any) -> Any:
    """The agent of a directory: an `Agent` for config.yaml (`build_agent`; `options` do not apply, and its
    sub-agents are loaded here with the same `kinds`, so they may be of any of them), else what the loader of
    its kind in `kinds` builds. `spec` is an `AgentSpec`, a directory, or its config.yaml/graph.yaml."""
    if not isinstance(spec, AgentSpec):
        path = Path(spec)
        spec = load_spec(path.parent if path.is_file() else path)
    if spec.kind == "loop":
        return build_agent(spec, model=model, variables=dict(variables or {}),
                           children=lambda name: load_agent(find(name), kinds=kinds))
    loader = (kinds or {}).get(spec.kind)
    if loader is None:
        raise ConfigError(f"{spec.directory}: {spec.name!r} is a {spec.kind} agent and nothing here loads "
                          f"{spec.kind} agents; load it with ringlet.graph.load_agent")
    return loader(spec, model=model, variables=variables, **options)
