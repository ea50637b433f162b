"""What the server's run driver (`driver.RunDriver`) keeps per run besides the run itself: how far it has stored
it (`Progress`), how a loop run is stored as it goes (`LoopTrack`; a graph run's is `graph_runs.GraphTrack`),
how a run that cannot be stored ends for its clients (`unstored_end`), how sub-agents' humans are waited
for in process (`InProcess`) and where sub-agents' conversations are kept in process (`Children`; on the
engine each child is a durable run of its own instead: `child_runs.DurableChildren`)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ringlet._ids import new_id, now
from ringlet.agent import AgentStream
from ringlet.events import ErrorEvent, Event, MessageEndEvent, MessageStartEvent, StatusEvent
from ringlet.gates.approval import NEVER, ApprovalDecision, ApprovalRequest, epoch
from ringlet.replay.tape import Recorder
from ringlet.server.runs.active import ActiveRun
from ringlet.store import Store

log = logging.getLogger("ringlet.server")


class Publish(Protocol):
    """How a stored event goes out to the conversation's streams (`RunDriver.publish`)."""

    def __call__(self, conversation_id: str | None, event: Event, event_id: int, run: ActiveRun | None = None,
                 payload: dict[str, Any] | None = None) -> None: ...


def unstored_end(run: ActiveRun, reason: str) -> list[Event]:
    """How a run whose events cannot be stored ends for its clients: `message_start` (when none was sent),
    `error {code: storage_unavailable, retryable: true}`, `message_end`."""
    rid, st = run.run_id, getattr(run.stream, "state", None)
    sent = next((json.loads(p.data)["message_id"] for p in run.published if p.type == "message_start" and not p.nested),
                None)
    message_id = sent or getattr(st, "response_id", None) or new_id("m")
    usage = st.usage.summary() if st is not None and hasattr(st, "usage") else \
        {"in_tokens": 0, "out_tokens": 0, "cost_usd": None}
    start = [] if run.published or run.resumed else [MessageStartEvent(
        run_id=rid, ts=now(), message_id=message_id, conversation_id=run.conversation_id, agent=run.agent)]
    return [*start, ErrorEvent(run_id=rid, ts=now(), code="storage_unavailable", retryable=True,
                               message=f"the server cannot store this run ({reason}); send the message again "
                                       "shortly"),
            MessageEndEvent(run_id=rid, ts=now(), message_id=message_id, finish_reason="error", usage=usage)]


@dataclass(eq=False)
class Progress:
    """How far `RunDriver.drive` has stored a run."""

    saved: int
    """How many of the run's messages are stored."""
    ended: bool = False
    paused: bool = False
    closing: list[Event] = field(default_factory=list[Event])
    """The run's last events (`error`, its final `status`), held to be stored with its end record."""
    storing: asyncio.Future[int] | None = None
    """The last streamed delta handed to the writer and not yet stored (`RunDriver.stream_delta`)."""
    failure: BaseException | None = None
    """Why a streamed delta could not be stored: the run stops there (none after it is sent)."""


