"""A graph run's checkpoints, and forking it from one (`checkpoints.py`, issue 44). As pydantic models, they
validate requests and give `/openapi.json` its schemas."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ringlet.server.http.schemas import INTEGRAL, Body, Conversation, View


class CheckpointSummary(View):
    step: int = Field(description="The super-steps completed when it was saved (0: before the first).")
    status: Literal["working", "input_required", "completed", "failed", "canceled"]
    frontier: list[str] = Field(description="The nodes its next super-step runs: where a fork from it starts. Empty "
                                            "at the run's end, which cannot be forked.")
    saved_at: float = Field(description="When it was saved (epoch seconds).")


class CheckpointList(View):
    run_id: str
    agent: str
    graph_changed: bool = Field(description="graph.yaml changed since these were saved: a fork needs `force`.")
    data: list[CheckpointSummary] = Field(description="One per super-step, oldest first.")


class CheckpointDetail(CheckpointSummary):
    run_id: str
    graph_changed: bool
    state: dict[str, Any] = Field(description="The graph state after `step` super-steps.")
    visit_counts: dict[str, int]
    reducers: dict[str, str] = Field(description="The graph's reducers by state key: what a patched key must hold.")


class ForkRun(Body):
    checkpoint: Annotated[int, Field(ge=0, description="The step of the checkpoint to start from."), INTEGRAL]
    state_patch: dict[str, Any] | None = Field(default=None, description=(
        "Top-level state keys to replace before the fork runs, checked against the graph's state (declared keys, "
        "reducers, output_schema properties): a misfit is a 422 naming the key and the fix."))
    force: bool = Field(False, description="Fork even though graph.yaml changed since the checkpoint.")
    title: str | None = Field(default=None, max_length=200, description="The new conversation's title.")


class ForkOrigin(View):
    run_id: str
    conversation_id: str | None
    step: int


class ForkedRun(View):
    run_id: str
    conversation_id: str = Field(description="The fork's own new conversation: follow its events there.")
    conversation: Conversation
    forked_from: ForkOrigin
    status: Literal["working"]
