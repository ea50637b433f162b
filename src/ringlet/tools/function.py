"""`@tool`: a Python function becomes a Tool whose JSON Schema comes from its type hints and docstring."""

from __future__ import annotations

import asyncio
import functools
import inspect
import types
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.errors import PydanticSchemaGenerationError, PydanticUserError

from ringlet.context import RunContext
from ringlet.errors import ToolDefinitionError
from ringlet.messages import Effect
from ringlet.tools.base import DEFAULT_TIMEOUT_S, MAX_ERRORS, ArgumentsInvalid, Tool, Validator


def format_validation_error(error: ValidationError) -> list[str]:
    """Pydantic errors as `<path>: <message>` lines, at most five."""
    out = []
    for e in error.errors()[:MAX_ERRORS]:
        path = ".".join(str(p) for p in e["loc"]) or "(root)"
        out.append(f"{path}: {e['msg']}")
    return out


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's generated titles: they cost prompt tokens and tell the model nothing."""
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    for sub in schema.get("$defs", {}).values():
        _clean_schema(sub)
    return schema


@dataclass(frozen=True, slots=True)
class _Spec:
    """What a function's tools share, built once: the schema, the validator, the context parameter, the
    docstring's description and whether it is async. It holds nothing of the function itself, so the cache
    keyed by the function lets the function go."""

    parameters: dict[str, Any]
    validate: Validator
    ctx_param: str | None
    description: str
    is_async: bool


_SPECS: weakref.WeakKeyDictionary[Any, dict[tuple[str, bool], _Spec | str]] = weakref.WeakKeyDictionary()
"""function -> (tool name, bound method?) -> its spec, or the message of the ToolDefinitionError it raised
(the message only: the exception's traceback would hold the function). The name is part of the key because
it is in the messages; a bound method is keyed by its function (a new method object is made at every
attribute access), which gives the same spec whatever it is bound to."""


def _spec(fn: Callable[..., Any], name: str) -> _Spec:
    """`fn`'s spec, built at the first tool made of it and then taken from the cache (a failure too)."""
    key, sub = (fn.__func__, (name, True)) if isinstance(fn, types.MethodType) else (fn, (name, False))
    try:
        specs = _SPECS.get(key)
    except TypeError:  # not weakly referenceable or not hashable: built every time
        return _build_spec(fn, name)
    found = specs.get(sub) if specs is not None else None
    if found is None:
        try:
            found = _SPECS.setdefault(key, {})[sub] = _build_spec(fn, name)
        except ToolDefinitionError as exc:
            _SPECS.setdefault(key, {})[sub] = str(exc)
            raise
    if isinstance(found, str):
        raise ToolDefinitionError(found)
    return found


def _build_spec(fn: Callable[..., Any], name: str) -> _Spec:
    """Read `fn`'s signature, type hints and docstring; build the argument model and its JSON Schema."""
    try:  # parameters only: the return annotation never reaches the schema
        probe = types.FunctionType((lambda: None).__code__, getattr(fn, "__globals__", {}))
        probe.__annotations__ = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != "return"}
        hints = get_type_hints(probe, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(f"tool {name!r}: cannot resolve its type hints: {exc}") from exc
    import docstring_parser

    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    param_docs = {p.arg_name: p.description for p in doc.params}
    fields: dict[str, Any] = {}
    ctx_param = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"tool {name!r}: parameter {param.name!r} is *args/**kwargs, which has no JSON Schema; "
                "list the parameters explicitly")
        annotation = hints.get(param.name, inspect.Parameter.empty)
        if annotation is RunContext:
            ctx_param = param.name
            continue
        if annotation is inspect.Parameter.empty:
            raise ToolDefinitionError(
                f"tool {name!r}: parameter {param.name!r} has no type annotation; annotate it, "
                f"e.g. `{param.name}: str`")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, Field(default, description=param_docs.get(param.name)))
    description = "\n\n".join(d for d in (doc.short_description, doc.long_description) if d)
    try:
        model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        schema = _clean_schema(model.model_json_schema())
    except (PydanticSchemaGenerationError, PydanticUserError, TypeError) as exc:
        culprit = _failing_parameter(fields) or "?"
        raise ToolDefinitionError(
            f"tool {name!r}: parameter {culprit!r} cannot become a JSON Schema "
            f"({type(exc).__name__}: {str(exc).splitlines()[0]}); use JSON-compatible types "
            "(str, int, float, bool, list, dict, Literal, pydantic models)") from exc
    return _Spec(schema, _validator(model), ctx_param, description, inspect.iscoroutinefunction(fn))


def _validator(model: type[BaseModel]) -> Validator:
    validator = model.__pydantic_validator__

    def validate(args: dict[str, Any]) -> dict[str, Any]:
        try:
            return validator.validate_python(args).__dict__
        except ValidationError as exc:
            raise ArgumentsInvalid(format_validation_error(exc)) from None

    return validate


def _failing_parameter(fields: dict[str, Any]) -> str | None:
    for pname, spec in fields.items():
        try:
            create_model("probe", **{pname: spec}).model_json_schema()
        except Exception:
            return pname
    return None


def function_tool(fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                  timeout_s: float = DEFAULT_TIMEOUT_S, sequential: bool = False, effect: Effect = "write",
                  max_chars: int | None = None, idempotent: bool = False, durable: bool = False) -> Tool:
    """Build a Tool from `fn` (sync or async). Sync functions run in a worker thread.

    The schema and validator are built once per function (and tool name) and shared by every tool made
    of it, as are the errors of a signature that cannot become a tool."""
    tool_name = name or fn.__name__
    spec = _spec(fn, tool_name)
    ctx_param, is_async = spec.ctx_param, spec.is_async

    def run(args: dict[str, Any], ctx: RunContext) -> Awaitable[Any]:
        kwargs = {**args, ctx_param: ctx} if ctx_param else args
        if is_async:
            return fn(**kwargs)
        return asyncio.to_thread(functools.partial(fn, **kwargs))

    return Tool(name=tool_name, description=description or spec.description, parameters=spec.parameters,
                run=run, validate=spec.validate, effect=effect, timeout_s=timeout_s, sequential=sequential,
                max_chars=max_chars, takes_context=ctx_param is not None, idempotent=idempotent, durable=durable)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(*, name: str | None = None, description: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
         sequential: bool = False, effect: Effect = "write", max_chars: int | None = None,
         idempotent: bool = False, durable: bool = False) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None,
         timeout_s: float = DEFAULT_TIMEOUT_S, sequential: bool = False, effect: Effect = "write",
         max_chars: int | None = None, idempotent: bool = False,
         durable: bool = False) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a tool, bare (`@tool`) or with options (`@tool(timeout_s=5, effect="read")`).

    Options: `name`, `description` (default: the docstring), `timeout_s` (30; 0 = none), `sequential`
    (a barrier within a batch), `effect` ("read" | "write" | "destructive"; default "write", the safe
    default of `gates.md` §2: with approvals configured, write and destructive tools ask a human, so mark
    read-only tools `@tool(effect="read")`), `max_chars` (result cap), `idempotent` (an
    approved call interrupted by a restart runs again), `durable` (results kept through compaction and
    captured into memory).
    A parameter annotated `RunContext` receives the run's context and is not part of the schema.
    """
    if fn is not None:
        return function_tool(fn)
    return lambda f: function_tool(f, name=name, description=description, timeout_s=timeout_s,
                                   sequential=sequential, effect=effect, max_chars=max_chars, idempotent=idempotent,
                                   durable=durable)
