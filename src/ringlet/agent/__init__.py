"""`Agent`: the Python API. `run()` drains `stream()`, and `run_sync()` wraps `run()`: one code path.

An `Agent` is a `Runnable` (`ringlet.agent.contract`), as are graph agents and remote A2A agents: `stream()`
takes the prompt (and the transcript before it), who runs it (`Caller`) and how this run differs from the
agent's others (`RunSettings`)."""

from __future__ import annotations

import asyncio
import copy
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Generic, Literal, Self, TypedDict, Unpack, cast

from typing_extensions import TypeVar

from ringlet._ids import SYSTEM, Seam
from ringlet.agent.build import (
    capabilities,
    check_output_name,
    compaction,
    for_run,
    loop_settings,
    toolsets_of,
)
from ringlet.agent.settings import (
    AGENT_DEFAULTS,
    DEFAULT_EXECUTION,
    DEFAULT_LIMITS,
    DEFAULT_MODEL_SETTINGS,
    NO_GATES,
    NO_HOST,
    Execution,
    Gates,
    Limits,
    RunHost,
    RunSettings,
    SubAgents,
    ToolLike,
)
from ringlet.agent.stream import AgentStream, OutputT, RunResult
from ringlet.agent.subagents import Lineage, Spawnable, SubAgentSettings, spawn_tools
from ringlet.agent.transcripts import compact_transcript, prompt_context
from ringlet.context import ANYONE, Caller, RunContext
from ringlet.errors import ConfigError
from ringlet.events import Event
from ringlet.gates import Gate
from ringlet.gates.approval import ApprovalDecision, ApprovalRules, Approver
from ringlet.hooks.dispatch import BackgroundQueue, Hooks
from ringlet.loop import LocalSteps, LoopConfig, Run, RunState
from ringlet.messages import Message
from ringlet.models.base import Model, ModelSettings
from ringlet.models.pricing import DEFAULT_PRICING
from ringlet.models.providers import resolve_model
from ringlet.output import JsonSchema, NativeOutput, Output, OutputValidator, PromptedOutput, ToolOutput
from ringlet.tools.builtin.question import check_answer
from ringlet.tools.registry import check_unique, origin_of

if TYPE_CHECKING:
    from ringlet.memory import Memory

__all__ = ["Agent", "AgentStream", "Caller", "Prompt", "ResumeOptions", "RunOptions", "RunResult", "RunSettings",
           "ToolLike"]

Prompt = str | Message | Sequence[Message]

log = logging.getLogger("ringlet.agent")
_NO_HOOKS = Hooks(())
_LOCAL_STEPS = LocalSteps(SYSTEM)
DepsT = TypeVar("DepsT", default=None)
"""The type of `ctx.deps` in the agent's tools (`deps_type`)."""
OutputSpec = type[OutputT] | ToolOutput[OutputT] | NativeOutput[OutputT] | PromptedOutput[OutputT] | JsonSchema


class RunOptions(TypedDict, total=False):
    """The keywords of `Agent.stream()`, which `run()` and `run_sync()` take too."""

    history: Sequence[Message]
    caller: Caller
    settings: RunSettings
    deps: Any


class ResumeOptions(TypedDict, total=False):
    """The keywords of `Agent.resume_stream()`, which `resume()` and `resume_sync()` take too."""

    deps: Any
    approver: Approver
    decided_by: str
    host: RunHost


