"""The explicit next step each round ends with; the loop matches on it (DESIGN.md §1)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ringlet.errors import RunError
from ringlet.events import FinishReason, RunStatus

if TYPE_CHECKING:
    from ringlet.gates.approval import ApprovalDecision
    from ringlet.loop.settings import LoopSettings
    from ringlet.loop.state import RunState
    from ringlet.messages import Message


@dataclass(slots=True)
class CallModel:
    """A model request; `final`: the tool-less final request, and why."""

    final: Literal["max_iterations", "repeated_error"] | None = None


@dataclass(slots=True)
class RunTools:
    """Run the tool calls of the assistant `message`."""

    message: Message


@dataclass(slots=True)
class ResumeTools:
    """Apply humans' decisions (by tool-call or approval id) to the calls the run paused on."""

    decisions: Mapping[str, ApprovalDecision]


@dataclass(slots=True)
class Suspend:
    """Calls wait for a human: the run pauses (status `input_required`, no `message_end`)."""


@dataclass(slots=True)
class End:
    reason: FinishReason
    status: RunStatus
    error: RunError | None = None


Step = CallModel | RunTools | ResumeTools | Suspend | End
STEPS = (CallModel, RunTools, ResumeTools, Suspend, End)


def next_round(st: RunState, settings: LoopSettings) -> Step:
    """Another round, or, at the iteration cap, the tool-less final request (or an error, if so set)."""
    if st.iteration < settings.max_iterations:
        return CallModel()
    if settings.on_max_iterations == "error":
        return End("error", "failed", RunError("max_iterations",
                                               f"the run reached max_iterations={settings.max_iterations}"))
    return CallModel("max_iterations")


def final_end(final: str, st: RunState, settings: LoopSettings) -> End:
    """How a run ends after its tool-less final request."""
    if final == "max_iterations":
        return End("max_iterations", "completed")
    return End("error", "failed", RunError(
        "repeated_tool_error", f"the same tool error repeated {settings.max_repeated_tool_errors} times in a "
        "row; tools were stopped", details={"fingerprint": st.error_fingerprint}))
