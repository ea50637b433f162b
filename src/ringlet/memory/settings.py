"""Memory settings (`memory-and-context.md` §7): the `memory:` section of an agent's config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TOOL_NAMES = ("store", "recall", "discover", "link", "task", "tasks", "remember")


class GraphConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    max_entities: int = Field(default=5, ge=0, le=50)
    max_edges: int = Field(default=20, ge=0, le=200)


class MemoryConfig(BaseModel):
    """The `memory:` section of an agent's config (`memory-and-context.md` §7)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    tools: Literal["all", "none"] | list[Literal["store", "recall", "discover", "link", "task", "tasks",
                                                 "remember"]] = "all"
    recall_top_k: int = Field(default=5, ge=0, le=50)
    recall_min_similarity: float = Field(default=0.3, ge=0, le=1)
    max_note_tokens: int = Field(default=1000, ge=50)
    implicit_capture: bool = True
    embeddings: str | dict[str, Any] | None = None
    """An embedding provider: `local`, `openai:<model>`, or `{provider, model, base_url, api_key_env}`."""
    graph: GraphConfig = Field(default_factory=GraphConfig)
    lookup_timeout_s: float = Field(default=2.0, gt=0)

    @property
    def tool_names(self) -> tuple[str, ...]:
        if self.tools == "all":
            return TOOL_NAMES
        return () if self.tools == "none" else tuple(self.tools)
