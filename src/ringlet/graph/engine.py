"""The executor: BSP super-steps over a validated graph (`graph-workflows.md` §4, §8, §10.4, §10.6).

Each step runs its frontier concurrently (at most `max_concurrency` at a time), every node on its own deep
copy of the pre-step state; the keys each node changed are merged in node-id order through the reducers,
and the union of the nodes' targets is the next frontier. A checkpoint is saved before the first step and
after every step, so a run can continue in any process from the state before the step it was in.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

from ringlet.errors import RunError
from ringlet.events import NodeEndEvent, NodeStartEvent
from ringlet.graph.checkpoint import Checkpoint
from ringlet.graph.context import NodeCall, RunEnv
from ringlet.graph.human import NeedsAnswer, Question
from ringlet.graph.llm import run_agent_node, run_llm
from ringlet.graph.nodes import (
    NO_OUTPUT,
    NodeFailure,
    Outcome,
    route,
    run_approval,
    run_end,
    run_input,
    run_rag,
    run_script_node,
)
from ringlet.graph.reducers import diff, json_type, merge_writes
from ringlet.graph.templates import TEMPLATE, TemplateError, resolve
from ringlet.usage import Usage

__all__ = ["Engine", "RunEnd"]

log = logging.getLogger("ringlet.graph")
TRACE = 5
T = TypeVar("T")


@dataclass(slots=True)
class RunEnd:
    """How `Engine.run` ended: completed with an output, failed with an error, or paused on a question."""

    status: Literal["completed", "failed", "input_required"]
    output: str = ""
    error: RunError | None = None
    question: Question | None = None


async def first_error(coros: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Run concurrently; results in order. The first failure cancels the others and is raised (when several
    fail together, the earliest in order wins)."""
    if len(coros) < 2:
        return [await c for c in coros]
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
        if failed:
            raise failed[0].exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


# -- one node -----------------------------------------------------------------------------------------------


Runner = Callable[[NodeCall], Awaitable[Outcome]]


async def execute(call: NodeCall) -> Outcome:
    """Run one node between its node_start and node_end events."""
    env, node, stats = call.env, call.node, call.env.stats
    env.emit(env.event(NodeStartEvent, node_id=call.node_id, node_type=node.type, step=call.step, visit=call.visit,
                       item_index=call.item_index))
    clock = env.runtime.seam.monotonic
    started = clock()
    entry = stats.setdefault(call.node_id, {"runs": 0, "us": 0, "failures": 0})  # ints: cheap to checkpoint
    try:
        outcome = await RUNNERS[node.type](call)
    except NeedsAnswer:
        raise
    except (Exception, asyncio.CancelledError) as exc:  # cancelled: the run's timeout, a failed sibling, an abort
        ms = (clock() - started) * 1000
        entry["runs"], entry["us"], entry["failures"] = entry["runs"] + 1, entry["us"] + int(ms * 1000), \
            entry["failures"] + 1
        env.emit(env.event(NodeEndEvent, node_id=call.node_id, node_type=node.type, step=call.step,
                           duration_ms=round(ms, 3), outcome="failed", error=_message(exc),
                           item_index=call.item_index))
        raise
    ms = (clock() - started) * 1000
    entry["runs"], entry["us"] = entry["runs"] + 1, entry["us"] + int(ms * 1000)
    env.emit(env.event(NodeEndEvent, node_id=call.node_id, node_type=node.type, step=call.step,
                       duration_ms=round(ms, 3), outcome=outcome.kind, next=tuple(outcome.targets),
                       error=outcome.error, item_index=call.item_index))
    return outcome


