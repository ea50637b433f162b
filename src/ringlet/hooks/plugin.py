"""`Plugin`: one class of no-op async hooks on a fixed naming grid, plus actions exposed as tools."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ringlet.context import NoticeLevel, RunContext
from ringlet.errors import ToolDefinitionError
from ringlet.messages import Effect, Message, ToolCall, ToolDefinition
from ringlet.models.tokens import TokenBreakdown

HOOKS = ("user_message_received", "status_changed", "pre_prompt", "response_update", "response_complete",
         "pre_execute", "tool_executed", "post_execute")


@dataclass(eq=False)
class HookContext:
    """What every hook receives: the run, and `notify()` for inline notifications."""

    run: RunContext
    source: str = field(default="ringlet", repr=False)

    def notify(self, level: NoticeLevel, title: str, message: str = "",
               progress: tuple[float, float | None] | None = None) -> None:
        """Queue a `notification` event (never sent to the model)."""
        self.run.notify(level, title, message, progress, source=self.source)

    @property
    def plugin_data(self) -> dict[str, Any]:
        return self.run.plugin_data


@dataclass(eq=False)
class UserMessageContext(HookContext):
    message: Message | None = None


@dataclass(eq=False)
class StatusContext(HookContext):
    old: str | None = None
    new: str = "working"


@dataclass(eq=False)
class PrePromptContext(HookContext):
    """Hooks may edit `messages`, `instructions` and `examples`, or `cancel(reason)` the run."""

    messages: list[Message] = field(default_factory=list)
    instructions: str | None = None
    examples: list[Message] = field(default_factory=list)
    round: int = 0
    token_breakdown: TokenBreakdown | None = None
    tools: tuple[ToolDefinition, ...] = ()
    budget: int = 0
    cancel_reason: str | None = None

    def cancel(self, reason: str) -> None:
        self.cancel_reason = reason


@dataclass(eq=False)
class ResponseUpdateContext(HookContext):
    """The partial assistant message (`metadata.is_complete` is False)."""

    message: Message | None = None


@dataclass
class Actions:
    next_round: Literal["self", "human"] | None = None
    new_user_message: str | None = None


@dataclass(eq=False)
class ResponseCompleteContext(HookContext):
    message: Message | None = None
    actions: Actions = field(default_factory=Actions)


@dataclass(frozen=True, slots=True)
class PreExecuteResult:
    """What a `pre_execute` hook decides: go on (maybe with new params), or abort the call.

    `proceed=False` aborts this one call, exactly as `PreExecuteContext.cancel(reason)` does: the call's
    result is the error `aborted` (with `plugin`), later plugins are skipped, the run goes on. They differ
    in two ways only: the message is `abort_message`, or `aborted by plugin '<name>'` when it is None
    (`cancel()` needs its reason), and `cancel()` is checked first, so a hook that calls it and also
    returns a result aborts with the cancel reason. `modified_params` (with `proceed=True`) go to the next
    plugin and are validated again before the call runs.
    """

    proceed: bool = True
    modified_params: dict[str, Any] | None = None
    abort_message: str | None = None


@dataclass(eq=False)
class PreExecuteContext(HookContext):
    """Per call, after validation and before the gates: `params` may be read; change them by returning
    `PreExecuteResult(modified_params=…)`, abort the call with `cancel(reason)` or `proceed=False`."""

    call: ToolCall | None = None
    tool: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    cancel_reason: str | None = None

    def cancel(self, reason: str) -> None:
        """Abort this one call with `reason` as the message the model reads (error `aborted`, with
        `plugin`); the run goes on (unlike `PrePromptContext.cancel`, which ends the run). The same as
        returning `PreExecuteResult(proceed=False, abort_message=reason)`, except that `cancel()` is checked
        first: whatever the hook returns is then ignored. Handy in helpers that return nothing."""
        self.cancel_reason = reason


@dataclass(eq=False)
class ToolExecutedContext(HookContext):
    """Inline, before the result joins the transcript; hooks may annotate `metadata`."""

    call: ToolCall | None = None
    tool: str = ""
    result: str = ""
    is_error: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class PostExecuteContext(HookContext):
    """Off the hot path, for every call (failed, denied, aborted and timed out ones too). The hook runs in
    the background, after the call's result went on: the run never waits for it, so it may still be running
    when `run()` returns; `await agent.wait_background()` waits for the queue (`run_sync()` does)."""

    tool: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    result: str | None = None
    success: bool = True
    error: dict[str, Any] | None = None
    duration_ms: float = 0.0
    was_cancelled: bool = False
    cancellation: dict[str, Any] | None = None


@dataclass(slots=True)
class ActionResult:
    """What a plugin action returns; the model reads it as JSON."""

    success: bool = True
    message: str = ""
    data: Any = None


ACTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
OPEN_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": True}


@dataclass(frozen=True, slots=True)
class ActionSpec:
    name: str
    description: str
    input_schema: dict[str, Any] | None
    effect: Effect
    timeout_s: float | None
    method: Callable[..., Awaitable[ActionResult]]


def action(name: str | None = None, description: str = "", input_schema: dict[str, Any] | None = None, *,
           effect: Effect = "write", timeout_s: float | None = None) -> Callable[[Any], Any]:
    """Expose a plugin method `async def m(self, params: dict, ctx: RunContext) -> ActionResult` as the tool
    `<plugin>_<name>`. A missing `input_schema` accepts any object."""

    def mark(method: Callable[..., Awaitable[ActionResult]]) -> Any:
        method.__ringlet_action__ = ActionSpec(  # type: ignore[attr-defined]
            name or method.__name__, description or (method.__doc__ or "").strip(), input_schema, effect,
            timeout_s, method)
        return method

    return mark


class Plugin:
    """Subclass and override any hooks; each is an async no-op here.

    A plugin is stateless: one instance serves many runs, and per-run state lives in
    `ctx.plugin_data[self.name]`. Order with `priority` (higher first), `before` and `after` (plugin
    names). `core = True` is for ringlet's own persistence/streaming/status plugins, which run first.
    """

    name: str = ""
    priority: int = 0
    before: ClassVar[tuple[str, ...] | list[str]] = ()
    after: ClassVar[tuple[str, ...] | list[str]] = ()
    core: bool = False
    actions: ClassVar[tuple[ActionSpec, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower().removesuffix("_plugin")
        specs = {s.name: s for base in reversed(cls.__mro__) for v in vars(base).values()
                 if (s := getattr(v, "__ringlet_action__", None)) is not None}
        for spec in specs.values():
            full = f"{cls.name}_{spec.name}"
            if not ACTION_NAME.match(full):
                raise ToolDefinitionError(
                    f"plugin {cls.name!r}: action name {full!r} must match ^[A-Za-z0-9_-]{{1,64}}$")
        cls.actions = tuple(specs.values())

    async def user_message_received(self, ctx: UserMessageContext) -> None: ...
    async def status_changed(self, ctx: StatusContext) -> None: ...
    async def pre_prompt(self, ctx: PrePromptContext) -> None: ...
    async def response_update(self, ctx: ResponseUpdateContext) -> None: ...
    async def response_complete(self, ctx: ResponseCompleteContext) -> None: ...
    async def pre_execute(self, ctx: PreExecuteContext) -> PreExecuteResult | None: ...
    async def tool_executed(self, ctx: ToolExecutedContext) -> None: ...
    async def post_execute(self, ctx: PostExecuteContext) -> None: ...
