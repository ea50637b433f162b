"""`Agent`: the Python API. `run()` drains `stream()`, and `run_sync()` wraps `run()`: one code path."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, Self, TypeAlias, TypedDict, Unpack, cast

from typing_extensions import TypeVar

from ringlet._ids import SYSTEM, Seam
from ringlet.agent.forks import Fork, fork_at
from ringlet.agent.settings import (
    DEFAULT_EXECUTION,
    DEFAULT_LIMITS,
    DEFAULT_MODEL_SETTINGS,
    NO_GATES,
    NO_HOST,
    Execution,
    Gates,
    Limits,
    RunHost,
    SubAgents,
)
from ringlet.agent.subagents import Lineage, Spawnable, SubAgentSettings, spawn_tools
from ringlet.context import Channel, RunContext
from ringlet.errors import ConfigError
from ringlet.events import Event, FinishReason, RunStatus
from ringlet.gates import Gate
from ringlet.gates.approval import NEVER, ApprovalDecision, ApprovalRequest, ApprovalRules, Approver, epoch
from ringlet.hooks.dispatch import BackgroundQueue, Hooks, PluginActions
from ringlet.hooks.plugin import Plugin
from ringlet.loop import LocalSteps, LoopConfig, LoopSettings, Run, RunState, Suspend, agent_loop
from ringlet.loop.compact import compact_now
from ringlet.loop.prompt import effective_budget, visible_messages, without_compacted
from ringlet.loop.settings import DEFAULT_SETTINGS
from ringlet.memory.compaction import CompactionConfig
from ringlet.memory.settings import MemoryConfig
from ringlet.messages import Message
from ringlet.models.base import Model, ModelSettings
from ringlet.models.pricing import DEFAULT_PRICING
from ringlet.models.providers import resolve_model
from ringlet.models.tokens import breakdown
from ringlet.output import JsonSchema, NativeOutput, Output, OutputValidator, PromptedOutput, ToolOutput
from ringlet.tools.base import StaticToolset, Tool, Toolset
from ringlet.tools.builtin.question import check_answer
from ringlet.tools.function import function_tool
from ringlet.tools.registry import check_unique, origin_of
from ringlet.usage import Usage

if TYPE_CHECKING:
    from ringlet.memory import Memory

ToolLike: TypeAlias = "Tool | Toolset | Callable[..., Any] | SubAgents | Memory | MemoryConfig"
"""What `tools=` takes: functions, tools, toolsets, and the capabilities that bring tools (and more) with
them: `SubAgents` (`spawn_agent`), a `Memory` or `MemoryConfig` (memory tools and context notes)."""
Prompt = str | Message | Sequence[Message]

log = logging.getLogger("ringlet.agent")
LIMIT_FIELDS = ("max_iterations", "on_max_iterations", "max_tokens_per_turn", "max_cost_usd_per_run",
                "max_blank_stops", "blank_stop_nudge", "max_repeated_tool_errors", "terminal_tool",
                "question_timeout_s")
EXECUTION_FIELDS = ("hook_timeout_s", "strict_plugins", "parallel_tools", "max_tool_concurrency", "batch_timeout_s",
                    "tool_result_max_chars")
_NO_HOOKS = Hooks(())
_LOCAL_STEPS = LocalSteps(SYSTEM)
OutputT = TypeVar("OutputT", default=str)
"""The type of a run's result: `str` (the answer's text) unless the agent has an `output_type`."""
DepsT = TypeVar("DepsT", default=None)
"""The type of `ctx.deps` in the agent's tools (`deps_type`)."""
OutputSpec = type[OutputT] | ToolOutput[OutputT] | NativeOutput[OutputT] | PromptedOutput[OutputT] | JsonSchema


class RunOptions(TypedDict, total=False):
    """The keywords of `Agent.stream()`, which `run()` and `run_sync()` take too."""

    history: Sequence[Message]
    deps: Any
    output_type: Any
    model: Model | str
    instructions: str
    tools: Iterable[ToolLike]
    model_settings: ModelSettings
    limits: Limits
    conversation_id: str
    realm: str
    user_id: str
    org_id: str
    roles: Sequence[str]
    channel: Channel
    plugin_data: dict[str, Any]
    run_id: str
    request_id: str
    approver: Approver
    host: RunHost


class ResumeOptions(TypedDict, total=False):
    """The keywords of `Agent.resume_stream()`, which `resume()` and `resume_sync()` take too."""

    deps: Any
    approver: Approver
    decided_by: str
    host: RunHost


