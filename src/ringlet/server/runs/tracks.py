"""What the server's run driver (`runs.Runner`) keeps per run besides the run itself: how far it has stored
it (`Progress`), how a loop run is stored as it goes (`LoopTrack`; a graph run's is `graph_runs.GraphTrack`),
how a run that cannot be stored ends for its clients (`unstored_end`), how sub-agents' humans are waited
for in process (`InProcess`) and where sub-agents' conversations are kept in process (`Children`; on the
engine each child is a durable run of its own instead: `child_runs.DurableChildren`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ringlet._ids import new_id, now
from ringlet.agent import AgentStream
from ringlet.events import ErrorEvent, Event, MessageEndEvent, MessageStartEvent, StatusEvent
from ringlet.gates.approval import NEVER, ApprovalDecision, ApprovalRequest, epoch
from ringlet.server.runs.active import ActiveRun
from ringlet.store import Store


class Driver(Protocol):
    """What these need of the server's run driver (`runs.Runner`)."""

    store: Store
    _waiters: dict[str, asyncio.Future[ApprovalDecision]]

    def publish(self, conversation_id: str | None, event: Event, event_id: int, run: ActiveRun | None = None,
                payload: dict[str, Any] | None = None) -> None: ...

    async def _durable(self, run: ActiveRun, stream: AgentStream, item: Event, saved: int) -> bool: ...

    async def _save(self, cid: str | None, messages: list[Any], saved: int) -> int: ...

    async def _record_end(self, run: ActiveRun, stream: AgentStream, saved: int, *, cancelled: bool = False,
                          closing: Sequence[Event] = ()) -> list[int]: ...

    def _expire_at(self, deadline: float) -> None: ...


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
    """How far `Runner._drive` has stored a run."""

    saved: int
    """How many of the run's messages are stored."""
    ended: bool = False
    paused: bool = False
    closing: list[Event] = field(default_factory=list)
    """The run's last events (`error`, its final `status`), held to be stored with its end record."""


@dataclass(eq=False)
class LoopTrack:
    """How `Runner._drive` stores a loop run as it goes: new messages as they come, approval records and
    the pause when announced, the rest at the end (a graph run's counterpart: `graph_runs.GraphTrack`)."""

    runner: Driver
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

    async def record_end(self, saved: int, closing: Sequence[Event]) -> None:
        """Store the run's end with its last events (`message_end` last) in one transaction, then send them."""
        ids = await self.runner._record_end(self.run, self.stream, saved, closing=closing)
        for event, event_id in zip(closing, ids, strict=True):
            self.runner.publish(self.run.conversation_id, event, event_id, self.run)

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
        ids = await self.runner._record_end(run, stream, saved, cancelled=cancelled, closing=closing)
        for event, event_id in zip(closing, ids, strict=True):
            self.runner.publish(run.conversation_id, event, event_id, run)
        return []

    def paused(self) -> None:
        deadlines = [epoch(p.request.expires_at) for p in self.stream.state.awaiting.values()
                     if p.request.expires_at != NEVER]
        if deadlines:
            self.runner._expire_at(min(deadlines))


class InProcess:
    """Waits in this process for decisions on stored requests (runs that are not stored, and sub-agents,
    whose requests are stored under their root conversation so they are answered through it)."""

    announces = True
    """`wait` takes `announce`, called once the records are stored (an MCP elicitation's question event:
    `ringlet.mcp.elicit.ask_in_call`), so a client never sees a question it cannot answer yet."""

    def __init__(self, runner: Driver, agent: str, realm: str, conversation_id: str | None = None) -> None:
        self.runner, self.agent, self.realm, self.conversation_id = runner, agent, realm, conversation_id

    async def wait(self, requests: Sequence[ApprovalRequest],
                   announce: Callable[[], None] | None = None) -> Mapping[str, ApprovalDecision]:
        runner = self.runner
        records = [{**asdict(r), "conversation_id": self.conversation_id or r.conversation_id} for r in requests]
        await runner.store.add_approvals(requests[0].run_id, records, agent=self.agent, realm=self.realm)
        if announce is not None:
            announce()
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


class Children:
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
