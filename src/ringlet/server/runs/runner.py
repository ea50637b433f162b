"""Runs on the server: started from a message, driven to the end whatever the clients do, stored as they go.

    Runner.start() ──► pump task: iterates Agent.stream() ──► handoff ──► driver: store event, then publish
                            ▲ (waits until stored)                       │
                            └────────────────────────────────────────────┤
                      SSE streams ◄── Hub (per-conversation, bounded) ◄──┘

Every event is appended to the conversation's event log (group commit, `EventWriter`) before the hub
hands it to the streams, so a stream that falls behind (its queue overflows) or reconnects reads the
rest from the store with no gap and no duplicate. The pump hands over one event at a time and the loop
goes on only once it is stored, with the transcript up to it (`_Handoff`): nothing the loop does after
an event (invoke a tool, add a message) is kept while that event is lost, so a tool's `tool_call_start`
is durable before the tool runs. A run's last events (`error`, its final `status`, `message_end`) are
stored in the transaction that records its end (`Store.finish_run`). Clients only read: a disconnect
never touches a run; `cancel()` cancels the pump, whose run still ends with `message_end`. Each run holds
a lease in the store; a run whose process died is closed as interrupted by whichever process sees the
lease expire, and its log and transcript are made to agree first (`_Reconciled`). When the storage fails
(a full disk, a lock past its timeout), a run that cannot store an event ends for its clients with
`error {code: storage_unavailable, retryable: true}` and `message_end`, which are sent but not stored;
its record stays `working` and recovery closes it once writes succeed again.
This is the one driver for every kind of run: a conversation's message, a trigger's or schedule's fire,
a resumed pause, a graph run, and a `/v1` request with or without a conversation (`start_unstored`: its
record is stored, its events go only to the requester). What a run stores as it goes is its track's
business: `LoopTrack` here, `graph_runs.GraphTrack` for graph runs (which also resume from their
checkpoints: `graph_runs.GraphRuns`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Coroutine, Sequence
from contextlib import suppress
from dataclasses import asdict
from typing import Any

from ringlet._ids import at, new_id, now
from ringlet.agent import AgentStream
from ringlet.agent.settings import RunHost, run_options
from ringlet.context import Channel
from ringlet.errors import ConversationBusy
from ringlet.events import (
    Event,
    StatusEvent,
)
from ringlet.gates.approval import ApprovalDecision, Approver, AutoDeny
from ringlet.loop import RunState
from ringlet.messages import Message
from ringlet.server.catalog import Catalog
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError, request_id
from ringlet.server.http.limits import Limits
from ringlet.server.http.settings import ServerSettings
from ringlet.server.runs.active import ActiveRun, Handoff, Hub, Published, pump, replay_key
from ringlet.server.runs.graphs import GraphRuns, checked_answer
from ringlet.server.runs.reconcile import FINAL, HOST, close_interrupted, gone, log_end
from ringlet.server.runs.tracks import Children, InProcess, LoopTrack, Progress, unstored_end
from ringlet.store import Store
from ringlet.store.engine import storage_error
from ringlet.store.schedule_records import ConversationSchedules, KeyQuota
from ringlet.store.writer import EventWriter

log = logging.getLogger("ringlet.server")




class Runner:
    """Starts, drives, cancels and recovers the runs of stored conversations."""

    def __init__(self, store: Store, catalog: Catalog, settings: ServerSettings) -> None:
        self.store, self.catalog, self.settings = store, catalog, settings
        self.writer = EventWriter(store)
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
        self._drivers: set[asyncio.Task[None]] = set()
        self._slots: dict[str | None, asyncio.Semaphore] = {}
        self.queued: set[str] = set()
        """In process (no engine): runs waiting for a slot (`max_concurrent_runs`), `status: queued`."""
        self._timers: set[asyncio.Task[None]] = set()
        self._resuming: set[str] = set()
        """Paused runs this process has taken and is starting again (alive, though not active yet)."""
        self._waiters: dict[str, asyncio.Future[ApprovalDecision]] = {}
        """Approvals of runs that are not stored (the /v1 API without a conversation), by approval id."""
        self.closing = False
        self.graphs = GraphRuns(self)
        self.limits = Limits.of(settings)
        """Per-key limits of this process: request rate, open streams, active runs (`limits.py`)."""
        self.engine: Any = None
        """Durable execution (`engine.Engine`), when runs are DBOS workflows; None: they run in process."""
        self.children: Any = None
        """With the engine, where runs keep their sub-agents (`child_runs.DurableChildren`: each a durable run
        of its own); None: in process (`tracks.Children`)."""

    def lease_until(self) -> str:
        return at(time.time() + self.settings.run_lease_s)

    # -- starting and ending runs ------------------------------------------------------------------------

    async def start(self, conversation: dict[str, Any], prompt: Message | Sequence[Message], *, principal: Principal,
                    channel: Channel = "chat", overrides: dict[str, Any] | None = None,
                    wait_turn: bool = False, run_id: str | None = None, approver: Approver | None = None) -> ActiveRun:
        """Store the message(s) and start a run on them. A conversation has one active run at a time: 409
        `run_in_progress`, or with `wait_turn` the message waits behind the active run."""
        cid = conversation["id"]
        principal.check_agent(conversation["agent"])  # every route checked these; a run never starts without
        principal.check_realm(conversation["realm"])
        self.catalog.get(conversation["agent"]).check_home(conversation["realm"])
        if overrides and overrides.get("model") is not None:
            self.catalog.get(conversation["agent"]).check_model(overrides["model"], self.settings.model_dirs)
        if self.closing:
            raise ApiError(503, "unavailable", "the server is shutting down; send the message again shortly",
                           headers={"Retry-After": "5"})
        run_id = run_id or new_id("r")
        await self._take_turn(cid, principal.key_id, run_id, wait=wait_turn)
        run = self.active[cid] = ActiveRun(run_id, cid, conversation["agent"])
        durable = self.engine is not None
        try:  # a durable run is built here only to check its overrides: a worker builds it from its spec
            agent = self.catalog.get(conversation["agent"]).agent()
            history = [] if durable else await self.store.load_messages(cid)
            incoming = [prompt] if isinstance(prompt, Message) else list(prompt)
            # built (and its overrides checked) before anything is stored; it starts when first iterated
            run.stream = self.stream_for(run.agent, incoming, history, cid=cid, realm=conversation["realm"],
                                         principal=principal, channel=channel, run_id=run.run_id,
                                         request_id=request_id.get() or None, approver=approver,
                                         overrides=overrides)
            try:
                await self.store.create_run(run.run_id, agent=run.agent, conversation_id=cid,
                                            lease_owner=self.owner, lease_expires_at=self.lease_until(),
                                            incoming=incoming, realm=conversation["realm"], key_id=principal.key_id,
                                            kind="graph" if getattr(agent, "is_graph", False) else "loop")
            except ConversationBusy:  # a run of another process (or one that died and is not closed yet)
                raise ApiError(409, "run_in_progress", f"conversation {cid} already has an active run; wait "
                               "for it or POST …/cancel") from None
            except Exception as exc:
                if (reason := storage_error(exc)) is None:
                    raise
                raise ApiError(503, "unavailable", f"the server cannot store messages now ({reason}); send the "
                               "message again shortly", details={"reason": "storage_unavailable"},
                               headers={"Retry-After": "5"}) from None
            if durable:
                await self._enqueue(run, conversation, incoming, principal=principal, channel=channel,
                                    overrides=overrides, deny=isinstance(approver, AutoDeny),
                                    kind="graph" if getattr(agent, "is_graph", False) else "loop")
        except BaseException:
            self._release(run)
            raise
        if not durable:
            self.launch(run)
        return run

    async def _take_turn(self, cid: str, key: str, run_id: str, *, wait: bool) -> None:
        """Take the conversation's turn (409 `run_in_progress` while it has an active run) and a place among
        the key's active runs (429 past `max_runs_per_key`; `_release` frees it). The runs the server starts
        itself (`wait`: fires, schedules) wait for both instead."""
        if wait:
            await self.limits.runs.acquire(key, run_id)
        try:
            await self._turn(cid, wait=wait)
            self.limits.runs.hold(key, run_id)
        except BaseException:
            self.limits.runs.release(run_id)
            raise

    async def _turn(self, cid: str, *, wait: bool) -> None:
        while (current := self.active.get(cid)) is not None:
            if not wait:
                raise ApiError(409, "run_in_progress", f"conversation {cid} already has an active run "
                               f"({current.run_id}); wait for it or POST …/cancel", details={"run_id": current.run_id})
            await current.done.wait()

    async def _enqueue(self, run: ActiveRun, conversation: dict[str, Any], incoming: Sequence[Message], *,
                       principal: Principal, channel: Channel, overrides: dict[str, Any] | None, deny: bool,
                       kind: str) -> None:
        """Hand a stored run to the engine's queue; one that cannot be queued ends here, as failed."""
        assert self.engine is not None
        try:
            await self.engine.dispatch(run, conversation, incoming, principal=principal, channel=channel,
                                       overrides=overrides, request_id=request_id.get() or None, deny=deny,
                                       kind=kind)
        except Exception:
            log.exception("could not enqueue run %s", run.run_id)
            track = self.graphs.track(run, run.stream) or LoopTrack(self, run, run.stream)
            for event in await track.abandoned(0):  # a graph run's closing events are sent by the caller
                await self.emit(run.conversation_id, event, run)
            raise ApiError(503, "unavailable", "the server could not queue this run; send the message again "
                           "shortly", headers={"Retry-After": "5"}) from None

    def stream_for(self, name: str, incoming: Sequence[Message], history: Sequence[Message], *, cid: str,
                   realm: str, principal: Principal, channel: Channel, run_id: str, request_id: str | None,
                   approver: Approver | None, overrides: dict[str, Any] | None, steps: Any = None,
                   lineage: Any = None) -> Any:
        """The stream of a new run of agent `name` in conversation `cid`; it starts when first iterated.
        `steps`: a durable run's step executor (`ringlet.durable.DurableSteps`); `lineage`: a durable sub-agent's."""
        agent = self.catalog.get(name).agent()
        host = RunHost(lineage=lineage, realms=principal.realms, child_host=self.children or Children(self.store),
                       child_approver=InProcess(self, name, realm, cid), steps=steps,
                       schedules=self.schedule_book(cid, name, realm, principal.org_id, principal.user_id,
                                                    principal.key_id))
        return agent.stream(incoming, history=history, conversation_id=cid, realm=realm,
                            user_id=principal.user_id, org_id=principal.org_id, roles=principal.roles,
                            channel=channel, run_id=run_id, request_id=request_id, approver=approver, host=host,
                            **run_options(agent, overrides or {}))

    def schedule_book(self, cid: str, agent: str, realm: str, org_id: str | None, user_id: str | None,
                      key_id: str | None) -> ConversationSchedules:
        """The schedules a run's tools (`alarm_clock`, `schedule_task`) keep for its conversation: made by
        its user under its key, whose limits (`max_schedules_per_key`, `min_schedule_interval_s`) hold."""
        key = None if key_id is None else KeyQuota(key_id, int(self.settings.limit("max_schedules_per_key")),
                                                   float(self.settings.limit("min_schedule_interval_s")))
        return self.store.schedules.book(cid, agent=agent, realm=realm, org_id=org_id, created_by=user_id,
                                         max_active=self.settings.scheduler_max_per_conversation, key=key)

    def relaunch(self, run_id: str, cid: str, agent: str, stream: Any, *, applied: tuple[str, ...] = ()) -> None:
        """Drive a run that goes on (a resumed pause, a graph run from its checkpoint) in its conversation:
        its earlier events are in the store."""
        run = self.active[cid] = ActiveRun(run_id, cid, agent, stream=stream, resumed=True, applied=applied)
        self.launch(run)

    def adopt(self, run_id: str, cid: str, agent: str, stream: Any, *, resumed: bool,
              applied: tuple[str, ...] = ()) -> ActiveRun:
        """The run a durable workflow drives here (`engine.py`): the one this process started, or a new one."""
        run = self.active.get(cid)
        if run is None or run.run_id != run_id or run.stream is None or resumed:
            run = self.active[cid] = ActiveRun(run_id, cid, agent, resumed=resumed, applied=applied)
        run.stream = stream
        if run.watcher is not None:  # it executes here: the driver releases it
            watcher, run.watcher = run.watcher, None
            watcher.cancel()
        return run

    def launch(self, run: ActiveRun) -> None:
        """Drive `run` (its stream set) in the background; `close()` waits for it."""
        driver = asyncio.create_task(self._limited(run), name=f"ringlet-run-{run.run_id}")
        self._drivers.add(driver)
        driver.add_done_callback(self._drivers.discard)

    async def _limited(self, run: ActiveRun) -> None:
        """Drive `run` once a slot is free for it (in process; on the engine its queue holds it instead): its
        agent's own `max_concurrent_runs` when it has one, else the server's; meanwhile it is `queued`."""
        hosted = self.catalog.hosted.get(run.agent)
        own = getattr(hosted, "max_concurrent_runs", None)
        limit, key = (own, run.agent) if own else (self.settings.max_concurrent_runs, None)
        if not limit:
            return await self._drive(run, run.stream)
        self.queued.add(run.run_id)
        try:
            async with self._slots.setdefault(key, asyncio.Semaphore(limit)):
                self.queued.discard(run.run_id)
                await self._drive(run, run.stream)
        finally:
            self.queued.discard(run.run_id)

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[None]:
        """Run `work` in the background (failures are logged); `close()` waits for it."""

        async def logged() -> None:
            try:
                await work
            except Exception:
                log.exception("background work failed")

        task = asyncio.create_task(logged())
        self._drivers.add(task)
        task.add_done_callback(self._drivers.discard)
        return task

    async def start_unstored(self, agent: str, stream: AgentStream, *, principal: Principal, realm: str) -> ActiveRun:
        """Drive a run that has no conversation (`/v1` without one): its record (status, usage, cost) is
        stored, its transcript is not, and its events go only to `run.listener` (then None)."""
        if self.closing:
            raise ApiError(503, "unavailable", "the server is shutting down; send the request again shortly",
                           headers={"Retry-After": "5"})
        run = ActiveRun(stream.run_id, None, agent, stream=stream, listener=asyncio.Queue())
        self.limits.runs.hold(principal.key_id, run.run_id)  # 429 past the key's active runs
        self.unstored[run.run_id] = run
        try:
            await self.store.create_run(run.run_id, agent=agent, lease_owner=self.owner,
                                        lease_expires_at=self.lease_until(), realm=realm, key_id=principal.key_id)
        except BaseException:
            self._release(run)
            raise
        self.launch(run)
        return run

    def cancel(self, conversation_id: str) -> str | None:
        """Cancel the conversation's active run; its run id, or None when it has none."""
        run = self.active.get(conversation_id)
        if run is None:
            return None
        self.stop(run)
        return run.run_id

    def stop(self, run: ActiveRun) -> None:
        """Cancel `run`: it still ends with `message_end` (finish_reason `cancelled`)."""
        run.cancel_requested = True  # seen by _drive if the pump does not exist yet
        if run.pump is not None:
            run.pump.cancel()
        elif run.watcher is not None and self.engine is not None:  # it executes in another process
            self.spawn(self.engine.cancel(run.run_id))

    async def emit(self, conversation_id: str | None, event: Event, run: ActiveRun | None = None) -> int:
        """Append an event to the conversation's log, then hand it to the conversation's streams (and to
        the active `run`'s backlog, in the same step). A run with no conversation hands it to its listener."""
        payload = event.model_dump()
        event_id = 0 if conversation_id is None else \
            await self.writer.append(conversation_id, event.type, payload)
        self.publish(conversation_id, event, event_id, run, payload)
        return event_id

    def publish(self, conversation_id: str | None, event: Event, event_id: int, run: ActiveRun | None = None,
                 payload: dict[str, Any] | None = None) -> None:
        """Hand an event stored as `event_id` to the streams (`emit`). Id 0: an event that is not stored
        (a run with no conversation, or the end of a run whose storage failed), sent without an id."""
        item = Published.of(event_id, event.type, event.model_dump() if payload is None else payload)
        if conversation_id is None:
            listener = run.listener if run is not None else None
            assert listener is not None, "a run with no conversation has a listener"
            listener.put_nowait(item)
            return
        self.hub.publish(conversation_id, item)
        if run is not None:
            run.published.append(item)

    def backlog(self, conversation_id: str, run_id: str) -> list[Published] | None:
        """The events of `run_id` so far, when it is this process's active run (else None: read the store)."""
        run = self.active.get(conversation_id)
        if run is None or run.run_id != run_id or run.resumed or run.watcher is not None:
            return None  # not here (or executing in another process): read the store
        return list(run.published)

    async def _drive(self, run: ActiveRun, stream: AgentStream) -> None:
        handoff = Handoff()
        track = self.graphs.track(run, stream) or LoopTrack(self, run, stream)
        run.pump = asyncio.create_task(pump(stream, handoff))
        run.pump.add_done_callback(lambda _: handoff.inbox.put_nowait(None))  # however it ended, even unstarted
        await asyncio.sleep(0)  # let the pump start: a cancel then lands inside the loop, which closes the run
        if run.cancel_requested:
            run.pump.cancel()
        at, failure = Progress(track.start), None
        try:
            while (item := await handoff.inbox.get()) is not None:
                if isinstance(item, BaseException):
                    log.error("run %s failed outside the loop", run.run_id, exc_info=item)
                    break
                await self._take(run, track, item, at)
                handoff.stored()
        except Exception as exc:
            failure = exc
            if storage_error(exc) is None:
                log.exception("could not store the events of run %s", run.run_id)
        finally:
            handoff.close()
            if not run.pump.done():  # storing failed: never leave the agent running unobserved
                run.pump.cancel()
            if not at.ended and not run.handover:  # the run died without its message_end: close it the way a
                await self._abandon(run, track, at.saved, failure)  # stream expects
            self._release(run)
            if run.listener is not None:
                run.listener.put_nowait(None)
        if at.paused and run.driver is None:  # a decision may have arrived while the run was pausing: it
            await self.resume(run.run_id)  # resumes now (a durable run's workflow looks itself)
            track.paused()

    async def _take(self, run: ActiveRun, track: Any, item: Event, at: Progress) -> None:
        """Store one event of the run (and what it announces, and the transcript up to it), then send it. The
        run's last events wait for its `message_end`: all are stored with its end record."""
        own = getattr(item, "agent_path", None) is None  # a sub-agent's events are just forwarded
        if run.replay:  # a durable run executed again: what the execution that died logged is not again
            key = replay_key(item.type, lambda name: getattr(item, name, None))
            if key in run.replay:  # logged already (a batch's results may come back in another order)
                run.replay[key] -= 1
                if not run.replay[key]:
                    del run.replay[key]
                paused = own and item.type == "status" and getattr(run.stream, "paused", False)
                at.ended = at.ended or paused or (own and item.type == "message_end")
                at.paused = at.paused or paused
                return
        if own and item.type == "message_end":
            await self._end(run, track, at.saved, [*at.closing, item])  # the record is final as its end is sent
            at.closing, at.ended = [], True
            self._release(run)  # no await since the publish: a client that saw the end may send again
            return
        if own and (item.type == "error" or (isinstance(item, StatusEvent) and item.state in FINAL)):
            at.closing.append(item)
            return
        for held in at.closing:  # not the end after all: they go in order
            await self.emit(run.conversation_id, held, run)
        at.closing = []
        if await track.durable(item, at.saved):
            at.saved, at.ended, at.paused = track.stored(), True, True
        await self.emit(run.conversation_id, item, run)
        at.saved = await track.save(at.saved)

    async def _end(self, run: ActiveRun, track: Any, saved: int, closing: list[Event]) -> None:
        """Record the run's end with its last events; a graph run (`graph_runs.GraphTrack`) records its end,
        then its events are stored, then the record is marked logged (recovery writes them if it dies first)."""
        if isinstance(track, LoopTrack):
            await track.record_end(saved, closing)
            return
        for event in closing[:-1]:
            await self.emit(run.conversation_id, event, run)
        await track.record_end(saved)
        await self.emit(run.conversation_id, closing[-1], run)
        if run.conversation_id is not None:
            await self.store.end_logged(run.run_id)

    async def _abandon(self, run: ActiveRun, track: Any, saved: int, failure: BaseException | None) -> None:
        """Close a run that stopped without its `message_end`. When that cannot be stored either, its
        clients still get `error` (`storage_unavailable`, retryable) and `message_end`, sent but not stored;
        its record stays `working` and `recover()` closes it once storage is back."""
        reason = storage_error(failure) if failure is not None else None
        if reason is None:
            try:
                for event in await track.abandoned(saved):
                    await self.emit(run.conversation_id, event, run)
            except Exception as exc:
                if (reason := storage_error(exc)) is None:
                    log.exception("could not close run %s", run.run_id)
            else:
                return
        log.error("run %s ended for its clients: its events cannot be stored (%s)", run.run_id, reason)
        self.dropped.add(run.run_id)
        for event in unstored_end(run, reason or "the run could not be closed"):
            self.publish(run.conversation_id, event, 0, run)

    async def _durable(self, run: ActiveRun, stream: AgentStream, item: Event, saved: int) -> bool:
        """Store what an event announces before the event is told: an approval record, or the pause itself
        (True: the run paused)."""
        if getattr(item, "agent_path", None) is not None or run.conversation_id is None:
            return False  # a sub-agent's own run stores what it must; a run with no conversation waits here
        if item.type in ("approval_required", "question"):
            parked = stream.state.awaiting.get(item.tool_call_id)  # type: ignore[union-attr]
            if parked is None:  # asked inside a running call (an MCP elicitation): its asker stored it
                return False
            await self.store.add_approvals(run.run_id, [asdict(parked.request)], agent=run.agent,
                                           realm=stream.state.realm)
        elif item.type == "compaction":  # the covered messages are marked in the store, not removed
            note_id = item.summary_message_id  # type: ignore[union-attr]
            await self.store.update_messages(run.conversation_id, [
                m for m in stream.state.messages[:saved] if m.metadata.get("compacted_into") == note_id])
        elif item.type == "status" and stream.paused:
            await self._record_pause(run, stream, saved)
            return True
        return False

    async def _save(self, cid: str | None, messages: list[Message], saved: int) -> int:
        """Store `messages[saved:]` as they are now; returns the new mark. The run goes on while this
        awaits, so the mark is taken before the await: later messages are the next save's. A run with no
        conversation keeps no transcript."""
        end = len(messages)
        if cid is not None:
            await self.store.append_messages(cid, messages[saved:end])
        return end

    async def _record_end(self, run: ActiveRun, stream: AgentStream, saved: int, *, cancelled: bool = False,
                          closing: Sequence[Event] = ()) -> list[int]:
        """Store the rest of the transcript, the run's outcome and usage, the conversation's status and the
        run's `closing` events, in one transaction; the events' ids (0 for a run with no conversation)."""
        cid = run.conversation_id
        await self.store.executed(run.run_id, run.applied)
        result = run.result = stream.result
        usage = stream.state.usage
        status = result.status if result else "canceled" if cancelled else "failed"
        reason = result.finish_reason if result else "cancelled" if cancelled else "error"
        ids = await self.store.finish_run(
            run.run_id, status=status, finish_reason=reason,
            in_tokens=usage.in_tokens, out_tokens=usage.out_tokens, cost_usd=usage.cost_usd,
            state=json.loads(stream.state.to_json()) if cid else None, conversation_id=cid,
            new=stream.state.messages[saved:], conversation_status="idle",
            events=[(cid, e.type, e.model_dump()) for e in closing] if cid else [])
        return ids if cid else [0] * len(closing)

    async def _record_pause(self, run: ActiveRun, stream: AgentStream, saved: int) -> None:
        """Store the paused run's continuation with its approval records and new messages, in one
        transaction; the run then needs no process until a decision arrives."""
        st = stream.state
        await self.store.pause_run(
            run.run_id, state=json.loads(st.to_json()), requests=[asdict(p.request) for p in st.awaiting.values()],
            conversation_id=run.conversation_id, new=st.messages[saved:], in_tokens=st.usage.in_tokens,
            out_tokens=st.usage.out_tokens, cost_usd=st.usage.cost_usd, agent=run.agent, realm=st.realm)
        await self.store.executed(run.run_id, [c for c in run.applied if c not in st.awaiting])

    def _release(self, run: ActiveRun) -> None:
        if run.conversation_id is not None and self.active.get(run.conversation_id) is run:
            del self.active[run.conversation_id]
        self.unstored.pop(run.run_id, None)
        self.limits.runs.release(run.run_id)  # idempotent; a resumed run was never counted
        run.done.set()

    # -- runs paused for approvals (gates.md §4.6) ------------------------------------------------------

    async def resume(self, run_id: str) -> bool:
        """Resume a paused run with the decisions that have arrived, in whichever process this is. False
        when there is nothing to apply yet, or another process holds the run."""
        if self.closing or not await self._decided(run_id):
            return False  # nothing to apply: the run stays paused, untouched (its status never flickers)
        durable = self.engine is not None and await self.engine.durable(run_id)
        key = await self.store.run_key(run_id)  # it goes on as a run of the key that caused it
        if key is not None and self.limits.runs.full(key, run_id):
            self.spawn(self._resume_in_turn(run_id, key, durable))  # that key has its most: it waits its turn
            return True
        if key is not None:
            self.limits.runs.hold(key, run_id)
        return await self._go_on(run_id, durable, counted=key is not None)

    async def _resume_in_turn(self, run_id: str, key: str, durable: bool) -> None:
        await self.limits.runs.acquire(key, run_id)
        await self._go_on(run_id, durable, counted=True)

    async def _go_on(self, run_id: str, durable: bool, *, counted: bool) -> bool:
        """Resume a decided run; `counted`: holding its key's place, released when it ends or pauses again."""
        if durable:  # its workflow waits for the wake-up, wherever it is; followed here while it runs
            assert self.engine is not None
            if not counted:
                await self.engine.wake(run_id)
                return True
            record = await self.store.get_run(run_id)
            mark, _ = await self.store.event_marks(record["conversation_id"] or "") if record else (0, 0)
            await self.engine.wake(run_id)
            if record is not None and record["conversation_id"] is not None:
                self.engine.watch(ActiveRun(run_id, record["conversation_id"], record["agent"], resumed=True), mark)
            else:
                self.limits.runs.release(run_id)
            return True
        self._resuming.add(run_id)  # taken and alive: upkeep must not close it while it starts again
        try:
            resumed = await self._resume(run_id)
        finally:
            self._resuming.discard(run_id)
        if not resumed:
            self.limits.runs.release(run_id)
        return resumed

    async def _resume(self, run_id: str) -> bool:
        row = await self.store.take_paused_run(run_id, self.owner, self.lease_until())
        if row is None:
            return False
        cid, decisions = row["conversation_id"], {}
        starting = self.active.get(cid) if cid else None
        if starting is not None and starting.run_id != run_id:  # a message that will find the run paused
            await starting.done.wait()
        try:
            stream, decisions = await self._continuation(row)
        except Exception:
            log.exception("could not resume run %s; it stays paused", run_id)
            stream = None
        if stream is None or cid is None or cid in self.active:  # paused runs belong to conversations
            await self.store.pause_again(run_id)
            return False
        await self.store.set_status(cid, "running")
        self.relaunch(run_id, cid, row["agent"], stream, applied=tuple(decisions))
        return True

    async def _continuation(self, row: dict[str, Any]) -> tuple[Any, dict[str, ApprovalDecision]]:
        """The stream that continues a paused run (`row`, taken), or None while there is nothing to apply,
        with the decisions it applies by tool-call id. A graph run goes on from its checkpoint instead."""
        if row["kind"] == "graph":
            return await self.graphs.continuation(row), {}
        decisions = await self._decisions(row["id"], RunState.from_json(json.dumps(row["state"])))
        return (self.resumed_stream(row, decisions) if decisions else None), decisions

    def resumed_stream(self, row: dict[str, Any], decisions: dict[str, ApprovalDecision], *,
                       steps: Any = None) -> AgentStream:
        """The stream that continues the paused loop run `row` with `decisions` (`steps`: a durable run's)."""
        cid, state = row["conversation_id"], RunState.from_json(json.dumps(row["state"]))
        book = self.schedule_book(cid, row["agent"], state.realm, state.org_id, state.user_id,
                                  row.get("key_id")) if cid else None
        return self.catalog.get(row["agent"]).agent().resume_stream(
            state, decisions, host=RunHost(schedules=book, child_host=self.children or Children(self.store),
                                           child_approver=InProcess(self, row["agent"], state.realm, cid), steps=steps))

    async def continuation_of(self, run_id: str) -> dict[str, Any] | None:
        """A durable paused run's continuation, taking the run (`engine.py` records it as a step): its row
        and the decisions to apply (a graph run: its answers, `GraphRuns.answers`) as JSON, or None while
        nothing is decided."""
        if not await self._decided(run_id):
            return None
        row = await self.store.take_paused_run(run_id, self.owner, self.lease_until())
        if row is None:
            return None
        if row["kind"] == "graph":  # a graph run goes on with its question's answer
            taken = await self.graphs.answers(row)
        else:
            decisions = await self._decisions(run_id, RunState.from_json(json.dumps(row["state"])))
            taken = {"decisions": {k: asdict(d) for k, d in decisions.items()}} if decisions else None
        if taken is None:
            await self.store.pause_again(run_id)
            return None
        await self.store.set_status(row["conversation_id"], "running")
        return {"row": {k: row[k] for k in ("id", "conversation_id", "agent", "kind", "state", "key_id")}, **taken}

    async def _decided(self, run_id: str) -> bool:
        """Whether a call the paused run waits for has a decision (read only, before taking the run)."""
        awaiting = ((await self.store.run_state(run_id)) or {}).get("awaiting") or {}
        return any(r["tool_call_id"] in awaiting and r["status"] != "pending"
                   for r in await self.store.list_approvals(run_id=run_id))

    async def _decisions(self, run_id: str, state: RunState) -> dict[str, ApprovalDecision]:
        """The decisions to resume with, by tool-call id. An approved call moves to `executing` first, so
        it runs at most once; one found `executing` already was interrupted by a stopped process."""
        records = {r["tool_call_id"]: r for r in await self.store.list_approvals(run_id=run_id)
                   if r["tool_call_id"] in state.awaiting}
        moved = await self.store.mark_executing([r["approval_id"] for r in records.values()
                                                 if r["status"] == "approved"])
        out = {}
        for call_id, r in records.items():
            status = r["status"]
            if (status == "approved" and r["approval_id"] not in moved) or status == "pending":
                continue  # another process is applying it, or nobody has decided yet
            if status in ("approved", "denied", "expired", "cancelled", "executing", "answered"):
                out[call_id] = ApprovalDecision(status, r["decided_by"] or "system", r["note"],
                                                r["decided_at"] or now(), answer=r.get("answer"))
        return out

    async def decide(self, record: dict[str, Any], *, approved: bool, note: str | None,
                     decided_by: str, resume: bool = True) -> dict[str, Any]:
        """Decide one approval (the first decision wins) and resume its run. 409 when it was decided
        already or has expired."""
        approval_id, when = record["approval_id"], now()
        ok = await self.store.decide_approval(approval_id, status="approved" if approved else "denied",
                                              decided_by=decided_by, note=note, when=when)
        current = await self.store.get_approval(approval_id) or record
        if not ok:
            if current["status"] in ("pending", "expired"):
                await self.expire_due()
                raise ApiError(409, "approval_expired", f"approval {approval_id} expired at "
                               f"{current['expires_at']}; the call was denied", details={"status": "expired"})
            raise ApiError(409, "approval_already_decided", f"approval {approval_id} is already "
                           f"{current['status']} (by {current['decided_by']})",
                           details={"status": current["status"], "decided_by": current["decided_by"],
                                    "decided_at": current["decided_at"]})
        waiter = self._waiters.pop(approval_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(ApprovalDecision("approved" if approved else "denied", decided_by, note, when))
        elif resume and not await self.resume(record["run_id"]) and self.engine is not None:
            await self.engine.decided(approval_id)  # a process waiting for it in memory (a sub-agent's) hears
        return {"approval_id": approval_id, "status": "approved" if approved else "denied",
                "decided_by": decided_by, "decided_at": when}

    async def answer(self, record: dict[str, Any], answer: Any, *, answered_by: str) -> dict[str, Any]:
        """Answer one question (checked against it: 422 when it does not fit) and resume its run. 409 when
        it was answered already (or has expired, or was cancelled)."""
        try:
            value, freeform = checked_answer(record["question"], answer)
        except ValueError as exc:
            raise ApiError(422, "validation_error", str(exc), details={"question_id": record["approval_id"]}) \
                from None
        question_id, when, given = record["approval_id"], now(), {"answer": value, "freeform": freeform}
        if not await self.store.decide_approval(question_id, status="answered", decided_by=answered_by, note=None,
                                                when=when, answer=given):
            current = await self.store.get_approval(question_id) or record
            if current["status"] == "pending":  # past its deadline: expire it now
                await self.expire_due()
            raise ApiError(409, "question_already_answered", f"question {question_id} is "
                           f"{'expired' if current['status'] == 'pending' else current['status']}",
                           details={"status": current["status"], "answered_by": current["decided_by"]})
        waiter = self._waiters.pop(question_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(ApprovalDecision("answered", answered_by, answer=given, decided_at=when))
        elif not await self.resume(record["run_id"]) and self.engine is not None:
            await self.engine.decided(question_id)
        return {"question_id": question_id, "status": "answered"}

    async def heard(self, approval_id: str) -> None:
        """Another process recorded a decision one of this process's in-memory waiters waits for."""
        waiter = self._waiters.get(approval_id)
        record = await self.store.get_approval(approval_id) if waiter is not None else None
        if record is None or record["status"] == "pending" or waiter is None or waiter.done():
            return
        self._waiters.pop(approval_id, None)
        waiter.set_result(ApprovalDecision(record["status"], record["decided_by"] or "system", record["note"],
                                           record["decided_at"] or now(), answer=record.get("answer")))

    def approver(self, agent: str, realm: str) -> Approver:
        """How a run that is not stored waits: its requests are stored (so the approvals API finds them) and
        it waits in this process for their decisions; `approval_mode: deny` denies at once instead."""
        if self.settings.approval_mode == "deny":
            return AutoDeny("system:approval_mode", "this server denies calls that need approval")
        return InProcess(self, agent, realm)

    async def expire_due(self) -> int:
        """Expire every pending approval past its deadline and resume the runs they held; how many."""
        due = await self.store.expire_approvals(now())
        for run_id in dict.fromkeys(r["run_id"] for r in due):
            await self.resume(run_id)
        return len(due)

    def _expire_at(self, deadline: float) -> None:
        """Expire approvals at `deadline` (the durable sweep in `upkeep` covers restarts)."""

        async def later() -> None:
            await asyncio.sleep(max(0.0, deadline - time.time()) + 0.01)
            try:
                await self.expire_due()
            except Exception:
                log.exception("could not expire approvals")

        timer = asyncio.create_task(later())
        self._timers.add(timer)
        timer.add_done_callback(self._timers.discard)

    async def cancel_paused(self, conversation_id: str) -> str | None:
        """Cancel the conversation's paused run: its pending approvals become `cancelled` and the run ends
        with `cancelled` results. Its run id, or None when it has none."""
        run_id = await self.store.paused_run_of(conversation_id)
        if run_id is None:
            return None
        await self.store.cancel_approvals(run_id)
        await self.resume(run_id)
        return run_id

    # -- runs whose process died ---------------------------------------------------------------------------

    async def recover(self) -> int:
        """Close every run whose process died as interrupted (with `graph_auto_resume`, resume graph runs
        from their checkpoints instead); returns how many were closed. A process is known dead when its
        lease expired, or at once when it ran on this machine and has exited (`gone`): a restarted server
        closes its predecessor's runs before it reports ready. Runs this process ended without storing
        their end (`dropped`: storage failed) are closed too, and ended runs whose last events a dead
        process had not logged get them (`reconcile.log_end`)."""
        closed = 0
        stamp = now()
        mine = {run.run_id for run in (*self.active.values(), *self.unstored.values())} | self._resuming | self.held
        expired = {row["id"]: row for row in await self.store.expired_runs(stamp)}
        orphaned = {row["id"]: row for row in await self.store.working_runs()  # no need to wait for their lease
                    if row["id"] not in expired and (row["id"] in self.dropped if row["lease_owner"] == self.owner
                                                     else gone(row["lease_owner"]))}
        for row in [*expired.values(), *orphaned.values()]:
            if self.engine is not None and await self.engine.durable(row["id"]):
                continue  # its workflow goes on: a worker executes it again (`engine.Engine.hand_on`)
            if row["id"] in mine:  # alive here (its lease lapsed while the loop was busy): renew it
                await self.store.renew_leases(self.owner, self.lease_until())
                continue
            held_by = row["lease_owner"] if row["id"] in orphaned else None
            if not await self.store.claim_run(row["id"], self.owner, self.lease_until(), expired_before=stamp,
                                              held_by=held_by):
                continue  # another process took it
            try:
                if await self._applying(row):  # it died while applying decisions: back to its pause
                    await self.store.pause_again(row["id"])
                    await self.resume(row["id"])
                    continue
                if row["id"] not in self.dropped and await self.graphs.restart(row):  # graph_auto_resume
                    continue
                await self._interrupted(row)
                closed += 1
            except Exception:
                log.exception("could not close interrupted run %s", row["id"])
        for row in await self.store.unlogged_ends():
            owner = row["lease_owner"]
            if row["id"] in mine or not (owner == self.owner or gone(owner) or (row["lease_expires_at"] or "") < stamp):
                continue
            try:
                await log_end(self, row)
            except Exception:
                log.exception("could not log the end of run %s", row["id"])
        return closed

    async def _applying(self, row: dict[str, Any]) -> bool:
        """Whether the run died while executing approved calls of its paused round (its stored state still
        waits for them): resuming gives those calls `interrupted by restart` results."""
        awaiting = (row["state"] or {}).get("awaiting") or {}
        return bool(awaiting) and any(r["status"] == "executing" and r["tool_call_id"] in awaiting
                                      for r in await self.store.list_approvals(run_id=row["id"]))

    async def _interrupted(self, row: dict[str, Any]) -> None:
        await close_interrupted(self, row)

    # -- background upkeep -------------------------------------------------------------------------------

    async def upkeep(self) -> None:
        """Renew this process's leases, close expired runs, prune old events and idempotency keys."""
        lease = self.settings.run_lease_s
        last_sweep = 0.0
        while True:
            await asyncio.sleep(lease / 3)
            try:
                if not await self.store.db.probe():
                    continue  # storage still fails (a full disk): nothing to do until writes succeed
                await self.store.renew_leases(self.owner, self.lease_until())
                await self.recover()
                await self.expire_due()
                if time.monotonic() - last_sweep >= self.settings.sweep_interval_s:
                    last_sweep = time.monotonic()
                    await self.sweep()
            except Exception:
                log.exception("server upkeep failed; retrying")

    async def sweep(self) -> None:
        retention = self.settings.events_retention_hours * 3600
        await self.store.prune_events(at(time.time() - retention))
        await self.store.prune_requests(at(time.time() - 24 * 3600))
        await self.store.checkpoints.prune()  # graph checkpoints: 72 h after their run ended
        for cid in await self.store.transient_leftovers(at(time.time() - 3600)):  # a `/v1` run's whose
            await self.store.purge_conversation(cid)  # API process died while it followed the run

    async def close(self) -> None:
        """Cancel the active runs (each still ends with message_end), wait for them, flush the writer."""
        self.closing = True
        for timer in list(self._timers):
            timer.cancel()
        for run in [*self.active.values(), *self.unstored.values()]:
            if run.watcher is not None:  # it executes elsewhere and goes on
                run.watcher.cancel()
            else:
                self.stop(run)
        if self._drivers:
            with suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await asyncio.gather(*self._drivers, return_exceptions=True)
        await self.catalog.aclose()
        await self.writer.close()


def runner_of(request: Any) -> Runner:
    """The Runner of the app serving `request`."""
    return request.app.state.ringlet.runner
