"""Memory: the knowledge store's tools, context notes, compaction and embeddings.

    memory = Memory("sqlite+aiosqlite:///memory.db", embeddings="local")
    agent = Agent(model, tools=[memory])

Everything is scoped to the run's realm (`memory-and-context.md` §1): the tools, the `<memory>` and
`<graph_context>` notes built before each turn, and the search behind them. The names below load on first
use: the store they bring is not part of `import ringlet`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ringlet.memory.compaction import CompactionConfig
    from ringlet.memory.core import Memory, memory_of, scope_of
    from ringlet.memory.settings import GraphConfig, MemoryConfig
    from ringlet.memory.tools import memory_toolset, remember

_WHERE = {"GraphConfig": "settings", "Memory": "core", "MemoryConfig": "settings", "memory_of": "core",
          "scope_of": "core", "memory_toolset": "tools", "remember": "tools", "CompactionConfig": "compaction"}
__all__ = ["CompactionConfig", "GraphConfig", "Memory", "MemoryConfig", "memory_of", "memory_toolset", "remember",
           "scope_of"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'ringlet.memory' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ringlet.memory.{_WHERE[name]}"), name)
