"""`llm` and `agent` nodes: a model task on ringlet's own loop, and a whole child agent; both with
`output_schema` (`graph-workflows.md` §3, §7, §10.2). An `llm` node's schema is the run's typed output
(`ringlet.output`, prompted mode: one more try in the same conversation, told what was wrong; issue 21);
an `agent` node's output gets one repair request to the child's model.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

from ringlet.agent.contract import RunSettings
from ringlet.agent.settings import RunHost
from ringlet.context import Caller
from ringlet.events import Event
from ringlet.graph.context import NodeCall
from ringlet.graph.nodes import NodeFailure, Outcome, apply_updates, route
from ringlet.graph.structured import SchemaFailure, parse_and_check, repair_prompt
from ringlet.graph.templates import render
from ringlet.models.base import Model
from ringlet.output import JsonSchema, PromptedOutput

__all__ = ["run_agent_node", "run_llm"]

_FRAMING = frozenset({"message_start", "message_end", "status", "error", "ping"})
"""Events of an llm node's inner run that belong to its own framing: the node_end event says how it went."""


class Retry(Exception):
    pass


def _caller(call: NodeCall, **changes: Any) -> Caller:
    """Who runs an inner run: the graph run's caller (realm, user, org, roles, channel), with `changes`."""
    c = call.env.caller
    given: dict[str, Any] = {k: c[k] for k in ("realm", "user_id", "org_id", "roles", "channel") if k in c}
    return Caller(**(given | changes))


async def _drain(call: NodeCall, stream: Any) -> Any:
    """Forward an inner run's events (tagged with the node, on the graph's run id); return its result."""
    env, run_id, node_id = call.env, call.env.run_id, call.node_id
    async for event in stream:
        if event.type not in _FRAMING:
            event.run_id, event.node_id = run_id, node_id  # retagged in place: this stream is its only reader
            env.emit(event)
    result = stream.result
    env.usage.add(result.usage)
    return result


def _text(result: Any) -> str:
    """All of the run's assistant text, joined with newlines."""
    return "\n".join(m.text for m in result.new_messages() if m.role == "assistant" and m.text)


async def structured(call: NodeCall, text: str, schema: dict[str, Any], model: Model) -> Any:
    """The parsed, schema-valid value of `text`, after at most one repair request to `model` (no tools)."""
    try:
        return parse_and_check(text, schema)
    except SchemaFailure as failure:
        agent = call.env.runtime.repair_agent(model)
        result = await _drain(call, agent.stream(repair_prompt(text, failure, schema),
                                                 caller=_caller(call, run_id=call.env.runtime.seam.new_id("r"))))
        try:
            return parse_and_check(_text(result), schema)
        except SchemaFailure as again:
            raise SchemaFailure(again.errors) from None


# -- llm -------------------------------------------------------------------------------------------------------


async def _attempt(call: NodeCall, agent: Any, prompt: str, instructions: str | None) -> Any:
    """One run of the node's task. With an `output_schema` the run's result is typed the way every agent's
    is (`ringlet.output`, prompted mode): the schema in the instructions, the JSON parsed from the answer,
    and one more try, told what was wrong, if it does not match."""
    node, steps = call.node, call.env.steps
    settings = RunSettings(
        instructions=instructions or None, approver=call.env.tool_approver,
        output_type=None if node.output_schema is None else
        PromptedOutput(JsonSchema(node.output_schema)),  # type: ignore[arg-type]  # (a schema, not a type)
        # a durable run's node alone in its super-step (`engine._run_frontier`) runs on the graph's steps
        host=RunHost(steps=steps) if steps is not None else None)
    stream = agent.stream(prompt, caller=_caller(call, run_id=call.env.runtime.seam.new_id("r")), settings=settings)
    result = await _drain(call, stream)
    if result.status == "input_required":
        raise NodeFailure("a tool call waits for approval and no approver is attached to the run")
    if result.finish_reason == "empty_response":  # the loop's fixed answer is no output for a node
        raise Retry("produced no output")
    if result.error is not None:
        code, message = result.error["code"], result.error["message"]
        if code == "max_iterations":
            raise NodeFailure(f"llm node hit max_iterations ({node.max_iterations}) before LLM concluded")
        if code == "stream_interrupted":
            raise Retry(message)
        if code == "output_validation_failed":
            raise Retry(f"output_schema validation failed: {'; '.join(result.error['details']['errors'])}")
        raise NodeFailure(message, code=code)
    if node.output_schema is not None:
        return result.output
    text = _text(result)
    if not text.strip():
        raise Retry("produced no output")
    return text


