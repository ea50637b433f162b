"""Runs on the server: started from a message, driven to the end whatever the clients do, stored as they go.

    Runner.start() ──► pump task: iterates Agent.stream() ──► inbox ──► driver: store event, then publish
                                                                         │
                      SSE streams ◄── Hub (per-conversation, bounded) ◄──┘

Every event is appended to the conversation's event log (group commit, `EventWriter`) before the hub
hands it to the streams, so a stream that falls behind (its queue overflows) or reconnects reads the
rest from the store with no gap and no duplicate. Clients only read: a disconnect never touches a run;
`cancel()` cancels the pump, whose run still ends with `message_end`. Each run holds a lease in the
store; a run whose process died is closed as interrupted by whichever process sees the lease expire.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from ringlet._ids import at, new_id, now
from ringlet.agent import AgentStream, RunResult
from ringlet.context import Channel
from ringlet.errors import ConversationBusy
from ringlet.events import ErrorEvent, Event, MessageEndEvent, ToolResultEvent
from ringlet.messages import Message
from ringlet.server.auth import Principal
from ringlet.server.catalog import Catalog
from ringlet.server.errors import ApiError, request_id
from ringlet.server.settings import ServerSettings
from ringlet.store import Store
from ringlet.store.writer import EventWriter

log = logging.getLogger("ringlet.server")


@dataclass(slots=True, frozen=True)
class Published:
    """A stored event on its way to the streams; `data` is its JSON payload, serialised once."""

    id: int
    type: str
    run_id: str | None
    data: str


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


@dataclass(eq=False)
class ActiveRun:
    run_id: str
    conversation_id: str
    agent: str
    stream: AgentStream | None = None
    pump: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: RunResult | None = None
    published: list[Published] = field(default_factory=list)
    """The run's events so far, as published: a stream joining the run reads its backlog from here."""
    cancel_requested: bool = False


