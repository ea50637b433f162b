"""The models of `graph.yaml` (schema "1.0"): every top-level field and the eight node types, with the
defaults of `graph-workflows.md` §2–§3.

The models only hold values. Reading the file (line and column of every key, unknown keys, the load
errors) is `ringlet.graph.parse`; the checks across nodes are `ringlet.graph.validate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

__all__ = [
    "NODE_TYPES",
    "REDUCERS",
    "AgentNode",
    "ApprovalNode",
    "EndNode",
    "GraphSettings",
    "GraphSpec",
    "InputNode",
    "LlmNode",
    "MapNode",
    "Node",
    "RagNode",
    "ScriptNode",
    "Source",
    "VariableSpec",
]

SUPPORTED_VERSIONS = ("1.0",)
REDUCERS = ("append", "extend", "concat", "sum", "max", "min", "merge", "overwrite")
RAG_DRIVERS = ("yaml", "duckdb")
Reducer = Literal["append", "extend", "concat", "sum", "max", "min", "merge", "overwrite"]
Next = str | list[str] | None

_FIXED = ConfigDict(extra="forbid", coerce_numbers_to_str=True, populate_by_name=True)


class GraphSettings(BaseModel):
    """`settings:`."""

    model_config = _FIXED
    max_loop_iterations: int = Field(default=100, ge=1)
    log_state_snapshots: bool = True
    validate_before_run: bool = True
    timeout: float | None = Field(default=None, gt=0)
    max_concurrency: int = Field(default=8, ge=0)
    """0 parses, so that the validator reports it with the other errors."""
    max_concurrent_runs: int | None = Field(default=None, ge=1)
    """At most this many runs of the graph execute at once (the server's limit for this agent, like a loop
    agent's `max_concurrent_runs` in config.yaml); None: no limit of its own."""


class VariableSpec(BaseModel):
    """One entry of `variables:`."""

    model_config = _FIXED
    name: str
    description: str = ""
    default: str | None = None


class _NodeBase(BaseModel):
    """Fields every node has. `id` defaults to the node's key."""

    model_config = _FIXED
    id: str = ""
    description: str = ""
    next: Next = None

    @property
    def targets(self) -> list[str]:
        """The declared `next` ids, as a list."""
        if self.next is None:
            return []
        return [self.next] if isinstance(self.next, str) else list(self.next)


class _Skills(BaseModel):
    skills_enabled: bool | None = None
    enabled_skills: list[str] | None = None
    inject_skill_instructions: bool | None = None
    skill_instructions: str | None = None


class LlmNode(_NodeBase, _Skills):
    type: Literal["llm"] = "llm"
    prompt: str
    instructions: str | None = None
    tools: list[str] = Field(default_factory=list)
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    reasoning_effort: str | None = None
    max_attempts: int = Field(default=1, ge=1)
    max_iterations: int = Field(default=10, ge=1)
    timeout: float | None = Field(default=None, gt=0)
    fallback: str | None = None
    state_updates: dict[str, str] = Field(default_factory=dict)
    output_schema: dict[str, Any] | None = None


class AgentNode(_NodeBase):
    type: Literal["agent"] = "agent"
    agent: str
    prompt: str
    timeout: float = Field(default=300, gt=0)
    output_schema: dict[str, Any] | None = None
    state_updates: dict[str, str] = Field(default_factory=dict)


class ScriptNode(_NodeBase):
    type: Literal["script"] = "script"
    script: str
    timeout: float = Field(default=30, gt=0)
    fallback: str | None = None
    state_updates: dict[str, str] = Field(default_factory=dict)


class ApprovalNode(_NodeBase):
    type: Literal["approval"] = "approval"
    question: str
    options: list[str]
    routes: dict[str, str]
    on_other: str
    state_updates: dict[str, str] = Field(default_factory=dict)


class InputNode(_NodeBase):
    type: Literal["input"] = "input"
    question: str
    default: str | None = None
    validation: str | None = None
    state_updates: dict[str, str] = Field(default_factory=dict)


class RagNode(_NodeBase):
    type: Literal["rag"] = "rag"
    documents: list[str]
    query: str = "{{initial_prompt}}"
    top_k: int = Field(default=5, ge=1)
    timeout: float = Field(default=120, gt=0)
    state_updates: dict[str, str] = Field(default_factory=dict)
    embedding_model: str | None = None
    chunk_size: int | None = Field(default=None, ge=1)
    chunk_overlap: int | None = Field(default=None, ge=0)
    reranker_model: str | None = None
    batch_size: int | None = Field(default=None, ge=1)
    extractor_model: str | None = None
    extractor_prompt: str | None = None
    graph_hops: int | None = Field(default=None, ge=0)
    driver: str | None = None

    @property
    def fully_specified(self) -> bool:
        """Whether the node says how to build its knowledge base (no confirmation needed)."""
        return None not in (self.embedding_model, self.chunk_size, self.chunk_overlap)


class MapNode(_NodeBase):
    type: Literal["map"] = "map"
    over: str
    as_: str = Field(alias="as")
    branch: str
    collect_into: str
    output_key: str = "output"
    max_concurrency: int | None = Field(default=None, ge=0)


class EndNode(_NodeBase):
    type: Literal["end"] = "end"
    output: str | None = None
    state_updates: dict[str, str] = Field(default_factory=dict)


Node = Annotated[LlmNode | AgentNode | ScriptNode | ApprovalNode | InputNode | RagNode | MapNode | EndNode,
                 Field(discriminator="type")]
NODE_MODELS: dict[str, type[BaseModel]] = {
    "llm": LlmNode, "agent": AgentNode, "script": ScriptNode, "approval": ApprovalNode, "input": InputNode,
    "rag": RagNode, "map": MapNode, "end": EndNode,
}
NODE_TYPES = tuple(NODE_MODELS)
COMMON_FIELDS = ("id", "type", "description", "next")


def node_fields(node_type: str) -> list[str]:
    """The keys a node of this type may have, as written in YAML (`as`, not `as_`)."""
    model = NODE_MODELS[node_type]
    return [f.alias or name for name, f in model.model_fields.items()]


def required_fields(node_type: str) -> list[str]:
    """The keys a node of this type must have, `type` first."""
    model = NODE_MODELS[node_type]
    return ["type", *(f.alias or name for name, f in model.model_fields.items() if f.is_required())]


@dataclass(frozen=True, slots=True)
class Source:
    """Where a graph came from, and where each of its YAML keys and values sits (1-based line, column)."""

    path: Path
    positions: dict[tuple[str | int, ...], tuple[int, int]] = field(default_factory=dict)
    text: str = ""

    def at(self, *loc: str | int) -> str:
        """`path:line:column` of the deepest known part of `loc` (the file itself when none is known)."""
        for end in range(len(loc), -1, -1):
            position = self.positions.get(tuple(loc[:end]))
            if position is not None:
                return f"{self.path}:{position[0]}:{position[1]}"
        return f"{self.path}:1:1"


class GraphSpec(BaseModel):
    """A parsed `graph.yaml`. `nodes` keeps the file's order."""

    model_config = _FIXED
    name: str
    description: str = ""
    version: str = "1.0"
    model: str | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    reasoning_effort: str | None = None
    global_tools: list[str] = Field(default_factory=list)
    mcp_servers: list[str] = Field(default_factory=list)
    skills_enabled: bool | None = None
    enabled_skills: list[str] | None = None
    inject_skill_instructions: bool = True
    skill_instructions: str | None = None
    conversation_starters: list[str] = Field(default_factory=list)
    variables: list[VariableSpec] = Field(default_factory=list)
    settings: GraphSettings = Field(default_factory=GraphSettings)
    initial_state: dict[str, Any] = Field(default_factory=dict)
    reducers: dict[str, Reducer] = Field(default_factory=dict)
    start: str
    nodes: dict[str, Node]
    _source: Source = PrivateAttr(default_factory=lambda: Source(Path("graph.yaml")))

    @property
    def source(self) -> Source:
        return self._source

    @property
    def directory(self) -> Path:
        return self._source.path.parent

    @property
    def tool_names(self) -> list[str]:
        """`global_tools` with a `.sh`, `.py` or `.ts` suffix stripped."""
        return [strip_suffix(t) for t in self.global_tools]


def strip_suffix(name: str) -> str:
    for suffix in (".sh", ".py", ".ts"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