async def recorded(call: NodeCall) -> Outcome:
    """`execute` as one step of a durable run (`env.steps`): what the node did (its state, outcome, events
    and usage, or the question it asked, or how it failed) is recorded, and a run executed again after its
    worker died gets it back without running the node again; the events are sent again (those stored
    already are not stored or sent twice)."""
    env, usage, emitted = call.env, Usage(), []
    ran: list[BaseException | None] = []

    def emit(event: Any) -> None:
        emitted.append(event)
        env.emit(event)

    async def work() -> dict[str, Any]:
        ran.append(None)
        if (sending := getattr(env.steps, "sending", None)) is not None:  # a node running again after its
            await sending(call.node_id)  # worker died: what it streamed the first time is withdrawn first
        call.env = replace(env, emit=emit, usage=usage, steps=None)  # the node's own events and usage
        try:
            outcome = await execute(call)
        except NeedsAnswer as exc:
            done: dict[str, Any] = {"question": exc.question.to_dict()}
        except Exception as exc:
            ran[0] = exc  # raised as it is in this execution; a replay raises its record
            done = {"failure": [getattr(exc, "code", None) if isinstance(getattr(exc, "code", None), str)
                                else "node_failed", _message(exc)]}
        else:
            done = {"state": call.state, "outcome": _outcome_json(outcome)}
        finally:
            call.env = env
        return {**done, "events": [e.model_dump() for e in emitted],
                "usage": usage.as_dict() if usage.requests else None}

    record = await env.steps.record(f"node {call.node_id}", work, key=call.node_id)
    if not ran:  # replayed: the node's events again
        _emit_all(env, record["events"])
    if record["usage"] is not None:
        env.usage.add(Usage(**record["usage"]))
    if ran and ran[0] is not None:
        raise ran[0]
    if "question" in record:
        raise NeedsAnswer(Question.from_dict(record["question"]))
    if "failure" in record:
        raise RecordedFailure(*record["failure"])
    call.state = record["state"]
    return _outcome_of(record["outcome"])


def _emit_all(env: Any, recorded: list[dict[str, Any]]) -> None:
    from ringlet.events import event_adapter

    for data in recorded:
        env.emit(event_adapter.validate_python(data))


