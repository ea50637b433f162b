"""Tools: `@tool`, the two-method toolset protocol, the per-run registry, result encoding; the built-in tools
in `builtin/`."""

from ringlet.tools.base import ArgumentsInvalid, StaticToolset, Tool, Toolset, encode_result, truncate
from ringlet.tools.function import function_tool, tool
from ringlet.tools.registry import Registry, check_unique

__all__ = [
    "ArgumentsInvalid",
    "Registry",
    "StaticToolset",
    "Tool",
    "Toolset",
    "check_unique",
    "encode_result",
    "function_tool",
    "tool",
    "truncate",
]
