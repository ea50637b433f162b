"""Evaluators: what a case's run is checked against.

An evaluator is a dataclass with `evaluate(ctx) -> result` (sync or async). The result is a bool (an
assertion: the case fails when one is False), a number (a score), a string (a label), an `EvaluationReason`
(a value with its reason), or a dict of named results. A dataset names evaluators the way pydantic-evals
writes them: `- EqualsExpected`, `- Contains: text` (the first field), `- Contains: {value: …, case_sensitive:
false}` (fields by name). The standard ones read the output; ringlet's own read the run: its tool calls,
errors, rounds, usage and the gates' decisions (`EvaluatorContext.events`, `.tool_calls`).
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Literal

from ringlet.events import ErrorEvent, Event, GuardrailEvent, ToolResultEvent
from ringlet.messages import Message, ToolCall

__all__ = [
    "NAMES", "Contains", "Equals", "EqualsExpected", "EvaluationReason", "Evaluator", "EvaluatorContext",
    "GuardrailDecision", "IsInstance", "MaxCost", "MaxDuration", "MaxRounds", "MaxTokens", "NoError", "OutputMatches",
    "PolicyDecision", "ToolCalled", "ToolNotCalled",
]

DENIED = frozenset({"policy_denied", "approval_denied", "approval_timeout"})
"""The error codes of a call a gate (policy or human) did not let run."""


@dataclass(slots=True)
class EvaluationReason:
    """A result with the reason for it (an evaluator may return this instead of a bare value)."""

    value: bool | int | float | str
    reason: str | None = None


@dataclass(slots=True)
class EvaluatorContext:
    """Everything an evaluator may look at: the case, and how its run went."""

    name: str
    inputs: Any
    metadata: Any
    expected_output: Any
    output: Any
    duration: float
    """Seconds from the run's start to its end."""
    events: Sequence[Event] = ()
    """The run's events, in order (a sub-agent's carry its `agent_path`)."""
    messages: Sequence[Message] = ()
    """The run's transcript: its input and everything it added."""
    usage: Mapping[str, Any] = field(default_factory=dict)
    """`in_tokens`, `out_tokens`, `requests` (model requests: rounds), `cost_usd` (None when unknown)."""
    status: str = "completed"
    error: Mapping[str, Any] | None = None
    spent: list[Any] = field(default_factory=list)
    """The `Usage` of evaluators' own model requests (a judge's): the case's cost includes them."""

    @property
    def tool_calls(self) -> list[ToolCall]:
        """Every tool call the model made, in order (the run's own, not a sub-agent's)."""
        return [c for m in self.messages if m.role == "assistant" for c in m.tool_calls]

    @property
    def tool_results(self) -> list[ToolResultEvent]:
        return [e for e in self.events if isinstance(e, ToolResultEvent) and e.agent_path is None]


class Evaluator:
    """Base of every evaluator. Subclasses are dataclasses; `evaluation_name` names their result (default:
    the class name). Override `evaluate`; it may be async."""

    evaluation_name: str | None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        raise NotImplementedError

    @property
    def label(self) -> str:
        return getattr(self, "evaluation_name", None) or type(self).__name__

    def spec(self) -> Any:
        """How a dataset file writes this evaluator (pydantic-evals' short forms)."""
        given = {f.name: value for f in fields(self)  # type: ignore[arg-type]
                 if (value := getattr(self, f.name)) != f.default}
        name = type(self).__name__
        if not given:
            return name
        first = fields(self)[0].name  # type: ignore[arg-type]
        if list(given) == [first]:
            return {name: _plain(given[first])}
        return {name: {k: _plain(v) for k, v in given.items()}}


def _plain(value: Any) -> Any:
    return value.total_seconds() if isinstance(value, timedelta) else value


# -- the standard evaluators (pydantic-evals' names and fields) --------------------------------------------


@dataclass(slots=True)
class EqualsExpected(Evaluator):
    """The output equals the case's `expected_output` (a case without one is not judged)."""

    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        if ctx.expected_output is None:
            return {}
        return _equal(ctx.output, ctx.expected_output)


@dataclass(slots=True)
class Equals(Evaluator):
    """The output equals `value`."""

    value: Any = None
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        return _equal(ctx.output, self.value)


def _equal(output: Any, expected: Any) -> bool | EvaluationReason:
    if output == expected:
        return True
    if isinstance(output, str) and not isinstance(expected, str) and output.strip() == str(expected):
        return True  # a text answer "4" equals the expected 4 a YAML file wrote as a number
    return EvaluationReason(False, f"{_short(output)} != {_short(expected)}")


