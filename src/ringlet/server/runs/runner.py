"""Runs on the server: started from a message, driven to the end whatever the clients do, stored as they go.

`Runner` is the one object the routes, the engine and firing call. It holds what this process knows of its
runs (the active ones, the hub their events go out through, the limits) and hands each job to the part
that does it:

    Runner ─┬─ Starter    start a run (409 / 429, or wait its turn), stream it, cancel it      starter.py
            ├─ RunDriver  take each event: store it, then publish it; end or abandon the run   driver.py
            ├─ Pauses     decide, answer, expire; resume a paused run                          pauses.py
            └─ Recovery   close or hand on dead processes' runs; upkeep and sweeps             recovery.py

                      SSE streams ◄── Hub (per conversation, bounded) ◄── RunDriver ◄── the run's stream

Clients only read: a disconnect never touches a run; `cancel()` cancels its pump, and the run still ends
with `message_end`. This is the one driver for every kind of run: a conversation's message, a trigger's or
schedule's fire, a resumed pause, a graph run (`graphs.GraphRuns`), and a `/v1` request with or without a
conversation (`start_unstored`: its record is stored, its events go only to the requester).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine, Sequence
from contextlib import suppress
from typing import Any

from ringlet._ids import at, new_id
from ringlet.agent import AgentStream
from ringlet.context import Channel
from ringlet.events import Event
from ringlet.gates.approval import ApprovalDecision, Approver
from ringlet.messages import Message
from ringlet.server.catalog import Catalog
from ringlet.server.durable.reconcile import HOST
from ringlet.server.http.auth import Principal
from ringlet.server.http.limits import Limits
from ringlet.server.http.settings import ServerSettings
from ringlet.server.runs.active import ActiveRun, Hub, Published
from ringlet.server.runs.driver import RunDriver
from ringlet.server.runs.executor import Executor, LocalExecutor
from ringlet.server.runs.graphs import GraphRuns
from ringlet.server.runs.pauses import Pauses
from ringlet.server.runs.recovery import Recovery
from ringlet.server.runs.starter import Starter
from ringlet.store import Store
from ringlet.store.records import Approval, Claim, Conversation, RunRecord
from ringlet.store.schedule_records import ConversationSchedules
from ringlet.store.writer import EventWriter

log = logging.getLogger("ringlet.server")


class Runner:
    """Starts, drives, pauses, cancels and recovers the runs of this process (a facade over its parts)."""

    def __init__(self, store: Store, catalog: Catalog, settings: ServerSettings) -> None:
        self.store, self.catalog, self.settings = store, catalog, settings
        window = settings.events_commit_s
        if window is None:
            window = 0.05 if store.engine.dialect.name == "postgresql" else 0.0
        self.writer = EventWriter(store, window_s=window)
        self.hub = Hub()
        self.owner = f"{new_id('proc')}@{HOST}:{os.getpid()}"
        """This process's lease owner id: where it runs, so a successor on this machine knows it is gone."""
        self.active: dict[str, ActiveRun] = {}
        self.unstored: dict[str, ActiveRun] = {}
        """Runs with no conversation (`/v1` without one), by run id."""
        self.held: set[str] = set()
        """Direct tool calls this process holds while they wait for a human (`tool_calls.py`), by run id."""
        self.dropped: set[str] = set()
        """Runs this process ended for their clients without storing their end (storage failed): still
        `working` in the store under this process's lease, closed by `recover()` once storage is back."""
        self.tasks: set[asyncio.Task[None]] = set()
        """What runs in the background here (drivers, `spawn`ed work): `close()` waits for it."""
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
        self.starter, self.driver = Starter(self), RunDriver(self)
        self.pauses, self.recovery = Pauses(self), Recovery(self)
        self.graphs = GraphRuns(self)
        self.executor: Executor = LocalExecutor(store, self.starter.stream_for, self.driver.launch, self.queued)
        """How runs execute (`executor.py`): in this process, unless the app wires DBOS's (`app.py`)."""

    def lease_until(self) -> str:
        return at(time.time() + self.settings.run_lease_s)

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[None]:
        """Run `work` in the background (failures are logged); `close()` waits for it."""

        async def logged() -> None:
            try:
                await work
            except Exception:
                log.exception("background work failed")

        task = asyncio.create_task(logged())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def close(self) -> None:
        """Cancel the active runs (each still ends with message_end), wait for them, flush the writer."""
        self.closing = True
        self.pauses.close()
        for run in [*self.active.values(), *self.unstored.values()]:
            if run.watcher is not None:  # it executes elsewhere and goes on
                run.watcher.cancel()
            else:
                self.stop(run)
        if self.tasks:
            with suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.catalog.aclose()
        await self.writer.close()

    # -- starting and stopping (`Starter`) ------------------------------------------------------------------

    async def start(self, conversation: Conversation, prompt: Message | Sequence[Message], *, principal: Principal,
                    channel: Channel = "chat", overrides: dict[str, Any] | None = None,
                    wait_turn: bool = False, run_id: str | None = None, approver: Approver | None = None,
                    claim: Claim | None = None) -> ActiveRun:
        return await self.starter.start(conversation, prompt, principal=principal, channel=channel, overrides=overrides,
                                        wait_turn=wait_turn, run_id=run_id, approver=approver, claim=claim)

    async def start_unstored(self, agent: str, stream: AgentStream, *, principal: Principal, realm: str) -> ActiveRun:
        return await self.starter.start_unstored(agent, stream, principal=principal, realm=realm)

    def schedule_book(self, cid: str, agent: str, realm: str, org_id: str | None, user_id: str | None,
                      key_id: str | None) -> ConversationSchedules:
        return self.starter.schedule_book(cid, agent, realm, org_id, user_id, key_id)

    def relaunch(self, run_id: str, cid: str, agent: str, stream: Any, *, applied: tuple[str, ...] = ()) -> None:
        self.starter.relaunch(run_id, cid, agent, stream, applied=applied)

    def adopt(self, run_id: str, cid: str, agent: str, stream: Any, *, resumed: bool,
              applied: tuple[str, ...] = ()) -> ActiveRun:
        return self.starter.adopt(run_id, cid, agent, stream, resumed=resumed, applied=applied)

    def cancel(self, conversation_id: str) -> str | None:
        return self.starter.cancel(conversation_id)

    def stop(self, run: ActiveRun) -> None:
        self.starter.stop(run)

    # -- driving (`RunDriver`) ------------------------------------------------------------------------------

    def launch(self, run: ActiveRun) -> None:
        self.driver.launch(run)

    async def drive(self, run: ActiveRun, stream: AgentStream) -> None:
        await self.driver.drive(run, stream)

    def release(self, run: ActiveRun) -> None:
        self.driver.release(run)

    async def emit(self, conversation_id: str | None, event: Event, run: ActiveRun | None = None) -> int:
        return await self.driver.emit(conversation_id, event, run)

    def publish(self, conversation_id: str | None, event: Event, event_id: int, run: ActiveRun | None = None,
                payload: dict[str, Any] | None = None) -> None:
        self.driver.publish(conversation_id, event, event_id, run, payload)

    def backlog(self, conversation_id: str, run_id: str) -> list[Published] | None:
        return self.driver.backlog(conversation_id, run_id)

    # -- people (`Pauses`) ----------------------------------------------------------------------------------

    async def wake_decided(self, before: str) -> int:
        return await self.pauses.wake_decided(before)

    async def resume(self, run_id: str) -> bool:
        return await self.pauses.resume(run_id)

    def resumed_stream(self, row: RunRecord, decisions: dict[str, ApprovalDecision], *,
                       steps: Any = None) -> AgentStream:
        return self.pauses.resumed_stream(row, decisions, steps=steps)

    async def continuation_of(self, run_id: str) -> dict[str, Any] | None:
        return await self.pauses.continuation_of(run_id)

    async def decide(self, record: Approval, *, approved: bool, note: str | None, decided_by: str,
                     resume: bool = True) -> dict[str, Any]:
        return await self.pauses.decide(record, approved=approved, note=note, decided_by=decided_by, resume=resume)

    async def answer(self, record: Approval, answer: Any, *, answered_by: str) -> dict[str, Any]:
        return await self.pauses.answer(record, answer, answered_by=answered_by)

    async def heard(self, approval_id: str) -> None:
        await self.pauses.heard(approval_id)

    def approver(self, agent: str, realm: str) -> Approver:
        return self.pauses.approver(agent, realm)

    async def expire_due(self) -> int:
        return await self.pauses.expire_due()

    def expire_at(self, deadline: float) -> None:
        self.pauses.expire_at(deadline)

    async def cancel_paused(self, conversation_id: str) -> str | None:
        return await self.pauses.cancel_paused(conversation_id)

    # -- dead processes' runs (`Recovery`) ------------------------------------------------------------------

    async def recover(self) -> int:
        return await self.recovery.recover()

    async def upkeep(self) -> None:
        await self.recovery.upkeep()

    async def sweep(self) -> None:
        await self.recovery.sweep()


def runner_of(request: Any) -> Runner:
    """The Runner of the app serving `request`."""
    return request.app.state.ringlet.runner
