"""A stored conversation as a case: its last user turn is the prompt, the turns before it the history, and
each tool call of that turn a `ToolCalled` evaluator (name and arguments) to edit; the answer it gave is kept
in `metadata.captured_output` (a case that should give the same answer gets `EqualsExpected` by hand)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ringlet.evals.dataset import Case, Dataset, DatasetError
from ringlet.evals.evaluators import NoError, ToolCalled
from ringlet.messages import Message

__all__ = ["add_case", "case_from_messages"]


def case_from_messages(messages: Sequence[Message], *, name: str, conversation_id: str | None = None,
                       agent: str | None = None) -> Case:
    """The case of a conversation's last user turn (a ValueError when it has no user message)."""
    users = [i for i, m in enumerate(messages) if m.role == "user" and m.text.strip()]
    if not users:
        raise ValueError("the conversation has no user message to make a case of")
    last = users[-1]
    history = [{"role": m.role, "content": m.text} for m in messages[:last]
               if m.role in ("user", "assistant") and m.text.strip()]
    turn = messages[last + 1:]
    calls = [c for m in turn if m.role == "assistant" for c in m.tool_calls]
    answer = next((m.text for m in reversed(turn) if m.role == "assistant" and m.text.strip()), None)
    inputs: Any = {"prompt": messages[last].text, "history": history} if history else messages[last].text
    metadata: dict[str, Any] = {"captured_output": answer}
    if conversation_id is not None:
        metadata["conversation_id"] = conversation_id
    if agent is not None:
        metadata["agent"] = agent
    return Case(name=name, inputs=inputs, metadata=metadata,
                evaluators=[NoError(), *(ToolCalled(name=c.name, args=dict(c.arguments) or None) for c in calls)])


def add_case(path: str | Path, case: Case) -> Dataset:
    """Add `case` to the dataset file at `path` (made when missing; a name already there gets a suffix)."""
    path = Path(path)
    dataset = Dataset.from_file(path) if path.exists() else Dataset(cases=[], name=path.stem)
    names = {c.name for c in dataset.cases}
    base, n = case.name, 1
    while case.name in names:
        n += 1
        case.name = f"{base}-{n}"
    dataset.cases.append(case)
    if path.suffix not in (".yaml", ".yml", ".json"):
        raise DatasetError(f"{path}: a dataset file ends in .yaml, .yml or .json")
    dataset.to_file(path)
    return dataset