@dataclass(slots=True)
class Contains(Evaluator):
    """The output contains `value`: a substring of a text output, an item of a list, a key (and value) of a
    dict. `as_strings` compares the string forms."""

    value: Any = None
    case_sensitive: bool = True
    as_strings: bool = False
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        output, value = ctx.output, self.value
        if self.as_strings or isinstance(output, str):
            text, part = str(output), str(value)
            if not self.case_sensitive:
                text, part = text.casefold(), part.casefold()
            return True if part in text else EvaluationReason(False, f"{_short(part)} is not in {_short(text)}")
        if isinstance(output, Mapping):
            if isinstance(value, Mapping):
                missing = {k: v for k, v in value.items() if output.get(k) != v}
                return True if not missing else EvaluationReason(False, f"output lacks {missing}")
            return True if value in output else EvaluationReason(False, f"key {value!r} is not in the output")
        try:
            return True if value in output else EvaluationReason(False, f"{_short(value)} is not in the output")
        except TypeError:
            return EvaluationReason(False, f"the output ({type(output).__name__}) cannot contain anything")


@dataclass(slots=True)
class IsInstance(Evaluator):
    """The output's type (or one of its base classes) is named `type_name`."""

    type_name: str = "str"
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        names = [c.__name__ for c in type(ctx.output).__mro__]
        return True if self.type_name in names else EvaluationReason(
            False, f"the output is a {type(ctx.output).__name__}, not a {self.type_name}")


@dataclass(slots=True)
class MaxDuration(Evaluator):
    """The run took at most `seconds`."""

    seconds: float | timedelta = 1.0
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        limit = self.seconds.total_seconds() if isinstance(self.seconds, timedelta) else float(self.seconds)
        return True if ctx.duration <= limit else EvaluationReason(
            False, f"took {ctx.duration:.3f} s, more than {limit:g} s")


# -- ringlet's evaluators, over the run ---------------------------------------------------------------------


@dataclass(slots=True)
class ToolCalled(Evaluator):
    """The model called tool `name` (a glob: `search_*`): with `args`, a call whose arguments include them
    (a subset, compared recursively); with `times`, exactly that many such calls."""

    name: str = ""
    args: dict[str, Any] | None = None
    times: int | None = None
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        named = [c for c in ctx.tool_calls if fnmatch.fnmatchcase(c.name, self.name)]
        matching = [c for c in named if self.args is None or _subset(self.args, c.arguments)]
        if self.times is None and matching:
            return True
        if self.times is not None and len(matching) == self.times:
            return True
        made = ", ".join(f"{c.name}({_short(c.arguments, 60)})" for c in ctx.tool_calls) or "no tool calls"
        wanted = f"{self.name}" + (f" with {self.args}" if self.args is not None else "")
        count = f" {self.times} time(s)" if self.times is not None else ""
        return EvaluationReason(False, f"expected {wanted}{count}, got {len(matching)}; the run made: {made}")

    @property
    def label(self) -> str:
        return self.evaluation_name or f"ToolCalled({self.name})"


@dataclass(slots=True)
class ToolNotCalled(Evaluator):
    """The model never called tool `name` (a glob)."""

    name: str = ""
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        calls = [c for c in ctx.tool_calls if fnmatch.fnmatchcase(c.name, self.name)]
        return True if not calls else EvaluationReason(
            False, f"{self.name} was called {len(calls)} time(s): {_short(calls[0].arguments, 80)}")

    @property
    def label(self) -> str:
        return self.evaluation_name or f"ToolNotCalled({self.name})"


@dataclass(slots=True)
class NoError(Evaluator):
    """The run ended without an `error` event (and completed). With `tools: true`, no tool call failed either."""

    tools: bool = False
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        errors = [e for e in ctx.events if isinstance(e, ErrorEvent)]
        if errors:
            return EvaluationReason(False, f"{errors[0].code}: {errors[0].message}")
        if ctx.status != "completed":
            return EvaluationReason(False, f"the run ended {ctx.status}")
        failed = [r for r in ctx.tool_results if r.is_error] if self.tools else []
        if failed:
            code = (failed[0].error or {}).get("code", "error")
            return EvaluationReason(False, f"tool {failed[0].name} failed: {code}")
        return True


@dataclass(slots=True)
class MaxRounds(Evaluator):
    """The run made at most `rounds` model requests."""

    rounds: int = 1
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        made = int(ctx.usage.get("requests") or 0)
        return True if made <= self.rounds else EvaluationReason(False, f"{made} rounds, more than {self.rounds}")


@dataclass(slots=True)
class MaxCost(Evaluator):
    """The run cost at most `usd` (a run whose cost is unknown fails: its model has no price)."""

    usd: float = 0.0
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        cost = ctx.usage.get("cost_usd")
        if cost is None:
            return EvaluationReason(False, "the run's cost is unknown (its model has no price)")
        return True if cost <= self.usd else EvaluationReason(False, f"cost ${cost:.6f}, more than ${self.usd:g}")


