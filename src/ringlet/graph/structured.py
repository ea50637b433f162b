"""`output_schema` (`graph-workflows.md` §7, §10.2): the prompt hint, parsing a model's answer, checking it
against the JSON Schema (Draft 2020-12), and the one repair request.
"""

from __future__ import annotations

import json
from typing import Any

from ringlet.output import json_text, schema_errors

__all__ = ["SchemaFailure", "check", "parse", "repair_prompt", "schema_hint"]

MAX_ERRORS = 10


class SchemaFailure(Exception):
    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


def schema_hint(schema: dict[str, Any]) -> str:
    return ("Respond with only a JSON object that matches this JSON Schema, with no other text:\n"
            + json.dumps(schema, ensure_ascii=False, indent=2))


def parse(text: str) -> Any:
    """The JSON value of a response, after `<think>` blocks and code fences are stripped."""
    cleaned = json_text(text)
    try:
        return json.loads(cleaned)
    except json.JSONDecodeError as exc:
        raise SchemaFailure([f"the output is not valid JSON: {exc}"]) from None


def check(value: Any, schema: dict[str, Any]) -> None:
    """Raise SchemaFailure with up to 10 validator errors when `value` does not match `schema`."""
    if errors := schema_errors(value, schema, MAX_ERRORS):
        raise SchemaFailure(errors)


def parse_and_check(text: str, schema: dict[str, Any]) -> Any:
    value = parse(text)
    check(value, schema)
    return value


def repair_prompt(bad_output: str, failure: SchemaFailure, schema: dict[str, Any]) -> str:
    errors = "\n".join(f"- {e}" for e in failure.errors[:MAX_ERRORS])
    return (f"Your previous output does not match the required JSON Schema.\n\nPrevious output:\n{bad_output}\n\n"
            f"Errors:\n{errors}\n\n{schema_hint(schema)}")
