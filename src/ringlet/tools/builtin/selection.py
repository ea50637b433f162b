"""The built-in tools by name (`builtin-tools-and-subagents.md` §1): what `builtin_tools:` selects from.

`summary` is the loop's terminal tool and `spawn_agent` / `dispatch_sub_agent` need the agent layer, so
they are named here but built elsewhere; every other name maps to a tool of this package.
"""

from __future__ import annotations

from ringlet.tools.base import Tool
from ringlet.tools.builtin.calculate import calculate
from ringlet.tools.builtin.clock import current_time
from ringlet.tools.builtin.question import ask_question_tool
from ringlet.tools.builtin.schedules import SCHEDULE_TOOLS
from ringlet.tools.builtin.web import WebFetchSettings, web_fetch_tool

SPAWN_NAMES = ("spawn_agent", "dispatch_sub_agent")
DEFAULT_BUILTINS = ("summary", "ask_question", *(t.name for t in SCHEDULE_TOOLS), "web_fetch")
"""Every agent's built-in tools unless its `builtin_tools:` says otherwise (plus `spawn_agent` with
`can_spawn_agents: true`)."""
BUILTIN_TOOLS: dict[str, Tool] = {t.name: t for t in (current_time, calculate, ask_question_tool(), *SCHEDULE_TOOLS,
                                                      web_fetch_tool())}
BUILTIN_NAMES = ("summary", *BUILTIN_TOOLS, *SPAWN_NAMES)


def builtin_tool(name: str, *, web_fetch: WebFetchSettings | None = None) -> Tool:
    """The built-in tool of this name (`web_fetch` with its settings)."""
    if name == "web_fetch" and web_fetch is not None:
        return web_fetch_tool(web_fetch)
    return BUILTIN_TOOLS[name]