@dataclass(eq=False)
class LoopTrack:
    """How `RunDriver.drive` stores a loop run as it goes: new messages as they come, approval records and
    the pause when announced, the rest at the end (a graph run's counterpart: `graph_runs.GraphTrack`)."""

    store: Store
    publish: Publish
    expire_at: Callable[[float], None]
    """When the run's earliest pending approval expires, expire it then (`Pauses.expire_at`)."""
    run: ActiveRun
    stream: AgentStream

    @property
    def start(self) -> int:
        return self.stream.state.history_length

    def stored(self) -> int:
        return len(self.stream.state.messages)

    async def durable(self, item: Event, saved: int) -> bool:
        """Store what an event announces before the event is told: an approval record, or the pause itself
        (True: the run paused)."""
        run, stream = self.run, self.stream
        if getattr(item, "agent_path", None) is not None or run.conversation_id is None:
            return False  # a sub-agent's own run stores what it must; a run with no conversation waits here
        if item.type in ("approval_required", "question"):
            parked = stream.state.awaiting.get(item.tool_call_id)  # type: ignore[union-attr]
            if parked is None:  # asked inside a running call (an MCP elicitation): its asker stored it
                return False
            await self.store.approvals.add(run.run_id, [asdict(parked.request)], agent=run.agent,
                                           realm=stream.state.realm)
        elif item.type == "compaction":  # the covered messages are marked in the store, not removed
            note_id = item.summary_message_id  # type: ignore[union-attr]
            await self.store.conversations.update_messages(run.conversation_id, [
                m for m in stream.state.messages[:saved] if m.metadata.get("compacted_into") == note_id])
        elif item.type == "guardrail" and item.stage == "input" and item.decision == "redact":  # type: ignore[union-attr]
            changed = [m for m in stream.state.messages if m.id == item.message_id]  # type: ignore[union-attr]
            await self.store.conversations.update_messages(run.conversation_id, changed)  # stored redacted
        elif item.type == "status" and stream.paused:
            await self._record_pause(saved)
            return True
        return False

    async def save(self, saved: int) -> int:
        """Store the run's messages after `saved` as they are now; returns the new mark. The run goes on while
        this awaits, so the mark is taken before the await: later messages are the next save's. A run with no
        conversation keeps no transcript."""
        messages, cid = self.stream.state.messages, self.run.conversation_id
        end = len(messages)
        new = [m for m in messages[saved:end] if not m.metadata.get("is_persisted")]  # (the run's incoming
        if new and cid is not None:  # messages were stored with it)
            await self.store.conversations.append_messages(cid, new)
        return end

    async def _record_end(self, saved: int, *, cancelled: bool = False, closing: Sequence[Event] = ()) -> list[int]:
        """Store the rest of the transcript, the run's outcome and usage, the conversation's status and the
        run's `closing` events, in one transaction; the events' ids (0 for a run with no conversation)."""
        run, stream = self.run, self.stream
        cid = run.conversation_id
        await self.store.approvals.executed(run.run_id, run.applied)
        result = run.result = stream.result
        usage = stream.state.usage
        status = result.status if result else "canceled" if cancelled else "failed"
        reason = result.finish_reason if result else "cancelled" if cancelled else "error"
        ids = await self.store.runs.finish(
            run.run_id, status=status, finish_reason=reason,
            in_tokens=usage.in_tokens, out_tokens=usage.out_tokens, cost_usd=usage.cost_usd,
            state=json.loads(stream.state.to_json()) if cid else None, conversation_id=cid,
            new=stream.state.messages[saved:], conversation_status="idle",
            events=[(cid, e.type, e.model_dump()) for e in closing] if cid else [], tape=_tape(stream))
        return ids if cid else [0] * len(closing)

    async def _record_pause(self, saved: int) -> None:
        """Store the paused run's continuation with its approval records and new messages, in one
        transaction; the run then needs no process until a decision arrives."""
        run, stream = self.run, self.stream
        st = stream.state
        await self.store.runs.pause(
            run.run_id, state=json.loads(st.to_json()), requests=[asdict(p.request) for p in st.awaiting.values()],
            conversation_id=run.conversation_id, new=st.messages[saved:], in_tokens=st.usage.in_tokens,
            out_tokens=st.usage.out_tokens, cost_usd=st.usage.cost_usd, agent=run.agent, realm=st.realm,
            tape=_tape(stream))
        await self.store.approvals.executed(run.run_id, [c for c in run.applied if c not in st.awaiting])

    async def record_end(self, saved: int, closing: Sequence[Event]) -> None:
        """Store the run's end with its last events (`message_end` last) in one transaction, then send them."""
        ids = await self._record_end(saved, closing=closing)
        for event, event_id in zip(closing, ids, strict=True):
            self.publish(self.run.conversation_id, event, event_id, self.run)

    async def abandoned(self, saved: int) -> list[Event]:
        """The loop died without its message_end (or was cancelled before it began): close the run the way a
        stream expects, `message_start` first (stored with its end record, and sent: nothing is left)."""
        run, stream = self.run, self.stream
        rid, st = run.run_id, stream.state
        cancelled = run.cancel_requested and not run.published
        start = [] if run.published or run.resumed else [MessageStartEvent(
            run_id=rid, ts=now(), message_id=st.response_id, conversation_id=run.conversation_id, agent=run.agent)]
        end = MessageEndEvent(run_id=rid, ts=now(), message_id=st.response_id, usage=st.usage.summary(),
                              finish_reason="cancelled" if cancelled else "error")
        if cancelled:
            closing = [*start, StatusEvent(run_id=rid, ts=now(), state="canceled"), end]
        else:
            closing = [*start, ErrorEvent(run_id=rid, ts=now(), code="internal_error",
                                          message="the run stopped unexpectedly"), end]
        ids = await self._record_end(saved, cancelled=cancelled, closing=closing)
        for event, event_id in zip(closing, ids, strict=True):
            self.publish(run.conversation_id, event, event_id, run)
        return []

    def paused(self) -> None:
        deadlines = [epoch(p.request.expires_at) for p in self.stream.state.awaiting.values()
                     if p.request.expires_at != NEVER]
        if deadlines:
            self.expire_at(min(deadlines))


