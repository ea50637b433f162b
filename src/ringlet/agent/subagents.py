"""Sub-agents (`builtin-tools-and-subagents.md` §6): `spawn_agent` / `dispatch_sub_agent` run a child agent
as one tool call.

The child is a normal run of its own agent (its tools, limits, instructions and realm), in a new
conversation, entered through the same `stream()` as every other source (`metadata.source = "sub_agent"`,
`channel = "sub_agent"`). Its events reach the parent's stream as they happen, tagged with `agent_path`,
`parent_tool_call_id` and `depth`. A root run's children share its concurrency slots; the depth is
capped; the child's clock stops while it waits for a human; cancelling the parent cancels the child (and,
through it, every descendant).

Where the child runs is its host's business (`RunContext.child_host`). In process (the library, the CLI, a
server on SQLite) its stream is pumped here, inside the parent's tool call (`ChildRun`). A host with
`run_child` (the server's engine: `server.child_runs`) runs it as a durable run of its own, perhaps in
another process: its ids then derive from the parent run's id and the call's (`DurableHost.ids`), so a spawn
call executed again after its worker died re-attaches to the same child (`reattaches`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ringlet.agent.contract import Runnable, RunSettings
from ringlet.context import Caller, RunContext
from ringlet.errors import ToolFailure
from ringlet.events import BaseEvent, ContentDeltaEvent, MessageStartEvent, StatusEvent
from ringlet.loop.fields import new_set
from ringlet.messages import Message
from ringlet.tools.base import ArgumentsInvalid, Returned, Tool
from ringlet.usage import Usage

if TYPE_CHECKING:
    from ringlet.gates.approval import Approver
    from ringlet.loop import StepExecutor

LONG_S = 86_400.0
"""The spawn tool's own timeout as the batch sees it: its child keeps its own clock, which stops while a
human is asked, so the batch must not cut it first."""


Spawnable: TypeAlias = Runnable
"""What a child can be: any `Runnable` (an `Agent`, a graph agent, a remote A2A agent)."""


class DurableHost(Protocol):
    """A `child_host` that runs children as durable runs of their own (`server.child_runs`)."""

    def hosts(self, agent: str) -> bool:
        """Whether a child of agent `agent` runs durably (else it runs in process, as without the host)."""
        ...

    def ids(self, ctx: RunContext) -> ChildIds:
        """The ids of the child of this call (`ctx.tool_call_id`), derived from the parent run's and the
        call's: the same whenever the call is executed."""
        ...

    async def run_child(self, run: ChildRun, message: Message, timeout_s: float) -> Returned:
        """Start (or re-attach to) the child with `run.ids`, forward its events through `run`, and return
        `run.result_of(...)`."""
        ...

    async def replay_child(self, ctx: RunContext, lineage: Lineage) -> None:
        """Forward the events of this call's child (it ended) again, tagged (`tagged`)."""
        ...


@dataclass(eq=False)
class Lineage:
    """Where a run sits among sub-agents: shared by a root run and all its descendants (`slots`, of `cap`
    permits). A durable child gets its lineage as JSON (`as_json`, `of`) and slots of its own, in the
    process that executes it: there the cap holds per parent process."""

    depth: int
    path: tuple[str, ...]
    slots: asyncio.Semaphore
    parent_tool_call_id: str | None = None
    children: set[asyncio.Task[Any]] = field(default_factory=new_set)
    cap: int = 4

    @classmethod
    def root(cls, agent: str, concurrency: int) -> Lineage:
        return cls(0, (agent,), asyncio.Semaphore(concurrency), cap=concurrency)

    def child(self, agent: str, call_id: str) -> Lineage:
        return Lineage(self.depth + 1, (*self.path, agent), self.slots, call_id, cap=self.cap)

    def as_json(self) -> dict[str, Any]:
        return {"depth": self.depth, "path": list(self.path), "parent_tool_call_id": self.parent_tool_call_id,
                "cap": self.cap}

    @classmethod
    def of(cls, data: dict[str, Any]) -> Lineage:
        """A lineage from `as_json()`, with slots of its own."""
        cap = max(int(data.get("cap") or 1), 1)
        return cls(int(data["depth"]), tuple(data["path"]), asyncio.Semaphore(cap), data.get("parent_tool_call_id"),
                   cap=cap)


@dataclass(frozen=True)
class ChildIds:
    """A durable child's ids (`DurableHost.ids`), derived from its parent run's id and the spawn call's id:
    the call executed again (its worker died) finds the same child. Call ids are unique within a run."""

    run_id: str
    conversation_id: str
    message_id: str


@dataclass(frozen=True)
class SubAgentSettings:
    """An agent's sub-agent limits (Loki's names where they exist)."""

    allowed: tuple[str, ...] | None = None
    """Agents a child may be; None: the parent's own agent only."""
    max_agent_depth: int = 3
    max_concurrent_agents: int = 4
    timeout_s: float = 120.0


class SpawnArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    task: str = Field(min_length=1, description="What the sub-agent must do; it becomes its user message.")
    context: str | None = Field(None, description="Background the sub-agent needs.")
    agent: str | None = Field(None, description="The agent to run (default: the same agent as you).")
    input: dict[str, Any] | None = Field(None, description="Structured input, passed as JSON.")


def _validate(args: dict[str, Any]) -> dict[str, Any]:
    try:
        return SpawnArgs.model_validate(args).model_dump(exclude_none=True)
    except ValidationError as exc:
        raise ArgumentsInvalid([f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
                                for e in exc.errors()]) from None


def child_message(args: dict[str, Any], ctx: RunContext, message_id: str | None = None) -> Message:
    """The child's user message: the task, then the context, then the input as JSON (its id, unless given,
    and its time from the parent run's seam)."""
    text = args["task"]
    if args.get("context"):
        text += f"\n\nContext:\n{args['context']}"
    if args.get("input") is not None:
        text += f"\n\nInput:\n```json\n{json.dumps(args['input'], ensure_ascii=False, indent=2)}\n```"
    return Message(id=message_id or ctx.seam.new_id("m"), role="user", content=text, created_at=ctx.seam.stamp(),
                   metadata={"source": "sub_agent", "parent_run_id": ctx.run_id})


@dataclass(frozen=True)
class _Spawner:
    """A sub-agent tool's `run` (a class, so that `reattaches` knows the tool)."""

    resolve: Callable[[str], Spawnable]
    settings: SubAgentSettings

    async def __call__(self, args: dict[str, Any], ctx: RunContext) -> Returned:
        return await spawn(args, ctx, self.resolve, self.settings)


def spawn_tools(names: Sequence[str], resolve: Callable[[str], Spawnable], settings: SubAgentSettings) -> list[Tool]:
    """The sub-agent tools under `names` (`spawn_agent`, `dispatch_sub_agent`), all running `resolve(name)`."""
    description = ("Hand a self-contained task to a sub-agent and get its final answer. Give it everything it "
                   "needs in `task` and `context`; several calls run in parallel.")
    return [Tool(name, description, SpawnArgs.model_json_schema(), _Spawner(resolve, settings), validate=_validate,
                 effect="write", approval="auto", timeout_s=LONG_S, emits=True) for name in names]


def _durable_host(ctx: RunContext, agent: str) -> DurableHost | None:
    host = ctx.child_host
    return host if callable(getattr(host, "run_child", None)) and host.hosts(agent) else None


def spawns(tool: Tool) -> bool:
    """Whether `tool` runs a sub-agent: its call's result carries the child's usage, which is its parent's too."""
    return isinstance(tool.run, _Spawner)


def reattaches(tool: Tool, args: dict[str, Any], ctx: RunContext) -> bool:
    """Whether this call of `tool` may be executed again after its worker died: a sub-agent call whose child
    is a durable run of its own, which the call re-attaches to (by its `ChildIds`) instead of starting another."""
    return isinstance(tool.run, _Spawner) and _durable_host(ctx, args.get("agent") or ctx.agent) is not None


async def replayed(args: dict[str, Any], ctx: RunContext, usage: dict[str, Any] | None) -> None:
    """A durable sub-agent call whose result is replayed from its record (its parent is executed again,
    `server.engine`): the child's `usage` is the parent's again, and the child's events are forwarded again
    (the parent's log keeps only those it lacks: an execution that died may not have logged them all)."""
    if usage:
        ctx.usage.add(Usage(**usage))
    name = args.get("agent") or ctx.agent
    if (host := _durable_host(ctx, name)) is not None:
        await host.replay_child(ctx, (ctx.lineage or Lineage.root(ctx.agent, 1)).child(name, ctx.tool_call_id or ""))


def tagged(event: BaseEvent, lineage: Lineage, run_id: str) -> BaseEvent:
    """A child's event as its parent's stream carries it: a child's own event gets its place in the tree
    (deeper ones already have theirs); every event in a run's stream carries that run's id (the child's is
    in the call's result metadata). The events are the child's own, made for this stream only, so they are
    tagged in place."""
    if event.agent_path is None:
        event.agent_path, event.depth = lineage.path, lineage.depth
        event.parent_tool_call_id = lineage.parent_tool_call_id
    event.run_id = run_id
    return event


