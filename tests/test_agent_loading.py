"""Agent directories load from the agent layer (issue 17): `ringlet.agent.config.load_agent` builds config.yaml
agents itself and other kinds through the loaders it is given (`kinds`); `ringlet.graph.load_agent` gives it
graph.yaml agents', and the CLI and the server call that one, so the agent layer never imports the graph
layer, and no import is made for its side effect (issue 53). The processes here start fresh."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ringlet.agent import config
from ringlet.agent.config import AgentSpec, load_agent
from ringlet.errors import ConfigError
from ringlet.testing import ScriptedModel
from test_graph_support import EXAMPLES


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RINGLET_DATA_DIR": str(tmp_path), "RINGLET_AGENTS_DIR": str(tmp_path / "agents")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          check=False)


def test_the_agent_layer_loads_config_agents_on_its_own(tmp_path: Path) -> None:
    done = _python(f"""
import sys
from ringlet.agent.config import load_agent
from ringlet.errors import ConfigError
from ringlet.testing import ScriptedModel

print(type(load_agent({str(EXAMPLES / "helper")!r}, model=ScriptedModel([]))).__name__)
try:
    load_agent({str(EXAMPLES / "triage")!r})
except ConfigError as exc:
    print(exc)
print(sorted(m for m in sys.modules if m.startswith("ringlet.graph")))
""", tmp_path)
    assert done.returncode == 0, done.stderr
    built, refused, graph_modules = done.stdout.splitlines()
    assert built == "Agent"
    assert refused.endswith("'triage' is a graph agent and nothing here loads graph agents; load it with "
                            "ringlet.graph.load_agent")
    assert graph_modules == "[]"


def test_ringlet_graph_load_agent_loads_both_kinds() -> None:
    from ringlet.agent import Agent
    from ringlet.graph import GraphAgent
    from ringlet.graph import load_agent as public

    assert isinstance(public(EXAMPLES / "triage" / "graph.yaml", model=ScriptedModel([])), GraphAgent)
    assert isinstance(public(EXAMPLES / "helper", model=ScriptedModel([])), Agent)
    with pytest.raises(ConfigError, match=r"load it with ringlet\.graph\.load_agent"):
        load_agent(EXAMPLES / "triage")  # the agent layer's own, given no kinds: importing graph changed nothing
    assert not hasattr(config, "register_kind")


def test_a_given_loader_gets_the_spec_model_variables_and_options() -> None:
    seen: list[tuple[AgentSpec, dict[str, Any]]] = []

    def loader(spec: AgentSpec, /, **options: Any) -> str:
        seen.append((spec, options))
        return "built"

    model = ScriptedModel([])
    assert load_agent(EXAMPLES / "triage", model=model, variables={"a": "1"}, kinds={"graph": loader},
                      checkpoints="cp") == "built"
    spec, options = seen[0]
    assert (spec.name, spec.kind, spec.directory) == ("triage", "graph", EXAMPLES / "triage")
    assert options == {"model": model, "variables": {"a": "1"}, "checkpoints": "cp"}


def test_an_empty_directory_is_no_agent(tmp_path: Path) -> None:
    """One rule, one message (graph-workflows.md §1), however the directory is found."""
    empty = tmp_path / "empty"
    empty.mkdir()
    message = f"^Agent 'empty' has neither a config.yaml nor a graph.yaml at '{empty}'$"
    with pytest.raises(ConfigError, match=message):
        load_agent(empty)
    with pytest.raises(ConfigError, match=message):
        config.find(str(empty))


@pytest.mark.slow
def test_the_server_hosts_graph_agents(tmp_path: Path) -> None:
    done = _python(f"""
from pathlib import Path
from ringlet.server.catalog import Catalog

print(type(Catalog.from_dir(Path({str(EXAMPLES)!r})).get("triage").agent()).__name__)
""", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "GraphAgent"


def test_the_cli_runs_graph_agents(tmp_path: Path) -> None:
    graph = tmp_path / "echo"
    graph.mkdir()
    (graph / "graph.yaml").write_text("name: echo\nstart: z\nnodes: {z: {type: end, output: '{{initial_prompt}}!'}}\n")
    done = subprocess.run([sys.executable, "-m", "ringlet", "run", str(graph), "hi"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "RINGLET_DATA_DIR": str(tmp_path)}, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "hi!"