def _values(call: NodeCall, *templates: str | None) -> Any:
    """The state a node's templates read; with Loki's special variables (`{{__os__}}`, `{{__tools__}}` of
    this node, …) beneath it when a template names one."""
    if not any(t and "{{__" in t for t in templates):
        return call.state
    from ringlet.agent.loki import special_variables
    from ringlet.tools.base import Tool

    tools = [t for t in call.env.runtime.node_tools(call.node) if isinstance(t, Tool)]
    return {**special_variables(tools), **call.state}


async def _attempts(call: NodeCall) -> Any:
    node = call.node
    values = _values(call, node.prompt, node.instructions)
    prompt = render(node.prompt, values)
    instructions = render(node.instructions, values) if node.instructions is not None else None
    skills = call.env.runtime.skills_prompt(node)
    if skills is not None:
        instructions = f"{instructions}\n\n{skills}" if instructions else skills
    agent = call.env.runtime.node_agent(call.node_id, node)
    bound = asyncio.timeout(node.timeout) if node.timeout is not None else contextlib.nullcontext()
    try:
        async with bound:
            failure: Retry | None = None
            for _ in range(node.max_attempts):
                try:
                    return await _attempt(call, agent, prompt, instructions)
                except Retry as exc:
                    failure = exc
            raise NodeFailure(str(failure))
    except TimeoutError:
        raise NodeFailure(f"llm node timed out after {node.timeout:g}s") from None


async def run_llm(call: NodeCall) -> Outcome:
    node = call.node
    try:
        output = await _attempts(call)
    except Exception as exc:
        error = getattr(exc, "message", None) or str(exc)
        if node.fallback and not call.in_map:
            apply_updates(call.state, node.state_updates, ("output", f"LLM node failed: {error}"))
            return Outcome([node.fallback], "fallback", error=error)
        raise NodeFailure(f"LLM node failed and no fallback declared: {error}") from exc
    if node.output_schema is not None and isinstance(output, dict) and not call.in_map:
        call.state.update(output)
    apply_updates(call.state, node.state_updates, ("output", output))
    return Outcome(route(call), output=output)


# -- agent -------------------------------------------------------------------------------------------------------


def nest(event: Event, parent: str, child: str, node_id: str) -> Event:
    """A child's event as the parent forwards it: the agent path from the parent down, its depth."""
    path = (parent, *(getattr(event, "agent_path", None) or (child,)))
    return replace(event, agent_path=path, depth=len(path) - 1,  # type: ignore[arg-type]
                   node_id=getattr(event, "node_id", None) or node_id)


async def _child_result(call: NodeCall, child: Any, prompt: str, depth: int) -> Any:
    env = call.env
    # the child keeps its own realm (and model and tools); it acts for the same principal
    caller = _caller(call, channel="sub_agent", realm="default")
    settings = RunSettings(approver=env.approver)
    # a graph child counts its agent nodes' depth on from this one's
    stream = child.stream(prompt, caller=caller, settings=settings, depth=depth) if child.kind == "graph" else \
        child.stream(prompt, caller=caller, settings=settings)
    name = getattr(child, "name", call.node.agent)
    async for event in stream:
        if event.type != "ping":
            env.emit(nest(event, env.runtime.name, name, call.node_id))
    result = stream.result
    env.usage.add(result.usage)
    return result


async def run_agent_node(call: NodeCall) -> Outcome:
    node, runtime = call.node, call.env.runtime
    depth = call.env.depth + 1
    if depth > runtime.options.max_agent_depth:
        raise NodeFailure(f"Max agent depth exceeded ({depth}/{runtime.options.max_agent_depth})")
    prompt = render(node.prompt, call.state)
    try:
        child = runtime.child(node.agent)
        async with asyncio.timeout(node.timeout):
            result = await _child_result(call, child, prompt, depth)
    except TimeoutError:
        raise NodeFailure(f"Agent '{node.agent}' timed out after {node.timeout:g}s") from None
    except Exception as exc:
        raise NodeFailure(f"Agent '{node.agent}' failed: {getattr(exc, 'message', None) or exc}") from exc
    if result.error is not None:
        raise NodeFailure(f"Agent '{node.agent}' failed: {result.error['message']}")
    if result.finish_reason == "empty_response":  # its model said nothing: the fixed answer is not output
        raise NodeFailure(f"Agent '{node.agent}' failed: its model gave no answer")
    if result.status == "input_required":
        raise NodeFailure(f"Agent '{node.agent}' failed: it paused for a human, and no approver is attached")
    output: Any = result.output
    if node.output_schema is not None:
        model: Model = getattr(child, "model", None)  # type: ignore[assignment]
        if not callable(getattr(model, "stream", None)):
            model = runtime.default_model()
        try:
            output = await structured(call, output, node.output_schema, model)
        except SchemaFailure as failure:
            raise NodeFailure(f"output_schema validation failed: {failure}") from None
        if isinstance(output, dict) and not call.in_map:
            call.state.update(output)
    apply_updates(call.state, node.state_updates, ("output", output))
    return Outcome(route(call), output=output)
