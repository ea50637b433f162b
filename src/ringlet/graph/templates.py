"""`{{path}}` templates (`graph-workflows.md` §5): dotted keys and `[i]` indexes into the state, nothing else.

    render("Hi {{user.name}}", state)            # strict: a missing key fails the node
    render("{{a}} {{b}}", state, strict=False)     # lenient: a missing key becomes ""

Strings are inserted raw, numbers and booleans as JSON text, null as "null", arrays and objects as compact
JSON. `{{ x }}` (with spaces) is not a template and stays as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ringlet.errors import RunError

__all__ = ["TemplateError", "reads", "render", "resolve", "to_text"]

TEMPLATE = re.compile(r"\{\{([A-Za-z0-9_.\[\]]+)\}\}")
_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_MISSING = object()


class TemplateError(RunError):
    """A strict template named keys the state does not have."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        names = ", ".join(f"'{m}'" for m in missing)
        super().__init__("template_error", f"Template interpolation failed: {names} not found in state")


def _segments(path: str) -> list[str | int] | None:
    """`a.list[2].x` → ["a", "list", 2, "x"]; None for a malformed path."""
    out: list[str | int] = []
    pos = 0
    for match in _SEGMENT.finditer(path):
        gap = path[pos:match.start()]
        if gap not in ("", ".") or (gap == "." and not out):
            return None
        out.append(match.group(1) if match.group(1) is not None else int(match.group(2)))
        pos = match.end()
    return out if out and pos == len(path) and isinstance(out[0], str) else None


def resolve(path: str, state: Mapping[str, Any]) -> Any:
    """The value at `path`, or raise KeyError(path)."""
    segments = _segments(path)
    if segments is None:
        raise KeyError(path)
    value: Any = state
    for seg in segments:
        if isinstance(seg, int):
            if not isinstance(value, list) or not -1 < seg < len(value):
                raise KeyError(path)
            value = value[seg]
        elif isinstance(value, Mapping) and seg in value:
            value = value[seg]
        else:
            raise KeyError(path)
    return value


def to_text(value: Any) -> str:
    """A state value as template text."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def render(template: str, state: Mapping[str, Any], *, strict: bool = True) -> str:
    """Fill every `{{path}}`. Strict: raise TemplateError naming all missing paths. Lenient: they become ""."""
    if "{{" not in template:
        return template
    missing: list[str] = []

    def fill(match: re.Match[str]) -> str:
        try:
            return to_text(resolve(match.group(1), state))
        except KeyError:
            if match.group(1) not in missing:
                missing.append(match.group(1))
            return ""

    out = TEMPLATE.sub(fill, template)
    if missing and strict:
        raise TemplateError(missing)
    return out


def reads(template: str | None) -> set[str]:
    """The top-level state keys a template reads."""
    if not template:
        return set()
    out = set()
    for match in TEMPLATE.finditer(template):
        segments = _segments(match.group(1))
        if segments:
            out.add(str(segments[0]))
    return out