@dataclass(slots=True)
class MaxTokens(Evaluator):
    """The run used at most `tokens` tokens (input and output), or at most `input` / `output` of each."""

    tokens: int | None = None
    input: int | None = None
    output: int | None = None
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        used_in, used_out = int(ctx.usage.get("in_tokens") or 0), int(ctx.usage.get("out_tokens") or 0)
        over = [f"{what} {used} > {limit}" for what, used, limit in (
            ("tokens", used_in + used_out, self.tokens), ("input", used_in, self.input),
            ("output", used_out, self.output)) if limit is not None and used > limit]
        return True if not over else EvaluationReason(False, "; ".join(over))


@dataclass(slots=True)
class PolicyDecision(Evaluator):
    """The gates `allowed` (the call ran) or `denied` (a policy, or a human, refused it) every call of tool
    `tool`; a run that never called it fails."""

    tool: str = ""
    decision: Literal["allowed", "denied"] = "denied"
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        results = [r for r in ctx.tool_results if fnmatch.fnmatchcase(r.name, self.tool)]
        if not results:
            return EvaluationReason(False, f"{self.tool} was never called")
        seen = ["denied" if (r.error or {}).get("code") in DENIED else "allowed" for r in results]
        wrong = [d for d in seen if d != self.decision]
        return True if not wrong else EvaluationReason(False, f"{self.tool}: {', '.join(seen)}")

    @property
    def label(self) -> str:
        return self.evaluation_name or f"PolicyDecision({self.tool})"


@dataclass(slots=True)
class GuardrailDecision(Evaluator):
    """Between `min` and `max` (None: no limit) decisions of guardrails named `guardrail` (a pattern) were
    `decision` (`allow`, `redact`, `block`; None: any), at `stage` (None: any), finding `kind` (`email`,
    `injection`, …; None: any). The reason counts them: `- GuardrailDecision: {decision: block, max: 0}`
    asserts nothing was blocked, `{guardrail: pii, decision: redact, kind: card}` that a card was redacted."""

    guardrail: str = "*"
    decision: Literal["allow", "redact", "block"] | None = "block"
    stage: Literal["input", "output", "tool_args", "tool_result"] | None = None
    kind: str | None = None
    min: int = 1
    max: int | None = None
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        found = [e for e in ctx.events if isinstance(e, GuardrailEvent) and fnmatch.fnmatchcase(e.guardrail,
                                                                                                  self.guardrail)
                 and self.decision in (None, e.decision) and self.stage in (None, e.stage)
                 and (self.kind is None or self.kind in e.kinds)]
        n = len(found)
        ok = n >= self.min and (self.max is None or n <= self.max)
        seen = ", ".join(f"{e.guardrail} {e.decision} {e.stage}" for e in found[:5])
        return EvaluationReason(ok, f"{n} matching decision{'s' if n != 1 else ''}" + (f": {seen}" if seen else ""))

    @property
    def label(self) -> str:
        return self.evaluation_name or f"GuardrailDecision({self.guardrail}, {self.decision or 'any'})"


@dataclass(slots=True)
class OutputMatches(Evaluator):
    """The output validates against the JSON Schema `schema`, equals `value`, or (text) matches the
    regular expression `pattern`. A text output that is JSON is parsed first."""

    schema: dict[str, Any] | None = None
    value: Any = None
    pattern: str | None = None
    evaluation_name: str | None = None

    def evaluate(self, ctx: EvaluatorContext) -> Any:
        from ringlet.output import schema_errors

        output = _parsed(ctx.output) if self.schema is not None or self.value is not None else ctx.output
        if self.schema is not None and (errors := schema_errors(_jsonable(output), self.schema, limit=3)):
            return EvaluationReason(False, "; ".join(errors))
        if self.value is not None and _jsonable(output) != self.value:
            return EvaluationReason(False, f"{_short(output)} != {_short(self.value)}")
        if self.pattern is not None and not re.search(self.pattern, str(ctx.output)):
            return EvaluationReason(False, f"{_short(ctx.output)} does not match /{self.pattern}/")
        return True


def _parsed(output: Any) -> Any:
    if isinstance(output, str):
        import json

        try:
            return json.loads(output)
        except ValueError:
            return output
    return output


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def _subset(want: Any, got: Any) -> bool:
    if isinstance(want, Mapping):
        return isinstance(got, Mapping) and all(k in got and _subset(v, got[k]) for k, v in want.items())
    if isinstance(want, float) and isinstance(got, int | float):
        return math.isclose(want, got, rel_tol=1e-9)
    return bool(want == got)


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


NAMES: dict[str, type[Evaluator]] = {cls.__name__: cls for cls in (
    EqualsExpected, Equals, Contains, IsInstance, MaxDuration, ToolCalled, ToolNotCalled, NoError, MaxRounds,
    MaxCost, MaxTokens, PolicyDecision, GuardrailDecision, OutputMatches)}
"""The evaluators a dataset may name without registering them (`LLMJudge` too, from `judge.py`)."""
