"""Runs on the server: started from a message, driven to the end whatever the clients do, stored as they go.

    Runner.start() ──► pump task: iterates Agent.stream() ──► inbox ──► driver: store event, then publish
                                                                         │
                      SSE streams ◄── Hub (per-conversation, bounded) ◄──┘

Every event is appended to the conversation's event log (group commit, `EventWriter`) before the hub
hands it to the streams, so a stream that falls behind (its queue overflows) or reconnects reads the
rest from the store with no gap and no duplicate. Clients only read: a disconnect never touches a run;
`cancel()` cancels the pump, whose run still ends with `message_end`. Each run holds a lease in the
store; a run whose process died is closed as interrupted by whichever process sees the lease expire.
This is the one driver for every kind of run: a conversation's message, a trigger's or schedule's fire,
a resumed pause, a graph run, and a `/v1` request with or without a conversation (`start_unstored`: its
record is stored, its events go only to the requester). What a run stores as it goes is its track's
business: `_LoopTrack` here, `graph_runs.GraphTrack` for graph runs (which also resume from their
checkpoints: `graph_runs.GraphRuns`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections import defaultdict
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from typing import Any

from ringlet._ids import at, new_id, now
from ringlet.agent import AgentStream
from ringlet.context import Channel
from ringlet.errors import ConversationBusy
from ringlet.events import ErrorEvent, Event, MessageEndEvent, MessageStartEvent, StatusEvent, ToolResultEvent
from ringlet.gates.approval import NEVER, ApprovalDecision, ApprovalRequest, Approver, AutoDeny, epoch
from ringlet.loop import RunState
from ringlet.messages import Message, ToolCall
from ringlet.server.active import ActiveRun, Published
from ringlet.server.auth import Principal
from ringlet.server.catalog import Catalog
from ringlet.server.errors import ApiError, request_id
from ringlet.server.graph_runs import GraphRuns, checked_answer
from ringlet.server.limits import Limits
from ringlet.server.settings import ServerSettings
from ringlet.store import Store
from ringlet.store.writer import EventWriter

log = logging.getLogger("ringlet.server")


class Subscriber:
    """One stream's view of a conversation. When it falls `maxsize` events behind, `lagging` is set and
    it must catch up from the store; the publisher never waits for a slow client."""

    def __init__(self, maxsize: int) -> None:
        self.queue: asyncio.Queue[Published] = asyncio.Queue(maxsize)
        self.lagging = False


class Hub:
    def __init__(self, maxsize: int = 1024) -> None:
        self.maxsize = maxsize
        self._subscribers: defaultdict[str, set[Subscriber]] = defaultdict(set)

    @contextmanager
    def subscribe(self, conversation_id: str) -> Iterator[Subscriber]:
        subscriber = Subscriber(self.maxsize)
        subscribers = self._subscribers[conversation_id]
        subscribers.add(subscriber)
        try:
            yield subscriber
        finally:
            subscribers.discard(subscriber)
            if not subscribers:
                self._subscribers.pop(conversation_id, None)

    def publish(self, conversation_id: str, item: Published) -> None:
        for subscriber in self._subscribers.get(conversation_id, ()):
            if subscriber.lagging:
                continue
            try:
                subscriber.queue.put_nowait(item)
            except asyncio.QueueFull:
                subscriber.lagging = True


async def _pump(stream: AgentStream, inbox: asyncio.Queue[Event | BaseException | None]) -> None:
    """Move the run's events to the driver; its only await is inside the loop, so a cancel lands there."""
    try:
        async for event in stream:
            inbox.put_nowait(event)
    except asyncio.CancelledError:
        pass  # a cancelled run has already yielded its message_end
    except Exception as exc:
        inbox.put_nowait(exc)


_HOST = socket.gethostname()[:40]


def gone(owner: str | None) -> bool:
    """Whether the process behind a lease owner id (`Runner.owner`) ran on this machine and has exited.
    False when that cannot be known (another machine, an id of another form): its lease decides then."""
    _, at, place = (owner or "").rpartition("@")
    host, _, pid = place.rpartition(":")
    if not at or host != _HOST or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return True  # a process with our pid but another owner id: our predecessor (a restarted container)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, as another user
    return False


