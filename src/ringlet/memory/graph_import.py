"""`ringlet graph import FILE --realm R`: bulk-load graph entities and edges into one realm (§2).

One JSON object per line: a node `{"id", "name", "type" | "labels", "aliases", "title", "content",
"properties", "tags"}` or an edge `{"from", "to", "relation", "strength", "metadata"}` (a line with `from`
is an edge). Nodes and edges are upserted by id, in one transaction: a bad line imports nothing and its
error names the line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ringlet.errors import ConfigError
from ringlet.memory.core import Memory
from ringlet.store.memory_records import Scope


class NodeLine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: str | None = Field(default=None, pattern="^node$")
    id: str = Field(min_length=1, max_length=40)
    name: str | None = None
    type: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    labels: list[str] | None = None
    aliases: list[str] = Field(default_factory=list)
    title: str | None = None
    content: str = ""
    properties: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _titled(self) -> NodeLine:
        if not (self.name or self.title or self.content):
            raise ValueError("a node needs a name, a title or content")
        return self

    def as_node(self) -> dict[str, Any]:
        properties = {**self.properties}
        if self.name:
            properties["name"] = self.name
        if self.aliases:
            properties["aliases"] = self.aliases
        return {"id": self.id, "labels": self.labels or [self.type or "Entity"], "title": self.title or self.name
                or self.content[:100], "content": self.content or self.name or "", "properties": properties,
                "tags": self.tags}


class EdgeLine(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    kind: str | None = Field(default=None, pattern="^edge$")
    id: str | None = Field(default=None, max_length=40)
    source: str = Field(alias="from", min_length=1)
    target: str = Field(alias="to", min_length=1)
    relation: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    strength: float = Field(default=1.0, ge=0, le=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    def as_edge(self) -> dict[str, Any]:
        return {"id": self.id, "from": self.source, "to": self.target, "relation": self.relation.upper(),
                "strength": self.strength, "metadata": self.metadata}


def parse(path: Path) -> tuple[list[dict[str, Any]], list[tuple[int, dict[str, Any]]]]:
    """Nodes, and edges with their line numbers; the first bad line is a ConfigError naming it."""
    nodes, edges = [], []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{number}: not JSON: {exc}; write one JSON object per line") from None
        if not isinstance(item, dict):
            raise ConfigError(f"{path}:{number}: a line must be a JSON object (a node or an edge)")
        try:
            if "from" in item or item.get("kind") == "edge":
                edges.append((number, EdgeLine.model_validate(item).as_edge()))
            else:
                nodes.append(NodeLine.model_validate(item).as_node())
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'line'}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"{path}:{number}: {problems}") from None
    return nodes, edges


async def import_file(memory: Memory, path: Path, scope: Scope) -> tuple[int, int]:
    """Validate the whole file, then upsert everything in one transaction; (nodes, edges) imported."""
    nodes, edges = parse(path)
    records = await memory.records()
    known = {n["id"] for n in nodes}
    wanted = {end for _, e in edges for end in (e["from"], e["to"])} - known
    known |= set(await records.get_nodes(scope, wanted))
    for number, e in edges:
        for end in (e["from"], e["to"]):
            if end not in known:
                raise ConfigError(f"{path}:{number}: edge end {end!r} is neither in the file nor in realm "
                                  f"{scope.realm!r}; nothing was imported")
    try:
        return await records.import_items(scope, nodes, [e for _, e in edges])
    except KeyError as exc:
        raise ConfigError(f"{path}: node id {exc.args[0]!r} belongs to another realm; pick another id") from None
