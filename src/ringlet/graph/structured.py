"""`output_schema` (`graph-workflows.md` §7, §10.2): the prompt hint, parsing a model's answer, checking it
against the JSON Schema (Draft 2020-12), and the one repair request.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jsonschema import Draft202012Validator

__all__ = ["SchemaFailure", "check", "parse", "repair_prompt", "schema_hint"]

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```$", re.DOTALL)
MAX_ERRORS = 10


class SchemaFailure(Exception):
    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


def schema_hint(schema: dict[str, Any]) -> str:
    return ("Respond with only a JSON object that matches this JSON Schema, with no other text:\n"
            + json.dumps(schema, ensure_ascii=False, indent=2))


def _clean(text: str) -> str:
    text = _THINK.sub("", text).strip()
    fenced = _FENCE.match(text)
    if fenced:
        return fenced.group(1).strip()
    inner = re.search(r"```[A-Za-z0-9_-]*\s*\n(.*?)\n```", text, re.DOTALL)  # a fence inside prose
    return inner.group(1).strip() if inner else text


def parse(text: str) -> Any:
    """The JSON value of a response, after `<think>` blocks and code fences are stripped."""
    cleaned = _clean(text)
    try:
        return json.loads(cleaned)
    except json.JSONDecodeError as exc:
        raise SchemaFailure([f"the output is not valid JSON: {exc}"]) from None


def check(value: Any, schema: dict[str, Any]) -> None:
    """Raise SchemaFailure with up to 10 validator errors when `value` does not match `schema`."""
    errors = sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        raise SchemaFailure([f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                             for e in errors[:MAX_ERRORS]])


def parse_and_check(text: str, schema: dict[str, Any]) -> Any:
    value = parse(text)
    check(value, schema)
    return value


def repair_prompt(bad_output: str, failure: SchemaFailure, schema: dict[str, Any]) -> str:
    errors = "\n".join(f"- {e}" for e in failure.errors[:MAX_ERRORS])
    return (f"Your previous output does not match the required JSON Schema.\n\nPrevious output:\n{bad_output}\n\n"
            f"Errors:\n{errors}\n\n{schema_hint(schema)}")
