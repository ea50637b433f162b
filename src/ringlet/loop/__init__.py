"""The agent loop and its parts: settings, run state, step executor, tool batches."""

from ringlet.loop.run import CallModel, End, LoopConfig, Run, RunTools, Step, agent_loop
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
    "agent_loop",
]
