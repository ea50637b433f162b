"""The queues of runs waiting for a slot, as far as one process sees them: DBOS's queues when runs execute as
workflows, else this process's own waiting runs (`Executor.queues`; `/metrics` and `ringlet status` show them)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["QueueDepth", "depths", "local_queue", "queue_depths"]


@dataclass(frozen=True, slots=True)
class QueueDepth:
    name: str
    depth: int
    """Runs waiting for a worker."""
    oldest_s: float | None
    """How long the oldest of them has waited (None: none waits)."""


def local_queue(queued: int) -> list[QueueDepth]:
    """Without the engine (SQLite): the runs this process holds waiting for a slot (`max_concurrent_runs`)."""
    return [QueueDepth("local", queued, None)]


async def queue_depths(dbos_url: str | None = None) -> list[QueueDepth]:
    """Every DBOS queue with runs waiting in it: from DBOS launched in this process (`dbos_url` None), else
    from DBOS's own client on its system database (`ringlet status`). Public API only."""
    from dbos import DBOS

    if dbos_url is None:
        return depths(await DBOS.list_queued_workflows_async(status="ENQUEUED", load_input=False,
                                                             load_output=False))
    return depths(await asyncio.to_thread(_client_list, dbos_url))


def _client_list(dbos_url: str) -> list[Any]:
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=dbos_url)
    try:
        return client.list_queued_workflows(status="ENQUEUED", load_input=False, load_output=False)
    finally:
        client.destroy()


def depths(waiting: list[Any]) -> list[QueueDepth]:
    """Workflows waiting (DBOS's `WorkflowStatus`es), counted per queue, with the oldest one's wait."""
    at_ms = time.time() * 1000
    found: dict[str, list[int]] = {}
    for workflow in waiting:
        found.setdefault(workflow.queue_name or "", []).append(workflow.created_at or int(at_ms))
    return [QueueDepth(name, len(stamps), round(max(0.0, (at_ms - min(stamps)) / 1000), 3))
            for name, stamps in sorted(found.items())]
