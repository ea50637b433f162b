"""Durable runs on DBOS Transact: a run's model requests and tool calls as steps of a DBOS workflow.

`DurableSteps` is the step executor (`ringlet.loop.StepExecutor`) of a run inside a workflow: every model
request is a step whose output is the response's chunks (sent to the run live while the request is in
flight), every tool call a step whose output is its result, a graph super-step's node calls and
checkpoints are steps too; a batch's (or a super-step's) step ids are drawn in a fixed order before any of
them runs, so however they interleave a replay gives each its own record; ids come from a seam derived
from the run id (`ringlet._ids.replayable`). A workflow DBOS executes again (its process died) gets every
finished step's record back: a response fully received is not requested again, a tool call that finished
does not run again, usage is not counted twice. A step in flight at the crash follows the at-most-once
rule: a model request is sent again; a tool call that is not idempotent returns `tool_error:
interrupted` (its start is a recorded step of its own), an idempotent one runs again.

The server runs every run on it with PostgreSQL (`ringlet.server.durable.engine`). In your own code,
`DurableAgent(agent)` runs an `Agent` inside your own DBOS workflow:

    agent = DurableAgent(Agent("openai:gpt-4o-mini", tools=[log_expense]))

    @DBOS.workflow()
    async def ask(question: str) -> str:
        return (await agent.run(question, stream_key="events")).output

(a runnable program: `examples/durable_agent.py`). Outside a workflow it raises `NotDurable` rather than
run without durability.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from dbos import DBOS

from ringlet import errors
from ringlet._ids import Seam, replayable
from ringlet.agent import Agent, AgentStream, RunResult
from ringlet.agent.settings import RunHost, RunSettings
from ringlet.agent.subagents import reattaches, replayed
from ringlet.context import Caller, RunContext
from ringlet.errors import NotDurable, ToolFailure
from ringlet.loop.steering import Steer
from ringlet.loop.step_json import chunk_json, chunk_of, value_json, value_of
from ringlet.models.base import (
    Chunk,
    Model,
    ModelRequest,
)
from ringlet.tools.base import Tool, Toolset

__all__ = ["DurableAgent", "DurableSteps", "NotDurable"]

log = logging.getLogger("ringlet")


# -- steps --------------------------------------------------------------------------------------------------


class DurableSteps:
    """The step executor of a durable run: model requests and tool calls are DBOS steps of its workflow."""

    __slots__ = ("_drawn", "seam", "sending")

    def __init__(self, run_id: str) -> None:
        self.seam: Seam = replayable(run_id)
        self._drawn: dict[str, tuple[Any, Any]] = {}
        """Step ids drawn for a batch's calls, by call id: (its start's, its own)."""
        self.sending: Callable[[str | None], Awaitable[None]] | None = None
        """Awaited before a model request is sent for real (not replayed from its record), and before a
        graph node that is one step runs (with its node id): what an earlier execution streamed there, if
        it died with it in flight, is withdrawn then (the server's `durable.attempts`)."""

    def stream_model(self, model: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        return _model_step(model, request, self.sending)

    def batch(self, calls: Sequence[tuple[str, Tool]]) -> None:
        for call_id, tool in calls:
            start = None if tool.idempotent else DBOS.reserve_step()
            self._drawn[call_id] = (start, DBOS.reserve_step())

    def call_tool(self, toolset: Toolset, tool: Tool, args: dict[str, Any], ctx: RunContext,
                  call_id: str) -> Awaitable[Any]:
        return _tool_step(self._drawn.pop(call_id, None), toolset, tool, args, ctx)

    def order(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._drawn[f"#{key}"] = (None, DBOS.reserve_step())

    def record(self, name: str, work: Callable[[], Awaitable[Any]], key: str | None = None) -> Awaitable[Any]:
        drawn = self._drawn.pop(f"#{key}", None) if key is not None else None
        return (drawn[1] if drawn is not None else DBOS.reserve_step()).run_async({"name": name}, work)

    def took(self, requests: int, steers: Sequence[Steer]) -> None:
        pass  # its steers are recorded with the workflow already (`DBOS.recv`)


async def _model_step(model: Model, request: ModelRequest,
                      sending: Callable[[str | None], Awaitable[None]] | None) -> AsyncIterator[Chunk]:
    """The request as one step: its chunks go to the run as they arrive and are recorded with the step, so
    a replay yields the recorded ones without asking the model again (`sending`: `DurableSteps.sending`)."""
    drawn = DBOS.reserve_step()
    live: asyncio.Queue[Chunk | None] = asyncio.Queue()
    sent = False

    async def request_once() -> dict[str, Any]:
        nonlocal sent
        sent, chunks = True, []
        if sending is not None:
            await sending(None)
        if _PERMITS and (permits := _PERMITS.get(model.name.partition(":")[0])) is not None:
            await _permit(*permits)  # the provider's rate limit, across processes (a replay needs none)
        try:
            async for chunk in model.stream(request):
                chunks.append(chunk_json(chunk))
                live.put_nowait(chunk)
        except errors.ProviderError as exc:
            return {"chunks": chunks, "error": {"class": type(exc).__name__, "message": exc.message,
                                                "status": exc.status, "retry_after_s": exc.retry_after_s,
                                                "provider": exc.provider}}
        finally:
            live.put_nowait(None)
        return {"chunks": chunks}

    step = asyncio.ensure_future(drawn.run_async({"name": f"model {model.name}"}, request_once))
    try:
        while (chunk := await _next_live(live, step)) is not None:
            yield chunk
        recorded = await step
    finally:
        if not step.done():
            step.cancel()
    if not sent:  # replayed: what the model said is in the record
        for data in recorded["chunks"]:
            yield chunk_of(data)
    if (error := recorded.get("error")) is not None:
        cls = getattr(errors, error.pop("class"), errors.ProviderError)
        raise cls(error.pop("message"), **error)


_PERMITS: dict[str, tuple[str, float]] = {}
"""Provider → the DBOS queue whose rate limiter paces its requests, and how often to look for the permit
(`rate_limit`); empty: no limits."""


def rate_limit(queues: dict[str, str], poll_s: float = 0.05) -> None:
    """Pace each provider's model requests in durable runs by a DBOS queue with a `limiter` (provider →
    queue name; the server registers the queues, `ringlet.server.durable.engine`): before a request is sent, its
    run takes a permit, a trivial workflow that queue starts when the limit allows."""
    _PERMITS.clear()
    _PERMITS.update({provider: (queue, poll_s) for provider, queue in queues.items()})


@DBOS.workflow(name="ringlet.permit")
async def _permit_workflow() -> None:
    """Started by a rate-limited queue when a request may go: its start is the permit."""


async def _permit(queue: str, poll_s: float) -> None:
    """Wait for a permit from `queue`, enqueued from a clean context: DBOS starts no workflow from a step."""

    async def take() -> None:
        handle = await DBOS.enqueue_workflow_async(queue, _permit_workflow)
        await handle.get_result(polling_interval_sec=poll_s)

    await asyncio.get_running_loop().create_task(take(), context=contextvars.Context())


async def _next_live(live: asyncio.Queue[Chunk | None], step: asyncio.Future[Any]) -> Chunk | None:
    if not live.empty():
        return live.get_nowait()
    if step.done():
        return None
    getting = asyncio.ensure_future(live.get())
    await asyncio.wait({getting, step}, return_when=asyncio.FIRST_COMPLETED)
    if getting.done():
        return getting.result()
    getting.cancel()
    return None


async def _tool_step(drawn: tuple[Any, Any] | None, toolset: Toolset, tool: Tool, args: dict[str, Any],
                     ctx: RunContext) -> Any:
    """The call as one step (its start another, when the tool is not idempotent): a replay returns the
    recorded result; a call that was running when its worker died is not run again unless idempotent, or a
    sub-agent call whose child is a durable run of its own: run again, it re-attaches to that child."""
    again = reattaches(tool, args, ctx)
    start, own = drawn or (None if tool.idempotent else DBOS.reserve_step(), DBOS.reserve_step())
    start, started_now, ran = None if again else start, False, False

    async def starting() -> bool:
        nonlocal started_now
        started_now = True
        return True

    if start is not None:
        await start.run_async({"name": f"start {tool.name}"}, starting)
    interrupted = start is not None and not started_now  # its start was recorded by an execution that died

    async def call_once() -> dict[str, Any]:
        nonlocal ran
        ran = True
        if interrupted:
            return {"failure": ["interrupted", f"tool {tool.name!r} was running when its worker stopped; it was "
                                "not run again, since it is not idempotent", {}]}
        try:
            value = await toolset.call_tool(tool, args, ctx)
        except ToolFailure as exc:
            usage = getattr(exc, "usage", None)  # a failed sub-agent's (`subagents.ChildFailure`)
            return {"failure": [exc.code, exc.message, exc.extra], **({"usage": usage} if usage else {})}
        except Exception as exc:
            log.exception("tool %r failed", tool.name)
            return {"failure": ["tool_error", f"{type(exc).__name__}: {exc}", {}]}
        return value_json(value)

    recorded = await own.run_async({"name": f"tool {tool.name}"}, call_once)
    if again and not ran:  # replayed: the child's usage and events are the parent's again, as when it ran
        await replayed(args, ctx, recorded.get("usage") or recorded.get("metadata", {}).get("usage"))
    return value_of(recorded)


# -- durable agents in your own workflows ---------------------------------------------------------------------


class DurableAgent:
    """An `Agent` whose runs are durable inside your own DBOS workflow: each model request and each tool
    call is a step of that workflow (recorded as JSON), so a workflow DBOS recovers after its process died
    goes on from them: a response fully received is not requested again, a tool call that finished does
    not run again (one in flight runs again only if it is `idempotent`, else it returns `tool_error:
    interrupted`), and the run keeps its ids. Outside a workflow it raises `NotDurable` rather than run
    without durability."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.name = agent.name

    async def stream(self, prompt: Any, *, caller: Caller | None = None, settings: RunSettings | None = None,
                     **options: Any) -> AgentStream:
        """The run's event stream (`Agent.stream`'s options), its steps recorded in the calling workflow."""
        run_id = await _run_id()
        settings = settings or RunSettings()
        host = replace(settings.host or RunHost(), steps=DurableSteps(run_id))
        return self.agent.stream(prompt, caller=replace(caller or Caller(), run_id=run_id),
                                 settings=replace(settings, host=host), **options)

    async def run(self, prompt: Any, *, stream_key: str | None = None, **options: Any) -> RunResult:
        """Run to the end (`Agent.run`'s options). `stream_key`: each event is also written, as its JSON
        payload, to the workflow's DBOS stream of that name (read it anywhere with
        `DBOS.read_stream_async(workflow_id, stream_key)`); the stream is closed when the run ends."""
        stream = await self.stream(prompt, **options)
        async for event in stream:
            if stream_key is not None:
                await DBOS.write_stream_async(stream_key, event.model_dump())
        if stream_key is not None:
            await DBOS.close_stream_async(stream_key)
        result = stream.result
        assert result is not None, "a run always ends with message_end"
        return result


async def _run_id() -> str:
    """A run id for a durable run of the calling workflow: derived from the workflow's id and the step id it
    reserves (the same when the workflow is executed again), so it costs no step record of its own."""
    if DBOS.workflow_id is None:
        raise NotDurable("a DurableAgent runs inside a DBOS workflow (a function decorated with @DBOS.workflow(), "
                         "after DBOS.launch()); call agent.agent.run(...) to run without durability")
    if DBOS.step_id is not None and DBOS.step_status is not None:
        raise NotDurable("a DurableAgent runs in the workflow itself, not inside a step: its model requests "
                         "and tool calls are the steps")

    step = DBOS.reserve_step().step_id  # never run: a gap in the step ids, which DBOS allows
    return "r_" + hashlib.sha256(f"{DBOS.workflow_id}:{step}".encode()).hexdigest()[:26]


def log_through_logging() -> None:
    """Send DBOS's log records where this process's logging sends everything else (the root logger's
    handlers), before the first `DBOS(config=...)` of the process. Left alone, DBOS adds a console handler
    of its own, bound to whatever `sys.stderr` is at that moment: a stream a test runner or a CLI runner
    may swap in and close, after which every later `DBOS(...)` of the process fails flushing it."""
    dbos_log = logging.getLogger("dbos")
    if not dbos_log.handlers:  # DBOS adds its console handler only to a logger that has none
        dbos_log.addHandler(logging.NullHandler())

