"""Which state keys a graph's templates read, and which keys it can have (`graph-workflows.md` §5), for the
validator's check of `{{name}}` against what is there to read.

A key is there when the graph says so: `initial_prompt`, `initial_state`, every node's `state_updates` keys,
the top-level `properties` of an `output_schema` (merged into state), a map's `collect_into` and its `as`
item, and, while a node's own `state_updates` render, its scoped variable (`output`, `choice`, `input`).
Loki's special variables (`{{__os__}}`, …) are there in an llm node's `prompt` and `instructions`.

What a script writes is its stdout, known only when it runs; `mentioned` says which names a graph's script
files contain, as a script's keys are (almost always) written in its source.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringlet.graph.spec import (
    AgentNode,
    ApprovalNode,
    EndNode,
    GraphSpec,
    InputNode,
    LlmNode,
    MapNode,
    RagNode,
    ScriptNode,
)
from ringlet.graph.templates import TEMPLATE, reads

__all__ = ["SPECIAL", "Read", "declared_keys", "mentioned", "template_reads"]

SPECIAL = frozenset({"__os__", "__os_family__", "__arch__", "__os_distro__", "__shell__", "__locale__", "__now__",
                     "__cwd__", "__tools__"})
"""Loki's special variables (`ringlet.agent.loki.special_variables`), filled in llm prompts and instructions."""

_SCOPED = {LlmNode: "output", AgentNode: "output", RagNode: "output", ApprovalNode: "choice", InputNode: "input"}


@dataclass(frozen=True, slots=True)
class Read:
    """One `{{path}}` of a node's field: the key it reads, the template text, where, and how it renders."""

    node: str
    loc: tuple[str | int, ...]
    key: str
    template: str
    strict: bool
    """A strict field fails its node on a missing key; a lenient one renders it as ""."""
    specials: bool = False
    """Loki's special variables are filled here (an llm node's prompt and instructions)."""
    scoped: str | None = None
    """The node's scoped variable, bound while its `state_updates` render."""


def declared_keys(spec: GraphSpec) -> set[str]:
    """Every key the graph itself says the state can hold (not what scripts print)."""
    keys = {"initial_prompt", *spec.initial_state}
    for node in spec.nodes.values():
        keys.update(getattr(node, "state_updates", {}) or {})
        schema = getattr(node, "output_schema", None)
        if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
            keys.update(schema["properties"])
        if isinstance(node, MapNode):
            keys.update((node.collect_into, node.as_))
    return keys


def template_reads(spec: GraphSpec) -> Iterator[Read]:
    """Each key each template of each node reads, in file order."""
    for node_id, node in spec.nodes.items():
        for name, text, strict in _fields(node):
            for key, template in _each(text):
                yield Read(node_id, (name,), key, template, strict, specials=isinstance(node, LlmNode))
        scoped = next((v for t, v in _SCOPED.items() if isinstance(node, t)), None)
        for key_name, text in (getattr(node, "state_updates", {}) or {}).items():
            for key, template in _each(text):
                yield Read(node_id, ("state_updates", key_name), key, template, False, scoped=scoped)


_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {
    LlmNode: (("prompt", True), ("instructions", True)), AgentNode: (("prompt", True),),
    InputNode: (("question", True), ("default", False)), ApprovalNode: (("question", True),),
    RagNode: (("query", True),), MapNode: (("over", True),), EndNode: (("output", False),)}
"""A node type's templated fields but `state_updates`: (field, strict)."""


def _fields(node: Any) -> list[tuple[str, str | None, bool]]:
    return [(name, getattr(node, name), strict) for name, strict in _FIELDS.get(type(node), ())]


def _each(text: str | None) -> Iterator[tuple[str, str]]:
    for match in TEMPLATE.finditer(text or ""):
        for key in reads(match.group(0)):
            yield key, match.group(0)


def mentioned(spec: GraphSpec, names: set[str]) -> set[str]:
    """The `names` that appear as words in the graph's script files (unreadable files mention nothing)."""
    found: set[str] = set()
    for node in spec.nodes.values():
        if not isinstance(node, ScriptNode):
            continue
        try:
            text = (spec.directory / Path(node.script)).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        found |= {n for n in names - found if re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", text)}
    return found
