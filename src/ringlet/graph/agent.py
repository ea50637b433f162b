"""`GraphAgent`: a graph.yaml agent with the surface of `Agent` (`stream`, `run`, `run_sync`, `aclose`).

Its `load_agent` is the agent layer's (`ringlet.agent.config.load_agent`) with graph agents among the
kinds it builds: it gives either kind for an agent directory, and loop agents it builds may spawn graph
agents by name.

    agent = load_agent(Path("agents/triage"), model=ScriptedModel([...]))
    async for event in agent.stream("Sort these"): ...     # message_start … node_start/node_end … message_end
    result = await agent.run("Sort these")                  # result.output is the End node's output
    result = await agent.resume(run_id, answer="approve")   # a run paused on a question, or interrupted
    result = await agent.fork(run_id, 2, {"city": "Oslo"})  # a new run from run_id's step 2, state edited
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ringlet.agent import config
from ringlet.agent.config import AgentLoader, AgentSpec
from ringlet.agent.contract import RunSettings
from ringlet.agent.settings import AGENT_DEFAULTS
from ringlet.context import ANYONE, Caller
from ringlet.errors import ConfigError, InvalidAnswer, RunError
from ringlet.events import ContentDeltaEvent, ErrorEvent, Event, MessageEndEvent, MessageStartEvent, StatusEvent
from ringlet.graph.checkpoint import Checkpoint
from ringlet.graph.context import ActiveClock, RunEnv
from ringlet.graph.engine import Engine, RunEnd
from ringlet.graph.fork import ForkFrom, fork_source, forked
from ringlet.graph.human import Question, answerer_of, check_input
from ringlet.graph.parse import load_graph
from ringlet.graph.runtime import GraphOptions, Runtime
from ringlet.graph.spec import GraphSpec
from ringlet.graph.validate import Checks, validate
from ringlet.messages import Message
from ringlet.usage import Usage

__all__ = ["GraphAgent", "GraphResult", "GraphStream", "InvalidAnswer", "load_agent"]

log = logging.getLogger("ringlet.graph")
_DONE: Any = object()


@dataclass(slots=True)
class GraphResult:
    """How a graph run ended, shaped like `RunResult`: `output` is the End node's output, `state` the graph
    state; `pending_question` is set while the run waits for a human (`status` input_required)."""

    run_id: str
    output: str
    finish_reason: str | None
    status: str
    usage: Usage
    messages: list[Message]
    error: dict[str, Any] | None
    state: dict[str, Any] = field(repr=False)
    pending_approvals: dict[str, Any] = field(default_factory=dict)
    pending_question: Question | None = None
    checkpoint: Checkpoint | None = field(default=None, repr=False)

    def new_messages(self) -> list[Message]:
        return list(self.messages)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "output": self.output, "finish_reason": self.finish_reason,
                "status": self.status, "usage": self.usage.as_dict(), "error": self.error,
                "messages": [m.model_dump(mode="json") for m in self.messages], "state": self.state,
                "pending_approvals": {},
                "pending_question": self.pending_question.to_dict() if self.pending_question else None}


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Message):
        return prompt.text
    users = [m for m in prompt if getattr(m, "role", None) == "user"]
    return users[-1].text if users else ""


class GraphStream:
    """The events of one graph run, framed by `message_start` … `message_end` (a run that pauses on a
    question ends its stream after `status: input_required`). `.result` is set once the stream is done."""

    def __init__(self, agent: GraphAgent, env: RunEnv, start: Checkpoint | None, *, resume: str | None = None,
                 answers: Mapping[str, str] | None = None, answer: str | None = None, force: bool = False,
                 fork: tuple[ForkFrom, dict[str, Any]] | None = None) -> None:
        self.agent, self.env, self._checkpoint = agent, env, start
        self._resume, self._answers, self._force = resume, dict(answers or {}), force
        self._answer, self._fork = answer, fork
        self._result: GraphResult | None = None
        self._events = self._run()

    @property
    def run_id(self) -> str:
        return self.env.run_id

    @property
    def result(self) -> GraphResult | None:
        return self._result

    @property
    def paused(self) -> bool:
        """Whether the run ended its stream paused on a question."""
        return self._result is not None and self._result.status == "input_required"

    def steer(self, text: str, /) -> Any:
        """A graph run takes no steers: its nodes own their prompts."""
        raise ConfigError(f"graph run {self.run_id} cannot be steered; send the message once it has ended")

    def __aiter__(self) -> AsyncGenerator[Event, None]:
        return self._events

    async def __anext__(self) -> Event:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()

    async def _load(self) -> Checkpoint:
        """The checkpoint to run from: a fresh run's, a fork's, or the stored one of the run being resumed."""
        if self._fork is not None:
            return await self._forked(*self._fork)
        if self._checkpoint is not None:  # a fresh run's, or (resuming) the paused run's own
            return self._prepare_resume(self._checkpoint) if self._resume else self._checkpoint
        assert self._resume is not None
        runtime = self.agent.runtime
        cp = await runtime.checkpoints.load(self._resume)
        if cp is None:
            raise ConfigError(f"no checkpoint for run {self._resume!r}; it never ran here, or has expired")
        if cp.graph_hash != runtime.graph_hash and not self._force:
            raise ConfigError(f"run {self._resume!r}: graph changed since checkpoint (pass force=True to resume "
                              "it with the new graph.yaml)")
        if cp.status in ("completed", "failed"):
            raise ConfigError(f"run {self._resume!r} already ended ({cp.status}); there is nothing to resume")
        return self._prepare_resume(cp)

    async def _forked(self, fork: ForkFrom, run: dict[str, Any]) -> Checkpoint:
        """A fork's first checkpoint: the source's step with the patch applied; the source's prompt and
        variables (those given to the fork win)."""
        agent, runtime = self.agent, self.agent.runtime
        source = await fork_source(runtime.checkpoints, fork, spec=agent.spec, agent=agent.name,
                                   graph_hash=runtime.graph_hash)
        variables = {**source.run.get("variables", {}), **self.env.variables}
        self.env.variables.update(variables)
        self.env.clock = ActiveClock(agent.spec.settings.timeout, source.elapsed_active_s, seam=runtime.seam)
        run = {**run, "prompt": source.run.get("prompt", ""), "variables": variables,
               "forked_from": {"run_id": fork.run_id, "step": fork.step}}
        return forked(source, fork.state_patch, run_id=self.env.run_id, graph_hash=runtime.graph_hash,
                      agent=agent.name, run=run)

    def _prepare_resume(self, cp: Checkpoint) -> Checkpoint:
        answers = {**cp.run.get("answers", {}), **self._answers}
        pending = cp.pending_question
        if pending is not None and self._answer is not None:
            answers[pending["question_id"]] = self._answer
        if pending is not None and pending["question_id"] in answers:
            question = Question.from_dict(pending)
            answer = answers[question.question_id]
            if question.input_type == "text" and answer == "" and question.default is not None:
                answer = question.default
            problem = check_input(question.validation, answer)
            if problem is not None:
                raise InvalidAnswer(problem)
        cp.run["answers"] = answers
        self.env.answers.update(answers)
        self.env.variables.update(cp.run.get("variables", {}))
        self.env.caller.update({k: v for k, v in cp.run.items() if k in ("realm", "user_id", "org_id", "roles",
                                                                          "conversation_id", "channel")})
        self.env.clock = ActiveClock(self.agent.spec.settings.timeout, cp.elapsed_active_s,
                                     seam=self.agent.runtime.seam)
        return cp

    async def _run(self) -> AsyncGenerator[Event, None]:
        cp = await self._load()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self.env.emit = queue.put_nowait
        task = asyncio.ensure_future(self._drive(cp, queue))
        try:
            while True:
                event = await queue.get()
                if event is _DONE:
                    break
                yield event
            await task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _drive(self, cp: Checkpoint, queue: asyncio.Queue[Any]) -> None:
        env, run = self.env, cp.run
        try:
            await self.agent.runtime.warm()  # before the first event, which loading a local model would swallow
            if cp.pending_question is None or not self._resume:  # a paused run continues its message
                env.emit(env.event(MessageStartEvent, message_id=run["message_id"],
                                   conversation_id=run.get("conversation_id"), agent=self.agent.name))
            env.emit(env.event(StatusEvent, state="working"))
            try:
                await self.agent.runtime.prepare()
                cp.status = "working"
                engine = Engine(env, cp)
                if not self._resume:  # a fresh run's (step 0) or a fork's first checkpoint
                    await engine.save()
                end = await engine.run()
            except RunError as exc:
                end = RunEnd("failed", error=exc)
            except (ConfigError, OSError) as exc:
                end = RunEnd("failed", error=RunError("graph_config", str(exc)))
            except Exception as exc:  # a bug: the run still ends with error and message_end
                log.exception("graph run %s failed", env.run_id)
                end = RunEnd("failed", error=RunError("internal_error", f"{type(exc).__name__}: {exc}"))
            self._finish(cp, end)
        finally:
            queue.put_nowait(_DONE)

    def _finish(self, cp: Checkpoint, end: RunEnd) -> None:
        env, run = self.env, cp.run
        message_id, at = run["message_id"], env.runtime.seam.stamp()
        prompt = Message(id=run["prompt_id"], role="user", content=run["prompt"], run_id=env.run_id,
                         conversation_id=run.get("conversation_id"), created_at=at)
        messages = [prompt]
        if end.status == "input_required":
            env.emit(env.event(StatusEvent, state="input_required"))
        elif end.status == "completed":
            if end.output:
                env.emit(env.event(ContentDeltaEvent, message_id=message_id, delta=end.output))
            messages.append(Message(id=message_id, role="assistant", content=end.output, run_id=env.run_id,
                                    conversation_id=run.get("conversation_id"), created_at=at,
                                    metadata={"graph": self.agent.name}))
            env.emit(env.event(StatusEvent, state="completed"))
        else:
            error = end.error or RunError("graph_failed", "the graph run failed")
            env.emit(env.event(ErrorEvent, code=error.code, message=error.message, retryable=error.retryable))
            env.emit(env.event(StatusEvent, state="failed"))
        if end.status != "input_required":
            env.emit(env.event(MessageEndEvent, message_id=message_id,
                               finish_reason="end_turn" if end.status == "completed" else "error",
                               usage=env.usage.summary()))
        error = end.error
        self._result = GraphResult(
            run_id=env.run_id, output=end.output, status=end.status,
            finish_reason=None if end.status == "input_required" else
            "end_turn" if end.status == "completed" else "error",
            usage=env.usage, messages=messages, state=cp.state, pending_question=end.question, checkpoint=cp,
            error={"code": error.code, "message": error.message, "details": error.details} if error else None)


class GraphAgent:
    """A graph agent, with the caller-facing surface of `Agent`.

    Options (keyword): `model` (every llm node's model), `models` (name → Model), `plugins`, `gates`,
    `approvals`, `approver` (answers approval and input nodes: a callable or an object with `answer()`;
    one with `wait()` also decides tool approvals in llm nodes), `resolver` (agent name → child, for agent
    nodes), `checkpoints` (a CheckpointStore), `store` (rag knowledge bases), `script_cwd`, `python`,
    `data_dir`, `on_question` ("pause" or "fail"), `confirm_rag`, `variables`, `checks` (for the validator).
    """

    kind: Literal["graph"] = "graph"
    """What shape of run it starts (`ringlet.agent.contract.RunKind`): resumed and forked by run id."""

    def __init__(self, spec: GraphSpec, *, name: str | None = None, approver: Any = None,
                 variables: Mapping[str, str] | None = None, checks: Checks | None = None, **options: Any) -> None:
        self.spec = spec
        self.name = name or spec.directory.name
        self.description = spec.description
        self.approver = approver
        self.variables = dict(variables or {})
        self.report = None
        if spec.settings.validate_before_run:
            resolver = options.get("resolver")
            if checks is None and resolver is not None:
                checks = Checks(spec.directory, agent_exists=lambda n: _resolvable(resolver, n))
            self.report = validate(spec, checks)
            self.report.raise_for_errors()
            for issue in self.report.warnings:
                log.log(logging.DEBUG if issue.quiet else logging.WARNING, "%s: %s", spec.source.path, issue)
        self.runtime = Runtime(spec, GraphOptions(**options), name=self.name, load=load_agent)

    @classmethod
    def from_directory(cls, directory: Path | str, **options: Any) -> GraphAgent:
        directory = Path(directory)
        return cls(load_graph(directory / "graph.yaml", agent=directory.name), name=directory.name, **options)

    @property
    def model(self) -> Any:
        """The graph's default model (what llm nodes without their own use)."""
        return self.runtime.default_model()

    @property
    def instructions(self) -> str | None:
        return None

    def resolve_variables(self, given: Mapping[str, Any] | None = None) -> dict[str, str]:
        """Defaults, then `<AGENT>_VARIABLES` (a JSON object), then load-time values, then `given`."""
        env_name = self.name.upper().replace("-", "_") + "_VARIABLES"
        from_env: dict[str, Any] = {}
        if os.environ.get(env_name):
            try:
                from_env = json.loads(os.environ[env_name])
            except ValueError as exc:
                raise ConfigError(f"{env_name} must be a JSON object of variable values: {exc}") from None
            if not isinstance(from_env, dict):
                raise ConfigError(f"{env_name} must be a JSON object of variable values")
        values: dict[str, Any] = {v.name: v.default for v in self.spec.variables if v.default is not None}
        values |= from_env | self.variables | dict(given or {})
        missing = [v.name for v in self.spec.variables if values.get(v.name) is None]
        if missing:
            raise ConfigError(f"The following agent variables are required: {', '.join(missing)}")
        return {k: str(v) for k, v in values.items() if v is not None}

    def _env(self, run_id: str, approver: Any, variables: dict[str, str], caller: dict[str, Any],
             steps: Any = None) -> RunEnv:
        approver = approver if approver is not None else self.approver
        clock = ActiveClock(self.spec.settings.timeout, seam=self.runtime.seam)
        return RunEnv(self.runtime, run_id, lambda _e: None, variables, clock,
                      answerer=answerer_of(approver),
                      tool_approver=approver if hasattr(approver, "wait") else None, approver=approver,
                      caller=caller, steps=steps)

    def stream(self, prompt: Any, /, *, history: Sequence[Message] = (), caller: Caller | None = None,
               settings: RunSettings | None = None, variables: Mapping[str, Any] | None = None,
               depth: int | None = None, fork: ForkFrom | Mapping[str, Any] | None = None) -> GraphStream:
        """Start a graph run (fresh state; `history` is not fed to the graph) for `caller` and return its event
        stream. Of `settings` a graph takes `approver` (answers approval and input nodes) and `host`
        (`RunHost`): a sub-agent's `lineage`, and `steps`, a durable run's step executor (its node calls and
        checkpoints are steps; its ids come from its seam); the rest is its nodes' own (a ConfigError says so).
        `fork` (`ForkFrom`, or its dict): start at another run's checkpoint instead (`fork_stream`); the
        prompt is then that run's, and `variables` override its variables."""
        caller, settings = caller or ANYONE, settings or AGENT_DEFAULTS
        _check_settings(self.name, settings)
        host, approver = settings.host, settings.approver
        lineage, steps = (host.lineage, host.steps) if host is not None else (None, None)
        seam = steps.seam if steps is not None else self.runtime.seam
        rid = caller.run_id or seam.new_id("r")
        who = {"realm": caller.realm, "user_id": caller.user_id, "org_id": caller.org_id, "roles": list(caller.roles),
               "channel": caller.channel, "conversation_id": caller.conversation_id, "request_id": caller.request_id}
        where = {"directory": str(self.spec.directory.resolve())}  # what `ringlet graph fork` loads it from
        if fork is not None:  # the prompt, variables and state are the source checkpoint's (loaded as it starts)
            given = {k: str(v) for k, v in (variables or {}).items() if v is not None}
            env = self._env(rid, approver, given, who, steps)
            env.depth = depth or (lineage.depth if lineage is not None else 0)
            run = {**who, **where, "message_id": seam.new_id("m"), "prompt_id": seam.new_id("m"), "answers": {}}
            return GraphStream(self, env, None, fork=(ForkFrom.of(fork), run))
        text = _prompt_text(prompt)
        values = self.resolve_variables(variables)
        state = copy.deepcopy(self.spec.initial_state)
        state["initial_prompt"] = text
        run = {**who, **where, "prompt": text, "variables": values, "message_id": seam.new_id("m"),
               "prompt_id": seam.new_id("m"), "answers": {}}
        cp = Checkpoint(run_id=rid, graph_hash=self.runtime.graph_hash, step=0, state=state,
                        frontier=[self.spec.start], visit_counts={}, elapsed_active_s=0.0, agent=self.name, run=run)
        env = self._env(rid, approver, values, who, steps)
        env.depth = depth or (lineage.depth if lineage is not None else 0)  # a sub-agent: its depth
        return GraphStream(self, env, cp)

    def resume_stream(self, run_id: str, answers: Mapping[str, str] | None = None, *, answer: str | None = None,
                      approver: Any = None, force: bool = False) -> GraphStream:
        """Continue a run from its checkpoint: one paused on a question (`answer`, or `answers` by question
        id), or one interrupted mid-run (its last step runs again). A changed graph.yaml needs `force`."""
        return GraphStream(self, self._env(run_id, approver, {}, {}), None, resume=run_id, answers=answers,
                           answer=answer, force=force)

    def continue_stream(self, checkpoint: Checkpoint, answers: Mapping[str, str], *, steps: Any = None) -> GraphStream:
        """Continue a run paused on a question from its checkpoint as the paused stream left it (not as
        stored: a durable run executed again replays from its recorded steps, whatever was stored since)."""
        return GraphStream(self, self._env(checkpoint.run_id, None, {}, {}, steps), checkpoint,
                           resume=checkpoint.run_id, answers=answers)

    def fork_stream(self, from_run: str, step: int, state_patch: Mapping[str, Any] | None = None, *,
                    force: bool = False, **options: Any) -> GraphStream:
        """A new run that starts at run `from_run`'s checkpoint after `step` super-steps, its state with
        `state_patch` (top-level keys) written over it (`ringlet.graph.fork`): the nodes before it are not
        run again, and the original run is not touched. Takes the options of `stream()` (a new `run_id`,
        `conversation_id`, `variables`, …). ForkError (StatePatchError) when it cannot start, raised as the
        stream starts; `check_fork` says so beforehand."""
        return self.stream(None, fork=ForkFrom(from_run, step, dict(state_patch or {}), force), **options)

    async def fork(self, from_run: str, step: int, state_patch: Mapping[str, Any] | None = None, *,
                   force: bool = False, **options: Any) -> GraphResult:
        """`fork_stream` run to its end (or a pause)."""
        stream = self.fork_stream(from_run, step, state_patch, force=force, **options)
        async for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    async def check_fork(self, fork: ForkFrom) -> Checkpoint:
        """The checkpoint `fork` would start from; ForkError (StatePatchError) when it cannot."""
        return await fork_source(self.runtime.checkpoints, fork, spec=self.spec, agent=self.name,
                                 graph_hash=self.runtime.graph_hash)

    async def checkpoints(self, run_id: str) -> list[Checkpoint]:
        """Every checkpoint kept of a run, one per super-step, oldest first (what `fork` starts from); empty
        when the store keeps none of it (or only the latest: then that one)."""
        store = self.runtime.checkpoints
        history = getattr(store, "history", None)
        if history is not None:
            return await history(run_id)
        latest = await store.load(run_id)
        return [latest] if latest is not None else []

    async def resume(self, run_id: str, answers: Mapping[str, str] | None = None, **options: Any) -> GraphResult:
        stream = self.resume_stream(run_id, answers, **options)
        async for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    async def run(self, prompt: Any, **options: Any) -> GraphResult:
        """Run to the end (or to a pause) and return the result. Takes the options of `stream()`."""
        stream = self.stream(prompt, **options)
        async for _ in stream:
            pass
        assert stream.result is not None, "a graph run ends with a result"
        return stream.result

    def run_sync(self, prompt: Any, **options: Any) -> GraphResult:
        async def main() -> GraphResult:
            try:
                return await self.run(prompt, **options)
            finally:
                await self.aclose()

        return asyncio.run(main())

    async def prepare(self) -> None:
        """Build the rag nodes' knowledge bases now (otherwise the first run does)."""
        await self.runtime.prepare()

    def use_gates(self, gates: Iterable[Any], *, audit: Any = None) -> None:
        self.runtime.use_gates(gates, audit)

    async def wait_background(self, timeout_s: float = 30.0) -> None:
        for agent in self.runtime._agents.values():
            await agent.wait_background(timeout_s)

    async def aclose(self) -> None:
        await self.runtime.aclose()

    async def __aenter__(self) -> GraphAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _check_settings(name: str, settings: RunSettings) -> None:
    """A graph run takes its caller's approver and host; the rest of `RunSettings` is its nodes' own."""
    given = [f for f in ("output_type", "model", "instructions", "model_settings", "limits", "plugin_data")
             if getattr(settings, f) is not None] + (["tools"] if settings.tools else [])
    if given:
        raise ConfigError(f"{', '.join(given)}: not for graph agent {name!r}; its nodes name their own models, "
                          "tools and limits (graph.yaml)")


def _resolvable(resolver: Any, name: str) -> bool:
    try:
        return resolver(name) is not None
    except (LookupError, ConfigError):
        return False


def _load(spec: AgentSpec, /, *, model: Any = None, variables: Mapping[str, str] | None = None,
          **options: Any) -> GraphAgent:
    """The graph agent of a directory, for `load_agent`."""
    graph = load_graph(spec.directory / "graph.yaml", agent=spec.name)
    return GraphAgent(graph, name=spec.name, model=model, variables=variables, **options)


KINDS: Mapping[str, AgentLoader] = {"graph": _load}
"""The kinds of agent the graph layer builds, beside the agent layer's own loop agents."""


def load_agent(spec: AgentSpec | Path | str, *, model: Any = None, variables: Mapping[str, str] | None = None,
               **options: Any) -> Any:
    """The agent of a directory, of any kind: an `Agent` for config.yaml, a `GraphAgent` for graph.yaml
    (`options` are a graph's: `checkpoints`, `store`, …). `spec` is an `AgentSpec`, a directory, or its file."""
    return config.load_agent(spec, model=model, variables=variables, kinds=KINDS, **options)