class Runner:
    """Starts, drives, cancels and recovers the runs of stored conversations."""

    def __init__(self, store: Store, catalog: Catalog, settings: ServerSettings) -> None:
        self.store, self.catalog, self.settings = store, catalog, settings
        self.writer = EventWriter(store)
        self.hub = Hub()
        self.owner = new_id("proc")
        self.active: dict[str, ActiveRun] = {}
        self._drivers: set[asyncio.Task[None]] = set()
        self.closing = False

    def lease_until(self) -> str:
        return at(time.time() + self.settings.run_lease_s)

    # -- starting and ending runs ------------------------------------------------------------------------

    async def start(self, conversation: dict[str, Any], prompt: Message | Sequence[Message], *, principal: Principal,
                    channel: Channel = "chat", overrides: dict[str, Any] | None = None,
                    wait_turn: bool = False, run_id: str | None = None) -> ActiveRun:
        """Store the message(s) and start a run on them. A conversation has one active run at a time: 409
        `run_in_progress`, or with `wait_turn` the message waits behind the active run."""
        cid = conversation["id"]
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
        run = self.active[cid] = ActiveRun(run_id or new_id("r"), cid, conversation["agent"])
        try:
            history = await self.store.load_messages(cid)
            incoming = [prompt] if isinstance(prompt, Message) else list(prompt)
            # built (and its overrides checked) before anything is stored; it starts when first iterated
            run.stream = agent.stream(incoming, history=history, conversation_id=cid, realm=conversation["realm"],
                                      user_id=principal.user_id, org_id=principal.org_id, roles=principal.roles,
                                      channel=channel, run_id=run.run_id, request_id=request_id.get() or None,
                                      **(overrides or {}))
            try:
                await self.store.create_run(run.run_id, agent=run.agent, conversation_id=cid,
                                            lease_owner=self.owner, lease_expires_at=self.lease_until(),
                                            incoming=incoming, realm=conversation["realm"])
            except ConversationBusy:  # a run of another process (or one that died and is not closed yet)
                raise ApiError(409, "run_in_progress", f"conversation {cid} already has an active run; wait "
                               "for it or POST …/cancel") from None
        except BaseException:
            self.active.pop(cid, None)
            run.done.set()
            raise
        driver = asyncio.create_task(self._drive(run, run.stream), name=f"ringlet-run-{run.run_id}")
        self._drivers.add(driver)
        driver.add_done_callback(self._drivers.discard)
        return run

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

    def cancel(self, conversation_id: str) -> str | None:
        """Cancel the conversation's active run; its run id, or None when it has none."""
        run = self.active.get(conversation_id)
        if run is None:
            return None
        run.cancel_requested = True  # seen by _drive if the pump does not exist yet
        if run.pump is not None:
            run.pump.cancel()
        return run.run_id

    async def emit(self, conversation_id: str, event: Event, run: ActiveRun | None = None) -> int:
        """Append an event to the conversation's log, then hand it to the conversation's streams (and to
        the active `run`'s backlog, in the same step)."""
        payload = event.model_dump()
        event_id = await self.writer.append(conversation_id, event.type, payload)
        item = Published(event_id, event.type, payload.get("run_id"),
                         json.dumps(payload, ensure_ascii=False, separators=(",", ":")))
        self.hub.publish(conversation_id, item)
        if run is not None:
            run.published.append(item)
        return event_id

    def backlog(self, conversation_id: str, run_id: str) -> list[Published] | None:
        """The events of `run_id` so far, when it is this process's active run (else None: read the store)."""
        run = self.active.get(conversation_id)
        return list(run.published) if run is not None and run.run_id == run_id else None

    async def _drive(self, run: ActiveRun, stream: AgentStream) -> None:
        cid, inbox = run.conversation_id, asyncio.Queue[Event | BaseException | None]()

        async def pump() -> None:  # its only await is inside the loop, so a cancel always lands there
            try:
                async for event in stream:
                    inbox.put_nowait(event)
            except asyncio.CancelledError:
                pass  # a cancelled run has already yielded its message_end
            except Exception as exc:
                inbox.put_nowait(exc)
            finally:
                inbox.put_nowait(None)

        run.pump = asyncio.create_task(pump())
        if run.cancel_requested:
            run.pump.cancel()
        saved, ended = stream.state.history_length, False
        try:
            while (item := await inbox.get()) is not None:
                if isinstance(item, BaseException):
                    log.error("run %s failed outside the loop", run.run_id, exc_info=item)
                    break
                if item.type == "message_end":  # the run's record is final before its end is sent
                    await self._record_end(run, stream, saved)
                    await self.emit(cid, item, run)
                    ended = True
                    self._release(run)  # no await since the publish: a client that saw the end may send again
                    continue
                await self.emit(cid, item, run)
                if len(stream.state.messages) > saved:
                    saved = await self._save(cid, stream.state.messages, saved)
        finally:
            if not run.pump.done():  # storing failed: never leave the agent running unobserved
                run.pump.cancel()
            if not ended:  # the loop died without its message_end: close the run the way a stream expects
                await self._record_end(run, stream, saved)
                with suppress(Exception):
                    await self.emit(cid, ErrorEvent(run_id=run.run_id, ts=now(), code="internal_error",
                                                    message="the run stopped unexpectedly"), run)
                    await self.emit(cid, MessageEndEvent(run_id=run.run_id, ts=now(),
                                                         message_id=stream.run.response_id, finish_reason="error",
                                                         usage=stream.state.usage.summary()), run)
            self._release(run)

    async def _save(self, cid: str, messages: list[Message], saved: int) -> int:
        """Store `messages[saved:]` as they are now; returns the new mark. The run goes on while this
        awaits, so the mark is taken before the await: later messages are the next save's."""
        end = len(messages)
        await self.store.append_messages(cid, messages[saved:end])
        return end

    async def _record_end(self, run: ActiveRun, stream: AgentStream, saved: int) -> None:
        """Store the rest of the transcript, the run's outcome and usage, and the conversation's status."""
        cid = run.conversation_id
        try:
            result = run.result = stream.result
            usage = stream.state.usage
            status = result.status if result else "failed"
            await self.store.finish_run(
                run.run_id, status=status, finish_reason=result.finish_reason if result else "error",
                in_tokens=usage.in_tokens, out_tokens=usage.out_tokens, cost_usd=usage.cost_usd,
                state=json.loads(stream.state.to_json()), conversation_id=cid, new=stream.state.messages[saved:],
                conversation_status="input_required" if status == "input_required" else "idle")
        except Exception:
            log.exception("could not record the end of run %s", run.run_id)

    def _release(self, run: ActiveRun) -> None:
        if self.active.get(run.conversation_id) is run:
            del self.active[run.conversation_id]
        run.done.set()

    # -- runs whose process died ---------------------------------------------------------------------------

    async def recover(self) -> int:
        """Close every run whose lease expired (its process died) as interrupted; returns how many."""
        closed = 0
        stamp = now()
        for row in await self.store.expired_runs(stamp):
            if not await self.store.claim_run(row["id"], self.owner, self.lease_until(), expired_before=stamp):
                continue  # another process took it
            try:
                await self._interrupted(row)
                closed += 1
            except Exception:
                log.exception("could not close interrupted run %s", row["id"])
        return closed

    async def _interrupted(self, row: dict[str, Any]) -> None:
        run_id, cid = row["id"], row["conversation_id"]
        finish_reason = "error"
        if cid is not None:
            logged = await self.store.events_after(cid, 0, limit=100_000, run_id=run_id)
            end = next((p for _, kind, p in logged if kind == "message_end"), None)
            if end is not None:  # the run ended; only its bookkeeping was lost
                finish_reason = end["finish_reason"]
            else:
                message_id = await self._keep_partial(cid, run_id, logged)
                await self._settle_open_calls(cid, run_id)
                await self.emit(cid, ErrorEvent(run_id=run_id, ts=now(), code="interrupted", retryable=False,
                                                message="the server stopped while this run was working"))
                await self.emit(cid, MessageEndEvent(run_id=run_id, ts=now(), message_id=message_id,
                                                     finish_reason="error",
                                                     usage={"in_tokens": row["in_tokens"],
                                                            "out_tokens": row["out_tokens"],
                                                            "cost_usd": row["cost_usd"]}))
            await self.store.set_status(cid, "idle")
        status = {"error": "failed", "cancelled": "canceled"}.get(finish_reason, "completed")
        await self.store.finish_run(run_id, status=status, finish_reason=finish_reason, in_tokens=row["in_tokens"],
                                    out_tokens=row["out_tokens"], cost_usd=row["cost_usd"])
        log.warning("run %s was interrupted (its process stopped); closed it", run_id)

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
        for _, kind, p in logged:
            if kind == "content_delta" and p["message_id"] not in stored:
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
                if time.monotonic() - last_sweep >= self.settings.sweep_interval_s:
                    last_sweep = time.monotonic()
                    await self.sweep()
            except Exception:
                log.exception("server upkeep failed; retrying")

    async def sweep(self) -> None:
        retention = self.settings.events_retention_hours * 3600
        await self.store.prune_events(at(time.time() - retention))
        await self.store.prune_requests(at(time.time() - 24 * 3600))

    async def close(self) -> None:
        """Cancel the active runs (each still ends with message_end), wait for them, flush the writer."""
        self.closing = True
        for cid in list(self.active):
            self.cancel(cid)
        if self._drivers:
            with suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await asyncio.gather(*self._drivers, return_exceptions=True)
        await self.writer.close()
