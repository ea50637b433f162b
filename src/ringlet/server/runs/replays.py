"""Replaying a stored run (`ringlet replay RUN_ID`, `POST /api/v1/runs/{id}/replay`): its tapes (`run_tapes`),
the transcript it started from and its stored events, run through `ringlet.replay` on the agent as it is
configured now (its stored `steer_queued` events are the server's, not the run's: they are not compared; the
steers it took are on its tape). Nothing is written: no model is called, no tool runs, no decision is audited."""

from __future__ import annotations

import json
from typing import Any, Protocol, cast

from ringlet.agent.settings import overrides_of, run_options
from ringlet.errors import ConfigError
from ringlet.messages import dump_messages
from ringlet.replay import Recording, ReplayReport, detached, replay
from ringlet.store.conversation_records import Conversations
from ringlet.store.event_records import EventLog
from ringlet.store.run_records import Runs
from ringlet.store.tape_records import Tapes

__all__ = ["NotReplayable", "replay_run", "replay_stored"]


class Stored(Protocol):
    """The records a replay reads (a `Store`, or the runs service's `Records`)."""

    @property
    def runs(self) -> Runs: ...

    @property
    def tapes(self) -> Tapes: ...

    @property
    def conversations(self) -> Conversations: ...

    @property
    def events(self) -> EventLog: ...


class NotReplayable(ConfigError):
    """The run cannot be replayed (unknown, still running, a graph run, or recorded before replays were)."""

    def __init__(self, message: str, *, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


async def replay_stored(store: Stored, catalog: Any, run_id: str) -> ReplayReport:
    """Replay run `run_id` on its agent in `catalog`, a server's (`Catalog.serve_on`): the one replay of
    `POST /api/v1/runs/{id}/replay` and `ringlet replay`. An agent no longer hosted: `ApiError` 404."""
    record = await store.runs.get(run_id)
    if record is None:
        raise NotReplayable(f"no run {run_id!r}", status=404)
    return await replay_run(store, catalog.get(record.agent).agent(), run_id)


async def replay_run(store: Stored, agent: Any, run_id: str) -> ReplayReport:
    """Replay run `run_id` of `agent` (built as the server builds it) against its stored events."""
    record = await store.runs.get(run_id)
    if record is None:
        raise NotReplayable(f"no run {run_id!r}", status=404)
    if record.kind == "graph":
        raise NotReplayable(f"run {run_id} is a graph run: graph runs are not replayed; fork it from one of its "
                            f"checkpoints instead (GET /api/v1/runs/{run_id}/checkpoints)")
    if record.status == "working":
        raise NotReplayable(f"run {run_id} is still running; replay it once it has ended or paused")
    tapes = await store.tapes.of(run_id)
    if not tapes:
        raise NotReplayable(f"run {run_id} has no recording (it ran before this ringlet recorded runs, or had "
                            "no conversation)")
    cid = record.conversation_id
    head = dict(tapes[0])
    given: Any = head.get("history") or {}
    if isinstance(given, dict):  # the server keeps the transcript once: read back what the run started from
        stored = cast(dict[str, Any], given)
        history = [] if cid is None else await store.conversations.load_messages(cid, before=stored.get("before")) \
            if stored.get("before") else (await store.conversations.load_messages(cid))[:stored.get("messages", 0)]
        head["history"] = json.loads(dump_messages(history))
    events: list[dict[str, Any]] = []
    if cid is not None:
        after = 0
        while rows := await store.events.after(cid, after, limit=1000, run_id=run_id):
            events += [payload for _, kind, payload in rows if kind != "steer_queued"]
            after = rows[-1][0]
    options = run_options(agent, overrides_of(head.get("overrides")))
    return await replay(detached(agent), Recording(segments=[head, *tapes[1:]]), events=events, **options)
