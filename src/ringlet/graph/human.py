"""Questions for humans: `approval` (pick an option, or free text) and `input` (free text) nodes.

In the library a run asks its `approver`: a callable `question -> answer` (sync or async), or an object
with an `answer(question)` method. Without one the run pauses (`input_required`, the question kept in the
checkpoint) until it is resumed with the answer, or fails when told to (`on_question="fail"`).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ringlet.errors import RunError
from ringlet.graph.validate import VALIDATION

__all__ = ["Answerer", "NeedsAnswer", "Question", "answerer_of", "check_input", "question_id"]

_OPS: dict[str, Callable[[int, int], bool]] = {
    ">": int.__gt__, ">=": int.__ge__, "<": int.__lt__, "<=": int.__le__, "==": int.__eq__}


@dataclass(frozen=True, slots=True)
class Question:
    """A question a node asks. `validation` (input nodes) is checked on the answer, never sent to clients."""

    question_id: str
    node_id: str
    question: str
    input_type: Literal["single-select", "text"]
    options: tuple[str, ...] = ()
    allow_freeform: bool = False
    default: str | None = None
    validation: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Question:
        return cls(**{**data, "options": tuple(data.get("options", ()))})


Answerer = Callable[[Question], "str | Awaitable[str]"]


class NeedsAnswer(Exception):
    """No one to ask now: the run pauses with this question."""

    def __init__(self, question: Question) -> None:
        super().__init__(question.question)
        self.question = question


def question_id(run_id: str, step: int, node_id: str, item: int | None = None) -> str:
    """The same id each time the step runs again (a replay after a resume asks the same question)."""
    digest = hashlib.sha256(f"{run_id}|{step}|{node_id}|{item}".encode()).hexdigest()[:24]
    return f"q_{digest}"


def answerer_of(approver: Any) -> Callable[[Question], Awaitable[str]] | None:
    """The question-answering side of an approver: its `answer` method, or the approver itself when it is a
    plain callable (an approver with only `wait` answers tool approvals, not questions)."""
    fn = getattr(approver, "answer", None)
    if fn is None and callable(approver) and not hasattr(approver, "wait"):
        fn = approver
    if fn is None:
        return None

    async def ask(question: Question) -> str:
        answer = fn(question)
        if inspect.isawaitable(answer):
            answer = await answer
        return str(answer)

    return ask


def check_input(validation: str | None, answer: str) -> str | None:
    """None when `answer` passes `len(input) OP N` (UTF-8 bytes), else the run's error message."""
    if validation is None:
        return None
    match = VALIDATION.match(validation)
    if match is None:
        return f"Invalid validation expression '{validation}'"
    size = len(answer.encode("utf-8"))
    if _OPS[match.group(1)](size, int(match.group(2))):
        return None
    return f"Input failed validation '{validation}' (got {size} chars)"


def input_error(validation: str | None, answer: str) -> None:
    message = check_input(validation, answer)
    if message is not None:
        raise RunError("input_invalid", message)
