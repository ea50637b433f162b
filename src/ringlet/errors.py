"""Every exception ringlet raises, in one tree. A dotted name is imported from that module of `ringlet`, the
others from this one.

    RingletError
    ├── ConfigError (ValueError)        bad configuration, found at construction or load time
    │   ├── ToolDefinitionError         a function, action or schema that cannot become a tool
    │   ├── PluginOrderError            plugins' `before`/`after` constraints form a cycle
    │   ├── NotDurable                  a durable run started outside a DBOS workflow (`ringlet.durable`)
    │   ├── graph.GraphLoadError        graph.yaml cannot be read or parsed; `problems` locate each cause
    │   ├── graph.GraphValidationError  graph.yaml parsed but is no valid graph; `errors`, `warnings`
    │   ├── graph.fork.ForkError        a graph run's fork cannot start (`code`: no such checkpoint, its end, …)
    │   │   └── graph.fork.StatePatchError  a fork's state_patch does not fit the state; `problems` name keys
    │   ├── evals.DatasetError          a dataset or report file that cannot be used; names file, line, fix
    │   └── server.runs.replays.NotReplayable  a stored run that cannot be replayed (still working, a graph run, …)
    ├── ToolFailure                     raised by a tool: becomes its coded error result (`not_found`, …)
    │   ├── tools.ArgumentsInvalid      arguments that fail a tool's schema: code `invalid_arguments`, `errors`
    │   ├── agent.subagents.ChildFailure  a sub-agent call failed; carries the child's `usage`
    │   └── ModelRetry                  raised by a tool or an output validator: the model reads it (code `retry`)
    ├── output.OutputInvalid            an answer that fails the run's output type; its message goes to the model
    ├── InvalidAnswer (ValueError)      an answer the pending question cannot take; the question stays open
    ├── RunError                        a run failed; carries the contract's error `code` and `details`
    │   ├── graph.nodes.NodeFailure     a graph node failed (`node_failed`, or the code it reports)
    │   ├── graph.scripts.ScriptError   a script node's script failed (`script_failed`)
    │   ├── graph.templates.TemplateError  a strict template names keys the state lacks (`template_error`)
    │   ├── graph.engine.RecordedFailure   a node's failure replayed from a durable run's record
    │   └── guardrails.GuardrailBlocked    a guardrail blocked a text: the run ends with `guardrail_blocked`
    ├── agent.forks.ForkError (ValueError)  a fork a transcript cannot make (unknown message, edit of a non-user one)
    ├── ConversationBusy                the conversation already has a working run (any process's)
    ├── KeyBusy                         the API key has its most working runs, counted in every process
    ├── store.request_records.KeyTaken  an Idempotency-Key stored already (by the same request, sent before)
    ├── PolicyError                     a Rego policy evaluation failed (the policy gate fails closed)
    ├── EmbeddingError                  an embedding provider failed; memory falls back to keyword search
    ├── mcp.session.StartFailed         an MCP server could not be started or initialised (ends with its stderr)
    ├── server.errors.ApiError          an HTTP error response (`status`, `code`): raise it in a route
    └── ProviderError                   a model provider failed; carries `retryable`, `status`, `retry_after_s`
        ├── RateLimitError              429                                  (retried)
        ├── OverloadedError             529, or 503 reporting overload      (retried)
        ├── ServerError                 500/502/503/504                      (retried)
        ├── ProviderTimeoutError        the request timed out               (retried)
        ├── NetworkError                reset, refused, DNS, broken pipe    (retried)
        ├── ContextWindowError          the prompt does not fit the model
        ├── AuthError                   401/403
        └── BadRequestError             any other 4xx

Other tool failures are not exceptions of this tree: they become `tool_error` results the model reads. Misuse
of an API (an argument of the wrong type or value, an unknown key) raises Python's own TypeError, ValueError
or KeyError, as Python code does.

Internal signals, never escaping a public API (each is caught where it is raised, one module or two away):
`graph.llm.Retry` (one more attempt of an llm node), `graph.structured.SchemaFailure` (output that fails
`output_schema`: repaired, retried or a NodeFailure), `graph.human.NeedsAnswer` (no one to ask: the graph run
pauses), `loop.tools._Expired` (a tool call's deadline: `tool_timeout`), `agent.remote._RemoteFailure` (a remote A2A
sub-agent that cannot run: `sub_agent_failed`), `mcp.session.Disconnected` (an MCP
server gone: started again), `server.errors._TooLarge` (a request body over the limit: a 413 response),
`server.errors._Nul` (a NUL character in a request: a 400 response), `tools.builtin.units.UnitError` (an unknown
unit or a mixed conversion: `calculate`'s clear error) and `mcp.sampling.SamplingDeclined` (a server's sampling
request not answered: the protocol's error to the server).
`tests/test_errors_tree.py` fails on any exception class outside the tree and this list.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthError",
    "BadRequestError",
    "ConfigError",
    "ContextWindowError",
    "ConversationBusy",
    "EmbeddingError",
    "InvalidAnswer",
    "ModelRetry",
    "NetworkError",
    "NotDurable",
    "OverloadedError",
    "PluginOrderError",
    "PolicyError",
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


class KeyBusy(RingletError):
    """A run was started for an API key that already has `limit` working runs (`working`, counted in the
    database, so in every process that shares it)."""

    def __init__(self, key: str, working: int, limit: int) -> None:
        super().__init__(f"key {key} already has {working} working runs (limit {limit})")
        self.key, self.working, self.limit = key, working, limit


class ModelRetry(ToolFailure):
    """Raised by a tool or an output validator to send `message` back to the model and let it try again:

        @tool
        def lookup(order_id: str) -> str:
            if not order_id.startswith("ord_"):
                raise ModelRetry("order ids look like ord_123; check the id and call lookup again")
            ...

    The model reads the message in place of the result (or of the final output) and may try again."""

    def __init__(self, message: str) -> None:
        super().__init__("retry", message)


class InvalidAnswer(RingletError, ValueError):
    """An answer the pending question cannot take (not one of its options, empty, or an input that fails the
    node's `validation`); the question stays open. The message says what would be accepted."""


class PolicyError(RingletError):
    """A policy evaluation failed (an engine error, or a rule whose value is not a set): the gate fails
    closed."""


class EmbeddingError(RingletError):
    """An embedding provider failed or is unreachable; callers fall back to keyword search."""


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