class RecordedFailure(RunError):
    """A node's failure as its step recorded it (code and message), raised again on replay."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)


def _outcome_json(outcome: Outcome) -> dict[str, Any]:
    data = {"targets": outcome.targets, "kind": outcome.kind, "stdout": outcome.stdout, "result": outcome.result,
            "error": outcome.error, "extra": outcome.extra}
    return data if outcome.output is NO_OUTPUT else {**data, "output": outcome.output}


def _outcome_of(data: dict[str, Any]) -> Outcome:
    return Outcome(data["targets"], data["kind"], data.get("output", NO_OUTPUT), data["stdout"], data["result"],
                   data["error"], data["extra"])


def _message(exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return getattr(exc, "message", None) or str(exc) or type(exc).__name__


# -- map -------------------------------------------------------------------------------------------------------------


def _items(call: NodeCall) -> list[Any]:
    node = call.node
    match = TEMPLATE.fullmatch(node.over)
    items: Any = node.over
    if match is not None:
        try:
            items = resolve(match.group(1), call.state)
        except KeyError:
            raise TemplateError([match.group(1)]) from None
    if not isinstance(items, list):
        raise NodeFailure(f"map node '{call.node_id}': 'over' must resolve to an array, got {json_type(items)}")
    return items


def _item_result(call: NodeCall, branch: Any, sub: NodeCall, outcome: Outcome, index: int) -> Any:
    """§10.3: an explicit write to output_key, else the branch's output, else the key of a script's stdout."""
    key = call.node.output_key
    if key in (getattr(branch, "state_updates", None) or {}):
        return sub.state.get(key, "")
    if outcome.output is not NO_OUTPUT:
        return outcome.output
    if outcome.stdout is not None and key in outcome.stdout:
        return outcome.stdout[key]
    raise NodeFailure(f"map node '{call.node_id}': item [{index}] produced no '{key}'")


async def run_map(call: NodeCall) -> Outcome:
    node, env = call.node, call.env
    items = _items(call)
    branch = call.spec.nodes[node.branch]
    limit = asyncio.Semaphore(node.max_concurrency or call.spec.settings.max_concurrency or 1)

    async def one(index: int, item: Any) -> Any:
        async with limit:
            fork = copy.deepcopy(call.state)
            fork[node.as_] = item
            sub = NodeCall(env, node.branch, branch, fork, call.step, call.visit, item_index=index, in_map=True)
            try:
                outcome = await execute(sub)
            except NeedsAnswer:
                raise
            except Exception as exc:
                raise NodeFailure(f"map node '{call.node_id}': item [{index}] failed: {_message(exc)}") from exc
            return _item_result(call, branch, sub, outcome, index)

    call.state[node.collect_into] = await first_error([one(i, item) for i, item in enumerate(items)])
    return Outcome(route(call))


RUNNERS: dict[str, Runner] = {
    "llm": run_llm, "agent": run_agent_node, "script": run_script_node, "approval": run_approval,
    "input": run_input, "rag": run_rag, "end": run_end, "map": run_map,
}


# -- the run -----------------------------------------------------------------------------------------------------------


class Engine:
    """One graph run, from a checkpoint (a fresh run's is step 0)."""

    def __init__(self, env: RunEnv, checkpoint: Checkpoint) -> None:
        self.env, self.checkpoint = env, checkpoint
        self.spec = env.runtime.spec
        self.stats = env.stats = checkpoint.node_stats

    @property
    def graph(self) -> str:
        return self.spec.name

    async def run(self) -> RunEnd:
        """Super-steps until an End node, a failure or a question nobody is there to answer."""
        cp = self.checkpoint
        try:
            while True:
                outcome = await self._step(cp)
                if outcome is not None:
                    return outcome
        except NeedsAnswer as pause:
            cp.pending_question = pause.question.to_dict()
            cp.status = "input_required"
            await self.save()
            return RunEnd("input_required", question=pause.question)
        except RunError as exc:
            await self.finish("failed", error=exc)
            return RunEnd("failed", error=exc)

    async def _step(self, cp: Checkpoint) -> RunEnd | None:
        settings, frontier = self.spec.settings, cp.frontier
        limit = settings.timeout
        if self.env.clock.expired():
            raise RunError("timeout", f"Graph '{self.graph}' timed out after {limit:g}s before super-step with "
                                      f"frontier [{', '.join(frontier)}]")
        visits = dict(cp.visit_counts)
        for node_id in frontier:
            visits[node_id] = visits.get(node_id, 0) + 1
            if visits[node_id] > settings.max_loop_iterations:
                raise RunError("max_loop_iterations", f"Node '{node_id}' visited {visits[node_id]} times "
                               f"(max_loop_iterations={settings.max_loop_iterations}). Possible infinite loop.")
        self._snapshot(cp)
        step = cp.step + 1
        try:
            async with self.env.clock.step():
                results = await self._run_frontier(step, frontier, visits)
        except TimeoutError:
            if not self.env.clock.timed_out:
                raise
            raise RunError("timeout", f"Graph '{self.graph}' timed out after {limit:g}s during super-step with "
                                      f"frontier [{', '.join(frontier)}]") from None
        merge_writes(cp.state, [(n, diff(cp.state, st)) for n, st, _ in results], self.spec.reducers)
        cp.step, cp.visit_counts, cp.pending_question = step, visits, None
        ended = next((o for _, _, o in results if o.result is not None), None)
        if ended is not None:
            await self.finish("completed", output=ended.result or "")
            return RunEnd("completed", output=ended.result or "")
        cp.frontier = self._next_frontier(results)
        await self.save()
        return None

    async def _run_frontier(self, step: int, frontier: list[str],
                            visits: dict[str, int]) -> list[tuple[str, dict[str, Any], Outcome]]:
        pre, env, nodes = self.checkpoint.state, self.env, self.spec.nodes
        limit = asyncio.Semaphore(self.spec.settings.max_concurrency or 1)
        # a durable run: each node call is a step, drawn in frontier order; an llm node alone in its super-step
        # runs in the workflow instead, its model requests and tool calls steps of their own (as a loop
        # run's), so a call that finished never runs again (beside other nodes, their steps would interleave)
        direct = env.steps is not None and len(frontier) == 1 and nodes[frontier[0]].type == "llm"
        if env.steps is not None and not direct:
            env.steps.order(frontier)

        async def one(node_id: str) -> tuple[str, dict[str, Any], Outcome]:
            async with limit:
                call = NodeCall(env, node_id, nodes[node_id], copy.deepcopy(pre), step, visits[node_id])
                try:
                    outcome = await (execute(call) if env.steps is None or direct else recorded(call))
                except NeedsAnswer:
                    raise
                except Exception as exc:
                    if not isinstance(exc, RunError):
                        log.warning("graph %s: node %s raised", self.graph, node_id, exc_info=True)
                    raise self._failed(node_id, exc) from exc
                return node_id, call.state, outcome

        return await first_error([one(n) for n in frontier])

    def _failed(self, node_id: str, exc: BaseException) -> RunError:
        code = getattr(exc, "code", "node_failed")
        return RunError(code if isinstance(code, str) else "node_failed",
                        f"Graph '{self.graph}' failed at node '{node_id}': {_message(exc)}",
                        details={"node_id": node_id})

    def _next_frontier(self, results: list[tuple[str, dict[str, Any], Outcome]]) -> list[str]:
        nodes = self.spec.nodes
        targets: list[str] = []
        for node_id, _, outcome in results:
            for target in outcome.targets:
                if target not in nodes:
                    raise RunError("node_failed", f"Graph '{self.graph}' failed at node '{node_id}': "
                                                  f"References non-existent node '{target}'")
                if target not in targets:
                    targets.append(target)
        ends = [t for t in targets if nodes[t].type == "end"]
        if len(ends) > 1:
            raise RunError("multiple_ends", f"super-step ended with multiple End targets ({', '.join(ends)}). "
                                            "Fan-out branches must converge before ending")
        if ends:
            return ends
        if not targets:
            raise RunError("empty_frontier", "frontier emptied without reaching an End node")
        return targets

    def _snapshot(self, cp: Checkpoint) -> None:
        if not self.spec.settings.log_state_snapshots or not log.isEnabledFor(logging.DEBUG):
            return
        text = json.dumps(cp.state, ensure_ascii=False, default=str)
        for node_id in cp.frontier:
            log.debug("[graph:%s] [%s] state: %d bytes, keys=[%s]", self.graph, node_id, len(text.encode()),
                      ", ".join(cp.state))
        log.log(TRACE, "[graph:%s] state: %s", self.graph, text)

    async def save(self) -> None:
        cp = self.checkpoint
        cp.elapsed_active_s = self.env.clock.elapsed()
        cp.updated_at = self.env.runtime.seam.now()
        steps, checkpoints = self.env.steps, self.env.runtime.checkpoints
        if steps is None:
            await checkpoints.save(cp)
            return

        async def save() -> None:  # a step: a replay does not save an older checkpoint over a newer one
            await checkpoints.save(cp)

        await steps.record("checkpoint", save)

    async def finish(self, status: Literal["completed", "failed"], *, output: str | None = None,
                     error: RunError | None = None) -> None:
        cp = self.checkpoint
        cp.status, cp.output, cp.frontier, cp.ended_at = status, output, [], self.env.runtime.seam.now()
        if error is not None:
            cp.error = {"code": error.code, "message": error.message, "details": error.details}
        await self.save()
        if log.isEnabledFor(logging.INFO) and self.stats:
            summary = ", ".join(f"{n} {s['runs']}x {s['us'] / 1000:.0f} ms" for n, s in self.stats.items())
            log.info("[graph:%s] %s after %d step(s): %s", self.graph, status, cp.step, summary)
