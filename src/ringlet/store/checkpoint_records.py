"""Graph runs' checkpoints in the store (`graph-workflows.md` §10.4), on SQLite and PostgreSQL.

`Checkpoints` is a `ringlet.graph.CheckpointStore`: `save` replaces the run's checkpoint in one upsert, `load`
reads it back, `prune` forgets those of runs that ended more than the retention ago (72 h). In the same
transaction `save` keeps every super-step's checkpoint (`graph_checkpoint_steps`), what a fork starts from
(`history`, `load_step`; `ringlet.graph.fork`): one row per step, replaced when the step is saved again (a
pause, a resumed run), except that a run's end never replaces a step saved with work left (a failed run's
last step keeps the frontier it failed on, so it can be forked with its state fixed).

The store sits below the graph package, so it keeps a checkpoint as the JSON its `to_json()` gives and hands
back `decode(text)`; `decoding(Checkpoint.from_json)` is the view a graph agent uses.

    checkpoints = store.checkpoints.decoding(Checkpoint.from_json)
    agent = load_agent(directory, checkpoints=checkpoints)   # ringlet.graph.load_agent

`reopen_run` is the store's side of resuming a graph run that was closed as interrupted; `record_fork_origin`
notes where a forked run's new conversation comes from.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ringlet._ids import now
from ringlet.errors import ConversationBusy
from ringlet.store.engine import Db
from ringlet.store.records import RunRecord
from ringlet.store.schema import conversations, graph_checkpoint_steps, graph_checkpoints, messages, runs

__all__ = ["RETENTION_S", "Checkpoints"]

RETENTION_S = 72 * 3600
"""How long a finished run's checkpoint is kept (the same 72 h as `ringlet.graph.checkpoint`)."""


_UPSERTS: dict[str, tuple[Any, Any, Any]] = {}


def _upserts(dialect: str) -> tuple[Any, Any, Any]:
    """The statements `save` runs, built once per dialect (executed with their values as parameters): the
    latest checkpoint's upsert; a step's upsert; a step's insert that leaves one already kept (a run's end)."""
    if dialect not in _UPSERTS:
        dialect_insert = sqlite_insert if dialect == "sqlite" else postgresql_insert
        latest = dialect_insert(graph_checkpoints)
        steps = dialect_insert(graph_checkpoint_steps)
        _UPSERTS[dialect] = (
            latest.on_conflict_do_update(index_elements=["run_id"], set_={
                k: latest.excluded[k] for k in ("agent", "status", "step", "body", "updated_at", "ended_at")}),
            steps.on_conflict_do_update(index_elements=["run_id", "step"], set_={
                k: steps.excluded[k] for k in ("status", "body")}),
            steps.on_conflict_do_nothing(index_elements=["run_id", "step"]))
    return _UPSERTS[dialect]