class Agent(Generic[DepsT, OutputT]):
    """A model, instructions and tools, run by the ringlet loop.

        agent = Agent(model, instructions="Be brief.", tools=[get_weather], limits=Limits(max_iterations=5))
        result = await agent.run("Weather in Paris?")
        async for event in agent.stream("And in Rome?"): ...

    `tools` takes functions, `Tool`s and `Toolset`s (MCP servers, the catalog), a `Memory` or
    `MemoryConfig` (the memory tools and the context notes) and `SubAgents` (`spawn_agent`). The settings
    come in typed, frozen groups (`ringlet.agent.settings`): `limits` (`Limits`: iterations, budget, cost,
    retries, compaction), `model_settings` (`ModelSettings`: temperature, top_p, max_tokens), `execution`
    (`Execution`: plugins, tool batches, the step executor) and `gates` (`Gates`: policies, approval rules,
    the approver, audit, realm). A run whose calls need a human pauses (`RunResult.pending_approvals`;
    continue it with `resume`), or waits for `gates.approver` if given. The step executor's `seam`
    (`ringlet._ids.Seam`) is where runs read the clocks and get ids: pass fixed ones to replay a run.

    `output_type` makes the result typed (`RunResult.output`): a pydantic model, dataclass, TypedDict,
    scalar, `list[...]` or union, a `JsonSchema`, or one of them in `ToolOutput` (the default mode),
    `NativeOutput` or `PromptedOutput`; a result that does not validate goes back to the model
    `limits.output_retries` times (see `ringlet.output`). `deps_type` types `ctx.deps` for the tools.
    """

    kind: Literal["loop"] = "loop"
    """What shape of run it starts (`ringlet.agent.contract.RunKind`)."""

    def __init__(self, model: Model | str | Sequence[Model | str], *, name: str = "agent",
                 instructions: str | None = None, tools: Iterable[ToolLike] = (),
                 output_type: OutputSpec[OutputT] | None = None, deps_type: type[DepsT] | None = None,
                 model_settings: ModelSettings | None = None, limits: Limits | None = None,
                 execution: Execution | None = None, gates: Gates | None = None) -> None:
        if isinstance(model, str | list | tuple):
            model = resolve_model(model)  # type: ignore[arg-type]
        if not callable(getattr(model, "stream", None)):
            raise ConfigError(f"model must be a ringlet Model or a 'provider:model' name, got {model!r}")
        model = cast("Model", model)
        self.name = name
        self.limits, self.execution = limits or DEFAULT_LIMITS, execution or DEFAULT_EXECUTION
        self.model_settings, self.access = model_settings or DEFAULT_MODEL_SETTINGS, gates or NO_GATES
        self.realm = self.access.realm
        """The realm this agent runs in as a sub-agent (None: its parent's); the server's default too."""
        self.model = model
        self.settings = loop_settings(self.limits, self.execution, self.model_settings)
        plugins = tuple(self.execution.plugins)
        self.plugins = plugins
        hooks = Hooks(plugins, timeout_s=self.settings.hook_timeout_s,
                      strict=self.settings.strict_plugins) if plugins else _NO_HOOKS
        tools, memory, sub_agents = capabilities(tools)
        self.memory: Memory | None = None
        if memory is not None:  # imported only when used: it brings the store
            from ringlet.memory import memory_of, memory_toolset

            self.memory = memory_of(memory)
            if self.memory is not None and self.memory.config.tool_names:
                tools = [*tools, memory_toolset(self.memory)]
        self._spawning = 0
        """The root-run concurrency of its sub-agents, once it can spawn them."""
        self.deps_type = deps_type
        self._output_validators: list[OutputValidator] = []
        output = self._output(output_type)
        self.toolsets = toolsets_of(tools, hooks.plugins)
        check_output_name(output, self.toolsets)
        access, limits = self.access, self.limits
        self._config = LoopConfig(name, model, instructions, self.settings, hooks, self.toolsets,
                                  self.execution.steps or _LOCAL_STEPS, on_iteration=self.execution.on_iteration,
                                  pricing=limits.pricing or DEFAULT_PRICING, gates=tuple(access.policies),
                                  approvals=access.approvals, audit=access.audit, memory=self.memory, output=output,
                                  guardrails=access.guardrails, **compaction(limits.compaction))
        self.approver = access.approver
        if sub_agents is not None:
            self._sub_agents(sub_agents)
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, BackgroundQueue] | None = None

    @property
    def loop_config(self) -> LoopConfig:
        """What each run of this agent starts from: its model, instructions, tools, hooks, gates, step executor
        (read it; change the agent through its methods, or run a copy: `with_config`)."""
        return self._config

    def with_config(self, **changes: Any) -> Self:
        """A copy of this agent whose runs start from its `loop_config` with `changes` (e.g. `gates`,
        `audit`); this agent is not changed."""
        clone = copy.copy(self)
        clone._config = replace(self._config, **changes)
        return clone

    def add_tools(self, tools: Iterable[ToolLike]) -> None:
        """Give every later run of this agent more tools (names must stay unique)."""
        toolsets = toolsets_of(tools, ())
        combined = (*self.toolsets, *toolsets)
        check_unique((t.name, origin_of(ts)) for ts in combined for t in ts.static_tools or ())
        self.toolsets = self._config.toolsets = combined
        self._config.registry = None

    def enable_sub_agents(self, resolve: Callable[[str], Spawnable], settings: SubAgentSettings,
                          names: Sequence[str] = ("spawn_agent",)) -> None:
        """Give the agent `spawn_agent` (or the names given): children by name from `resolve`, within
        `settings` (allowed agents, depth, concurrency per root run, timeout)."""
        self._spawning = settings.max_concurrent_agents
        self.add_tools(spawn_tools(names, resolve, settings))

    def _sub_agents(self, given: SubAgents) -> None:
        """`SubAgents` among the tools: a resolver (with `allowed`), or agents allowed by name (none: this
        agent itself)."""
        settings = SubAgentSettings(allowed=given.allowed, max_agent_depth=given.max_agent_depth,
                                    max_concurrent_agents=given.max_concurrent_agents, timeout_s=given.timeout_s)
        agents = given.agents
        if callable(agents):
            self.enable_sub_agents(agents, settings, given.tool_names)
            return
        known = {a.name: a for a in agents}

        def resolve(name: str) -> Spawnable:
            return known.get(name, self)

        self.enable_sub_agents(resolve, replace(settings, allowed=settings.allowed or tuple(known) or (self.name,)),
                               given.tool_names)

    @property
    def instructions(self) -> str | None:
        return self._config.instructions

    def _output(self, spec: Any) -> Output | None:
        if spec is None or spec is str:  # text, as without an output type
            return None
        return Output.of(spec, retries=self.limits.output_retries, validators=self._output_validators)

    def output_validator(self, fn: OutputValidator) -> OutputValidator:
        """Register a check of every result (decorator): `fn(value)` or `fn(ctx, value)`, sync or async,
        returns the value (maybe changed) or raises `ModelRetry("why")` to send the model back to it."""
        self._output_validators.append(fn)
        return fn

    def stream(self, prompt: Prompt, *, history: Sequence[Message] = (), caller: Caller | None = None,
               settings: RunSettings | None = None, deps: DepsT | None = None) -> AgentStream[OutputT]:
        """Start a run and return its event stream: `prompt` after the transcript `history`, for `caller`
        (who runs it and where: conversation, realm, user, org, roles, channel, request id, run id), with
        `settings` (how this run differs: its result type, another model, more instructions or tools, other
        limits, an approver that waits for humans' decisions instead of pausing, what a host gives it)."""
        caller, settings = caller or ANYONE, settings or AGENT_DEFAULTS
        config, host = self._config, settings.host or NO_HOST
        if settings.changes_agent():
            config, _ = for_run(config, self, settings)
        if host.steps is not None:
            config = replace(config, steps=host.steps)
        if settings.output_type is not None:  # this run's own result type (its final-result tool too)
            config = replace(config, output=self._output(settings.output_type), registry=None)
            check_output_name(config.output, config.toolsets)
        seam = config.steps.seam
        approver = settings.approver or self.approver
        rid = caller.run_id or seam.new_id("r")
        ctx = RunContext(
            run_id=rid, agent=self.name, conversation_id=caller.conversation_id, realm=caller.realm,
            user_id=caller.user_id, org_id=caller.org_id, roles=caller.roles, channel=caller.channel, deps=deps,
            request_id=caller.request_id, schedules=host.schedules, humans=host.humans, realms=host.realms,
            child_host=host.child_host, child_approver=host.child_approver or approver, seam=seam,
            lineage=host.lineage or self._lineage(),
            plugin_data=settings.plugin_data if settings.plugin_data is not None else {})
        state = RunState(run_id=rid, agent=self.name, conversation_id=caller.conversation_id,
                         plugin_data=ctx.plugin_data, usage=ctx.usage, realm=caller.realm, user_id=caller.user_id,
                         org_id=caller.org_id, roles=list(caller.roles), channel=caller.channel,
                         request_id=caller.request_id)
        for m in history:
            state.append(m)
            state.call_counter += len(m.tool_calls)  # call_<n> ids stay unique across the conversation
        state.history_length = len(state.messages)
        run = Run(config, state, ctx, config.settings, background=self._background)
        return AgentStream(run, _incoming(prompt, state, seam), approver=approver)

    def resume_stream(self, state: RunState | str | bytes,
                      decisions: Mapping[str, ApprovalDecision | bool] | None = None, *, deps: DepsT | None = None,
                      approver: Approver | None = None, decided_by: str = "user",
                      host: RunHost | None = None) -> AgentStream[OutputT]:
        """Continue a run paused for approvals or questions, in this process or another: `state` is
        `RunResult.state` (or its `to_json()`), `decisions` map tool-call ids (or approval/question ids) to
        `True`/`False` or an `ApprovalDecision` (with a note), or, for a question, to its answer (a label,
        a list of labels, or text; `InvalidAnswer` when it does not fit). Undecided calls keep waiting.
        `host`: as `RunSettings.host` for `stream()`."""
        if not isinstance(state, RunState):
            state = RunState.from_json(state)
        if state.agent != self.name:
            raise ConfigError(f"run {state.run_id} belongs to agent {state.agent!r}, not {self.name!r}")
        if not state.awaiting:
            raise ConfigError(f"run {state.run_id} is not waiting for approvals (status {state.status})")
        host = host or NO_HOST
        config = self._config if host.steps is None else replace(self._config, steps=host.steps)
        ctx = RunContext(
            run_id=state.run_id, agent=self.name, conversation_id=state.conversation_id, realm=state.realm,
            user_id=state.user_id, org_id=state.org_id, roles=tuple(state.roles),
            channel=state.channel, request_id=state.request_id,  # type: ignore[arg-type]
            deps=deps, plugin_data=state.plugin_data, usage=state.usage, schedules=host.schedules,
            child_host=host.child_host, child_approver=host.child_approver or approver or self.approver,
            seam=config.steps.seam, lineage=self._lineage())
        run = Run(config, state, ctx, self.settings, background=self._background)
        chosen = {k: _decision(state, k, v, decided_by) for k, v in (decisions or {}).items()}
        return AgentStream(run, (), approver=approver or self.approver, resume=chosen)

    def _lineage(self) -> Lineage | None:
        """A root run's place among sub-agents, once the agent can spawn them."""
        return Lineage.root(self.name, self._spawning) if self._spawning else None

    async def resume(self, state: RunState | str | bytes,
                     decisions: Mapping[str, ApprovalDecision | bool] | None = None,
                     **options: Unpack[ResumeOptions]) -> RunResult[OutputT]:
        """`resume_stream()` run to the end (or to the next pause); returns the result."""
        return await _drained(self.resume_stream(state, decisions, **options))

    async def run(self, prompt: Prompt, **options: Unpack[RunOptions]) -> RunResult[OutputT]:
        """Run to the end and return the result. Takes the options of `stream()`."""
        return await _drained(self.stream(prompt, **options))

    def run_sync(self, prompt: Prompt, **options: Unpack[RunOptions]) -> RunResult[OutputT]:
        """`run()` for code without an event loop; queued post_execute hooks finish before it returns.
        Inside a running event loop (async code, Jupyter) it raises ConfigError: `await agent.run(...)`."""
        return _in_new_loop(self, "run", lambda: self.run(prompt, **options))

    def resume_sync(self, state: RunState | str | bytes,
                    decisions: Mapping[str, ApprovalDecision | bool] | None = None,
                    **options: Unpack[ResumeOptions]) -> RunResult[OutputT]:
        """`resume()` for code without an event loop, like `run_sync()`: queued post_execute hooks finish
        before it returns; inside a running event loop it raises ConfigError (`await agent.resume(...)`)."""
        return _in_new_loop(self, "resume", lambda: self.resume(state, decisions, **options))

    async def context(self, history: Sequence[Message], *, realm: str = "default") -> dict[str, Any]:
        """Where the tokens of the next request after `history` would go: the TokenBreakdown fields plus
        `context_window` and `budget` (the effective budget of `loop-and-hooks.md` §7)."""
        return await prompt_context(self._config, history, realm)

    @property
    def gates(self) -> tuple[Gate, ...]:
        return tuple(self._config.gates)

    async def compact(self, history: Sequence[Message], *, realm: str = "default",
                      conversation_id: str | None = None) -> tuple[list[Message], Event | None]:
        """Compact a transcript now (`POST …/compact`): the oldest turn pairs become one `<compacted>` note.
        Returns the messages to store (the note, and the covered messages marked `compacted_into`) and the
        `compaction` event; `([], None)` when nothing can be compacted."""
        return await compact_transcript(self._config, history, realm, conversation_id)

    @property
    def approvals(self) -> ApprovalRules | None:
        return self._config.approvals

    def use_gates(self, gates: Iterable[Gate], *, audit: Callable[[dict[str, Any]], Any] | None = None) -> None:
        """Replace the gates every later run of this agent goes through (e.g. the server's policy), and,
        with `audit`, where approval decisions are audited."""
        self._config.gates = tuple(gates)
        if audit is not None:
            self._config.audit = audit

    def _background(self) -> BackgroundQueue | None:
        if not self._config.hooks.has("post_execute"):
            return None
        if self._queues is None:
            self._queues = weakref.WeakKeyDictionary()
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = BackgroundQueue()
        return queue

    async def aclose(self) -> None:
        """Close what the agent's toolsets hold open (MCP sessions and their server processes)."""
        for toolset in self.toolsets:
            close = getattr(toolset, "aclose", None)
            if close is not None:
                try:
                    await close()
                except Exception:
                    log.warning("closing toolset %r failed", toolset, exc_info=True)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def wait_background(self, timeout_s: float = 30.0) -> None:
        """Wait (at most `timeout_s`) until queued post_execute hooks have run: before the event loop
        closes, in tests, and on graceful shutdown."""
        queue = self._queues.get(asyncio.get_running_loop()) if self._queues is not None else None
        if queue is not None:
            try:
                async with asyncio.timeout(timeout_s):
                    await queue.join()
            except TimeoutError:
                log.warning("post_execute hooks still running after %s s; leaving them", timeout_s)


