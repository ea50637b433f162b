"""The explicit next step each round ends with; the loop matches on it (DESIGN.md §1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
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

RERUN = "rerun_calls"
"""The metadata key of an input assistant message whose calls (these ids) a run runs first (a fork's `rerun`,
`ringlet.agent.forks`). Only code sets it: no API copies a client's metadata onto an assistant message."""


def first_step(incoming: Sequence[Message], resume: Mapping[str, ApprovalDecision] | None) -> Step:
    """A run's first round: humans' decisions applied (a resumed run), the calls its input asks to run
    again (its last assistant message marked `rerun_calls`, those of the marked calls with no result in the
    input), or a model request."""
    if resume is not None:
        return ResumeTools(resume)
    asked = next((i for i in range(len(incoming) - 1, -1, -1) if incoming[i].role == "assistant"), None)
    if asked is None or not incoming[asked].metadata.get(RERUN):
        return CallModel()
    marked = set(incoming[asked].metadata[RERUN])
    answered = {m.tool_call_id for m in incoming[asked + 1:] if m.role == "tool"}
    calls = tuple(c for c in incoming[asked].tool_calls if c.id in marked and c.id not in answered)
    return RunTools(replace(incoming[asked], tool_calls=calls)) if calls else CallModel()


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