class Checkpoints:
    """The `graph_checkpoints` table. A checkpoint is any object with `run_id`, `agent`, `status`, `step`,
    `ended_at` and `to_json()` (a `ringlet.graph.Checkpoint`); `load` returns `decode(json_text)` (without
    a decoder: the parsed JSON object)."""

    def __init__(self, db: Db, decode: Callable[[str], Any] | None = None) -> None:
        self.db = db
        self.decode = decode

    def decoding(self, decode: Callable[[str], Any]) -> Checkpoints:
        """The same table, loading checkpoints as `decode(text)` (e.g. `Checkpoint.from_json`)."""
        return Checkpoints(self.db, decode)

    async def save(self, checkpoint: Any) -> None:
        """Replace the run's checkpoint atomically (one INSERT … ON CONFLICT DO UPDATE), and keep it as its
        step's (the same transaction)."""
        body, stamp = checkpoint.to_json(), now()
        row = {"run_id": checkpoint.run_id, "agent": checkpoint.agent or "", "status": checkpoint.status,
               "step": checkpoint.step, "body": body, "updated_at": stamp, "ended_at": checkpoint.ended_at}
        step = {"run_id": checkpoint.run_id, "step": checkpoint.step, "status": checkpoint.status, "body": body,
                "created_at": stamp}
        async with self.db.begin() as conn:
            latest, live, ended = _upserts(conn.dialect.name)
            await conn.execute(latest, row)
            await conn.execute(live if checkpoint.status in ("working", "input_required") else ended, step)

    async def history(self, run_id: str) -> list[Any]:
        """Every checkpoint kept of the run, one per super-step, oldest first (decoded like `load`)."""
        s = graph_checkpoint_steps.c
        async with self.db.connect() as conn:
            rows = (await conn.execute(select(s.body).where(s.run_id == run_id).order_by(s.step))).scalars().all()
        return [self._decoded(text) for text in rows]

    async def load_step(self, run_id: str, step: int) -> Any:
        """The run's checkpoint after `step` super-steps, or None when none is kept."""
        s = graph_checkpoint_steps.c
        async with self.db.connect() as conn:
            text = (await conn.execute(select(s.body).where(s.run_id == run_id, s.step == step))).scalar()
        return None if text is None else self._decoded(text)

    def _decoded(self, text: str) -> Any:
        return self.decode(text) if self.decode is not None else json.loads(text)

    async def load_json(self, run_id: str) -> str | None:
        async with self.db.connect() as conn:
            return (await conn.execute(select(graph_checkpoints.c.body)
                                       .where(graph_checkpoints.c.run_id == run_id))).scalar()

    async def load(self, run_id: str) -> Any:
        """The run's latest checkpoint, or None when it has none (never stored here, or pruned)."""
        text = await self.load_json(run_id)
        return None if text is None else self._decoded(text)

    async def delete(self, run_id: str) -> None:
        async with self.db.begin() as conn:
            await conn.execute(delete(graph_checkpoints).where(graph_checkpoints.c.run_id == run_id))
            await conn.execute(delete(graph_checkpoint_steps).where(graph_checkpoint_steps.c.run_id == run_id))

    async def prune(self, older_than_s: float = RETENTION_S) -> int:
        """Forget the checkpoints of runs that ended more than `older_than_s` ago; returns how many."""
        g = graph_checkpoints.c
        expired = (g.ended_at.is_not(None), g.ended_at < time.time() - older_than_s)
        async with self.db.begin() as conn:  # the steps first: the latest checkpoint says which runs ended
            await conn.execute(delete(graph_checkpoint_steps).where(
                graph_checkpoint_steps.c.run_id.in_(select(g.run_id).where(*expired))))
            result = await conn.execute(delete(graph_checkpoints).where(*expired))
        return result.rowcount

    async def record_fork_origin(self, conversation_id: str, from_conversation_id: str, from_run_id: str) -> None:
        """Note on a graph fork's new conversation where it comes from: the conversation of the run it was
        forked from, and that run's first message there (its prompt; a graph run forks at a checkpoint, so
        this is the message the forked run answers again)."""
        m = messages.c
        async with self.db.begin() as conn:  # a prompt is stored without its run: the last user message before
            answered = (await conn.execute(select(func.min(m.seq)).where(  # the run's first one (if any yet)
                m.conversation_id == from_conversation_id, m.run_id == from_run_id))).scalar()
            prompt = select(m.id).where(m.conversation_id == from_conversation_id, m.role == "user")
            if answered is not None:
                prompt = prompt.where(m.seq < answered)
            first = (await conn.execute(prompt.order_by(m.seq.desc()).limit(1))).scalar()
            await conn.execute(update(conversations).where(conversations.c.id == conversation_id).values(
                forked_from_conversation_id=from_conversation_id, forked_from_message_id=first))

    async def reopen_run(self, run_id: str, owner: str, until: str) -> RunRecord | None:
        """Take a run that was closed as interrupted (`failed`) back to `working` under `owner`'s lease, to
        resume it from its checkpoint. In the same transaction its conversation becomes `running` again
        (`ConversationBusy` when another run holds it) and gives back the usage the close added to it (the
        resumed run's end adds the run's whole usage). None when the run is not `failed` (any more)."""
        async with self.db.begin() as conn:
            row = (await conn.execute(select(runs).where(runs.c.id == run_id, runs.c.status == "failed"))
                   ).mappings().first()
            if row is None:
                return None
            taken = await conn.execute(update(runs).where(runs.c.id == run_id, runs.c.status == "failed").values(
                status="working", finish_reason=None, ended_at=None, lease_owner=owner, lease_expires_at=until))
            if taken.rowcount == 0:
                return None
            cid = row["conversation_id"]
            if cid is not None:
                c = conversations.c
                cost = c.cost_usd if row["cost_usd"] is None else \
                    case((c.cost_usd.is_(None), None), else_=c.cost_usd - row["cost_usd"])
                claimed = await conn.execute(update(conversations).where(
                    c.id == cid, c.status.not_in(["running", "input_required"])).values(
                    status="running", in_tokens=c.in_tokens - row["in_tokens"],
                    out_tokens=c.out_tokens - row["out_tokens"], cost_usd=cost, updated_at=now()))
                if claimed.rowcount == 0:  # raising rolls the run back too
                    raise ConversationBusy(f"conversation {cid} already has an active run")
        return RunRecord.of(row)