def _in_new_loop(agent: Agent[Any, OutputT], method: str,
                 start: Callable[[], Awaitable[RunResult[OutputT]]]) -> RunResult[OutputT]:
    """Run `start()` in a new event loop, then the agent's post_execute hooks, then close its toolsets. Checked
    before any coroutine exists, so a running loop gets one clear error and no never-awaited warning."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop running: the normal case
        pass
    else:
        raise ConfigError(f"Agent.{method}_sync() cannot be called from a running event loop (async code, "
                          f"Jupyter); use `await agent.{method}(...)` there instead")

    async def main() -> RunResult[OutputT]:
        try:
            result = await start()
            await agent.wait_background()
        finally:
            await agent.aclose()  # this event loop ends here: so do the sessions it holds
        return result

    return asyncio.run(main())


async def _drained(stream: AgentStream[OutputT]) -> RunResult[OutputT]:
    """A stream run to its end (or its pause): its result."""
    async for _ in stream:
        pass
    result = stream.result
    assert result is not None, "a run ends with message_end or pauses"
    return result


def _decision(state: RunState, key: str, value: Any, decided_by: str) -> ApprovalDecision:
    """A decision given to `resume`: approvals take a bool or a decision, questions their answer."""
    if isinstance(value, ApprovalDecision):
        return value
    parked = state.awaiting.get(key) or next((p for p in state.awaiting.values() if p.request.approval_id == key),
                                              None)
    if parked is None or parked.request.question is None:
        return ApprovalDecision.of(value, decided_by)
    answer, freeform = check_answer(parked.request.question, value)
    return ApprovalDecision("answered", decided_by, answer={"answer": answer, "freeform": freeform})


def _incoming(prompt: Prompt, state: RunState, seam: Seam) -> list[Message]:
    """The run's input as messages; a text prompt is the run's own user message."""
    if isinstance(prompt, str):
        source = "chat" if state.channel == "cli" else state.channel
        return [Message(id=seam.new_id("m"), role="user", content=prompt, run_id=state.run_id,
                        conversation_id=state.conversation_id, created_at=seam.stamp(), metadata={"source": source})]
    if isinstance(prompt, Message):
        return [prompt]
    return list(prompt)
