"""ringlet: a runtime for tool-using LLM agents, built around one agent loop.

    from ringlet import Agent, tool

    @tool
    def get_weather(city: str) -> str:
        "Current weather for a city."
        return f"Sunny in {city}"

    result = Agent(model, tools=[get_weather]).run_sync("Weather in Paris?")
    print(result.output)
"""

from ringlet import events
from ringlet.agent import Agent, AgentStream, RunResult
from ringlet.context import RunContext
from ringlet.errors import (
    AuthError,
    BadRequestError,
    ConfigError,
    ContextWindowError,
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
from ringlet.models import Model, ModelRequest, TokenBreakdown
from ringlet.tools import Tool, Toolset, tool
from ringlet.usage import RequestUsage, Usage

__version__ = "0.1.0"

__all__ = [
    "ActionResult",
    "Agent",
    "AgentStream",
    "AuthError",
    "BadRequestError",
    "ConfigError",
    "ContextWindowError",
    "Event",
    "LoopSettings",
    "Message",
    "Model",
    "ModelRequest",
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
    "RunResult",
    "RunState",
    "ServerError",
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
