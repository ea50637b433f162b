"""The one driver of every run (DESIGN §1): it takes each event of a run's stream, stores it (and what it
announces, and the transcript up to it), then hands it to the conversation's streams; it ends the run with
its last events in the transaction that records its end, or, when the run stops without its
`message_end`, closes it the way a stream expects.

    RunDriver.launch(run) ──► drive: pump task iterates Agent.stream() ──► handoff ──► take: store, then publish
                                       ▲ (waits until stored)                            │
                                       └─────────────────────────────────────────────────┘

Every event is appended to the conversation's event log (group commit, `EventWriter`) before the hub
hands it to the streams, so a stream that falls behind or reconnects reads the rest from the store with
no gap and no duplicate. The pump hands over one event at a time and the loop goes on only once it is
stored, with the transcript up to it (`Handoff`): nothing the loop does after an event (invoke a tool, add
a message) is kept while that event is lost, so a tool's `tool_call_start` is durable before the tool
runs. An answer's text deltas (`content_delta`) and a run's `message_start` are the exception, since the
loop does nothing on them: each is handed to the writer and the loop goes on at once, so an answer's tokens
share commits; each is still sent only once stored, in order, and the next other event waits until they all
are (a tool call's deltas are not: its arguments are in the log before it runs). The next event joins their
commit when it can (`joins`: status `working` after `message_start`, a tool call's start after the text):
it is queued behind them before they are stored. A delta that cannot be stored stops the run at once, as
any event would.
When the storage fails (a full disk, a lock past its timeout), a run that cannot store an event ends for
its clients with `error {code: storage_unavailable, retryable: true}` and `message_end`, which are sent
but not stored; its record stays `working` and recovery closes it once writes succeed again.
What a run stores as it goes is its track's business (`tracks.LoopTrack`, `graphs.GraphTrack`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ringlet.agent import AgentStream
from ringlet.events import Event, StatusEvent
from ringlet.graph.agent import GraphStream
from ringlet.server.durable.reconcile import FINAL
from ringlet.server.runs.active import ActiveRun, Handoff, Published, pump, replay_key
from ringlet.server.runs.graphs import CanceledRun, GraphTrack
from ringlet.server.runs.here import Here
from ringlet.server.runs.tracks import LoopTrack, Progress, unstored_end
from ringlet.store import Store
from ringlet.store.engine import storage_error
from ringlet.store.writer import EventWriter

if TYPE_CHECKING:
    from ringlet.server.catalog import Catalog
    from ringlet.server.http.settings import ServerSettings
    from ringlet.server.runs.pauses import Pauses

log = logging.getLogger("ringlet.server")
DELTAS = frozenset({"content_delta", "message_start"})
"""Events the loop does nothing on: stored without the loop waiting for them (`RunDriver.stream_delta`)."""


def joins(item: Event) -> bool:
    """Whether an event that follows lingering ones (`DELTAS`) is appended before they are stored, so it
    shares their commit: status `working` after `message_start`, a tool call's start after the answer's
    text. It is still stored before the loop goes on, and sent after them."""
    return item.type == "tool_call_start" or (isinstance(item, StatusEvent) and item.state == "working")


class RunDriver:
    """Drives runs in this process: each in a task of its own (`launch`), within the concurrency limits."""

    pauses: Pauses
    """What wakes a run that paused with its decisions already made, and expires its approvals on time: set
    by the wiring (`runner.Runner`), since resuming a run launches it here again."""

    def __init__(self, store: Store, catalog: Catalog, settings: ServerSettings, here: Here,
                 writer: EventWriter) -> None:
        self.store, self.catalog, self.settings, self.here, self.writer = store, catalog, settings, here, writer
        self.dropped = here.dropped
        """(`reconcile.Closer`: the runs this process ended without storing their end.)"""
        self._slots: dict[str | None, asyncio.Semaphore] = {}
        """In process: one semaphore per `max_concurrent_runs` (the server's, keyed None, or an agent's)."""

    def launch(self, run: ActiveRun) -> None:
        """Drive `run` (its stream set) in the background; `close()` waits for it."""
        driver = asyncio.create_task(self._limited(run), name=f"ringlet-run-{run.run_id}")
        self.here.tasks.add(driver)
        driver.add_done_callback(self.here.tasks.discard)

    def relaunch(self, run_id: str, cid: str, agent: str, stream: Any, *, applied: tuple[str, ...] = ()) -> None:
        """Drive a run that goes on (a resumed pause, a graph run from its checkpoint) in its conversation:
        its earlier events are in the store."""
        run = self.here.active[cid] = ActiveRun(run_id, cid, agent, stream=stream, resumed=True, applied=applied)
        self.launch(run)

    def track(self, run: ActiveRun, stream: Any) -> LoopTrack | GraphTrack:
        """How `run` is stored as it goes: a graph run's way, or a loop run's."""
        if isinstance(stream, GraphStream | CanceledRun):
            return GraphTrack(self.store, self.here, run, stream)
        return LoopTrack(self.store, self.publish, self.pauses.expire_at, run, stream)

    async def _limited(self, run: ActiveRun) -> None:
        """Drive `run` once a slot is free for it (in process; on the engine its queue holds it instead): its
        agent's own `max_concurrent_runs` when it has one, else the server's; meanwhile it is `queued`."""
        hosted = self.catalog.hosted.get(run.agent)
        own = getattr(hosted, "max_concurrent_runs", None)
        limit, key = (own, run.agent) if own else (self.settings.max_concurrent_runs, None)
        if not limit:
            return await self.drive(run, run.stream)
        self.here.queued.add(run.run_id)
        try:
            async with self._slots.setdefault(key, asyncio.Semaphore(limit)):
                self.here.queued.discard(run.run_id)
                await self.drive(run, run.stream)
        finally:
            self.here.queued.discard(run.run_id)

    async def emit(self, conversation_id: str | None, event: Event, run: ActiveRun | None = None) -> int:
        """Append an event to the conversation's log, then hand it to the conversation's streams (and to
        the active `run`'s backlog, in the same step). A run with no conversation hands it to its listener."""
        payload = event.model_dump()
        event_id = 0 if conversation_id is None else \
            await self.writer.append(conversation_id, event.type, payload)
        self.publish(conversation_id, event, event_id, run, payload)
        return event_id

    def stream_delta(self, run: ActiveRun, event: Event, at: Progress, handoff: Handoff) -> None:
        """Store a streamed delta without waiting: published once stored (the writer settles in order, so
        deltas go out in order); after one that could not be stored, none is sent (`_stored` raises)."""
        payload = event.model_dump()
        storing = asyncio.ensure_future(self.writer.append(run.conversation_id or "", event.type, payload,
                                                           linger=True, lead=event.type == "message_start"))

        def stored(done: asyncio.Future[int]) -> None:
            if at.failure is None:
                at.failure = done.exception()
                if at.failure is None:
                    self.publish(run.conversation_id, event, done.result(), run, payload)
                else:  # the driver stops now (`drive`), not at the run's next other event
                    handoff.inbox.put_nowait(at.failure)

        storing.add_done_callback(stored)
        at.storing = storing

    async def _stored(self, at: Progress) -> None:
        """Wait until the run's streamed deltas are stored (and sent); raise why one could not be."""
        if at.storing is not None:
            self.writer.hurry()
            await asyncio.wait([at.storing])
            at.storing = None
        if at.failure is not None:
            raise at.failure

    async def _lingering(self, run: ActiveRun, track: Any, item: Event, at: Progress, handoff: Handoff) -> bool:
        """Whether the run's own `item` was taken as a lingering event (`DELTAS`: stored without the loop
        waiting), or as one that joins their commit (`joins`: appended before they are stored, then sent
        after them, and stored before the loop goes on). When one of those before it cannot be stored, the
        run stops there and `item` is not sent."""
        if item.type in DELTAS:
            self.stream_delta(run, item, at, handoff)
            return True
        if at.storing is None or not joins(item):
            return False
        payload = item.model_dump()
        appending = self.writer.put(run.conversation_id or "", item.type, payload)  # queued behind them now
        appending.add_done_callback(lambda done: done.cancelled() or done.exception())  # (retrieved either way)
        await self._stored(at)
        self.publish(run.conversation_id, item, await appending, run, payload)
        at.saved = await track.save(at.saved)
        return True

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
        self.here.hub.publish(conversation_id, item)
        if run is not None:
            run.published.append(item)

    def backlog(self, conversation_id: str, run_id: str) -> list[Published] | None:
        """The events of `run_id` so far, when it is this process's active run (else None: read the store)."""
        run = self.here.active.get(conversation_id)
        if run is None or run.run_id != run_id or run.resumed or run.watcher is not None:
            return None  # not here (or executing in another process): read the store
        return list(run.published)

    async def drive(self, run: ActiveRun, stream: AgentStream) -> None:
        handoff = Handoff()
        track = self.track(run, stream)
        run.pump = asyncio.create_task(pump(stream, handoff))
        run.pump.add_done_callback(lambda _: handoff.inbox.put_nowait(None))  # however it ended, even unstarted
        await asyncio.sleep(0)  # let the pump start: a cancel then lands inside the loop, which closes the run
        if run.cancel_requested:
            run.pump.cancel()
        at, failure = Progress(track.start), None
        try:
            while (item := await handoff.inbox.get()) is not None:
                if isinstance(item, BaseException):
                    if item is not at.failure:  # (a delta that could not be stored: `_stored` raises it)
                        log.error("run %s failed outside the loop", run.run_id, exc_info=item)
                    break
                await self._take(run, track, item, at, handoff)
                handoff.stored()
            await self._stored(at)
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
            self.release(run)
            if run.listener is not None:
                run.listener.put_nowait(None)
        if at.paused and run.driver is None:  # a decision may have arrived while the run was pausing: it
            await self.pauses.resume(run.run_id)  # resumes now (a durable run's workflow looks itself)
            track.paused()

    async def _take(self, run: ActiveRun, track: Any, item: Event, at: Progress, handoff: Handoff) -> None:
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
        if own and not at.closing and run.conversation_id is not None and await self._lingering(run, track, item,
                                                                                               at, handoff):
            return
        await self._stored(at)
        if own and item.type == "message_end":
            await self._end(run, track, at.saved, [*at.closing, item])  # the record is final as its end is sent
            at.closing, at.ended = [], True
            self.release(run)  # no await since the publish: a client that saw the end may send again
            return
        if own and (item.type == "error" or (isinstance(item, StatusEvent) and (
                item.state in FINAL or (item.state == "input_required" and getattr(run.stream, "ending", False))))):
            at.closing.append(item)  # the run's last events (a run that ends handing calls to its client ends
            return  # `input_required`): stored and sent with its message_end, then the run lets go at once
        if at.closing and item.type == "notification":  # told while the run ends (a hook that timed out):
            await self.emit(run.conversation_id, item, run)  # sent now, the run's last events kept together
            return
        for held in at.closing:  # not the end after all: they go in order
            await self.emit(run.conversation_id, held, run)
        at.closing = []
        if await track.durable(item, at.saved):  # the pause is stored (its transcript with it)
            at.saved, at.ended, at.paused = track.stored(), True, True
            await self.emit(run.conversation_id, item, run)
            self.release(run)  # no await since the publish: a client that saw the pause may answer it at once
            return
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
            await self.store.runs.end_logged(run.run_id)

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
        self.here.dropped.add(run.run_id)
        for event in unstored_end(run, reason or "the run could not be closed"):
            self.publish(run.conversation_id, event, 0, run)

    def release(self, run: ActiveRun) -> None:
        """The run no longer holds its conversation, nor its key's place; once per run (a paused run lets go as
        its pause is sent: the run that resumes it under the same id holds its own place)."""
        if run.released:
            return
        run.released = True
        if run.conversation_id is not None and self.here.active.get(run.conversation_id) is run:
            del self.here.active[run.conversation_id]
        self.here.unstored.pop(run.run_id, None)
        key = self.here.limits.runs.holders.get(run.run_id)
        self.here.limits.runs.release(run.run_id)  # idempotent; a resumed run was never counted
        if key is not None and self.here.limits.runs.limit:  # other processes' runs of the key wait too
            self.here.executor.key_freed(key)
        run.done.set()
