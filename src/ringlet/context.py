"""RunContext: what tools, hooks and gates know about the run they serve."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Literal

from typing_extensions import TypeVar

from ringlet._ids import SYSTEM, Seam
from ringlet.usage import Usage

NoticeLevel = Literal["info", "warning", "error", "success", "progress"]
Channel = Literal["chat", "webhook", "cron", "schedule", "sub_agent", "api", "cli", "eval"]


@dataclass(frozen=True, slots=True)
class Notice:
    """A notification waiting to be emitted as a `notification` event. Never sent to the model."""

    level: NoticeLevel
    title: str
    message: str = ""
    source: str = "ringlet"
    progress: tuple[float, float | None] | None = None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who runs a run and where: its conversation, realm, user, org and roles, the channel it came in by,
    the request that started it and its run id (None: a new one). One value, handed to any `Runnable`'s
    `stream()` (`ringlet.agent.contract`); the run's `RunContext` and `RunState` carry the same fields.

        await agent.run("hi", caller=Caller(user_id="ada", roles=("admin",), channel="api"))
    """

    conversation_id: str | None = None
    realm: str = "default"
    user_id: str | None = None
    org_id: str | None = None
    roles: tuple[str, ...] = ()
    channel: Channel = "chat"
    request_id: str | None = None
    run_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.roles, tuple):  # a list given: kept as a tuple, so the value stays frozen
            object.__setattr__(self, "roles", tuple(self.roles))


ANYONE = Caller()
"""The caller of a run given none: realm `default`, channel `chat`, nobody in particular."""


class CancelToken:
    """Set when a call is cancelled or timed out; long-running tools (threads included) should check it."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


DepsT = TypeVar("DepsT", default=Any)
"""The type of `RunContext.deps`: the agent's `deps_type`."""


@dataclass(eq=False)
class RunContext(Generic[DepsT]):
    """One per run; tools that declare a `RunContext` parameter get a per-call copy.

    `plugin_data[<plugin name>]` is the only per-run state plugins keep; it must stay JSON-serialisable
    because it is saved with the run. `deps` is whatever the application passed to `run(deps=...)`.
    """

    run_id: str
    agent: str
    conversation_id: str | None = None
    realm: str = "default"
    user_id: str | None = None
    org_id: str | None = None
    roles: tuple[str, ...] = ()
    channel: Channel = "chat"
    request_id: str | None = None
    deps: DepsT = None  # type: ignore[assignment]  # None when the run was given no deps
    usage: Usage = field(default_factory=Usage)
    plugin_data: dict[str, Any] = field(default_factory=dict)
    tool_call_id: str | None = None
    tool_name: str | None = None
    cancelled: CancelToken = field(default_factory=CancelToken)
    notices: list[Notice] = field(default_factory=list)
    schedules: Any = None
    """The schedule book of this run's conversation (`alarm_clock`, `schedule_task`), when there is one."""
    humans: bool = True
    """Whether a human can answer (`ask_question`); False in a CLI run without a terminal."""
    lineage: Any = None
    """Where this run sits among sub-agents (depth, agent path, the root run's slots); None for a root run
    that has not spawned any."""
    child_approver: Any = None
    """How this run's sub-agents wait for humans (the server: records under the root conversation)."""
    child_host: Any = None
    """Where this run's sub-agents' conversations are kept (the server's store); None: nowhere."""
    realms: frozenset[str] | None = None
    """The realms the run's principal may use (None: any); a sub-agent in another realm needs one."""
    emit: Any = None
    """While a batch runs: hands an event (a sub-agent's) to the run's stream at once."""
    sampler: Any = None
    """Answers an MCP server's `sampling/createMessage` in this run (`ringlet.loop.sampling.Sampler`): its
    gates, its model, its usage; None: declined."""
    seam: Seam = SYSTEM
    """Where the run reads the clocks and gets ids (its step executor's): for what a tool makes as part of
    the run, such as a sub-agent's conversation id."""

    def notify(self, level: NoticeLevel, title: str, message: str = "",
               progress: tuple[float, float | None] | None = None, *, source: str | None = None) -> None:
        """Queue a notification; the loop emits it as an inline `notification` event."""
        self.notices.append(Notice(level, title, message, source or self.tool_name or "ringlet", progress))

    def for_call(self, tool_call_id: str, tool_name: str) -> RunContext:
        """A copy for one tool call, with its own cancellation flag; notices still reach the run."""
        copy = object.__new__(RunContext)
        copy.__dict__.update(self.__dict__)
        copy.tool_call_id, copy.tool_name, copy.cancelled = tool_call_id, tool_name, CancelToken()
        return copy
