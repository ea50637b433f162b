"""Merging a super-step's writes into the state (`graph-workflows.md` §4–§5).

Each node's writes are the keys whose value differs from the pre-step state. They are folded in node-id
order; a key with a reducer goes through it on every step, a key without one is simply set, and a key
written by several nodes of one step needs a reducer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ringlet.errors import RunError

__all__ = ["diff", "json_type", "merge_writes", "reduce"]


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of `after` that are new or differ from `before` (an equal value is not a write)."""
    missing = object()
    return {k: v for k, v in after.items() if before.get(k, missing) != v or k not in before}


def _mismatch(reducer: str, key: str, wanted: str, got: Any) -> RunError:
    return RunError("reducer_error", f"reducer '{reducer}' requires {wanted} for key '{key}', got {json_type(got)}")


def _number(reducer: str, key: str, value: Any) -> float | int:
    """A number, or a numeric string (state_updates always write strings)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        for kind in (int, float):
            try:
                number = kind(value.strip())
            except ValueError:
                continue
            if isinstance(number, float) and not math.isfinite(number):
                break
            return number
    raise _mismatch(reducer, key, "a number", value)


def _numeric(name: str, key: str, current: Any, write: Any, present: bool) -> Any:
    """sum, max, min; an integral result is stored as an integer."""
    new = _number(name, key, write)
    if present:
        old = _number(name, key, current)
        new = old + new if name == "sum" else max(old, new) if name == "max" else min(old, new)
    return int(new) if isinstance(new, float) and new.is_integer() else new


def reduce(name: str, key: str, current: Any, write: Any, *, present: bool) -> Any:
    """Fold one write into the current value of `key` (absent when not `present`)."""
    if name == "overwrite":
        return write
    if name == "append":
        if present and not isinstance(current, list):
            raise _mismatch(name, key, "an array (or absent)", current)
        return [*(current if present else []), write]
    if name == "extend":
        if present and not isinstance(current, list):
            raise _mismatch(name, key, "an array (or absent)", current)
        if not isinstance(write, list):
            raise _mismatch(name, key, "an array to extend with", write)
        return [*(current if present else []), *write]
    if name == "concat":
        if not isinstance(write, str) or (present and not isinstance(current, str)):
            raise _mismatch(name, key, "strings", write if not isinstance(write, str) else current)
        return write if not present or current == "" else f"{current}\n{write}"
    if name in ("sum", "max", "min"):
        return _numeric(name, key, current, write, present)
    if name == "merge":
        if not isinstance(write, Mapping) or (present and not isinstance(current, Mapping)):
            raise _mismatch(name, key, "objects", write if not isinstance(write, Mapping) else current)
        return {**(current if present else {}), **write}
    raise RunError("reducer_error", f"unknown reducer '{name}' for key '{key}'")


def merge_writes(state: dict[str, Any], writes: Sequence[tuple[str, Mapping[str, Any]]],
                 reducers: Mapping[str, str]) -> None:
    """Apply the step's writes (node id, keys written) to `state` in node-id order, through the reducers."""
    ordered = sorted(writes, key=lambda w: w[0])
    writers: dict[str, int] = {}
    for _, written in ordered:
        for key in written:
            writers[key] = writers.get(key, 0) + 1
    for key, count in writers.items():
        if count > 1 and key not in reducers:
            raise RunError("reducer_error", f"Key '{key}' was written by {count} parallel branches but has no "
                                            "reducer declared")
    for _, written in ordered:
        for key, value in written.items():
            reducer = reducers.get(key)
            if reducer is None:
                state[key] = value
            else:
                state[key] = reduce(reducer, key, state.get(key), value, present=key in state)
