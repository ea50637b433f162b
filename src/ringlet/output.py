"""Typed outputs: how a run's answer becomes a validated value of the type the caller asked for.

An output type is any type pydantic validates (a model, a dataclass, a `TypedDict`, a scalar, `list[...]`,
a union of them) or a JSON Schema (`JsonSchema`, for `config.yaml` and `/v1`'s `response_format`). How the
model gives it is the mode:

- `tool` (the default, `ToolOutput`): a final-result tool whose parameters are the schema; the run ends
  when the model calls it with valid arguments;
- `native` (`NativeOutput`): the provider's own JSON-schema response format (OpenAI, Gemini, Anthropic,
  a grammar for `local:`); the answer's text is the JSON;
- `prompted` (`PromptedOutput`): the schema goes into the instructions and the JSON is parsed from text.

An answer that does not validate goes back to the model with the validator's message, `retries` times,
then the run fails with `output_validation_failed`. Output validators may raise `ModelRetry`.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar, Generic, Literal, TypeVar

import pydantic_core
from pydantic import TypeAdapter, ValidationError

from ringlet.context import RunContext
from ringlet.errors import ConfigError, RingletError

__all__ = ["JsonSchema", "NativeOutput", "OutputMode", "PromptedOutput", "ToolOutput"]

T = TypeVar("T")
OutputMode = Literal["tool", "native", "prompted"]
OUTPUT_TOOL = "final_result"
MAX_ERRORS = 5
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```$", re.DOTALL)
_INNER_FENCE = re.compile(r"```[A-Za-z0-9_-]*\s*\n(.*?)\n```", re.DOTALL)
OutputValidator = Callable[..., Any]
"""`(value) -> value` or `(ctx: RunContext, value) -> value`, sync or async; raises `ModelRetry` to ask again."""


@dataclass(frozen=True, slots=True)
class JsonSchema:
    """An output given as a JSON Schema (Draft 2020-12); the value is the parsed JSON."""

    schema: dict[str, Any]
    name: str = OUTPUT_TOOL
    description: str | None = None


@dataclass(frozen=True, slots=True)
class _Moded(Generic[T]):
    """An output type with the way the model gives it (`mode`, fixed by each subclass)."""

    mode: ClassVar[OutputMode]
    type: type[T]
    name: str = OUTPUT_TOOL
    description: str | None = None


class ToolOutput(_Moded[T]):
    """The answer is a call to a final-result tool (`name`) whose parameters are `type`'s schema."""

    __slots__ = ()
    mode = "tool"


class NativeOutput(_Moded[T]):
    """The answer is JSON text constrained by the provider's structured-output support."""

    __slots__ = ()
    mode = "native"


class PromptedOutput(_Moded[T]):
    """The answer is JSON text the instructions ask for (any model)."""

    __slots__ = ()
    mode = "prompted"


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """What a native-mode request asks the provider for: JSON matching `schema`."""

    name: str
    schema: dict[str, Any]
    description: str | None = None


