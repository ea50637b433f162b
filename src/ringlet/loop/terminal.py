"""The terminal tool (`loop-and-hooks.md` §1): a tool whose call is the run's final answer; and typed
output's final-result tool (`ringlet.output`), whose call is the run's result."""

from __future__ import annotations

import functools
from typing import Any

from ringlet.context import RunContext
from ringlet.output import Output
from ringlet.tools.base import ArgumentsInvalid, Tool, Toolset


@functools.cache
def terminal_tool(name: str) -> Tool:
    async def unused(args: dict[str, Any], ctx: RunContext) -> str:
        return "ok"

    return Tool(name=name, effect="read", run=unused, validate=_require_text,
                description="Finish the task: give your final answer to the user in `text`. Ends the run.",
                parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})


@functools.cache
def output_tool(output: Output) -> Tool:
    """The final-result tool of tool mode. The loop takes its calls before any gate or backend (like the
    terminal tool), so its `run` is never reached."""
    async def taken_by_the_loop(args: dict[str, Any], ctx: RunContext) -> str:
        return "ok"

    return Tool(name=output.name, description=output.description, parameters=output.parameters,
                run=taken_by_the_loop, effect="read", approval="auto", takes_context=False)


def _require_text(args: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(args.get("text"), str):
        raise ArgumentsInvalid(["text: Field required (a string)"])
    return args


class _BuiltIn(Toolset):
    label = "built-in"


BUILT_IN = _BuiltIn()
"""The owner of ringlet's own tools in a registry (the terminal tool)."""
