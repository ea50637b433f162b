"""What a cluster is doing, read from the store and DBOS at the moment it is asked: its live workers and their
last beat, its queues and their depth, the runs in flight, the pauses waiting, the schema version.

`ringlet status`, `GET /api/v1/admin/status` and the gauges of `/metrics` (`metrics.ClusterCollector`) all read
it here, on SQLite and on PostgreSQL. Each read is a few aggregate queries, never a scan of every run.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, text

from ringlet.server.runs.queues import QueueDepth
from ringlet.store import Store
from ringlet.store.schema import approvals, runs, schema_version, workers
from ringlet.store.worker_records import CLOCK

SQLITE_CLOCK = "((julianday('now') - 2440587.5) * 86400.0)"
"""SQLite's clock in epoch seconds (what `CLOCK` is on PostgreSQL); a retired worker (a beat of 0) is left out."""


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    id: str
    role: str
    """`serve`, `worker` or `api` (serves only)."""
    last_beat_s: float
    """Seconds since its last heartbeat (by the database's clock)."""


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    schema_version: int
    runs_in_flight: int
    """Runs `working` (executing, or queued for a worker) across every process."""
    pauses_waiting: int
    """Approvals and questions waiting for a human."""
    oldest_pause_s: float | None
    """How long the oldest of them has waited."""
    oldest_pause_id: str | None
    workers: list[WorkerBeat] = field(default_factory=list)
    queues: list[QueueDepth] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _age(stamp: str | None, at: float) -> float | None:
    return None if stamp is None else max(0.0, at - datetime.fromisoformat(stamp).timestamp())


async def read(store: Store, *, queues: list[QueueDepth] | None = None) -> ClusterStatus:
    """The cluster's status; `queues` as `queue_depths` (or `local_queue`) read them."""
    at = time.time()
    async with store.db.connect() as conn:
        version = (await conn.execute(select(func.max(schema_version.c.version)))).scalar() or 0
        flying = (await conn.execute(select(func.count()).select_from(runs)
                                     .where(runs.c.status == "working"))).scalar() or 0
        pending = (approvals.c.status == "pending")
        waiting = (await conn.execute(select(func.count()).select_from(approvals).where(pending))).scalar() or 0
        oldest = (await conn.execute(select(approvals.c.approval_id, approvals.c.requested_at).where(pending)
                                     .order_by(approvals.c.requested_at).limit(1))).first()
        clock = text(CLOCK if conn.dialect.name == "postgresql" else SQLITE_CLOCK)
        beat = (await conn.execute(select(workers.c.id, workers.c.role, clock - workers.c.seen_at)
                                   .where(workers.c.seen_at > 0).order_by(workers.c.id))).all()
    return ClusterStatus(
        schema_version=version, runs_in_flight=flying, pauses_waiting=waiting,
        oldest_pause_s=_age(oldest[1], at) if oldest else None, oldest_pause_id=oldest[0] if oldest else None,
        workers=[WorkerBeat(w, role, round(max(0.0, float(quiet)), 3)) for w, role, quiet in beat],
        queues=queues or [])


