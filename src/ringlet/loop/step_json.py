"""What a step records, as JSON: a model response's chunks and a tool call's value (or its coded failure).

The durable engine keeps them as DBOS step outputs (`ringlet.durable`), a replay recording as its tape
(`ringlet.replay`); both give them back to the loop unchanged (`chunk_of`, `value_of`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from ringlet.errors import ToolFailure
from ringlet.models.base import Chunk, Finish, ModelSwitch, Retrying, TextDelta, ToolCallArgsDelta, ToolCallStart
from ringlet.tools.base import Returned, encode_result
from ringlet.tools.builtin.question import Question
from ringlet.usage import RequestUsage

__all__ = ["chunk_json", "chunk_of", "value_json", "value_of"]



def chunk_json(chunk: Chunk) -> list[Any]:
    if isinstance(chunk, TextDelta):
        return ["t", chunk.text]
    if isinstance(chunk, ToolCallArgsDelta):
        return ["a", chunk.index, chunk.delta]
    if isinstance(chunk, ToolCallStart):
        return ["s", chunk.index, chunk.name, chunk.id]
    if isinstance(chunk, Finish):
        return ["f", chunk.finish_reason, None if chunk.usage is None else asdict(chunk.usage)]
    if isinstance(chunk, ModelSwitch):
        return ["m", chunk.model, chunk.reason]
    return ["r", chunk.attempt, chunk.delay_s, chunk.reason]


def chunk_of(data: list[Any]) -> Chunk:
    kind, *rest = data
    if kind == "t":
        return TextDelta(rest[0])
    if kind == "a":
        return ToolCallArgsDelta(rest[0], rest[1])
    if kind == "m":
        return ModelSwitch(rest[0], rest[1])
    if kind == "s":
        return ToolCallStart(rest[0], rest[1], rest[2])
    if kind == "f":
        return Finish(rest[0], None if rest[1] is None else RequestUsage(**rest[1]))
    return Retrying(rest[0], rest[1], rest[2])


def value_json(value: Any) -> dict[str, Any]:
    if isinstance(value, Question):
        return {"question": value.as_dict()}
    if isinstance(value, Returned):
        return {"text": encode_result(value.value), "metadata": json.loads(json.dumps(value.metadata, default=str))}
    return {"text": encode_result(value)}


def value_of(recorded: dict[str, Any]) -> Any:
    if "failure" in recorded:
        code, message, extra = recorded["failure"]
        raise ToolFailure(code, message, **extra)
    if "question" in recorded:
        q = recorded["question"]
        return Question(q["question"], q["input_type"], tuple(q["options"]), q["allow_freeform"])
    if "metadata" in recorded:
        return Returned(recorded["text"], recorded["metadata"])
    return recorded["text"]
