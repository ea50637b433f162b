"""Durable runs on DBOS Transact: any worker executes any run, and a dead worker's runs go on elsewhere.

On PostgreSQL (`engine: dbos`, the default there) every run the server starts for a conversation is a
DBOS workflow (`ringlet.run`, its input the run's spec), enqueued on one queue (`ringlet-runs`); a process
that listens on it (`ringlet serve`, `ringlet worker`; not `ringlet serve --no-worker`) executes it with
the server's one driver (`RunDriver.drive`), its steps run by `ringlet.durable.DurableSteps`: the process
that enqueued it, when it can (`dbos.take`), else the first worker told by `NOTIFY` (`WAKE_CHANNEL`). Inside the
workflow:

- every model request is a step whose output is the response's chunks (sent to the run live while the
  request is in flight), and every tool call a step whose output is the call's result; a batch draws
  its calls' step ids in the order the model made the calls (`batch()`), so however they interleave, a
  replay gives each call its own result;
- ids come from a seam derived from the run id (`ringlet._ids.replayable`), so an execution replayed
  from the recorded steps makes the same messages, calls and approvals;
- a graph run's node calls are steps too (one per node of a super-step, drawn in frontier order), and so
  are its checkpoints;
- a run waiting for people (a loop run's approvals, a graph run's question) holds no step and no lease: it
  waits on a DBOS message (`decision`, sent by `wake()` from whichever process records a decision) with
  the earliest request's expiry as timeout.

Every process beats in the `workers` table (its id is its lease owner id and its DBOS executor id). A
process that finds another silent for `worker_timeout_s` (or, on its own machine, exited) hands that
executor's pending workflows back to the queue (DBOS's recovery), and a live worker executes them again:
completed steps return their recorded results (a tool that finished does not run again, a response fully
received is not requested again, usage is not counted twice), and the events the dead worker stored are
neither stored nor sent again (`ActiveRun.replay`). A step in flight at the crash follows the at-most-once
rule: a model request is sent again; a tool that is not idempotent gets `tool_error: interrupted` (its
start is a recorded step of its own), an idempotent one runs again, and so does a sub-agent call, which
re-attaches to its child: a durable run of its own (`child_runs.py`).

Limits are queues too, so they hold across every process: the run queue's global concurrency is
`max_concurrent_runs`; an agent with its own `max_concurrent_runs` (config.yaml) has a queue of its own
(`ringlet-runs:<agent>`) with that limit instead; sub-agents' runs wait in a queue of their own, unlimited
(their parent holds a slot); each provider in `provider_rate_limits` has a queue with a rate limiter
(`ringlet-provider:<name>`) from which its model requests take permits (`ringlet.durable.rate_limit`). A
run in its queue, taken by no worker yet, is `queued` in the API (`Engine.queued`); its record stays
`working` (so recovery, which leaves a run with a live workflow alone, needs nothing new).

With SQLite (`engine: local`, the default there) runs execute in process, as before: DBOS over SQLite
costs more than 2 ms per step over the in-process path (`bench/scale_out.py` prints both).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from typing import TYPE_CHECKING, Any, TypeVar

from dbos import DBOS, SetWorkflowID
from sqlalchemy import text

from ringlet import telemetry
from ringlet.durable import rate_limit
from ringlet.server.durable.dbos import (
    FIRES,
    WAKE_CHANNEL,
    WOKEN_FIRE_POLL_S,
    Dbos,
    claims,
    launch,
    outside,
    register,
    shutdown,
    stop_taking,
    take,
    wake_fires,
)
from ringlet.server.durable.pulse import engine_url, pulse
from ringlet.server.durable.reconcile import cancel_in_call, gone
from ringlet.server.durable.steers import CHANNEL as STEER_CHANNEL
from ringlet.server.durable.steers import Steering
from ringlet.server.durable.workflow import Process, run_workflow
from ringlet.server.runs.active import ActiveRun
from ringlet.store.records import RunRecord
from ringlet.store.worker_records import Workers

if TYPE_CHECKING:
    from ringlet.server.durable.feed import Feed
    from ringlet.server.runs.runner import Runner

log = logging.getLogger("ringlet.server")
T = TypeVar("T")
QUEUE = "ringlet-runs"
KEY_FREED = "ringlet_key_freed"
"""Notified (the API key's id) when a run of that key ended or paused: its runs waiting for a place among the
key's working runs, in any process, count again (`Starter._admitted`)."""
PERMIT_POLL_S = 0.1
"""How often a provider's rate-limited queue looks whether a request may go (its permits come due with time)."""
CHILDREN = "ringlet-runs-children"
"""Sub-agents' runs: not limited by `max_concurrent_runs` (their parent's run holds a slot while it waits for
them; limited too, a full house of parents would wait for children that never start)."""


# -- the engine: DBOS, the queue, the heartbeat and recovery ----------------------------------------------


class Engine:
    """DBOS in this process: the queue it executes runs from (unless it only serves), its heartbeat, and
    the recovery of dead workers' runs."""

    def __init__(self, runner: Runner, url: str, *, role: str, feed: Feed) -> None:
        self.runner, self.url, self.role = runner, url, role
        self.workers = Workers(runner.store.db)
        self._beat: asyncio.Task[None] | None = None
        self.queues: dict[str, str] = {}
        """Agent → its own queue (agents with `max_concurrent_runs`)."""
        self.busy: set[str] = set()  # runs whose workflow executes here (not waiting for people): a drain's wait
        self._settled = asyncio.Event()
        self.steering = Steering()
        """The inboxes of the runs executing here: steers sent to them are heard on the feed (`steers.py`)."""
        feed.on("ringlet_cancel", self._cancelled)  # heard on the live feed's connection
        feed.on(STEER_CHANNEL, self.steering.heard)
        feed.on("ringlet_decided", self._heard)
        feed.on(WAKE_CHANNEL, self._queued)
        feed.on(KEY_FREED, runner.here.limits.runs.heard)

    async def open(self) -> None:
        settings = self.runner.settings
        Process.runner, Process.engine = self.runner, self
        # in this event loop (the workflows DBOS hands this process run here); a process that only serves
        # takes no runs from the queue, only fires (`firing.py`)
        await launch(self.url, executor_id=self.runner.here.owner, settings=settings,
                     listen=[FIRES] if self.role == "api" else None, idle_timeout_s=settings.worker_timeout_s)
        # DBOS's tables in the database whose notifications the feed hears: a fire wakes every process
        if self.url == engine_url(self.runner.store) and await wake_fires(self.runner.store.db):
            await register(FIRES, polling_interval_sec=settings.fire_poll_s or WOKEN_FIRE_POLL_S)
            self.runner.here.spawn(outside(take(FIRES)))  # what was enqueued before this process listened
        limit = settings.max_concurrent_runs or None  # DBOS: a worker's share is never above the whole
        await register(QUEUE, worker_concurrency=min(settings.worker_concurrency, limit or 1 << 30),
                       polling_interval_sec=settings.queue_poll_s, global_concurrency=limit)
        await register(CHILDREN, worker_concurrency=settings.worker_concurrency,
                       polling_interval_sec=settings.queue_poll_s)
        await self._limits()
        self._beat = asyncio.create_task(self._beating(), name="ringlet-heartbeat")

    async def _limits(self) -> None:
        """The limits shared by every process (each registers the same queues; the last one's settings
        hold): a queue of its own for each agent with `max_concurrent_runs`, and one with a rate limiter
        for each provider in `provider_rate_limits`, from which its model requests take permits."""
        settings = self.runner.settings
        self.queues = {h.name: f"{QUEUE}:{h.name}" for h in self.runner.catalog.hosted.values()
                       if getattr(h, "max_concurrent_runs", None)}
        for name, queue in self.queues.items():
            limit = self.runner.catalog.hosted[name].max_concurrent_runs or 1
            await register(queue, worker_concurrency=min(settings.worker_concurrency, limit),
                           polling_interval_sec=settings.queue_poll_s, global_concurrency=limit)
        providers = {name: f"ringlet-provider:{name}" for name in settings.provider_rate_limits}
        for name, queue in providers.items():  # its permits come due with time: looked for often
            limit = settings.provider_rate_limits[name]
            await register(queue, polling_interval_sec=PERMIT_POLL_S, limiter={"limit": limit.limit,
                                                                                "period": limit.period})
        rate_limit(providers, poll_s=PERMIT_POLL_S / 2)

    def queue_of(self, agent: str) -> str:
        """The queue a run of `agent` waits in: the agent's own when it has a limit, else the shared one."""
        return self.queues.get(agent, QUEUE)

    async def queued(self, run_id: str) -> bool:
        """Whether the run waits in its queue, taken by no worker yet (a limit holds it, or none is free)."""
        status = await DBOS.get_workflow_status_async(run_id)
        return status is not None and status.status == "ENQUEUED"

    def executing(self, run_id: str, *, busy: bool) -> None:
        """A run's workflow executes here now (`busy`), or no longer (it ended, or waits for people)."""
        if busy:
            self.busy.add(run_id)
        else:
            self.busy.discard(run_id)
            self._settled.set()

    async def drain(self, seconds: float) -> int:
        """Take no more runs (nor fires) from the queues, and wait up to `seconds` for the runs executing here to
        end or pause; how many still execute then (`close` hands them on to another worker)."""
        stop_taking()
        deadline = asyncio.get_running_loop().time() + seconds
        while self.busy:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                log.warning("drained for %g s: %d run(s) still executing go on in another worker", seconds,
                            len(self.busy))
                return len(self.busy)
            log.info("draining: waiting up to %.1f s for %d run(s) executing here", left, len(self.busy))
            self._settled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), left)
        return 0

    async def close(self) -> None:
        """Stop executing: runs in progress are handed on (not ended), and this worker is marked dead at once
        so that a live one takes them over now."""
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
        driven = [r for r in self.runner.here.active.values() if r.driver is not None]
        for run in driven:
            run.handover = True  # not ended: the record goes on elsewhere
            run.driver.cancel()  # type: ignore[union-attr]
        await asyncio.gather(*[r.driver for r in driven if r.driver is not None], return_exceptions=True)
        try:
            await self.workers.retire(self.runner.here.owner)
        except Exception as exc:
            log.warning("could not retire worker %s: %s", self.runner.here.owner, exc)
        shutdown()
        Process.runner = Process.engine = None

    async def dispatch(self, run: ActiveRun, spec: dict[str, Any]) -> None:
        """Enqueue a run this process started (stored, `working`; `spec`: its workflow's input, `spec_of`) and
        take it here when this process executes runs and has room; else every worker is told, and the first
        free one takes it. Until then (and for good when another worker does) `run` follows its events here
        (`watch`)."""
        queue = self.queue_of(run.agent)
        with claims(run.run_id) as here:
            with SetWorkflowID(run.run_id):
                await DBOS.enqueue_workflow_async(queue, run_workflow, spec)
            await outside(take(queue))
            if here():  # it executes here: its driver publishes its events to this `run` (`Starter.adopt`), so
                return  # its streams read them from memory
        self.watch(run, run.base or 0)
        await self.announce(queue)

    async def nudge(self, queue: str) -> None:
        """Room was made in `queue`, or work put back in it: this process takes what waits there now if it
        executes that queue and has room, else every process that does is told to (`WAKE_CHANNEL`)."""
        if not await take(queue):
            await self.announce(queue)

    async def announce(self, queue: str) -> None:
        """Tell every process that executes `queue` (this one too) to take what waits in it now (else the
        queue's poll takes it)."""
        await self._notify(WAKE_CHANNEL, queue)

    def freed(self, agent: str) -> None:
        """A run of `agent` ended here (called in its workflow): once the workflow has ended, and so no longer
        counts against its queue's limits, the next run waiting for its place starts. Under a limit, every
        process that executes the queue is told, and the first to claim it takes it (so the runs spread over
        the workers); without one, a run waits only when a process had no room for it (the others were told
        when it was enqueued), so it is taken here while this process is full."""
        queue = self.queue_of(agent)
        limited = queue != QUEUE or bool(self.runner.settings.max_concurrent_runs)
        if not limited and queue not in Dbos.full:
            return  # there was room here: what was enqueued meanwhile was taken when it came

        def next_one(_: object) -> None:
            self.runner.here.spawn(outside(self.announce(queue) if limited else take(queue)))

        if (workflow := asyncio.current_task()) is None:
            next_one(None)
        else:  # DBOS releases its place in the queue's count as the workflow's task ends
            workflow.add_done_callback(next_one)

    def key_freed(self, key: str) -> None:
        """A run of API key `key` ended or paused here: every process's runs of that key waiting for a place
        among its working runs count again (`Starter._admitted`)."""
        self.runner.here.spawn(self._notify(KEY_FREED, key))

    async def _notify(self, channel: str, payload: str) -> None:
        try:
            async with self.runner.store.db.begin() as conn:
                await conn.execute(text("SELECT pg_notify(:channel, :payload)"),
                                   {"channel": channel, "payload": payload})
        except Exception as exc:  # a poll covers it: the queue's, or `worker_timeout_s` for a key's waiters
            log.warning("could not send %s (%s): %s", channel, payload, exc)

    def watch(self, run: ActiveRun, after: int) -> None:
        """Follow `run` (events after `after`) wherever it executes until it ends or pauses; then it is
        released here (`RunDriver.release`: its key's place among active runs)."""
        run.watcher = asyncio.create_task(self._watch(run, after), name=f"ringlet-watch-{run.run_id}")

    async def _watch(self, run: ActiveRun, after: int) -> None:
        """Follow a run started here until it ends (`message_end`) or pauses (`status: input_required`),
        wherever it executes; then it is no longer active here."""
        runner, cid = self.runner, run.conversation_id or ""
        try:
            with runner.here.hub.subscribe(cid, base=after) as subscriber:
                told = False
                async for item in runner.runs.items(subscriber, cid, after=after, run_id=run.run_id):
                    if item is not None and run.cancel_requested and not told:  # cancelled before it got to a
                        told = True  # worker: the worker now executing it hears it again
                        await self.cancel(run.run_id)
                    if item is not None and not item.nested and item.type == "status" and \
                            json.loads(item.data).get("state") == "input_required":
                        break
        except Exception:
            log.exception("lost track of run %s", run.run_id)
        finally:
            if run.watcher is asyncio.current_task():  # not taken over by a driver here
                run.watcher = None
                runner.driver.release(run)

    async def cancel(self, run_id: str) -> None:
        """Cancel a run executing in another process: every process hears it, and the one that executes it
        stops it (one cancelled before a worker took it is told again by `_watch` once it has started)."""
        async with self.runner.store.db.begin() as conn:
            await conn.execute(text("SELECT pg_notify('ringlet_cancel', :run)"), {"run": run_id})

    async def decided(self, approval_id: str) -> None:
        """A decision was recorded that no run's workflow waits for: a process waiting for it in memory (a
        sub-agent's run, a run without a conversation) hears it."""
        async with self.runner.store.db.begin() as conn:
            await conn.execute(text("SELECT pg_notify('ringlet_decided', :id)"), {"id": approval_id})

    def _queued(self, queue: str) -> None:
        self.runner.here.spawn(take(queue))

    def _heard(self, approval_id: str) -> None:
        if approval_id in self.runner.here.waiters:
            self.runner.here.spawn(self.runner.pauses.heard(approval_id))

    def _cancelled(self, run_id: str) -> None:
        for run in self.runner.here.active.values():
            if run.run_id == run_id and run.pump is not None:
                self.runner.starter.stop(run)

    async def requeue(self, row: RunRecord) -> bool:
        """Enqueue the workflow of a stored run that has none: the process that stored it died before it
        enqueued it (`Starter.start`). From the input stored with its record, under the run's id, as that
        process would have (DBOS enqueues an id once); its messages are the conversation's last ones (the
        run never executed: nothing came after them). False, and nothing done, when its workflow exists or
        existed, or its record holds no input (a run stored otherwise, or by an older ringlet): it is
        closed then."""
        spec = (row.state or {}).get("spec") if row.status == "working" else None
        if spec is None or row.conversation_id is None or await DBOS.get_workflow_status_async(row.id) is not None:
            return False
        ids: list[str] = spec["incoming"]
        incoming = await self.runner.store.conversations.load_messages(row.conversation_id, limit=len(ids))
        if [m.id for m in incoming] != ids:
            return False
        queue = self.queue_of(row.agent)
        with SetWorkflowID(row.id):
            await DBOS.enqueue_workflow_async(queue, run_workflow, {
                **spec, "incoming": [m.model_dump(mode="json") for m in incoming]})
        log.warning("run %s was stored but never queued (its process stopped in between); queued it now", row.id)
        await self.nudge(queue)
        return True

    async def durable(self, run_id: str) -> bool:
        """Whether a workflow executes (or will execute) this run."""
        status = await DBOS.get_workflow_status_async(run_id)
        return status is not None and status.status in ("PENDING", "ENQUEUED", "DELAYED")

    async def wake(self, run_id: str) -> None:
        """Tell a paused run that a decision arrived (it reads them from the store)."""
        await DBOS.send_async(run_id, "decided", topic="decision")

    async def _beating(self) -> None:
        """Look for dead workers at each beat while this one lives: the heartbeat is a thread of its own (`pulse`),
        so a busy event loop never makes a live worker look dead, and each beat looks at the others in its own
        statement and hands what it saw (the latest look) to this loop."""
        settings, stop, loop = self.runner.settings, threading.Event(), asyncio.get_running_loop()
        seen: list[dict[str, bool]] = []
        looked = asyncio.Event()

        def land(silent: dict[str, bool]) -> None:
            seen[:] = [silent]
            looked.set()

        def heard(silent: dict[str, bool]) -> None:  # (the beat's thread; the loop may close as the process stops)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(land, silent)

        beat = threading.Thread(target=pulse, args=(engine_url(self.runner.store), self.runner.here.owner, self.role,
                                                      settings.heartbeat_s, stop), name="ringlet-pulse", daemon=True,
                                kwargs={"silent_s": settings.worker_timeout_s, "heard": heard})
        beat.start()
        try:
            while True:
                await looked.wait()
                looked.clear()
                try:
                    await self.hand_on(seen.pop())
                except Exception:
                    log.exception("could not look for dead workers; retrying")
        finally:
            stop.set()

    async def hand_on(self, silent: dict[str, bool] | None = None) -> list[str]:
        """Give the pending runs of dead workers to the queue (DBOS's recovery; any process may, once); the
        workers whose runs were handed on. A worker is dead when its heartbeat has been silent for
        `worker_timeout_s` (it is a thread: a busy event loop does not silence it), or at once when it ran on
        this machine and has exited. `silent`: each worker and whether it is, as a beat saw (else read now)."""
        if silent is None:
            silent = await self.workers.silent(self.runner.settings.worker_timeout_s)
        dead = {w for w, quiet in silent.items() if quiet or (w != self.runner.here.owner and gone(w))}
        for worker in sorted(dead):  # DBOS's recovery is idempotent: processes doing it together do no harm
            handles = await asyncio.to_thread(DBOS._recover_pending_workflows, [worker])  # pyright: ignore[reportPrivateUsage]
            for handle in handles:  # questions its MCP sessions asked in a call are not answered any more
                await cancel_in_call(self.runner.store, handle.get_workflow_id())
            if await self.workers.forget(worker) and handles:  # said once, by the process that forgot it
                log.warning("worker %s is gone: %d run(s) handed on", worker, len(handles))
                telemetry.emit("ringlet.run.recovered", {"runs": len(handles)}, {"engine": "dbos"})
            if handles:  # back in their queues: taken now
                for queue in (QUEUE, CHILDREN, *self.queues.values()):
                    self.runner.here.spawn(self.nudge(queue))
        return sorted(dead)