class InProcess:
    """Waits in this process for decisions on stored requests (runs that are not stored, and sub-agents,
    whose requests are stored under their root conversation so they are answered through it)."""

    announces = True
    """`wait` takes `announce`, called once the records are stored (an MCP elicitation's question event:
    `ringlet.mcp.elicit.ask_in_call`), so a client never sees a question it cannot answer yet."""

    def __init__(self, store: Store, waiters: dict[str, asyncio.Future[ApprovalDecision]], agent: str, realm: str,
                 conversation_id: str | None = None) -> None:
        self.store, self.waiters = store, waiters
        self.agent, self.realm, self.conversation_id = agent, realm, conversation_id

    async def wait(self, requests: Sequence[ApprovalRequest],
                   announce: Callable[[], None] | None = None) -> Mapping[str, ApprovalDecision]:
        records = [{**asdict(r), "conversation_id": self.conversation_id or r.conversation_id} for r in requests]
        await self.store.approvals.add(requests[0].run_id, records, agent=self.agent, realm=self.realm)
        if announce is not None:
            announce()
        loop = asyncio.get_running_loop()
        futures = {r.tool_call_id: self.waiters.setdefault(r.approval_id, loop.create_future()) for r in requests}
        try:
            await asyncio.wait(futures.values(), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # at the earliest expiry (the run goes on: those calls timed out), or the
            run_id = requests[0].run_id  # run was stopped: the records say which, as the run does
            if any(r.expired() for r in requests):
                await self.store.approvals.expire(now(), run_id=run_id)
            else:
                await self.store.approvals.cancel(run_id)
            raise
        finally:
            for r in requests:
                if futures[r.tool_call_id].done() or r.expired():
                    self.waiters.pop(r.approval_id, None)
        return {call_id: f.result() for call_id, f in futures.items() if f.done()}


class Children:
    """Where a server run's sub-agents live: each in a stored conversation of its own (hidden from default
    lists, with its transcript and usage); their humans are asked through the root conversation."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def opened(self, ctx: Any, agent: str, realm: str, conversation_id: str) -> None:
        await self.store.conversations.create(
            agent=agent, realm=realm, org_id=ctx.org_id, user_id=ctx.user_id, parent_run_id=ctx.run_id,
            conversation_id=conversation_id, parent_conversation_id=ctx.conversation_id,
            parent_tool_call_id=ctx.tool_call_id)

    async def closed(self, conversation_id: str, stream: Any) -> None:
        st = stream.state
        await self.store.conversations.append_messages(conversation_id, st.messages[st.history_length:])
        usage = st.usage
        await self.store.conversations.add_usage(conversation_id, usage.in_tokens, usage.out_tokens, usage.cost_usd)


def _tape(stream: Any) -> dict[str, Any] | None:
    """The run's recording since it started or resumed, when it was recorded (`ringlet.replay`)."""
    steps = getattr(getattr(getattr(stream, "run", None), "config", None), "steps", None)
    if not isinstance(steps, Recorder):
        return None
    try:  # a recording that cannot be kept never costs the run its end: it is only not replayable
        return json.loads(json.dumps(steps.segment()))
    except (TypeError, ValueError):
        log.exception("run %s: its recording cannot be stored; it will not be replayable", stream.run_id)
        return None
