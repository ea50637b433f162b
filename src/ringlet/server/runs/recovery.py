"""Runs whose process died (`server-contract.md` §4.3): each run holds a lease in the store, and a run whose
process died is closed as interrupted (its log and transcript made to agree first, `reconcile`) by
whichever process sees its lease expire, or at once when it ran on this machine and has exited; graph runs
resume from their checkpoints instead. With the engine a dead worker's runs go on elsewhere
(`engine.Engine.hand_on`). The upkeep loop renews this process's leases, recovers, expires approvals and
prunes what has outlived its retention."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ringlet import telemetry
from ringlet._ids import at, now
from ringlet.server.durable.dbos import Dbos, forget, outside
from ringlet.server.durable.reconcile import close_interrupted, gone, log_end
from ringlet.server.http.settings import ServerSettings
from ringlet.server.runs.driver import RunDriver
from ringlet.server.runs.graphs import GraphRuns
from ringlet.server.runs.here import Here
from ringlet.server.runs.pauses import Pauses
from ringlet.store import Store
from ringlet.store.records import RunRecord

log = logging.getLogger("ringlet.server")


class Recovery:
    """Recovery of dead processes' runs, and the upkeep that runs it."""

    def __init__(self, store: Store, settings: ServerSettings, here: Here, driver: RunDriver, pauses: Pauses,
                 graphs: GraphRuns) -> None:
        self.store, self.settings, self.here = store, settings, here
        self.driver, self.pauses, self.graphs = driver, pauses, graphs

    async def recover(self) -> int:
        """Close every run whose process died as interrupted (with `graph_auto_resume`, resume graph runs
        from their checkpoints instead; on the engine, enqueue a run stored whose process died before it
        enqueued its workflow: `Executor.adopt`); returns how many were closed. A process is known dead when its
        lease expired, or at once when it ran on this machine and has exited (`gone`): a restarted server
        closes its predecessor's runs before it reports ready. Runs this process ended without storing
        their end (`dropped`: storage failed) are closed too, and ended runs whose last events a dead
        process had not logged get them (`reconcile.log_end`)."""
        here, store, closed = self.here, self.store, 0
        stamp = now()
        mine = here.mine()
        expired = {row.id: row for row in await store.runs.expired(stamp)}
        orphaned = {row.id: row for row in await store.runs.working()  # no need to wait for their lease
                    if row.id not in expired and (row.id in here.dropped if row.lease_owner == here.owner
                                                  else gone(row.lease_owner))}
        for row in [*expired.values(), *orphaned.values()]:
            if await self.here.executor.goes_on(row.id):
                continue  # its workflow goes on: a worker executes it again (`engine.Engine.hand_on`)
            if row.id in mine:  # alive here (its lease lapsed while the loop was busy): renew it
                await self.store.runs.renew_leases(self.here.owner, self.here.lease_until())
                continue
            held_by = row.lease_owner if row.id in orphaned else None
            if not await store.runs.claim(row.id, here.owner, here.lease_until(), expired_before=stamp,
                                          held_by=held_by):
                continue  # another process took it
            try:
                if await self.here.executor.adopt(row):
                    continue  # its process died between storing it and enqueueing it: enqueued now
                if await self._applying(row):  # it died while applying decisions: back to its pause
                    await self.store.runs.pause_again(row.id)
                    await self.pauses.resume(row.id)
                    continue
                if row.id not in self.here.dropped and await self.graphs.restart(row):  # graph_auto_resume
                    continue
                await self._interrupted(row)
                closed += 1
                telemetry.emit("ringlet.run.recovered", {"runs": 1}, {"engine": "local"})
            except Exception:
                log.exception("could not close interrupted run %s", row.id)
        for row in await self.store.runs.unlogged_ends():
            owner = row.lease_owner
            lapsed = (row.lease_expires_at or "") < stamp
            if row.id in mine or not (owner == here.owner or gone(owner) or lapsed):
                continue
            try:
                await log_end(self.driver, row)
            except Exception:
                log.exception("could not log the end of run %s", row.id)
        return closed

    async def _applying(self, row: RunRecord) -> bool:
        """Whether the run died while executing approved calls of its paused round (its stored state still
        waits for them): resuming gives those calls `interrupted by restart` results."""
        awaiting: dict[str, Any] = (row.state or {}).get("awaiting") or {}
        return bool(awaiting) and any(r.status == "executing" and r.tool_call_id in awaiting
                                      for r in await self.store.approvals.list(run_id=row.id))

    async def _interrupted(self, row: RunRecord) -> None:
        await close_interrupted(self.driver, row)

    async def upkeep(self) -> None:
        """Renew this process's leases, close expired runs, prune old events and idempotency keys."""
        lease = self.settings.run_lease_s
        last_sweep = 0.0
        while True:
            await asyncio.sleep(lease / 3)
            try:
                if not await self.store.db.probe():
                    continue  # storage still fails (a full disk): nothing to do until writes succeed
                await self.store.runs.renew_leases(self.here.owner, self.here.lease_until())
                await self.recover()
                await self.pauses.expire_due()
                await self.pauses.wake_decided(at(time.time() - lease / 3))  # a wake-up lost with its process
                if time.monotonic() - last_sweep >= self.settings.sweep_interval_s:
                    last_sweep = time.monotonic()
                    await self.sweep()
            except Exception:
                log.exception("server upkeep failed; retrying")

    async def sweep(self) -> None:
        retention = self.settings.events_retention_hours * 3600
        await self.store.events.prune(at(time.time() - retention))
        await self.store.tapes.prune(at(time.time() - retention))  # runs' recordings, as long as their events
        if Dbos.url is not None:  # DBOS's records of ended runs and fires, kept as long as the event log
            await outside(forget(time.time() - retention))
        await self.store.requests.prune(at(time.time() - 24 * 3600))
        await self.store.checkpoints.prune()  # graph checkpoints: 72 h after their run ended
        store = self.store
        for cid in await store.conversations.transient_leftovers(at(time.time() - 3600)):  # a `/v1` run's whose
            await self.store.conversations.purge(cid)  # API process died while it followed the run
