"""Every exception ringlet raises, in one tree.

    RingletError
    ├── ConfigError                 bad configuration, found at construction or load time
    │   ├── ToolDefinitionError     a tool's signature or name cannot become a tool
    │   └── PluginOrderError        `before`/`after` form a cycle
    ├── ToolFailure                 raised by a tool: becomes its coded error result (`not_found`, …)
    ├── RunError                    a run failed; carries the contract's error `code` and `details`
    ├── ConversationBusy            the conversation already has a working run (any process's)
    └── ProviderError               a model provider failed; carries `retryable`, `status`, `retry_after_s`
        ├── RateLimitError          429                                  (retried)
        ├── OverloadedError         529, or 503 reporting overload      (retried)
        ├── ServerError             500/502/503/504                      (retried)
        ├── ProviderTimeoutError    the request timed out               (retried)
        ├── NetworkError            reset, refused, DNS, broken pipe    (retried)
        ├── ContextWindowError      the prompt does not fit the model
        ├── AuthError               401/403
        └── BadRequestError         any other 4xx

Other tool failures are not exceptions of this tree: they become `tool_error` results the model reads.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthError",
    "BadRequestError",
    "ConfigError",
    "ContextWindowError",
    "ConversationBusy",
    "NetworkError",
    "NotDurable",
    "OverloadedError",
    "PluginOrderError",
    "ProviderError",
    "ProviderTimeoutError",
    "RateLimitError",
    "RingletError",
    "RunError",
    "ServerError",
    "ToolDefinitionError",
    "ToolFailure",
]


class RingletError(Exception):
    """Base class of every ringlet exception."""


class ConfigError(RingletError, ValueError):
    """Configuration that cannot work. The message names the culprit and the fix."""


class NotDurable(ConfigError):
    """A run meant to be durable (`ringlet.durable`) started where it cannot be: outside a DBOS workflow."""


class ToolDefinitionError(ConfigError):
    """A function, action or schema that cannot become a tool."""


class PluginOrderError(ConfigError):
    """Plugins whose `before`/`after` constraints form a cycle."""


class ToolFailure(RingletError):
    """Raised by a tool to fail with a coded error result the model reads (`not_found`, `invalid_arguments`,
    …): `{"error": {"code", "message", **extra}}`. Any other exception is a `tool_error`."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.extra = code, message, extra


class RunError(RingletError):
    """A run ended in failure. `code` is the contract's snake_case error code."""

    def __init__(self, code: str, message: str, *, details: dict[str, Any] | None = None,
                 retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}
        self.retryable = retryable


class ConversationBusy(RingletError):
    """A run was started on a conversation that already has a working run."""


class ProviderError(RingletError):
    """A model provider failed. Subclasses say whether a retry can help."""

    retryable: bool = False

    def __init__(self, message: str, *, status: int | None = None, retry_after_s: float | None = None,
                 provider: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retry_after_s = retry_after_s
        self.provider = provider

    @property
    def code(self) -> str:
        """The snake_case error code used in events."""
        name = type(self).__name__.removesuffix("Error") or "Provider"
        return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_") + "_error"


class RateLimitError(ProviderError):
    retryable = True


class OverloadedError(ProviderError):
    retryable = True


class ServerError(ProviderError):
    retryable = True


class ProviderTimeoutError(ProviderError):
    retryable = True


class NetworkError(ProviderError):
    retryable = True


class ContextWindowError(ProviderError):
    pass


class AuthError(ProviderError):
    pass


class BadRequestError(ProviderError):
    pass
