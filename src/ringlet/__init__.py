"""ringlet: a runtime for tool-using LLM agents, built around one agent loop.

    from ringlet import Agent, tool

    @tool
    def get_weather(city: str) -> str:
        "Current weather for a city."
        return f"Sunny in {city}"

    result = Agent(model, tools=[get_weather]).run_sync("Weather in Paris?")
    print(result.output)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ringlet import events
    from ringlet.agent import Agent, AgentStream, RunResult
    from ringlet.agent.contract import Runnable, RunStream
    from ringlet.agent.settings import Execution, Gates, Limits, ModelSettings, RunHost, RunSettings, SubAgents
    from ringlet.context import Caller, RunContext
    from ringlet.errors import (
        AuthError,
        BadRequestError,
        ConfigError,
        ContextWindowError,
        ModelRetry,
        NetworkError,
        OverloadedError,
        PluginOrderError,
        ProviderError,
        ProviderTimeoutError,
        RateLimitError,
        RingletError,
        RunError,
        ServerError,
        ToolDefinitionError,
    )
    from ringlet.events import Event
    from ringlet.hooks import (
        ActionResult,
        Plugin,
        PostExecuteContext,
        PreExecuteContext,
        PreExecuteResult,
        PrePromptContext,
        ResponseCompleteContext,
        ToolExecutedContext,
        action,
    )
    from ringlet.loop import LoopSettings, RunState
    from ringlet.messages import Message, ToolCall, ToolDefinition
    from ringlet.models import FallbackModel, Model, ModelRequest, TokenBreakdown
    from ringlet.tools import Tool, Toolset, tool
    from ringlet.usage import RequestUsage, Usage

__version__ = "0.1.0"

# Names are imported on first use (PEP 562): `import ringlet` stays cheap, and a program pays only for
# what it touches. `ringlet.Agent` is exactly `ringlet.agent.Agent`.
_LAZY = {
    "ActionResult": "ringlet.hooks",
    "Agent": "ringlet.agent",
    "Execution": "ringlet.agent.settings",
    "Gates": "ringlet.agent.settings",
    "Limits": "ringlet.agent.settings",
    "ModelSettings": "ringlet.agent.settings",
    "RunHost": "ringlet.agent.settings",
    "RunSettings": "ringlet.agent.settings",
    "Runnable": "ringlet.agent.contract",
    "RunStream": "ringlet.agent.contract",
    "Caller": "ringlet.context",
    "SubAgents": "ringlet.agent.settings",
    "AgentStream": "ringlet.agent",
    "AuthError": "ringlet.errors",
    "BadRequestError": "ringlet.errors",
    "ConfigError": "ringlet.errors",
    "ContextWindowError": "ringlet.errors",
    "Event": "ringlet.events",
    "FallbackModel": "ringlet.models",
    "LoopSettings": "ringlet.loop",
    "Message": "ringlet.messages",
    "Model": "ringlet.models",
    "ModelRequest": "ringlet.models",
    "ModelRetry": "ringlet.errors",
    "NetworkError": "ringlet.errors",
    "OverloadedError": "ringlet.errors",
    "Plugin": "ringlet.hooks",
    "PluginOrderError": "ringlet.errors",
    "PostExecuteContext": "ringlet.hooks",
    "PreExecuteContext": "ringlet.hooks",
    "PreExecuteResult": "ringlet.hooks",
    "PrePromptContext": "ringlet.hooks",
    "ProviderError": "ringlet.errors",
    "ProviderTimeoutError": "ringlet.errors",
    "RateLimitError": "ringlet.errors",
    "RequestUsage": "ringlet.usage",
    "ResponseCompleteContext": "ringlet.hooks",
    "RingletError": "ringlet.errors",
    "RunContext": "ringlet.context",
    "RunError": "ringlet.errors",
    "RunResult": "ringlet.agent",
    "RunState": "ringlet.loop",
    "ServerError": "ringlet.errors",
    "TokenBreakdown": "ringlet.models",
    "Tool": "ringlet.tools",
    "ToolCall": "ringlet.messages",
    "ToolDefinition": "ringlet.messages",
    "ToolDefinitionError": "ringlet.errors",
    "ToolExecutedContext": "ringlet.hooks",
    "Toolset": "ringlet.tools",
    "Usage": "ringlet.usage",
    "action": "ringlet.hooks",
    "events": "ringlet.events",
    "tool": "ringlet.tools",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ringlet' has no attribute {name!r}")
    value = importlib.import_module(module) if name == "events" else getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "ActionResult",
    "Agent",
    "AgentStream",
    "AuthError",
    "BadRequestError",
    "Caller",
    "ConfigError",
    "ContextWindowError",
    "Event",
    "Execution",
    "FallbackModel",
    "Gates",
    "Limits",
    "LoopSettings",
    "Message",
    "Model",
    "ModelRequest",
    "ModelRetry",
    "ModelSettings",
    "NetworkError",
    "OverloadedError",
    "Plugin",
    "PluginOrderError",
    "PostExecuteContext",
    "PreExecuteContext",
    "PreExecuteResult",
    "PrePromptContext",
    "ProviderError",
    "ProviderTimeoutError",
    "RateLimitError",
    "RequestUsage",
    "ResponseCompleteContext",
    "RingletError",
    "RunContext",
    "RunError",
    "RunHost",
    "RunResult",
    "RunSettings",
    "RunState",
    "RunStream",
    "Runnable",
    "ServerError",
    "SubAgents",
    "TokenBreakdown",
    "Tool",
    "ToolCall",
    "ToolDefinition",
    "ToolDefinitionError",
    "ToolExecutedContext",
    "Toolset",
    "Usage",
    "__version__",
    "action",
    "events",
    "tool",
]
