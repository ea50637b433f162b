"""What this process knows of its runs: which are active here, which wait, what it holds in memory for them,
and how they execute (`executor.py`: in process, or DBOS's, chosen once by the app). The parts of the run
machinery (`Starter`, `RunDriver`, `Pauses`, `Recovery`, `GraphRuns`) share this one value, handed to each at
construction (`runner.py`); it holds state, never calls into them."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine
from typing import Any

from ringlet._ids import at, new_id
from ringlet.gates.approval import ApprovalDecision
from ringlet.server.durable.reconcile import HOST
from ringlet.server.http.limits import Limits
from ringlet.server.http.settings import ServerSettings
from ringlet.server.runs.active import ActiveRun, Hub
from ringlet.server.runs.executor import Executor

log = logging.getLogger("ringlet.server")


class Here:
    """This process's runs (state only; no behaviour but `spawn` and the lease's deadline)."""

    executor: Executor
    """How runs execute (`executor.py`): in this process, unless the app wires DBOS's (`app.py`). Set once by
    the wiring (`runner.Runner`) before anything runs."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.hub = Hub()
        self.owner = f"{new_id('proc')}@{HOST}:{os.getpid()}"
        """This process's lease owner id: where it runs, so a successor on this machine knows it is gone."""
        self.active: dict[str, ActiveRun] = {}
        """Runs of conversations, by conversation id (one at a time per conversation)."""
        self.unstored: dict[str, ActiveRun] = {}
        """Runs with no conversation (`/v1` without one), by run id."""
        self.held: set[str] = set()
        """Direct tool calls this process holds while they wait for a human (`tool_calls.py`), by run id."""
        self.dropped: set[str] = set()
        """Runs this process ended for their clients without storing their end (storage failed): still
        `working` in the store under this process's lease, closed by `Recovery.recover` once storage is back."""
        self.tasks: set[asyncio.Task[None]] = set()
        """What runs in the background here (drivers, `spawn`ed work): `Runner.close` waits for it."""
        self.queued: set[str] = set()
        """In process (no engine): runs waiting for a slot (`max_concurrent_runs`), `status: queued`."""
        self.resuming: set[str] = set()
        """Paused runs this process has taken and is starting again (alive, though not active yet)."""
        self.waiters: dict[str, asyncio.Future[ApprovalDecision]] = {}
        """Approvals and questions waited for in this process's memory (runs that are not stored, in-call
        questions), by approval id."""
        self.closing = False
        self.limits = Limits.of(settings)
        """Per-key limits of this process: request rate, open streams, active runs (`limits.py`)."""

    def lease_until(self) -> str:
        return at(time.time() + self.settings.run_lease_s)

    def mine(self) -> set[str]:
        """The run ids alive in this process: active, resuming, or held tool calls."""
        return {run.run_id for run in (*self.active.values(), *self.unstored.values())} | self.resuming | self.held

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[None]:
        """Run `work` in the background (failures are logged); `Runner.close` waits for it."""

        async def logged() -> None:
            try:
                await work
            except Exception:
                log.exception("background work failed")

        task = asyncio.create_task(logged())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task
