"""The agent loop and its parts: settings, run state, step executor, tool batches."""

from ringlet.loop.config import LoopConfig
from ringlet.loop.loop import agent_loop
from ringlet.loop.next_step import CallModel, End, RunTools, Step, Suspend
from ringlet.loop.run import Run
from ringlet.loop.settings import DEFAULT_SETTINGS, LoopSettings
from ringlet.loop.state import RunState
from ringlet.loop.steps import LocalSteps, StepExecutor

__all__ = [
    "DEFAULT_SETTINGS",
    "CallModel",
    "End",
    "LocalSteps",
    "LoopConfig",
    "LoopSettings",
    "Run",
    "RunState",
    "RunTools",
    "Step",
    "StepExecutor",
    "Suspend",
    "agent_loop",
]
