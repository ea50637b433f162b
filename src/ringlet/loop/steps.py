"""The one seam for side effects: every model request and every tool call goes through a StepExecutor.

Inputs and outputs of steps are plain values, and the loop reads the clock and makes ids only through the
executor's `seam` (`ringlet._ids.Seam`: wall clock, monotonic clock, new ids), so a durable executor
(DBOS: a run is a workflow, each request and call a step) can record and replay them without the loop
changing. `LocalSteps` runs them directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from ringlet.context import RunContext
from ringlet.models.base import Chunk, Model, ModelRequest
from ringlet.tools.base import Tool, Toolset

if TYPE_CHECKING:
    from ringlet._ids import Seam
    from ringlet.loop.steering import Steer


LANE: ContextVar[str] = ContextVar("ringlet_lane", default="")
"""Which part of a run reads its seam: "" the run itself, a tool call's id while that call settles in a
batch of its own task. Readings in one lane come in a fixed order however the calls interleave, so a
recording keeps them by lane (`ringlet.replay`)."""


class StepExecutor(Protocol):
    seam: Seam
    """Where the loop reads the clocks and gets new ids."""

    def stream_model(self, model: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        """Stream one model request."""
        ...

    def batch(self, calls: Sequence[tuple[str, Tool]]) -> None:
        """The calls of a batch (call id, tool), in the order the model made them, before any of them runs:
        a durable executor draws their step ids here, so that however the calls interleave, a replay
        matches each call with its own recorded result."""
        ...

    def call_tool(self, toolset: Toolset, tool: Tool, args: dict[str, Any], ctx: RunContext,
                  call_id: str) -> Awaitable[Any]:
        """Run one tool call's backend (`call_id`: the call it answers); awaiting it gives the raw value."""
        ...

    def order(self, keys: Sequence[str]) -> None:
        """Work about to run concurrently (a graph super-step's nodes), by key, in a fixed order: a durable
        executor draws its step ids here, like `batch`."""
        ...

    def record(self, name: str, work: Callable[[], Awaitable[Any]], key: str | None = None) -> Awaitable[Any]:
        """Run `work` (its value JSON) once as a step named `name` (`key`: one given to `order`): a durable
        executor records the value, and a replay returns it without running `work` again."""
        ...

    def took(self, requests: int, steers: Sequence[Steer]) -> None:
        """The steers the run took at the boundary after its `requests`-th model request (`ringlet.loop.
        steering`): a recording keeps them on its tape, so that its replay takes them there too."""
        ...


class LocalSteps:
    """Runs steps in process, directly, reading time and ids from `seam` (`ringlet._ids.SYSTEM`: the real ones)."""

    __slots__ = ("seam",)

    def __init__(self, seam: Seam) -> None:
        self.seam = seam

    def stream_model(self, model: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        return model.stream(request)

    def batch(self, calls: Sequence[tuple[str, Tool]]) -> None:
        pass

    def call_tool(self, toolset: Toolset, tool: Tool, args: dict[str, Any], ctx: RunContext,
                  call_id: str) -> Awaitable[Any]:
        return toolset.call_tool(tool, args, ctx)  # no extra coroutine frame on the per-call path

    def order(self, keys: Sequence[str]) -> None:
        pass

    def record(self, name: str, work: Callable[[], Awaitable[Any]], key: str | None = None) -> Awaitable[Any]:
        return work()

    def took(self, requests: int, steers: Sequence[Steer]) -> None:
        pass