@dataclass(slots=True)
class RunResult(Generic[OutputT]):
    """How a run ended. `state` is the serialisable run state (enough to inspect or continue the run)."""

    run_id: str
    output: OutputT | None
    """The answer: its text, or with an `output_type` the validated result — None when such a run did not
    produce it: it failed (`error`, e.g. `output_validation_failed`) or paused (`pending_approvals`). Typed
    `| None` for every run, so code checks before it reads a field (a text run's is then what it said so far)."""
    finish_reason: FinishReason | None
    """None while the run is paused for approvals."""
    status: RunStatus
    usage: Usage
    messages: list[Message]
    error: dict[str, Any] | None
    state: RunState = field(repr=False)
    pending_approvals: dict[str, ApprovalRequest] = field(default_factory=dict)
    """The paused run's approval requests and questions (`request.question` set), by tool-call id: decide
    or answer them, then `agent.resume(state, …)`."""

    def new_messages(self) -> list[Message]:
        """The messages of this run: its input and everything the run added."""
        return self.messages[self.state.history_length:]

    def fork(self, at: str | int, *, edit: str | None = None, tool_result: str | None = None,
             tool_call_id: str | None = None, rerun: bool = False) -> Fork:
        """This run's transcript forked at message `at` (its id or index): `agent.run(fork.prompt,
        history=fork.history)` goes on from there. `edit`: new text for that user message; `tool_result`: a
        result in place of a tool call's; `rerun`: run that call again (`ringlet.agent.forks`)."""
        return fork_at(self.messages, at, edit=edit, tool_result=tool_result, tool_call_id=tool_call_id,
                       rerun=rerun)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (without the state): output, finish_reason, status, usage, messages, error."""
        return {"run_id": self.run_id, "output": self.output, "finish_reason": self.finish_reason,
                "status": self.status, "usage": self.usage.as_dict(), "error": self.error,
                "messages": [m.model_dump(mode="json") for m in self.messages],
                "pending_approvals": {k: asdict(r) for k, r in self.pending_approvals.items()}}


class AgentStream(Generic[OutputT]):
    """The events of one run, as an async iterator; `.result` is available once `message_end` has passed
    (or once the run paused for approvals: `.paused`). With an `approver` the stream waits for its
    decisions instead of pausing. What a consumer needs is in the events and in `.state` (serialisable)."""

    def __init__(self, run: Run, incoming: Sequence[Message], *, approver: Approver | None = None,
                 resume: Mapping[str, ApprovalDecision] | None = None) -> None:
        self.run = run
        events = agent_loop(run, incoming, resume)
        self._events = events if approver is None else self._waiting(events, approver)

    async def _waiting(self, events: AsyncGenerator[Event, None], approver: Approver) -> AsyncGenerator[Event, None]:
        """Resume the paused run with the approver's decisions (or at the earliest expiry) until it ends."""
        run = self.run
        while True:
            async with aclosing(events):
                async for event in events:
                    yield event
            if not run.paused:
                return
            requests = [p.request for p in run.state.awaiting.values()]
            earliest = min((epoch(r.expires_at) for r in requests if r.expires_at != NEVER), default=None)
            try:
                async with asyncio.timeout(None if earliest is None else max(0.0, earliest - run.seam.now())):
                    decisions = dict(await approver.wait(requests))
            except TimeoutError:
                decisions = {}  # the loop counts an expired request as denied
            except asyncio.CancelledError:  # cancelled while waiting: the run still ends with message_end
                cancel = {r.tool_call_id: ApprovalDecision("cancelled", "system:cancel") for r in requests}
                async for event in agent_loop(run, (), cancel):
                    yield event
                raise
            events = agent_loop(run, (), decisions)

    @property
    def run_id(self) -> str:
        return self.run.state.run_id

    @property
    def state(self) -> RunState:
        """The run state: transcript, usage, `response_id` (the id `message_start` gave), and while paused
        `awaiting` (each waiting call's whole `ApprovalRequest`)."""
        return self.run.state

    @property
    def paused(self) -> bool:
        """Whether the run paused for humans' decisions: set when its `status: input_required` event is
        yielded; no `message_end` until `Agent.resume` continues it."""
        return self.run.paused

    @property
    def ending(self) -> bool:
        """Whether the run is closing: its last events (`status`, `message_end`) are being yielded."""
        return self.run.end is not None and not self.run.paused

    def __aiter__(self) -> AsyncGenerator[Event, None]:
        return self._events  # iterate the loop itself: no wrapper on the per-event path

    async def __anext__(self) -> Event:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()

    async def stream_output(self) -> AsyncGenerator[OutputT, None]:
        """Run to the end, yielding the typed result as it streams: validated partial values while the
        model writes it (each one further along), then the final value. Without an `output_type`, the
        text so far. Afterwards `.result` is set as usual."""
        output, raw, source, last = self.run.config.output, "", None, None
        tool_mode = output is not None and output.mode == "tool"
        async for event in self:
            if tool_mode and event.type == "tool_call_start" and event.name == output.name:  # type: ignore[union-attr]
                source, raw = event.tool_call_id, ""
                continue
            if tool_mode and event.type == "tool_call_delta" and event.tool_call_id == source:
                raw += event.args_delta
            elif not tool_mode and event.type == "content_delta":
                if event.message_id != source:  # a new message: a new answer
                    source, raw = event.message_id, ""
                raw += event.delta
            else:
                continue
            value: Any = raw if output is None else output.partial(raw)
            if value is not None and value != last:
                last = value
                yield value
        if output is not None and self.run.output_value is not None and self.run.output_value != last:
            yield self.run.output_value

    @property
    def result(self) -> RunResult[OutputT] | None:
        """How the run ended (or paused), or None while it has not."""
        end, st, output = self.run.end, self.run.state, self.run.config.output
        if end is None:
            return None
        end = None if isinstance(end, Suspend) else end
        e = end.error if end else None
        final = next((m for m in reversed(st.messages) if m.role == "assistant"), None)
        text = final.text if final and not final.tool_calls else ""
        value: Any = text if output is None else self.run.output_value
        if value is None and output is not None and st.output is not None:  # resumed elsewhere: from JSON
            value = output.validate(st.output)
        return RunResult(run_id=st.run_id, output=cast("OutputT", value),
                         finish_reason=end.reason if end else None, status=end.status if end else "input_required",
                         usage=st.usage, messages=list(st.messages),
                         error={"code": e.code, "message": e.message, "details": e.details} if e else None,
                         state=st, pending_approvals={k: p.request for k, p in st.awaiting.items()})


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
        self.settings = _loop_settings(self.limits, self.execution, self.model_settings)
        plugins = tuple(self.execution.plugins)
        self.plugins = plugins
        hooks = Hooks(plugins, timeout_s=self.settings.hook_timeout_s,
                      strict=self.settings.strict_plugins) if plugins else _NO_HOOKS
        tools, memory, sub_agents = _capabilities(tools)
        self.memory = None
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
        self.toolsets = _toolsets(tools, hooks.plugins)
        _check_output_name(output, self.toolsets)
        access, limits = self.access, self.limits
        self._config = LoopConfig(name, model, instructions, self.settings, hooks, self.toolsets,
                                  self.execution.steps or _LOCAL_STEPS, on_iteration=self.execution.on_iteration,
                                  pricing=limits.pricing or DEFAULT_PRICING, gates=tuple(access.policies),
                                  approvals=access.approvals, audit=access.audit, memory=self.memory, output=output,
                                  **_compaction(limits.compaction))
        self.approver = access.approver
        if sub_agents is not None:
            self._sub_agents(sub_agents)
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, BackgroundQueue] | None = None

    def add_tools(self, tools: Iterable[ToolLike]) -> None:
        """Give every later run of this agent more tools (names must stay unique)."""
        toolsets = _toolsets(tools, ())
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
            return known.get(name, cast("Spawnable", self))

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

    def stream(self, prompt: Prompt, *, history: Sequence[Message] = (), deps: DepsT | None = None,
               output_type: OutputSpec[Any] | None = None, model: Model | str | None = None,
               instructions: str | None = None, tools: Iterable[ToolLike] = (),
               model_settings: ModelSettings | None = None, limits: Limits | None = None,
               conversation_id: str | None = None, realm: str = "default", user_id: str | None = None,
               org_id: str | None = None, roles: Sequence[str] = (), channel: Channel = "chat",
               plugin_data: dict[str, Any] | None = None, run_id: str | None = None,
               request_id: str | None = None, approver: Approver | None = None,
               host: RunHost | None = None) -> AgentStream[OutputT]:
        """Start a run and return its event stream. For this run only: `output_type` (its result type),
        `model` (a Model or a name), `instructions` (after the agent's own), `tools` (more tools),
        `model_settings` and `limits` (in place of the agent's). Who runs it: `conversation_id`, `realm`,
        `user_id`, `org_id`, `roles`, `channel`, `request_id`; `approver` waits for humans' decisions (none:
        the run pauses). `host` is what a server or a parent run gives it (`RunHost`)."""
        config, settings, host = self._config, self.settings, host or NO_HOST
        if model is not None or instructions or tools or model_settings is not None or limits is not None:
            config, settings = self._override(model, instructions, tools, model_settings, limits)
        if host.steps is not None:
            config = replace(config, steps=host.steps)
        if output_type is not None:  # this run's own result type (its final-result tool too)
            config = replace(config, output=self._output(output_type), registry=None)
            _check_output_name(config.output, config.toolsets)
        seam = config.steps.seam
        rid = run_id or seam.new_id("r")
        ctx = RunContext(
            run_id=rid, agent=self.name, conversation_id=conversation_id, realm=realm, user_id=user_id,
            org_id=org_id, roles=tuple(roles), channel=channel, deps=deps, request_id=request_id,
            schedules=host.schedules, humans=host.humans, realms=host.realms, child_host=host.child_host,
            child_approver=host.child_approver or approver or self.approver, seam=seam,
            lineage=host.lineage or (Lineage.root(self.name, self._spawning) if self._spawning else None),
            plugin_data=plugin_data if plugin_data is not None else {})
        state = RunState(run_id=rid, agent=self.name, conversation_id=conversation_id,
                         plugin_data=ctx.plugin_data, usage=ctx.usage, realm=realm, user_id=user_id, org_id=org_id,
                         roles=list(roles), channel=channel, request_id=request_id)
        for m in history:
            state.append(m)
            state.call_counter += len(m.tool_calls)  # call_<n> ids stay unique across the conversation
        state.history_length = len(state.messages)
        run = Run(config, state, ctx, settings, background=self._background)
        return AgentStream(run, _incoming(prompt, state, seam), approver=approver or self.approver)

    def resume_stream(self, state: RunState | str | bytes,
                      decisions: Mapping[str, ApprovalDecision | bool] | None = None, *, deps: DepsT | None = None,
                      approver: Approver | None = None, decided_by: str = "user",
                      host: RunHost | None = None) -> AgentStream[OutputT]:
        """Continue a run paused for approvals or questions, in this process or another: `state` is
        `RunResult.state` (or its `to_json()`), `decisions` map tool-call ids (or approval/question ids) to
        `True`/`False` or an `ApprovalDecision` (with a note), or, for a question, to its answer (a label,
        a list of labels, or text; `InvalidAnswer` when it does not fit). Undecided calls keep waiting.
        `host`: as for `stream()`."""
        if not isinstance(state, RunState):
            state = RunState.from_json(state)
        if state.agent != self.name:
            raise ConfigError(f"run {state.run_id} belongs to agent {state.agent!r}, not {self.name!r}")
        if not state.awaiting:
            raise ConfigError(f"run {state.run_id} is not waiting for approvals (status {state.status})")
        host = host or NO_HOST
        ctx = RunContext(
            run_id=state.run_id, agent=self.name, conversation_id=state.conversation_id, realm=state.realm,
            user_id=state.user_id, org_id=state.org_id, roles=tuple(state.roles),
            channel=state.channel, request_id=state.request_id,  # type: ignore[arg-type]
            deps=deps, plugin_data=state.plugin_data, usage=state.usage, schedules=host.schedules,
            child_host=host.child_host, child_approver=host.child_approver or approver or self.approver,
            seam=(host.steps or self._config.steps).seam,
            lineage=Lineage.root(self.name, self._spawning) if self._spawning else None)
        config = self._config if host.steps is None else replace(self._config, steps=host.steps)
        run = Run(config, state, ctx, self.settings, background=self._background)
        chosen = {k: _decision(state, k, v, decided_by) for k, v in (decisions or {}).items()}
        return AgentStream(run, (), approver=approver or self.approver, resume=chosen)

    async def resume(self, state: RunState | str | bytes,
                     decisions: Mapping[str, ApprovalDecision | bool] | None = None,
                     **options: Unpack[ResumeOptions]) -> RunResult[OutputT]:
        """`resume_stream()` run to the end (or to the next pause); returns the result."""
        stream = self.resume_stream(state, decisions, **options)
        async for _ in stream:
            pass
        result = stream.result
        assert result is not None, "a resumed run ends with message_end or pauses again"
        return result

    def _override(self, model: Model | str | None, instructions: str | None, tools: Iterable[ToolLike],
                  model_settings: ModelSettings | None, limits: Limits | None) -> tuple[LoopConfig, LoopSettings]:
        """This run's config and settings: another model, more instructions and tools, other settings."""
        config = self._config
        if isinstance(model, str):  # the agent's own model by name is the agent's own instance
            model = config.model if model == config.model.name else resolve_model(model)
        changes: dict[str, Any] = {"model": model or config.model}
        if instructions:
            own = config.instructions
            changes["instructions"] = f"{own}\n\n{instructions}" if own else instructions
        extra = _toolsets(tools, ()) if tools else ()
        if extra:
            toolsets = (*config.toolsets, *extra)
            check_unique((t.name, origin_of(ts)) for ts in toolsets for t in ts.static_tools or ())
            changes |= {"toolsets": toolsets, "registry": None}
        settings = self.settings
        if model_settings is not None or limits is not None:
            settings = _loop_settings(limits or self.limits, self.execution, model_settings or self.model_settings)
            if limits is not None:
                changes |= {"pricing": limits.pricing or DEFAULT_PRICING, **_compaction(limits.compaction)}
        return LoopConfig(**{**config.__dict__, **changes, "settings": settings}), settings

    async def run(self, prompt: Prompt, **options: Unpack[RunOptions]) -> RunResult[OutputT]:
        """Run to the end and return the result. Takes the options of `stream()`."""
        stream = self.stream(prompt, **options)
        async for _ in stream:
            pass
        result = stream.result
        assert result is not None, "a run always ends with message_end"
        return result

    def run_sync(self, prompt: Prompt, **options: Unpack[RunOptions]) -> RunResult[OutputT]:
        """`run()` for code without an event loop; queued post_execute hooks finish before it returns.
        Inside a running event loop (async code, Jupyter) it raises ConfigError: `await agent.run(...)`."""
        return self._sync("run", lambda: self.run(prompt, **options))

    def resume_sync(self, state: RunState | str | bytes,
                    decisions: Mapping[str, ApprovalDecision | bool] | None = None,
                    **options: Unpack[ResumeOptions]) -> RunResult[OutputT]:
        """`resume()` for code without an event loop, like `run_sync()`: queued post_execute hooks finish
        before it returns; inside a running event loop it raises ConfigError (`await agent.resume(...)`)."""
        return self._sync("resume", lambda: self.resume(state, decisions, **options))

    def _sync(self, method: str, start: Callable[[], Awaitable[RunResult[OutputT]]]) -> RunResult[OutputT]:
        """Run `start()` in a new event loop, then its post_execute hooks, then close the toolsets. Checked
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
                await self.wait_background()
            finally:
                await self.aclose()  # this event loop ends here: so do the sessions it holds
            return result

        return asyncio.run(main())

    async def context(self, history: Sequence[Message], *, realm: str = "default") -> dict[str, Any]:
        """Where the tokens of the next request after `history` would go: the TokenBreakdown fields plus
        `context_window` and `budget` (the effective budget of `loop-and-hooks.md` §7)."""
        ctx = RunContext(run_id=self._config.steps.seam.new_id("r"), agent=self.name, realm=realm)
        run = Run(self._config, RunState(run_id=ctx.run_id, agent=self.name), ctx, self.settings)
        registry = self._config.registry or await run.tool_registry()
        prompt = visible_messages(history, {}, 0)
        if any(m.metadata.get("kind") == "compaction" for m in prompt):  # what a compaction left in the prompt
            prompt = without_compacted(prompt)
        window = self.model.context_window
        return {**asdict(breakdown(self.instructions, prompt, registry.tool_tokens)), "context_window": window,
                "budget": effective_budget(self.settings.max_tokens_per_turn, window,
                                           self.settings.max_output_tokens)}

    @property
    def gates(self) -> tuple[Gate, ...]:
        return tuple(self._config.gates)

    async def compact(self, history: Sequence[Message], *, realm: str = "default",
                      conversation_id: str | None = None) -> tuple[list[Message], Event | None]:
        """Compact a transcript now (`POST …/compact`): the oldest turn pairs become one `<compacted>` note.
        Returns the messages to store (the note, and the covered messages marked `compacted_into`) and the
        `compaction` event; `([], None)` when nothing can be compacted."""
        config = self._config
        if config.compaction is None:
            raise ConfigError(f"compaction is off for agent {self.name!r}")
        ctx = RunContext(run_id=config.steps.seam.new_id("r"), agent=self.name, conversation_id=conversation_id,
                         realm=realm)
        state = RunState(run_id=ctx.run_id, agent=self.name, conversation_id=conversation_id, usage=ctx.usage)
        for m in history:
            state.append(m)
        events = await compact_now(Run(config, state, ctx, self.settings))
        event = next((e for e in events if e.type == "compaction"), None)
        if event is None:
            return [], None
        note_id = event.summary_message_id  # type: ignore[union-attr]
        return [m for m in state.messages if m.id == note_id or m.metadata.get("compacted_into") == note_id], event

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


_DEFAULT_COMPACTION = CompactionConfig.model_construct()  # valid defaults: no schema built at import


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


def _loop_settings(limits: Limits, execution: Execution, sampling: ModelSettings) -> LoopSettings:
    """The loop's one validated settings value, from the agent's groups."""
    if limits is DEFAULT_LIMITS and execution is DEFAULT_EXECUTION and sampling is DEFAULT_MODEL_SETTINGS:
        return DEFAULT_SETTINGS
    values = {f: getattr(limits, f) for f in LIMIT_FIELDS} | {f: getattr(execution, f) for f in EXECUTION_FIELDS}
    values |= {"temperature": sampling.temperature, "top_p": sampling.top_p, "max_output_tokens": sampling.max_tokens}
    return LoopSettings.build(**{k: v for k, v in values.items() if v != LoopSettings.model_fields[k].default})


def _capabilities(tools: Iterable[Any]) -> tuple[list[Any], Any, SubAgents | None]:
    """The agent's tools apart from the capabilities among them: its memory (a `Memory` or a
    `MemoryConfig`) and its `SubAgents`."""
    plain, memory, sub_agents = [], None, None
    for t in tools:
        if isinstance(t, SubAgents):
            sub_agents = t
        elif isinstance(t, MemoryConfig) or any(f"{c.__module__}.{c.__qualname__}" == "ringlet.memory.core.Memory"
                                                 for c in type(t).__mro__):
            memory = t  # (Memory is not imported to check: it brings the store)
        else:
            plain.append(t)
    return plain, memory, sub_agents


def _check_output_name(output: Output | None, toolsets: Sequence[Toolset]) -> None:
    """Tool mode's final-result tool needs a name no tool of the agent has."""
    if output is not None and output.mode == "tool" and any(
            t.name == output.name for ts in toolsets for t in ts.static_tools or ()):
        raise ConfigError(f"the output tool's name {output.name!r} is taken by a tool of the agent; give the "
                          "output another name: ToolOutput(type, name=...)")


