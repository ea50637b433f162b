"""What the server's one run driver (`runs.Runner`) holds of a run while it runs, shared with the graph
side (`graph_runs`) without an import circle."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ActiveRun", "Published"]


@dataclass(slots=True, frozen=True)
class Published:
    """An event on its way to the streams; `data` is its JSON payload, serialised once. `id` is its id in
    the conversation's event log (0 for a run with no conversation, whose events are not logged)."""

    id: int
    type: str
    run_id: str | None
    data: str
    nested: bool = False
    """A sub-agent's event, forwarded into its parent's stream."""


@dataclass(eq=False)
class ActiveRun:
    """A run this process drives. Every kind goes through the same driver: a conversation's message, a
    trigger's or schedule's fire, a resumed pause, a graph run, and a `/v1` request with or without a
    conversation; they differ only in the stream they are started with and whether they have a
    conversation."""

    run_id: str
    conversation_id: str | None
    """None for a run with no conversation (`/v1` without one): its record is stored, its transcript and
    events are not; its events go to `listener` only."""
    agent: str
    stream: Any = None
    """The run's AgentStream (a graph run's: its GraphStream)."""
    pump: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: Any = None
    """The run's result once it has ended (a RunResult, or a graph run's GraphResult)."""
    published: list[Published] = field(default_factory=list)
    """The run's events so far, as published: a stream joining the run reads its backlog from here."""
    listener: asyncio.Queue[Published | None] | None = None
    """A run with no conversation: its events, then None once it has ended."""
    cancel_requested: bool = False
    resumed: bool = False
    """Resumed after a pause: its earlier events are in the store, not in `published`."""
    applied: tuple[str, ...] = ()
    """Tool-call ids whose approvals this resumption applied."""
