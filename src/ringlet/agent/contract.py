"""The run contract: what anything that runs offers, whatever runs inside it.

A loop `Agent`, a graph agent (`ringlet.graph.GraphAgent`) and a remote A2A agent (`ringlet.agent.remote`)
are each a `Runnable`: `stream(prompt, history=…, caller=…, settings=…)` starts a run and gives its
`RunStream`, whose events are the one event union (`ringlet.events`), framed by `message_start` …
`message_end`, and whose `result` (a `RunOutcome`) says how it ended. Who runs it and where travels as one
`Caller` (`ringlet.context`); how this run differs from the agent's others as one `RunSettings`
(`ringlet.agent.settings`).

    async def answer(agent: Runnable, text: str, who: Caller) -> str:
        stream = agent.stream(text, caller=who)
        async for event in stream: ...
        return stream.result.output

Code that hosts runs asks the contract what it needs, never which class it has: `kind` says what shape of
run it starts (and so how a paused one resumes, and what else the agent offers).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ringlet.context import Caller
from ringlet.events import Event
from ringlet.messages import Message
from ringlet.usage import Usage

if TYPE_CHECKING:
    from ringlet.gates.approval import Approver
    from ringlet.models.base import Model, ModelSettings

__all__ = ["Caller", "RunKind", "RunOutcome", "RunSettings", "RunStream", "Runnable"]

RunKind = Literal["loop", "graph", "remote"]
"""What shape of run a `Runnable` starts, as its run record keeps it:

- `loop`: model turns and tool calls over a transcript; a paused run resumes from its state (`RunState`),
  its transcript forks at any message, its tools can be called directly, and a run can be replayed;
- `graph`: nodes over a graph state; a paused or interrupted run resumes, and a run forks, from its
  checkpoints, by run id; its nodes name their own models and tools;
- `remote`: a task of an agent elsewhere (A2A); it cannot pause here, nor resume."""


@dataclass(frozen=True, slots=True)
class RunSettings:
    """How one run differs from its agent's other runs; each field left at None (or empty) is the agent's.

        await agent.run("hi", settings=RunSettings(limits=Limits(max_iterations=2), approver=my_approver))

    `output_type`: this run's result type (as the agent's `output_type`); `model`: another model (a Model
    or a `provider:model` name); `instructions`: more, after the agent's own; `tools`: more tools;
    `model_settings`, `limits`: in place of the agent's; `plugin_data`: the plugins' per-run data to start
    from (saved with the run); `approver`: waits for humans' decisions (none: the run pauses for them);
    `host`: what a server or a parent run gives the run (`RunHost`). A graph agent takes `approver` and
    `host` (its nodes have their own model, tools and limits)."""

    output_type: Any = None
    model: Model | str | None = None
    instructions: str | None = None
    tools: Sequence[Any] = ()
    """More tools: what `Agent(tools=...)` takes (`ringlet.agent.settings.ToolLike`)."""
    model_settings: ModelSettings | None = None
    limits: Any = None
    """A `ringlet.agent.settings.Limits`, or None."""
    plugin_data: dict[str, Any] | None = None
    approver: Approver | None = None
    host: Any = None
    """A `ringlet.agent.subagents.RunHost`, or None. (`tools`, `limits` and `host` are typed by their docs:
    their modules build on this one, and the contract imports nothing above it.)"""

    def changes_agent(self) -> bool:
        """Whether the run needs the agent's config changed (another model, instructions, tools or settings)."""
        return self.model is not None or bool(self.instructions) or bool(self.tools) or \
            self.model_settings is not None or self.limits is not None


class RunOutcome(Protocol):
    """How a run ended (or paused): `RunResult`, `GraphResult`, `RemoteResult`."""

    @property
    def run_id(self) -> str: ...

    @property
    def output(self) -> Any:
        """The answer: its text, or a typed result (None when the run produced none)."""
        ...

    @property
    def status(self) -> str:
        """`completed`, `failed`, `cancelled`, or `input_required` while it waits for a human."""
        ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def usage(self) -> Usage: ...

    @property
    def error(self) -> dict[str, Any] | None:
        """`code`, `message`, `details` of a run that failed."""
        ...


class RunStream(Protocol):
    """The events of one run, as an async iterator; it starts when first iterated. `paused` once it stopped
    for a human (its stream then ends without `message_end`); `result` once it ended or paused."""

    @property
    def run_id(self) -> str: ...

    @property
    def paused(self) -> bool: ...

    @property
    def result(self) -> RunOutcome | None: ...

    def steer(self, text: str, /) -> Any:
        """Send the working run a user message, taken at its next round boundary (`steer_queued`, then
        `steer_taken`); a run that cannot take one (a graph's, a remote agent's) raises `ConfigError`."""
        ...

    def __aiter__(self) -> AsyncIterator[Event]: ...


class Runnable(Protocol):
    """Anything that runs: started with a prompt (and a transcript before it, which a graph does not read),
    for a `Caller`, with this run's `RunSettings`; resumed once paused (`resume_stream`: a loop run's state
    or a graph run's id, with the humans' decisions or answers)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> RunKind: ...

    def stream(self, prompt: Any, /, *, history: Sequence[Message] = (), caller: Caller | None = None,
               settings: RunSettings | None = None) -> RunStream:
        """Start a run and return its event stream."""
        ...

    def resume_stream(self, paused: Any, decisions: Mapping[str, Any] | None = None, /) -> RunStream:
        """Continue a paused run (what `kind` says identifies it) with the decisions or answers given."""
        ...

    async def aclose(self) -> None:
        """Close what the agent holds open (MCP sessions, local models)."""
        ...