class OutputInvalid(RingletError):
    """An answer that does not validate; `message` goes back to the model."""

    def __init__(self, message: str, errors: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message, self.errors = message, list(errors) or [message]


@dataclass(eq=False)
class Output:
    """A run's output type, ready to use: its schema (built once), its validation and its prompt text."""

    mode: OutputMode
    name: str
    description: str
    schema: dict[str, Any]
    """The value's JSON Schema."""
    wrapped: bool
    """Tool mode with a non-object schema: the tool's one parameter `result` holds the value."""
    retries: int = 1
    validators: Sequence[OutputValidator] = ()
    adapter: TypeAdapter[Any] | None = None
    """How a Python type's value is validated; None for a JSON Schema (checked with jsonschema)."""

    @classmethod
    def of(cls, spec: Any, *, retries: int = 1, validators: Sequence[OutputValidator] = ()) -> Output:
        """The output of `spec`: a type, a JSON Schema, or one of them wrapped in a mode."""
        mode: OutputMode = "tool"
        name, description = OUTPUT_TOOL, None
        if isinstance(spec, _Moded):
            mode, name, description, spec = spec.mode, spec.name, spec.description, spec.type
        if retries < 0:
            raise ConfigError(f"output_retries must be 0 or more, got {retries}")
        if isinstance(spec, JsonSchema):
            _check_schema(spec.schema)
            schema, adapter = spec.schema, None
            name, description = spec.name if name == OUTPUT_TOOL else name, description or spec.description
        else:
            try:
                adapter = TypeAdapter(spec)
                schema = _clean(adapter.json_schema())
            except Exception as exc:  # pydantic cannot build a schema for it
                raise ConfigError(f"output_type {spec!r} has no JSON Schema: {exc}") from None
            description = description or (inspect.getdoc(spec) if isinstance(spec, type) and spec.__doc__ else None)
        wrapped = mode == "tool" and schema.get("type") != "object"
        return cls(mode, name, description or "Give the final result.", schema, wrapped, retries,
                   validators, adapter)  # the agent's own list: `@agent.output_validator` adds to it later

    @property
    def parameters(self) -> dict[str, Any]:
        """The final-result tool's parameters."""
        if not self.wrapped:
            return self.schema
        defs = self.schema.get("$defs")
        inner = {k: v for k, v in self.schema.items() if k != "$defs"}
        wrapper: dict[str, Any] = {"type": "object", "properties": {"result": inner}, "required": ["result"]}
        return {**wrapper, "$defs": defs} if defs else wrapper

    @property
    def format(self) -> ResponseFormat:
        return ResponseFormat(self.name, self.schema, self.description)

    def hint(self) -> str:
        """The instructions' paragraph of prompted mode (and of a tool-less final request)."""
        return ("Answer with only a JSON value that matches this JSON Schema, with no other text:\n"
                + json.dumps(self.schema, ensure_ascii=False))

    def retry_text(self, problem: str) -> str:
        if self.mode == "tool":
            return f"{problem}\nCall the `{self.name}` tool with a valid result."
        return f"{problem}\nAnswer again with only the JSON value."

    def validate(self, value: Any) -> Any:
        """The typed value of a JSON value; raises OutputInvalid with the validator's errors."""
        if self.adapter is None:
            if errors := schema_errors(value, self.schema):
                raise OutputInvalid("the result does not match the schema: " + "; ".join(errors), errors)
            return value
        try:
            return self.adapter.validate_python(value)
        except ValidationError as exc:
            raise OutputInvalid("the result does not validate: " + _errors(exc)) from None

    def from_arguments(self, args: dict[str, Any]) -> Any:
        if self.wrapped:
            if "result" not in args:
                raise OutputInvalid("the result does not validate: result: Field required")
            return self.validate(args["result"])
        return self.validate(args)

    def from_text(self, text: str) -> Any:
        try:
            value = json.loads(json_text(text))
        except json.JSONDecodeError as exc:
            raise OutputInvalid(f"the output is not valid JSON: {exc}") from None
        return self.validate(value)

    async def checked(self, value: Any, ctx: RunContext) -> Any:
        """`value` after the output validators; a `ModelRetry` becomes OutputInvalid with its message."""
        from ringlet.errors import ModelRetry

        for validator in self.validators:
            try:
                result = validator(ctx, value) if _takes_ctx(validator) else validator(value)
                value = await result if inspect.isawaitable(result) else result
            except ModelRetry as exc:
                raise OutputInvalid(str(exc)) from None
        return value

    def partial(self, raw: str) -> Any:
        """The value so far of incomplete JSON text, or None when nothing valid can be made of it yet."""
        try:
            data = pydantic_core.from_json(raw, allow_partial="trailing-strings")
        except ValueError:
            return None
        if self.wrapped and self.mode == "tool":
            if not isinstance(data, dict) or "result" not in data:
                return None
            data = data["result"]
        if self.adapter is None:
            return data
        try:
            return self.adapter.validate_python(data, experimental_allow_partial=True)
        except ValidationError:
            return None

    def dump(self, value: Any) -> str:
        """The value as JSON text: the final message's content."""
        if self.adapter is None:
            return json.dumps(value, ensure_ascii=False)
        return self.adapter.dump_json(value).decode()

    def jsonable(self, value: Any) -> Any:
        return value if self.adapter is None else self.adapter.dump_python(value, mode="json")


@cache
def _takes_ctx(validator: OutputValidator) -> bool:
    """Whether a validator is `(ctx, value)`, not `(value)` (read once per validator, not per answer)."""
    return len(inspect.signature(validator).parameters) > 1


def json_text(text: str) -> str:
    """The JSON of a model's answer: `<think>` blocks and code fences (around it or inside prose) removed."""
    text = _THINK.sub("", text).strip()
    if fenced := _FENCE.match(text):
        return fenced.group(1).strip()
    inner = _INNER_FENCE.search(text)
    return inner.group(1).strip() if inner else text


def schema_errors(value: Any, schema: dict[str, Any], limit: int = 10) -> list[str]:
    """Up to `limit` `<path>: <message>` errors of `value` against the JSON Schema (Draft 2020-12)."""
    from jsonschema import Draft202012Validator

    errors = sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:limit]]


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()[:MAX_ERRORS])


def _clean(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's titles (prompt tokens that tell the model nothing)."""
    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def _check_schema(schema: Any) -> None:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema, dict):
        raise ConfigError(f"an output schema must be a JSON Schema object, got {type(schema).__name__}")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ConfigError(f"the output schema is not a valid JSON Schema: {exc.message}") from None