@dataclass(eq=False)
class _LoopTrack:
    """How `Runner._drive` stores a loop run as it goes: new messages as they come, approval records and
    the pause when announced, the rest at the end (a graph run's counterpart: `graph_runs.GraphTrack`)."""

    runner: Runner
    run: ActiveRun
    stream: AgentStream

    @property
    def start(self) -> int:
        return self.stream.state.history_length

    def stored(self) -> int:
        return len(self.stream.state.messages)

    async def durable(self, item: Event, saved: int) -> bool:
        return await self.runner._durable(self.run, self.stream, item, saved)

    async def save(self, saved: int) -> int:
        messages = self.stream.state.messages
        return await self.runner._save(self.run.conversation_id, messages, saved) if len(messages) > saved else saved

    async def record_end(self, saved: int) -> None:
        await self.runner._record_end(self.run, self.stream, saved)

    async def abandoned(self, saved: int) -> list[Event]:
        """The loop died without its message_end (or was cancelled before it began): close the run the way a
        stream expects, `message_start` first."""
        run, stream = self.run, self.stream
        rid, st = run.run_id, stream.state
        cancelled = run.cancel_requested and not run.published
        await self.runner._record_end(run, stream, saved, cancelled=cancelled)
        start = [] if run.published or run.resumed else [MessageStartEvent(
            run_id=rid, ts=now(), message_id=st.response_id, conversation_id=run.conversation_id, agent=run.agent)]
        end = MessageEndEvent(run_id=rid, ts=now(), message_id=st.response_id, usage=st.usage.summary(),
                              finish_reason="cancelled" if cancelled else "error")
        if cancelled:
            return [*start, StatusEvent(run_id=rid, ts=now(), state="canceled"), end]
        return [*start, ErrorEvent(run_id=rid, ts=now(), code="internal_error",
                                   message="the run stopped unexpectedly"), end]

    def paused(self) -> None:
        deadlines = [epoch(p.request.expires_at) for p in self.stream.state.awaiting.values()
                     if p.request.expires_at != NEVER]
        if deadlines:
            self.runner._expire_at(min(deadlines))


