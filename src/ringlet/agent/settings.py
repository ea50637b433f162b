"""The typed settings of an `Agent`, in a few frozen groups instead of a list of flags:

- `Limits`: when a run stops and what it may spend (iterations, tokens, cost, retries, compaction);
- `ringlet.models.base.ModelSettings`: how the model samples (temperature, top_p, max_tokens);
- `Execution`: how a run executes (plugins and their hooks, tool batches, the step executor);
- `Gates`: who may run what (policies, approval rules, the approver, the audit sink, the realm);
- `SubAgents`: the agents `spawn_agent` may start, given among the agent's tools.

Each validates its values when built (a `ConfigError` names the field and what it must be). `RunSettings` is
how one run differs from the agent's own (another model, limits, an approver…); `RunHost` is what a host
(the server, a parent run) gives one run, inside it; library callers rarely need it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from ringlet.agent.contract import RunSettings
from ringlet.agent.subagents import RunHost, SubAgents
from ringlet.errors import ConfigError
from ringlet.loop.settings import LoopSettings
from ringlet.memory.compaction import CompactionConfig
from ringlet.memory.settings import MemoryConfig
from ringlet.models.base import ModelSettings
from ringlet.output import JsonSchema
from ringlet.tools.base import Tool, Toolset, client_tool

if TYPE_CHECKING:
    from ringlet.gates import Gate
    from ringlet.gates.approval import ApprovalRules, Approver
    from ringlet.guardrails import Guardrails
    from ringlet.hooks.plugin import Plugin
    from ringlet.loop import StepExecutor
    from ringlet.memory import Memory
    from ringlet.models.pricing import Pricing

__all__ = ["Execution", "Gates", "Limits", "ModelSettings", "RunHost", "RunSettings", "SubAgents", "ToolLike"]

ToolLike: TypeAlias = "Tool | Toolset | Callable[..., Any] | SubAgents | Memory | MemoryConfig"
"""What `tools=` takes: functions, tools, toolsets, and the capabilities that bring tools (and more) with
them: `SubAgents` (`spawn_agent`), a `Memory` or `MemoryConfig` (memory tools and context notes)."""


def _checked(values: dict[str, Any]) -> None:
    """Validate the loop's knobs among `values` that are not the defaults (a ConfigError names each bad one)."""
    defaults = LoopSettings.model_fields
    known = {k: v for k, v in values.items() if k in defaults and v != defaults[k].default}
    if known:
        LoopSettings.build(**known)


@dataclass(frozen=True, slots=True)
class Limits:
    """When a run stops and what it may spend (`loop-and-hooks.md` §8)."""

    max_iterations: int = 10
    """Tool rounds per run; at the cap the model answers without tools (or the run fails: `on_max_iterations`)."""
    on_max_iterations: Literal["answer", "error"] = "answer"
    max_tokens_per_turn: int = 32_000
    """The prompt's token budget (the model's context window bounds it too)."""
    max_cost_usd_per_run: float | None = None
    pricing: Pricing | None = None
    """Prices per model for usage and `max_cost_usd_per_run` (default: ringlet's table)."""
    max_blank_stops: int = 3
    blank_stop_nudge: str | None = None
    max_repeated_tool_errors: int = 3
    terminal_tool: str | None = "summary"
    """The tool whose call is the final answer; None: no terminal tool."""
    question_timeout_s: float | None = None
    output_retries: int = 1
    """How often a result that fails the output type goes back to the model (`output_type`)."""
    compaction: CompactionConfig | bool = True
    """Summarise the oldest turns when the prompt nears the budget: True (the defaults), False, or a config."""

    def __post_init__(self) -> None:
        _checked({f.name: getattr(self, f.name) for f in fields(self)})
        if self.output_retries < 0:
            from ringlet.errors import ConfigError

            raise ConfigError(f"invalid agent settings: output_retries: must be 0 or more, got {self.output_retries}")


@dataclass(frozen=True, slots=True)
class Execution:
    """How a run executes: its plugins (and their hooks' timeout), tool batches and step executor."""

    plugins: Sequence[Plugin] = ()
    hook_timeout_s: float = 5.0
    strict_plugins: bool = False
    """A failing hook fails the run (default: logged and skipped)."""
    parallel_tools: bool = True
    max_tool_concurrency: int = 8
    batch_timeout_s: float = 120.0
    tool_result_max_chars: int = 32_000
    steps: StepExecutor | None = None
    """Runs every model request and tool call (default `LocalSteps`; `ringlet.durable` records them)."""
    on_iteration: Callable[[dict[str, Any]], Any] | None = None
    """Called after each tool round with the iteration, the calls' count, usage so far and the messages."""

    def __post_init__(self) -> None:
        _checked({f.name: getattr(self, f.name) for f in fields(self)})


