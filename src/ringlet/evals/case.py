"""A case of a dataset (what the agent is asked, and how its run is judged), and the error of a dataset file
that cannot be used. The runner and the report need these, never the file format (`dataset.py`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ringlet._ids import new_id
from ringlet.errors import ConfigError
from ringlet.evals.evaluators import Evaluator
from ringlet.messages import Message

__all__ = ["Case", "DatasetError", "message_of"]


class DatasetError(ConfigError):
    """A dataset file that cannot be used: the message names its file, line and the fix."""


@dataclass(slots=True)
class Case:
    """One scenario: what the agent is asked, and how its run is judged (besides the dataset's evaluators)."""

    name: str
    inputs: Any
    expected_output: Any = None
    metadata: Any = None
    evaluators: list[Evaluator] = field(default_factory=list)
    line: int | None = field(default=None, compare=False)
    """Where the case starts in its file (1-based), for messages."""

    @property
    def prompt(self) -> str:
        if isinstance(self.inputs, str):
            return self.inputs
        if isinstance(self.inputs, Mapping) and "prompt" in self.inputs:
            return str(self.inputs["prompt"])
        return json.dumps(self.inputs, ensure_ascii=False, default=str)

    def option(self, name: str) -> Any:
        """`history`, `deps` or `model` of a mapping input with a `prompt`, else None."""
        if isinstance(self.inputs, Mapping) and "prompt" in self.inputs:
            return self.inputs.get(name)
        return None

    @property
    def history(self) -> list[Message]:
        return [message_of(m) for m in self.option("history") or ()]


def message_of(data: Any) -> Message:
    if isinstance(data, Message):
        return data
    return Message.validate({"id": new_id("m"), **data})