class _InProcess:
    """Waits in this process for decisions on stored requests (runs that are not stored, and sub-agents,
    whose requests are stored under their root conversation so they are answered through it)."""

    def __init__(self, runner: Runner, agent: str, realm: str, conversation_id: str | None = None) -> None:
        self.runner, self.agent, self.realm, self.conversation_id = runner, agent, realm, conversation_id

    async def wait(self, requests: Sequence[ApprovalRequest]) -> Mapping[str, ApprovalDecision]:
        runner = self.runner
        records = [{**asdict(r), "conversation_id": self.conversation_id or r.conversation_id} for r in requests]
        await runner.store.add_approvals(requests[0].run_id, records, agent=self.agent, realm=self.realm)
        loop = asyncio.get_running_loop()
        futures = {r.tool_call_id: runner._waiters.setdefault(r.approval_id, loop.create_future()) for r in requests}
        try:
            await asyncio.wait(futures.values(), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await runner.store.cancel_approvals(requests[0].run_id)
            raise
        finally:
            for r in requests:
                if futures[r.tool_call_id].done() or r.expired():
                    runner._waiters.pop(r.approval_id, None)
        return {call_id: f.result() for call_id, f in futures.items() if f.done()}


class _Children:
    """Where a server run's sub-agents live: each in a stored conversation of its own (hidden from default
    lists, with its transcript and usage); their humans are asked through the root conversation."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def opened(self, ctx: Any, agent: str, realm: str, conversation_id: str) -> None:
        await self.store.create_conversation(
            agent=agent, realm=realm, org_id=ctx.org_id, user_id=ctx.user_id, parent_run_id=ctx.run_id,
            conversation_id=conversation_id, parent_conversation_id=ctx.conversation_id,
            parent_tool_call_id=ctx.tool_call_id)

    async def closed(self, conversation_id: str, stream: Any) -> None:
        st = stream.state
        await self.store.append_messages(conversation_id, st.messages[st.history_length:])
        await self.store.add_usage(conversation_id, st.usage.in_tokens, st.usage.out_tokens, st.usage.cost_usd)


class Runner:
    """Starts, drives, cancels and recovers the runs of stored conversations."""

    def __init__(self, store: Store, catalog: Catalog, settings: ServerSettings) -> None:
        self.store, self.catalog, self.settings = store, catalog, settings
        self.writer = EventWriter(store)
        self.hub = Hub()
        self.owner = f"{new_id('proc')}@{_HOST}:{os.getpid()}"
        """This process's lease owner id: where it runs, so a successor on this machine knows it is gone."""
        self.active: dict[str, ActiveRun] = {}
        self.unstored: dict[str, ActiveRun] = {}
        """Runs with no conversation (`/v1` without one), by run id."""
        self.held: set[str] = set()
        """Direct tool calls this process holds while they wait for a human (`tool_calls.py`), by run id."""
        self._drivers: set[asyncio.Task[None]] = set()
        self._timers: set[asyncio.Task[None]] = set()
        self._resuming: set[str] = set()
        """Paused runs this process has taken and is starting again (alive, though not active yet)."""
        self._waiters: dict[str, asyncio.Future[ApprovalDecision]] = {}
        """Approvals of runs that are not stored (the /v1 API without a conversation), by approval id."""
        self.closing = False
        self.graphs = GraphRuns(self)
        self.limits = Limits.of(settings)
        """Per-key limits of this process: request rate, open streams, active runs (`limits.py`)."""

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
        if overrides and overrides.get("model") is not None:
            self.catalog.get(conversation["agent"]).check_model(overrides["model"], self.settings.model_dirs)
        if self.closing:
            raise ApiError(503, "unavailable", "the server is shutting down; send the message again shortly",
                           headers={"Retry-After": "5"})
        while (current := self.active.get(cid)) is not None:
            if not wait_turn:
                raise ApiError(409, "run_in_progress", f"conversation {cid} already has an active run "
                               f"({current.run_id}); wait for it or POST …/cancel",
                               details={"run_id": current.run_id})
            await current.done.wait()
        agent = self.catalog.get(conversation["agent"]).agent()
        run_id = run_id or new_id("r")
        if not wait_turn:  # 429 past the key's active runs (_release frees it); the runs the server starts
            self.limits.runs.hold(principal.key_id, run_id)  # itself (triggers, schedules) wait their turn
        run = self.active[cid] = ActiveRun(run_id, cid, conversation["agent"])
        try:
            history = await self.store.load_messages(cid)
            incoming = [prompt] if isinstance(prompt, Message) else list(prompt)
            # built (and its overrides checked) before anything is stored; it starts when first iterated
            run.stream = agent.stream(incoming, history=history, conversation_id=cid, realm=conversation["realm"],
                                      user_id=principal.user_id, org_id=principal.org_id, roles=principal.roles,
                                      channel=channel, run_id=run.run_id, request_id=request_id.get() or None,
                                      approver=approver, realms=principal.realms, child_host=_Children(self.store),
                                      child_approver=_InProcess(self, conversation["agent"], conversation["realm"],
                                                                cid),
                                      **(overrides or {}),
                                      schedules=self.store.schedules.book(  # alarm_clock, schedule_task
                                          cid, agent=conversation["agent"], realm=conversation["realm"],
                                          org_id=principal.org_id, created_by=principal.user_id,
                                          max_active=self.settings.scheduler_max_per_conversation))
            try:
                await self.store.create_run(run.run_id, agent=run.agent, conversation_id=cid,
                                            lease_owner=self.owner, lease_expires_at=self.lease_until(),
                                            incoming=incoming, realm=conversation["realm"],
                                            kind="graph" if getattr(agent, "is_graph", False) else "loop")
            except ConversationBusy:  # a run of another process (or one that died and is not closed yet)
                raise ApiError(409, "run_in_progress", f"conversation {cid} already has an active run; wait "
                               "for it or POST …/cancel") from None
        except BaseException:
            self._release(run)
            raise
        self.launch(run)
        return run

    def relaunch(self, run_id: str, cid: str, agent: str, stream: Any, *, applied: tuple[str, ...] = ()) -> None:
        """Drive a run that goes on (a resumed pause, a graph run from its checkpoint) in its conversation:
        its earlier events are in the store."""
        run = self.active[cid] = ActiveRun(run_id, cid, agent, stream=stream, resumed=True, applied=applied)
        self.launch(run)

    def launch(self, run: ActiveRun) -> None:
        """Drive `run` (its stream set) in the background; `close()` waits for it."""
        driver = asyncio.create_task(self._drive(run, run.stream), name=f"ringlet-run-{run.run_id}")
        self._drivers.add(driver)
        driver.add_done_callback(self._drivers.discard)

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
                                        lease_expires_at=self.lease_until(), realm=realm)
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

    async def emit(self, conversation_id: str | None, event: Event, run: ActiveRun | None = None) -> int:
        """Append an event to the conversation's log, then hand it to the conversation's streams (and to
        the active `run`'s backlog, in the same step). A run with no conversation hands it to its listener."""
        payload = event.model_dump()
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        if conversation_id is None:
            listener = run.listener if run is not None else None
            assert listener is not None, "a run with no conversation has a listener"
            listener.put_nowait(Published(0, event.type, payload.get("run_id"), data, "agent_path" in payload))
            return 0
        event_id = await self.writer.append(conversation_id, event.type, payload)
        item = Published(event_id, event.type, payload.get("run_id"), data, "agent_path" in payload)
        self.hub.publish(conversation_id, item)
        if run is not None:
            run.published.append(item)
        return event_id

    def backlog(self, conversation_id: str, run_id: str) -> list[Published] | None:
        """The events of `run_id` so far, when it is this process's active run (else None: read the store)."""
        run = self.active.get(conversation_id)
        return list(run.published) if run is not None and run.run_id == run_id and not run.resumed else None

    async def _drive(self, run: ActiveRun, stream: AgentStream) -> None:
        cid, inbox = run.conversation_id, asyncio.Queue[Event | BaseException | None]()
        track = self.graphs.track(run, stream) or _LoopTrack(self, run, stream)
        run.pump = asyncio.create_task(_pump(stream, inbox))
        run.pump.add_done_callback(lambda _: inbox.put_nowait(None))  # however it ended, even unstarted
        await asyncio.sleep(0)  # let the pump start: a cancel then lands inside the loop, which closes the run
        if run.cancel_requested:
            run.pump.cancel()
        saved, ended, paused = track.start, False, False
        try:
            while (item := await inbox.get()) is not None:
                if isinstance(item, BaseException):
                    log.error("run %s failed outside the loop", run.run_id, exc_info=item)
                    break
                # the run's record is final before its end is sent (a sub-agent's end is just forwarded)
                if item.type == "message_end" and getattr(item, "agent_path", None) is None:
                    await track.record_end(saved)
                    await self.emit(cid, item, run)
                    ended = True
                    self._release(run)  # no await since the publish: a client that saw the end may send again
                    continue
                if await track.durable(item, saved):
                    saved, ended, paused = track.stored(), True, True
                await self.emit(cid, item, run)
                saved = await track.save(saved)
        finally:
            if not run.pump.done():  # storing failed: never leave the agent running unobserved
                run.pump.cancel()
            if not ended:  # the run died without its message_end: close it the way a stream expects
                closing = await track.abandoned(saved)
                with suppress(Exception):
                    for event in closing:
                        await self.emit(cid, event, run)
            self._release(run)
            if run.listener is not None:
                run.listener.put_nowait(None)
        if paused:  # a decision may have arrived while the run was pausing: it resumes now
            await self.resume(run.run_id)
            track.paused()

    async def _durable(self, run: ActiveRun, stream: AgentStream, item: Event, saved: int) -> bool:
        """Store what an event announces before the event is told: an approval record, or the pause itself
        (True: the run paused)."""
        if getattr(item, "agent_path", None) is not None or run.conversation_id is None:
            return False  # a sub-agent's own run stores what it must; a run with no conversation waits here
        if item.type in ("approval_required", "question"):
            parked = stream.state.awaiting[item.tool_call_id]  # type: ignore[union-attr]
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

    async def _record_end(self, run: ActiveRun, stream: AgentStream, saved: int, *, cancelled: bool = False) -> None:
        """Store the rest of the transcript, the run's outcome and usage, and the conversation's status."""
        cid = run.conversation_id
        try:
            await self.store.executed(run.run_id, run.applied)
            result = run.result = stream.result
            usage = stream.state.usage
            status = result.status if result else "canceled" if cancelled else "failed"
            reason = result.finish_reason if result else "cancelled" if cancelled else "error"
            await self.store.finish_run(
                run.run_id, status=status, finish_reason=reason,
                in_tokens=usage.in_tokens, out_tokens=usage.out_tokens, cost_usd=usage.cost_usd,
                state=json.loads(stream.state.to_json()) if cid else None, conversation_id=cid,
                new=stream.state.messages[saved:], conversation_status="idle")
        except Exception:
            log.exception("could not record the end of run %s", run.run_id)

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
        self._resuming.add(run_id)  # taken and alive: upkeep must not close it while it starts again
        try:
            return await self._resume(run_id)
        finally:
            self._resuming.discard(run_id)

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
        run_id, cid = row["id"], row["conversation_id"]
        state = RunState.from_json(json.dumps(row["state"]))
        decisions = await self._decisions(run_id, state)
        book = self.store.schedules.book(
            cid, agent=row["agent"], realm=state.realm, org_id=state.org_id, created_by=state.user_id,
            max_active=self.settings.scheduler_max_per_conversation) if cid else None
        stream = self.catalog.get(row["agent"]).agent().resume_stream(
            state, decisions, schedules=book, child_host=_Children(self.store),
            child_approver=_InProcess(self, row["agent"], state.realm, cid)) if decisions else None
        return stream, decisions

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
        elif resume:
            await self.resume(record["run_id"])
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
        else:
            await self.resume(record["run_id"])
        return {"question_id": question_id, "status": "answered"}

    def approver(self, agent: str, realm: str) -> Approver:
        """How a run that is not stored waits: its requests are stored (so the approvals API finds them) and
        it waits in this process for their decisions; `approval_mode: deny` denies at once instead."""
        if self.settings.approval_mode == "deny":
            return AutoDeny("system:approval_mode", "this server denies calls that need approval")
        return _InProcess(self, agent, realm)

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
        closes its predecessor's runs before it reports ready."""
        closed = 0
        stamp = now()
        mine = {run.run_id for run in (*self.active.values(), *self.unstored.values())} | self._resuming | self.held
        expired = {row["id"]: row for row in await self.store.expired_runs(stamp)}
        orphaned = {row["id"]: row for row in await self.store.working_runs()  # no need to wait for their lease
                    if row["id"] not in expired and row["lease_owner"] != self.owner and gone(row["lease_owner"])}
        for row in [*expired.values(), *orphaned.values()]:
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
                if await self.graphs.restart(row):  # graph_auto_resume: it goes on from its checkpoint
                    continue
                await self._interrupted(row)
                closed += 1
            except Exception:
                log.exception("could not close interrupted run %s", row["id"])
        return closed

    async def _applying(self, row: dict[str, Any]) -> bool:
        """Whether the run died while executing approved calls of its paused round (its stored state still
        waits for them): resuming gives those calls `interrupted by restart` results."""
        awaiting = (row["state"] or {}).get("awaiting") or {}
        return bool(awaiting) and any(r["status"] == "executing" and r["tool_call_id"] in awaiting
                                      for r in await self.store.list_approvals(run_id=row["id"]))

    async def _interrupted(self, row: dict[str, Any]) -> None:
        if row["kind"] == "direct":
            await self._interrupted_call(row)
            return
        run_id, cid = row["id"], row["conversation_id"]
        finish_reason, closing = "error", None
        if cid is not None:
            logged = await self.store.events_after(cid, 0, limit=100_000, run_id=run_id)
            end = next((p for _, kind, p in logged if kind == "message_end"), None)
            if end is not None:  # the run ended; only its bookkeeping was lost
                finish_reason = end["finish_reason"]
            else:
                message_id = await self._keep_partial(cid, run_id, logged)
                if not any(kind == "message_start" for _, kind, _ in logged):  # it died before its first event
                    await self.emit(cid, MessageStartEvent(run_id=run_id, ts=now(), message_id=message_id,
                                                           conversation_id=cid, agent=row["agent"]))
                await self._settle_open_calls(cid, run_id)
                await self.emit(cid, ErrorEvent(run_id=run_id, ts=now(), code="interrupted", retryable=False,
                                                message="the server stopped while this run was working"))
                closing = MessageEndEvent(run_id=run_id, ts=now(), message_id=message_id, finish_reason="error",
                                          usage={"in_tokens": row["in_tokens"], "out_tokens": row["out_tokens"],
                                                 "cost_usd": row["cost_usd"]})
        status = {"error": "failed", "cancelled": "canceled"}.get(finish_reason, "completed")
        await self.store.finish_run(run_id, status=status, finish_reason=finish_reason, in_tokens=row["in_tokens"],
                                    out_tokens=row["out_tokens"], cost_usd=row["cost_usd"])
        if cid is not None:  # the record is final before the end is sent (a client may resume it at once)
            await self.store.set_status(cid, "idle")
            if closing is not None:
                await self.emit(cid, closing)
        log.warning("run %s was interrupted (its process stopped); closed it", run_id)

    async def _interrupted_call(self, row: dict[str, Any]) -> None:
        """A direct tool call (`tool_calls.py`) whose process died while it waited for a human or ran:
        its approval is cancelled, and the conversation gets its `interrupted` result (stored and sent)."""
        run_id, cid = row["id"], row["conversation_id"]
        records = await self.store.list_approvals(run_id=run_id)
        await self.store.cancel_approvals(run_id)
        error = {"code": "interrupted", "message": "the server stopped before this call was decided or finished; "
                                                   "call the tool again"}
        stamp = now()
        for r in records:
            if r["status"] in ("pending", "approved", "executing"):
                call = ToolCall(id=r["tool_call_id"], name=r["tool"], arguments=r["args"] or {},
                                raw_arguments=json.dumps(r["args"] or {}))
                meta = {"source": "direct", "duration": 0}
                await self.emit(cid, ToolResultEvent(run_id=run_id, ts=stamp, tool_call_id=call.id, name=call.name,
                                                     error=error, is_error=True, duration_ms=0.0, truncated=False))
                await self.store.append_messages(cid, [
                    Message(id=new_id("m"), role="assistant", tool_calls=(call,), run_id=run_id, conversation_id=cid,
                            created_at=stamp, metadata=meta),
                    Message(id=new_id("m"), role="tool", content=json.dumps({"error": error}), tool_call_id=call.id,
                            name=call.name, run_id=run_id, conversation_id=cid, created_at=stamp,
                            metadata={**meta, "is_tool_result": True, "is_error": True, "interrupted": True})])
        await self.store.finish_run(run_id, status="failed", finish_reason="error", in_tokens=0, out_tokens=0,
                                    cost_usd=None)
        log.warning("direct tool call run %s was interrupted (its process stopped); closed it", run_id)

    async def _settle_open_calls(self, cid: str, run_id: str) -> None:
        """Give every tool call of the run that has no result an `interrupted` error result (stored and
        sent), so the transcript stays one providers accept."""
        transcript = await self.store.load_messages(cid, limit=500)
        answered = {m.tool_call_id for m in transcript if m.role == "tool"}
        open_calls = [c for m in transcript if m.run_id == run_id for c in m.tool_calls if c.id not in answered]
        error = {"code": "interrupted", "message": "the server stopped while this tool was running"}
        for c in open_calls:
            await self.emit(cid, ToolResultEvent(run_id=run_id, ts=now(), tool_call_id=c.id, name=c.name,
                                                 error=error, is_error=True, duration_ms=0.0, truncated=False))
        await self.store.append_messages(cid, [Message(
            id=new_id("m"), role="tool", content=json.dumps({"error": error}), tool_call_id=c.id, name=c.name,
            run_id=run_id, conversation_id=cid, created_at=now(),
            metadata={"is_tool_result": True, "is_error": True, "interrupted": True}) for c in open_calls])

    async def _keep_partial(self, cid: str, run_id: str, logged: list[tuple[int, str, dict[str, Any]]]) -> str:
        """Store the text streamed for a message that never completed, marked `interrupted`; returns the
        id `message_end` should name."""
        start = next((p["message_id"] for _, kind, p in logged if kind == "message_start"), new_id("m"))
        stored = {m.id for m in await self.store.load_messages(cid, limit=500)}
        partial: dict[str, list[str]] = {}
        for _, kind, p in logged:  # (a graph's llm nodes stream text of their own: it is not the answer)
            if kind == "content_delta" and p["message_id"] not in stored and "node_id" not in p:
                partial.setdefault(p["message_id"], []).append(p["delta"])
        for message_id, deltas in partial.items():
            await self.store.append_messages(cid, [Message(
                id=message_id, role="assistant", content="".join(deltas), run_id=run_id, conversation_id=cid,
                created_at=now(), metadata={"interrupted": True})])
        return next(reversed(partial), start)

    # -- background upkeep -------------------------------------------------------------------------------

    async def upkeep(self) -> None:
        """Renew this process's leases, close expired runs, prune old events and idempotency keys."""
        lease = self.settings.run_lease_s
        last_sweep = 0.0
        while True:
            await asyncio.sleep(lease / 3)
            try:
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

    async def close(self) -> None:
        """Cancel the active runs (each still ends with message_end), wait for them, flush the writer."""
        self.closing = True
        for timer in list(self._timers):
            timer.cancel()
        for run in [*self.active.values(), *self.unstored.values()]:
            self.stop(run)
        if self._drivers:
            with suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await asyncio.gather(*self._drivers, return_exceptions=True)
        await self.catalog.aclose()
        await self.writer.close()
