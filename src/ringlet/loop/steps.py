"""The one seam for side effects: every model request and every tool call goes through a StepExecutor.

Inputs and outputs of steps are plain values, and the loop reads the clock and makes ids only through the
executor's `seam` (`ringlet._ids.Seam`: wall clock, monotonic clock, new ids), so a durable executor
(DBOS: a run is a workflow, each request and call a step) can record and replay them without the loop
changing. `LocalSteps` runs them directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any, Protocol

from ringlet.context import RunContext
from ringlet.models.base import Chunk, Model, ModelRequest
from ringlet.tools.base import Tool, Toolset

if TYPE_CHECKING:
    from ringlet._ids import Seam


class StepExecutor(Protocol):
    seam: Seam
    """Where the loop reads the clocks and gets new ids."""

    def stream_model(self, model: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        """Stream one model request."""
        ...

    def call_tool(self, toolset: Toolset, tool: Tool, args: dict[str, Any], ctx: RunContext) -> Awaitable[Any]:
        """Run one tool call's backend; awaiting it gives the raw value."""
        ...


class LocalSteps:
    """Runs steps in process, directly, reading time and ids from `seam` (`ringlet._ids.SYSTEM`: the real ones)."""

    __slots__ = ("seam",)

    def __init__(self, seam: Seam) -> None:
        self.seam = seam

    def stream_model(self, model: Model, request: ModelRequest) -> AsyncIterator[Chunk]:
        return model.stream(request)

    def call_tool(self, toolset: Toolset, tool: Tool, args: dict[str, Any], ctx: RunContext) -> Awaitable[Any]:
        return toolset.call_tool(tool, args, ctx)  # no extra coroutine frame on the per-call path