@dataclass(frozen=True, slots=True)
class Gates:
    """Who may run what: policy gates (e.g. `PolicyGate`) judge every call in order, approval rules decide
    which calls need a human, and the approver waits for them (none: the run pauses, `input_required`)."""

    policies: Sequence[Gate] = ()
    approvals: ApprovalRules | None = None
    approver: Approver | None = None
    audit: Callable[[dict[str, Any]], Any] | None = None
    """Where approval decisions are audited."""
    realm: str | None = None
    """The realm this agent runs in as a sub-agent (None: its parent's); the server's default too."""
    guardrails: Guardrails | None = None
    """Checks of what the run's texts say (`ringlet.guardrails`): the user's message, the answer, tool calls
    and their results; each decision is audited (`audit`) and sent as a `guardrail` event."""


def grouped(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Flat loop settings (`config.yaml`'s `limits:` names) as the keywords of `Limits`, `Execution` and
    `ModelSettings` (`max_output_tokens` is `ModelSettings.max_tokens`)."""
    limits = {k: v for k, v in values.items() if k in Limits.__dataclass_fields__}
    execution = {k: v for k, v in values.items() if k in Execution.__dataclass_fields__}
    sampling = {k: v for k, v in values.items() if k in ("temperature", "top_p", "prompt_cache", "cache_points",
                                                         "cache_key")}
    if "max_output_tokens" in values:
        sampling["max_tokens"] = values["max_output_tokens"]
    return limits, execution, sampling


def run_options(agent: Any, overrides: dict[str, Any], settings: RunSettings | None = None) -> dict[str, Any]:
    """A request's overrides as JSON (the API's `overrides`, `/v1`'s system messages, tools, sampling and
    `response_format`) as the keywords of `agent.stream()`: `settings` (the one given, completed: limits and
    sampling replace the agent's own fields), and a graph agent's `variables` and `fork` (a graph takes only
    those: its nodes have their own model and limits)."""
    given = dict(overrides)
    out: dict[str, Any] = {}
    run: dict[str, Any] = {}
    loop = agent.kind == "loop"
    for graph_only in ("variables", "fork"):  # `fork`: where a forked graph run starts (`ringlet.graph.fork`)
        if loop and graph_only in given:
            raise ConfigError(f"{graph_only} {'are' if graph_only == 'variables' else 'is'} a graph agent's "
                              f"(graph.yaml); agent {agent.name!r} is a loop agent")
        if graph_only in given:
            out[graph_only] = given.pop(graph_only)
    for key, name in (("model", "model"), ("extra_instructions", "instructions"), ("extra_tools", "tools")):
        if key in given:
            run[name] = given.pop(key)
    if "output_schema" in given:
        run["output_type"] = JsonSchema(**given.pop("output_schema"))
    limits, _, sampling = grouped(given)
    unknown = set(given) - set(limits) - {"temperature", "top_p", "max_output_tokens"}
    if unknown or (set(limits) - {"max_iterations"}):
        raise ConfigError(f"cannot override {sorted(unknown | (set(limits) - {'max_iterations'}))} per request; "
                          "only model, max_iterations, temperature, top_p and max_output_tokens can be")
    if loop:
        if limits:
            run["limits"] = replace(agent.limits, **limits)
        if sampling:
            run["model_settings"] = replace(agent.model_settings, **sampling)
    if run:
        settings = replace(settings or RunSettings(), **run)
    return out | ({"settings": settings} if settings is not None else {})


def overrides_json(overrides: dict[str, Any] | None) -> dict[str, Any]:
    """A request's overrides as plain JSON (a client's tools as their definitions), to store with its run."""
    given = dict(overrides or {})
    if "extra_tools" in given:
        given["extra_tools"] = [{"name": t.name, "description": t.description, "parameters": t.parameters}
                                for t in given["extra_tools"]]
    return given


def overrides_of(data: dict[str, Any] | None) -> dict[str, Any]:
    """Stored overrides (`overrides_json`) as a request gave them: a client's tools as deferred tools again."""
    given = dict(data or {})
    if "extra_tools" in given:
        given["extra_tools"] = [client_tool(**t) for t in given["extra_tools"]]
    return given


DEFAULT_LIMITS = Limits()
AGENT_DEFAULTS = RunSettings()
"""A run as its agent runs by default."""
DEFAULT_EXECUTION = Execution()
NO_GATES = Gates()
DEFAULT_MODEL_SETTINGS = ModelSettings()
NO_HOST = RunHost()
