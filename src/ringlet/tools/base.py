"""Tools and toolsets: the unit the model calls, and the two-method protocol that provides them."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_core import to_json

from ringlet.context import RunContext
from ringlet.errors import ToolDefinitionError, ToolFailure
from ringlet.messages import Effect, ToolDefinition

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_TIMEOUT_S = 30.0
NO_RESULT = '{"success":false,"message":"no result"}'
MAX_ERRORS = 5


class ArgumentsInvalid(ToolFailure):
    """Arguments that fail a tool's schema; `errors` are `<path>: <message>` strings (at most 5). Its result
    is the coded error `invalid_arguments` with those `errors`."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors[:MAX_ERRORS]
        super().__init__("invalid_arguments", "; ".join(errors), errors=self.errors)


Validator = Callable[[dict[str, Any]], dict[str, Any]]
Check = Callable[[dict[str, Any]], Awaitable[None]]
Runner = Callable[[dict[str, Any], RunContext], Awaitable[Any]]


@dataclass(eq=False)
class Tool:
    """A callable tool: its definition, how to validate arguments, how to run, and its execution options.

    `validate` returns the (possibly coerced) arguments or raises `ArgumentsInvalid`; `run` receives
    them with the per-call RunContext. `timeout_s=0` means no timeout; `max_chars=None` takes the agent's
    `tool_result_max_chars`.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    run: Runner
    validate: Validator = field(default=lambda args: args)
    effect: Effect = "write"
    """`read`, `write` or `destructive`. Undeclared is `write` (`gates.md` §2: what ringlet cannot see is
    assumed to change something), so with approvals on it asks a human; declare `read` for read-only tools."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    sequential: bool = False
    max_chars: int | None = None
    connector: str | None = None
    takes_context: bool = True
    """Whether `run` reads the per-call context; if not, the loop skips building one."""
    idempotent: bool = False
    """Safe to run twice: an approved call interrupted by a restart is run again rather than failed."""
    durable: bool = False
    """Its results matter beyond this turn: compaction keeps them verbatim and memory captures them."""
    approval: Literal["auto", "confirm"] | None = None
    """The tool's own approval mode, used when the agent's config has none for it (memory tools: auto)."""
    resolve: Callable[[dict[str, Any], RunContext], tuple[Toolset, Tool, dict[str, Any]]] | None = None
    """A meta-tool that stands for another tool (`execute_connector_tool`): its arguments name the inner
    tool, which the gates then judge and the backend runs."""
    emits: bool = False
    """Emits events of its own while it runs (`ctx.emit`: a sub-agent's), so even a lone call runs through
    the batch queue, which forwards them as they come."""
    check: Check | None = None
    """Refuses arguments the tool will never accept, before anyone is asked to approve the call: awaited
    with the arguments (validated, after `pre_execute`) ahead of the policy and approval gates; raising
    `ToolFailure` makes that the call's result (`web_fetch`: an address it does not reach). `run` still
    checks for itself what only running can show."""
    deferred: bool = False
    """The caller runs this tool, not ringlet: when the model calls it, the other calls of the batch run,
    then the run ends (`input_required`) with the call in `RunState.deferred_calls`. The caller continues
    the run by sending the result as a tool message (OpenAI-compatible client tools)."""

    def __post_init__(self) -> None:
        if not NAME_PATTERN.match(self.name):
            raise ToolDefinitionError(
                f"tool name {self.name!r} is invalid: use 1-64 letters, digits, '_' or '-'")
        if self.timeout_s < 0:
            raise ToolDefinitionError(f"tool {self.name!r}: timeout_s must be >= 0 (0 means none)")

    @cached_property
    def definition(self) -> ToolDefinition:
        return ToolDefinition(name=self.name, description=self.description, parameters=self.parameters)

    @cached_property
    def tokens(self) -> int:
        """Estimated prompt tokens of this tool's definition."""
        from ringlet.models.tokens import estimate_tool_definition

        return estimate_tool_definition(self.definition)


def client_tool(name: str, description: str, parameters: dict[str, Any]) -> Tool:
    """A tool the client runs (`/v1`'s and AG-UI's `tools`): listed to the model, never run where the loop
    runs (deferred: the run ends with the call for the client, which sends its result back)."""

    async def never(args: dict[str, Any], ctx: Any) -> str:
        raise RuntimeError("a client tool cannot run on the server")

    return Tool(name=name, description=description, parameters=parameters, run=never, deferred=True,
                connector="client")


class Toolset:
    """Lists tools and calls them. MCP servers, plugin actions, meta-tools and built-ins are all toolsets.

    Subclasses override `list_tools` (and `call_tool` to wrap calls). A toolset whose tools never change
    sets `static_tools`, which lets an Agent reject duplicate names at construction.
    """

    static_tools: Sequence[Tool] | None = None

    async def list_tools(self, ctx: RunContext) -> Sequence[Tool]:
        return self.static_tools or ()

    def call_tool(self, tool: Tool, args: dict[str, Any], ctx: RunContext) -> Awaitable[Any]:
        """Call one of this toolset's tools (override to wrap calls; an `async def` works too)."""
        return tool.run(args, ctx)


class StaticToolset(Toolset):
    """A fixed list of tools, e.g. functions decorated with `@tool`."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.static_tools = tuple(tools)


def schema_validator(schema: dict[str, Any]) -> Validator:
    """Arguments checked against the tool's JSON Schema before the server sees them."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError:
        return lambda args: args  # a schema the validator cannot read: the server checks the arguments
    validator = Draft202012Validator(schema)

    def validate(args: dict[str, Any]) -> dict[str, Any]:
        errors = sorted(validator.iter_errors(args), key=lambda e: list(e.path))
        if errors:
            raise ArgumentsInvalid([f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message}" for e in errors])
        return args

    return validate


@dataclass(frozen=True, slots=True)
class Returned:
    """A tool's value together with metadata for its `tool` message (e.g. a sub-agent's run ids)."""

    value: Any
    metadata: dict[str, Any]


def encode_result(value: Any) -> str:
    """A tool's return value as the text the model reads (`loop-and-hooks.md` §2, Results)."""
    if isinstance(value, str):
        return value
    if value is None:
        return NO_RESULT
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return to_json(value, fallback=str).decode()


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    """Cut `text` to `max_chars` and say so in a trailer; returns the text and whether it was cut."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text, False
    return f"{text[:max_chars]}…[truncated: kept {max_chars} of {len(text)} characters]", True
