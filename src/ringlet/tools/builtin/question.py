"""`ask_question` (`builtin-tools-and-subagents.md` §3): the model asks a human, and the run pauses.

The tool itself only checks the question and hands it back as a `Question`; the loop parks the call the
way it parks a call waiting for approval (durably, resumable in any process), and the answer, checked by
`check_answer`, becomes the call's result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ringlet.context import RunContext
from ringlet.errors import InvalidAnswer, ToolFailure
from ringlet.tools.base import ArgumentsInvalid, Tool

InputType = Literal["single-select", "multi-select", "text"]
NO_HUMAN = "no one can answer questions in this run"


class Option(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    label: str = Field(min_length=1, max_length=200)
    description: str | None = Field(default=None, max_length=500)


class QuestionArgs(BaseModel):
    """The arguments of `ask_question`."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    question: str = Field(min_length=1, max_length=2000, description="The question, in plain words.")
    input_type: InputType = Field("single-select", description="How the human answers: one option, several "
                                  "options, or free text.")
    options: list[Option] | None = Field(None, description="2-10 options with unique labels; required for the "
                                         "select types, ignored for text.")
    allow_freeform: bool = Field(True, description="Whether the human may answer in their own words instead.")

    @model_validator(mode="after")
    def _options(self) -> QuestionArgs:
        if self.input_type == "text":
            self.options = None
            return self
        labels = [o.label for o in self.options or ()]
        if not 2 <= len(labels) <= 10:
            raise ValueError(f"options: a {self.input_type} question needs 2 to 10 options, got {len(labels)}")
        if len(set(labels)) != len(labels):
            raise ValueError("options: labels must be unique")
        return self


@dataclass(frozen=True, slots=True)
class Question:
    """What `ask_question` returns: the loop parks the call until a human answers it."""

    question: str
    input_type: InputType
    options: tuple[dict[str, Any], ...]
    allow_freeform: bool

    def as_dict(self) -> dict[str, Any]:
        return {"question": self.question, "input_type": self.input_type, "options": list(self.options),
                "allow_freeform": self.allow_freeform}


def check_answer(question: dict[str, Any], answer: Any) -> tuple[str | list[str], bool]:
    """The answer as stored (a label, labels, or text) and whether it is free-form; InvalidAnswer (a
    ValueError, saying what would be accepted) when it does not answer the question."""
    kind, free = question["input_type"], bool(question.get("allow_freeform"))
    labels = [o["label"] for o in question.get("options") or ()]
    if kind == "text":
        if not isinstance(answer, str) or not answer.strip():
            raise InvalidAnswer("answer: a text question needs a non-empty string")
        return _conforming(question, answer), False
    if isinstance(answer, str) and answer in labels:
        return (answer, False) if kind == "single-select" else ([answer], False)
    if kind == "multi-select" and isinstance(answer, list) and answer and all(a in labels for a in answer):
        if len(set(answer)) != len(answer):
            raise InvalidAnswer("answer: the labels must be distinct")
        return list(answer), False
    if free and isinstance(answer, str) and answer.strip():
        return _conforming(question, answer), True
    wanted = "one option label" if kind == "single-select" else "a list of one or more option labels"
    extra = " or free text" if free else ""
    raise InvalidAnswer(f"answer: expected {wanted}{extra}; options: {', '.join(labels)}")


def answer_value(schema: dict[str, Any], text: str) -> Any:
    """A written answer as the value `schema` describes: the text itself for a string, else its JSON."""
    if schema.get("type") == "string":
        return text
    try:
        return json.loads(text)
    except ValueError:
        raise InvalidAnswer(f"answer: expected JSON ({schema.get('type', 'a value')}), got {text[:80]!r}") from None


def _conforming(question: dict[str, Any], text: str) -> str:
    """A written answer, checked against the question's `answer_schema` when it has one (an MCP server's
    elicitation: `ringlet.mcp.elicit`); InvalidAnswer names what does not fit."""
    schema = question.get("answer_schema")
    if schema is None:
        return text
    from jsonschema import Draft202012Validator

    checker = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = sorted(checker.iter_errors(answer_value(schema, text)), key=lambda e: list(e.path))
    if errors:
        raise InvalidAnswer("answer: " + "; ".join(f"{'.'.join(map(str, e.path)) or 'value'}: {e.message}"
                                                   for e in errors[:5]))
    return text


def _validate(args: dict[str, Any]) -> dict[str, Any]:
    try:
        QuestionArgs.model_validate(args)
    except ValidationError as exc:
        raise ArgumentsInvalid([f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
                                for e in exc.errors()]) from None
    return args


_OPTION = {"type": "object", "properties": {"label": {"type": "string"}, "description": {"type": "string"}},
           "required": ["label"]}
PARAMETERS = {"type": "object", "properties": {
    "question": {"type": "string", "maxLength": 2000, "description": "The question, in plain words."},
    "input_type": {"type": "string", "enum": ["single-select", "multi-select", "text"],
                   "default": "single-select",
                   "description": "One option, several options, or free text."},
    "options": {"type": "array", "items": _OPTION, "minItems": 2, "maxItems": 10,
                "description": "2-10 options with unique labels; required for the select types."},
    "allow_freeform": {"type": "boolean", "default": True,
                       "description": "Whether the user may answer in their own words instead."}},
    "required": ["question"]}


def ask_question_tool() -> Tool:
    """The `ask_question` tool (read, no timeout of its own: the wait for a human is a pause)."""

    async def run(args: dict[str, Any], ctx: RunContext) -> Question:
        if not ctx.humans:
            raise ToolFailure("no_human_available", NO_HUMAN)
        q = QuestionArgs.model_validate(args)
        options = tuple(o.model_dump(exclude_none=True) for o in q.options or ())
        return Question(q.question, q.input_type, options, q.allow_freeform)

    return Tool("ask_question", "Ask the user a question and wait for the answer: one choice among options, "
                "several choices, or free text. Use it when you cannot go on without the user's decision.",
                PARAMETERS, run, validate=_validate, effect="read", timeout_s=0, approval="auto")
