"""Plugins and hooks: the `Plugin` base class, actions as tools, ordering and dispatch."""

from ringlet.hooks.dispatch import BackgroundQueue, Hooks, PluginActions, order_plugins, schema_validator
from ringlet.hooks.plugin import (
    ActionResult,
    Actions,
    HookContext,
    Plugin,
    PostExecuteContext,
    PreExecuteContext,
    PreExecuteResult,
    PrePromptContext,
    ResponseCompleteContext,
    ResponseUpdateContext,
    StatusContext,
    ToolExecutedContext,
    UserMessageContext,
    action,
)

__all__ = [
    "ActionResult",
    "Actions",
    "BackgroundQueue",
    "HookContext",
    "Hooks",
    "Plugin",
    "PluginActions",
    "PostExecuteContext",
    "PreExecuteContext",
    "PreExecuteResult",
    "PrePromptContext",
    "ResponseCompleteContext",
    "ResponseUpdateContext",
    "StatusContext",
    "ToolExecutedContext",
    "UserMessageContext",
    "action",
    "order_plugins",
    "schema_validator",
]
