"""Node runners for `script`, `approval`, `input`, `rag` and `end` nodes, and what every runner shares:
the outcome value, `state_updates` with scoped variables, and routing (`graph-workflows.md` §3, §5).

A runner mutates its call's own state (never the shared one) and returns an `Outcome`. An exception is
the node's failure; runners with a `fallback` catch their own failures and route there instead.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

from ringlet.errors import RunError
from ringlet.graph.context import NodeCall
from ringlet.graph.human import Question, input_error
from ringlet.graph.scripts import ScriptCall, ScriptError, run_script
from ringlet.graph.templates import render

__all__ = ["NO_OUTPUT", "NodeFailure", "Outcome", "apply_updates", "route"]

NO_OUTPUT: Any = object()
"""The outcome of a node that has no `{{output}}` (script, approval, input, end)."""


class NodeFailure(RunError):
    def __init__(self, message: str, code: str = "node_failed") -> None:
        super().__init__(code, message)


@dataclass(slots=True)
class Outcome:
    targets: list[str]
    kind: Literal["ok", "fallback"] = "ok"
    output: Any = NO_OUTPUT
    """The node's `{{output}}` (llm, agent, rag): a map item's result."""
    stdout: dict[str, Any] | None = None
    """A script's JSON object (without `_next`)."""
    result: str | None = None
    """An end node's output: the run's result."""
    error: str | None = None
    """Why a node took its fallback."""
    extra: dict[str, Any] = field(default_factory=dict)


def apply_updates(state: dict[str, Any], updates: dict[str, str], scoped: tuple[str, Any] | None = None) -> None:
    """Render `state_updates` leniently and write them (always strings). A scoped variable (`output`,
    `choice`, `input`) is bound only while they render; then its old value comes back, or it goes away."""
    if not updates:
        return
    if scoped is None:
        rendered = {k: render(t, state, strict=False) for k, t in updates.items()}
    else:
        name, value = scoped
        had, old = name in state, state.get(name)
        state[name] = value
        try:
            rendered = {k: render(t, state, strict=False) for k, t in updates.items()}
        finally:
            if had:
                state[name] = old
            else:
                del state[name]
    state.update(rendered)


def route(call: NodeCall, declared: list[str] | None = None) -> list[str]:
    """Where the node goes next: `declared` (or its `next`). Map branches go nowhere."""
    if call.in_map:
        return []
    targets = declared if declared is not None else call.node.targets
    if not targets:
        raise NodeFailure(f"{call.node.type} node '{call.node_id}' has no 'next' and is not an end node",
                          code="no_route")
    return list(dict.fromkeys(targets))


# -- script ------------------------------------------------------------------------------------------------


async def run_script_node(call: NodeCall) -> Outcome:
    node, env = call.node, call.env
    runtime = env.runtime
    script = ScriptCall(node.script, runtime.spec.directory, call.state, node.timeout,
                        cwd=runtime.options.script_cwd, variables=env.variables, run_id=env.run_id,
                        node_id=call.node_id, data_dir=runtime.data_dir, python=runtime.options.python)
    try:
        result = await run_script(script)
    except ScriptError as exc:
        if node.fallback and not call.in_map:
            return Outcome([node.fallback], "fallback", error=exc.message)
        raise
    call.state.update(result.data)
    apply_updates(call.state, node.state_updates)
    if result.next is not None and not call.in_map:
        if result.next not in call.spec.nodes:
            raise NodeFailure(f"Script '{node.script}' routed with _next to unknown node '{result.next}'. "
                              f"Available nodes: {', '.join(call.spec.nodes)}")
        return Outcome([result.next], stdout=result.data)
    return Outcome(route(call), stdout=result.data)


# -- humans ----------------------------------------------------------------------------------------------------


async def run_approval(call: NodeCall) -> Outcome:
    node = call.node
    question = Question(call.question_id(), call.node_id, render(node.question, call.state), "single-select",
                        options=tuple(node.options), allow_freeform=True)
    choice = await call.env.ask(question, "approval")
    target = node.routes.get(choice, node.on_other)
    apply_updates(call.state, node.state_updates, ("choice", choice))
    return Outcome(route(call, [target]))


async def run_input(call: NodeCall) -> Outcome:
    node = call.node
    default = render(node.default, call.state, strict=False) if node.default is not None else None
    question = Question(call.question_id(), call.node_id, render(node.question, call.state), "text",
                        default=default, validation=node.validation)
    answer = await call.env.ask(question, "input")
    if answer == "" and default is not None:
        answer = default
    input_error(node.validation, answer)
    apply_updates(call.state, node.state_updates, ("input", answer))
    return Outcome(route(call))


# -- rag, end ----------------------------------------------------------------------------------------------------


async def run_rag(call: NodeCall) -> Outcome:
    node = call.node
    query = render(node.query, call.state)
    runtime = call.env.runtime
    await runtime.prepare()
    try:
        async with asyncio.timeout(node.timeout):
            output = await runtime.knowledge(call.node_id).query(query, node.top_k)
    except TimeoutError:
        raise NodeFailure(f"rag node timed out after {node.timeout:g}s") from None
    apply_updates(call.state, node.state_updates, ("output", output))
    return Outcome(route(call), output=output)


async def run_end(call: NodeCall) -> Outcome:
    node = call.node
    apply_updates(call.state, node.state_updates)
    result = render(node.output, call.state, strict=False) if node.output is not None else ""
    return Outcome([], result=result)