async def spawn(args: dict[str, Any], ctx: RunContext, resolve: Callable[[str], Spawnable],
                settings: SubAgentSettings) -> Returned:
    """One child run, start to end: checks, a slot, the run with its events forwarded, the result."""
    name = args.get("agent") or ctx.agent
    allowed = settings.allowed if settings.allowed is not None else (ctx.agent,)
    if name not in allowed:
        raise ToolFailure("agent_not_allowed", f"agent {name!r} is not one this agent may spawn; allowed: "
                          f"{', '.join(allowed)}")
    parent = ctx.lineage or Lineage.root(ctx.agent, settings.max_concurrent_agents)
    depth = parent.depth + 1
    if depth > settings.max_agent_depth:
        raise ToolFailure("max_depth_exceeded", f"max agent depth exceeded ({depth}/{settings.max_agent_depth})")
    try:
        if name.startswith("a2a:"):  # a remote A2A agent (`agent/remote.py`; the SDK is imported only then)
            from ringlet.agent.remote import RemoteAgent

            child: Spawnable = RemoteAgent.of(name)
        else:
            child = resolve(name)
    except Exception as exc:
        raise ToolFailure("sub_agent_failed", f"agent {name!r} cannot start: {exc}") from None
    realm = getattr(child, "realm", None) or ctx.realm  # its own realm, else its parent's
    if realm != ctx.realm and ctx.realms is not None and realm not in ctx.realms:
        raise ToolFailure("realm_forbidden", f"agent {name!r} runs in realm {realm!r}, which this run's "
                          "principal may not use")
    lineage = parent.child(name, ctx.tool_call_id or "")
    # a durable child's ids come from the call's, never from the seam: the call may be executed again
    ids = host.ids(ctx) if (host := _durable_host(ctx, name)) is not None else None
    run = ChildRun(child, lineage, ctx, settings.timeout_s, realm, ids=ids)
    return await run.go(child_message(args, ctx, ids.message_id if ids is not None else None))