def _compaction(value: CompactionConfig | bool) -> dict[str, Any]:
    """`compaction=`: True (the defaults, one shared instance), False (never), or a CompactionConfig."""
    config = _DEFAULT_COMPACTION if value is True else value or None
    if config is None or not config.enabled:
        return {"compaction": None}
    return {"compaction": config, "compaction_model": resolve_model(config.model) if config.model else None}


def _incoming(prompt: Prompt, state: RunState, seam: Seam) -> list[Message]:
    """The run's input as messages; a text prompt is the run's own user message."""
    if isinstance(prompt, str):
        source = "chat" if state.channel == "cli" else state.channel
        return [Message(id=seam.new_id("m"), role="user", content=prompt, run_id=state.run_id,
                        conversation_id=state.conversation_id, created_at=seam.stamp(), metadata={"source": source})]
    if isinstance(prompt, Message):
        return [prompt]
    return list(prompt)


def _toolsets(tools: Iterable[ToolLike], plugins: Sequence[Plugin]) -> tuple[Toolset, ...]:
    """Group loose tools and functions into one toolset, add plugin actions, reject duplicate names."""
    loose: list[Tool] = []
    sets: list[Toolset] = []
    for t in tools:
        if isinstance(t, Tool):
            loose.append(t)
        elif isinstance(t, Toolset):
            sets.append(t)
        elif callable(t):
            loose.append(function_tool(t))
        else:
            raise ConfigError(f"tools must be @tool functions, Tool objects or Toolsets, got {t!r}")
    if loose:
        sets.insert(0, StaticToolset(loose))
    sets += [PluginActions(p) for p in plugins if p.actions]
    check_unique((t.name, origin_of(ts)) for ts in sets for t in ts.static_tools or ())
    return tuple(sets)
