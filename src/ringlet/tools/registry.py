"""The tools of one run: every toolset listed once, names checked for clashes, calls routed to owners."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ringlet.context import RunContext
from ringlet.errors import ConfigError
from ringlet.messages import ToolDefinition
from ringlet.tools.base import Tool, Toolset

MAX_LISTED = 50


def check_unique(named: Iterable[tuple[str, str]]) -> None:
    """Raise ConfigError on a name used twice; `named` yields (tool name, where it comes from)."""
    seen: dict[str, str] = {}
    for name, origin in named:
        if name in seen:
            raise ConfigError(
                f"tool name {name!r} is defined twice ({seen[name]} and {origin}); rename one of them "
                "(the first one does not silently win)")
        seen[name] = origin


async def listed(toolsets: Sequence[Toolset], ctx: RunContext) -> list[tuple[Toolset, Tool]]:
    """Every tool of `toolsets` for this run, with the toolset it comes from."""
    return [(ts, t) for ts in toolsets for t in await ts.list_tools(ctx)]


def origin_of(toolset: Toolset) -> str:
    return getattr(toolset, "label", None) or type(toolset).__name__


@dataclass(frozen=True, slots=True)
class Registry:
    """Name -> (toolset, tool) for one run, plus the definitions offered to the model."""

    routes: dict[str, tuple[Toolset, Tool]]
    definitions: tuple[ToolDefinition, ...]
    tool_tokens: int

    @classmethod
    async def build(cls, toolsets: Sequence[Toolset], ctx: RunContext) -> Registry:
        """List every toolset (for this run) and route each name to its owner."""
        return cls.of(await listed(toolsets, ctx))

    @classmethod
    def of(cls, listed: Sequence[tuple[Toolset, Tool]]) -> Registry:
        check_unique((t.name, origin_of(ts)) for ts, t in listed)
        definitions = tuple(t.definition for _, t in listed)
        return cls({t.name: (ts, t) for ts, t in listed}, definitions, sum(t.tokens for _, t in listed))

    def unknown_message(self, name: str) -> str:
        names = sorted(self.routes)
        shown = ", ".join(names[:MAX_LISTED]) + (", …" if len(names) > MAX_LISTED else "")
        return f"unknown tool {name!r}. Available tools: {shown or '(none)'}"