class ChildRun:
    """A child's stream pumped in a task: its events forwarded, its clock stopped while it waits for a
    human, cancelled (with its own descendants) when the parent is or when its time is up. With a durable
    host (`ids` given), the host runs the child and follows it through `clocked`, `forward`, `result_of`."""

    def __init__(self, child: Spawnable, lineage: Lineage, ctx: RunContext, timeout_s: float, realm: str, *,
                 ids: ChildIds | None = None) -> None:
        self.child, self.lineage, self.ctx, self.timeout_s, self.realm = child, lineage, ctx, timeout_s, realm
        self.ids = ids
        self.conversation_id = ids.conversation_id if ids is not None else \
            ctx.seam.new_id("c")  # in process, the parent run's seam: its ids replay with it
        self.stream: Any = None
        self.partial: str | None = None

    def caller(self) -> Caller:
        """Who runs the child: its parent's principal, in its own conversation and realm."""
        ctx = self.ctx
        return Caller(conversation_id=self.conversation_id, realm=self.realm, user_id=ctx.user_id,
                      org_id=ctx.org_id, roles=ctx.roles, channel="sub_agent")

    async def go(self, message: Message) -> Returned:
        ctx, host = self.ctx, self.ctx.child_host
        loop = asyncio.get_running_loop()  # the child's time limit is a real timer, on the event loop's clock
        start = loop.time()
        async with self.lineage.slots:  # the wait for a slot counts toward the timeout
            left = self.timeout_s - (loop.time() - start)
            if self.ids is not None:  # a durable run of its own (`DurableHost`), holding this process's slot
                return await host.run_child(self, message, left)
            self.stream = self.child.stream(message, caller=self.caller(), settings=RunSettings(
                approver=ctx.child_approver, host=RunHost(humans=ctx.humans, lineage=self.lineage,
                                                          child_approver=ctx.child_approver, realms=ctx.realms,
                                                          child_host=host)))
            if host is not None:
                await host.opened(ctx, self.lineage.path[-1], self.realm, self.conversation_id)
            try:
                timed_out = await self._pump(left)
            finally:
                if host is not None:  # the child's transcript is kept, even when the parent was cancelled
                    await asyncio.shield(host.closed(self.conversation_id, self.stream))
        return self.result_of(timed_out, self.stream.result if self.stream is not None else None)

    async def _pump(self, budget: float) -> bool:
        """Forward the child's events until it ends; True when its time ran out (it was cancelled)."""
        inbox: asyncio.Queue[BaseEvent | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for event in self.stream:
                    inbox.put_nowait(event)
            finally:
                inbox.put_nowait(None)

        async def stop() -> None:
            task.cancel()

        task = asyncio.create_task(pump())
        try:
            return await self.clocked(inbox, budget, stop)
        finally:
            if not task.done():  # the parent was cancelled: so is the child, and its children
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            while not inbox.empty():  # the child's closing events
                if (event := inbox.get_nowait()) is not None:
                    self.forward(event)

    async def clocked(self, inbox: asyncio.Queue[BaseEvent | None], budget: float,
                      stop: Callable[[], Awaitable[None]]) -> bool:
        """Forward the child's events from `inbox` until its end (None); True when its time ran out: then
        `stop()` and its closing events are still forwarded. The clock is one timer, held while the child
        waits for a human."""
        loop = asyncio.get_running_loop()
        left, waiting = max(budget, 0.0), False
        try:
            async with asyncio.timeout(left) as clock:
                while (event := await inbox.get()) is not None:
                    asked = self._observe(event, waiting)
                    if asked and not waiting:  # a human is asked: the clock stops
                        left = (clock.when() or loop.time()) - loop.time()
                        clock.reschedule(None)
                    elif waiting and not asked:  # and goes on once they answered
                        clock.reschedule(loop.time() + left)
                    waiting = asked
                    self.forward(event)
        except TimeoutError:
            await stop()
            while (event := await inbox.get()) is not None:  # its closing events
                self.forward(event)
            return True
        return False

    def forward(self, event: BaseEvent) -> None:
        if self.ctx.emit is not None:
            self.ctx.emit(tagged(event, self.lineage, self.ctx.run_id))

    def _observe(self, event: BaseEvent, waiting: bool) -> bool:
        """Whether the child now waits for a human (its clock stopped); keeps its latest text."""
        if event.agent_path is not None:  # a grandchild's: its own child run keeps its clock
            return waiting
        if isinstance(event, StatusEvent):
            return event.state == "input_required"
        if isinstance(event, ContentDeltaEvent):
            self.partial = (self.partial or "") + event.delta
        elif isinstance(event, MessageStartEvent):
            self.partial = None
        return waiting

    def result_of(self, timed_out: bool, result: Any) -> Returned:
        """The call's result from the child's (a `RunResult`, or its like: `run_id`, `output`, `status`,
        `finish_reason`, `usage`, `error`; None when it has none)."""
        run_id = result.run_id if result is not None else None
        usage: dict[str, Any] | None = result.usage.as_dict() if result else None
        meta = {"child_run_id": run_id, "child_conversation_id": self.conversation_id,
                "finish_reason": result.finish_reason if result else None, "usage": usage}
        if result is not None:
            self.ctx.usage.add(result.usage)  # the child's usage is the parent's too
        if timed_out:
            raise ChildFailure("sub_agent_timeout", f"the sub-agent did not finish within {self.timeout_s:g} s",
                               usage, partial=self.partial, child_run_id=run_id)
        if result is None or result.status not in ("completed",):
            error: dict[str, Any] = (result.error if result else None) or {}
            why = error.get("message") if result else "it stopped without a result"
            if result is not None and result.status == "input_required":
                why = "it needs a human decision and this run has no one to ask (no approver)"
            raise ChildFailure("sub_agent_failed", f"the sub-agent failed: {why}", usage, child_run_id=run_id)
        return Returned(result.output, meta)


class ChildFailure(ToolFailure):
    """A sub-agent call's failure; `usage` is the child's all the same (counted in its parent's: a durable
    run's step records it, so that a replay counts it again, `server.engine`)."""

    def __init__(self, code: str, message: str, usage: dict[str, Any] | None, **extra: Any) -> None:
        super().__init__(code, message, **extra)
        self.usage = usage


@dataclass(frozen=True, slots=True)
class SubAgents:
    """`spawn_agent` for an agent (give it among the agent's `tools`): `agents` by name (none: the agent
    itself), or a resolver from a name to an agent; depth, concurrency per root run and time limits."""

    agents: Sequence[Spawnable] | Callable[[str], Spawnable] = ()
    allowed: tuple[str, ...] | None = None
    """Names a child may be (default: the names of `agents`, or the agent itself)."""
    max_agent_depth: int = 3
    max_concurrent_agents: int = 4
    timeout_s: float = 120.0
    tool_names: tuple[str, ...] = ("spawn_agent",)


@dataclass(frozen=True, slots=True)
class RunHost:
    """What a host gives one run: the server (its stores and approvals) or a parent run (a sub-agent's)."""

    schedules: Any = None
    """The conversation's schedule book (`alarm_clock`, `schedule_task`)."""
    humans: bool = True
    """Whether anyone can answer `ask_question` (False: it returns `no_human_available`)."""
    lineage: Lineage | None = None
    """A sub-agent's place among its parent's."""
    child_approver: Approver | None = None
    """How this run's sub-agents wait for humans (default: the run's approver)."""
    realms: frozenset[str] | None = None
    """The realms the principal may use (for sub-agents in other realms); None: any."""
    child_host: Any = None
    """Keeps sub-agents' conversations (`opened()` / `closed()`)."""
    steps: StepExecutor | None = None
    """This run's step executor instead of the agent's (the server's durable one)."""
