"""Graph agents: `graph.yaml` parsed into models (`spec`, `parse`), checked (`validate`), then run in BSP
super-steps by the engine, with `llm` nodes on ringlet's own loop.

    agent = load_agent(find("triage"))          # an Agent for config.yaml, a GraphAgent for graph.yaml
    result = await agent.run("Sort these tickets")
    print(result.output)                        # the End node's output

`load_agent` is `ringlet.agent.config.load_agent` with graph agents among the kinds it builds. Names are
imported on first use, so `import ringlet.graph` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ringlet.graph.agent import GraphAgent, GraphResult, GraphStream, load_agent
    from ringlet.graph.checkpoint import (
        Checkpoint,
        CheckpointHistory,
        CheckpointStore,
        FileCheckpoints,
        MemoryCheckpoints,
    )
    from ringlet.graph.fork import ForkError, ForkFrom, StatePatchError
    from ringlet.graph.human import Question
    from ringlet.graph.mermaid import to_mermaid
    from ringlet.graph.parse import GraphLoadError, agent_kind, load_graph, parse_graph
    from ringlet.graph.spec import GraphSpec
    from ringlet.graph.validate import Checks, GraphValidationError, Issue, Report, validate_graph

_EXPORTS = {
    "Checkpoint": "ringlet.graph.checkpoint",
    "CheckpointHistory": "ringlet.graph.checkpoint",
    "CheckpointStore": "ringlet.graph.checkpoint",
    "Checks": "ringlet.graph.validate",
    "FileCheckpoints": "ringlet.graph.checkpoint",
    "ForkError": "ringlet.graph.fork",
    "ForkFrom": "ringlet.graph.fork",
    "GraphAgent": "ringlet.graph.agent",
    "GraphLoadError": "ringlet.graph.parse",
    "GraphResult": "ringlet.graph.agent",
    "GraphSpec": "ringlet.graph.spec",
    "GraphStream": "ringlet.graph.agent",
    "GraphValidationError": "ringlet.graph.validate",
    "Issue": "ringlet.graph.validate",
    "MemoryCheckpoints": "ringlet.graph.checkpoint",
    "Question": "ringlet.graph.human",
    "Report": "ringlet.graph.validate",
    "StatePatchError": "ringlet.graph.fork",
    "agent_kind": "ringlet.graph.parse",
    "load_agent": "ringlet.graph.agent",
    "load_graph": "ringlet.graph.parse",
    "parse_graph": "ringlet.graph.parse",
    "to_mermaid": "ringlet.graph.mermaid",
    "validate_graph": "ringlet.graph.validate",
}
__all__ = [
    "Checkpoint",
    "CheckpointHistory",
    "CheckpointStore",
    "Checks",
    "FileCheckpoints",
    "ForkError",
    "ForkFrom",
    "GraphAgent",
    "GraphLoadError",
    "GraphResult",
    "GraphSpec",
    "GraphStream",
    "GraphValidationError",
    "Issue",
    "MemoryCheckpoints",
    "Question",
    "Report",
    "StatePatchError",
    "agent_kind",
    "load_agent",
    "load_graph",
    "parse_graph",
    "to_mermaid",
    "validate_graph",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
