"""The runs service (`Runs`): what the protocols (chat, AG-UI, A2A, OpenAI, approvals, forks, tool calls) and
firing (triggers, schedules) call to start runs, follow them, read how they ended, cancel them and decide what
they wait for, and the records they read (`Records`: the store's repositories, one by one). They never reach
the parts behind it (`runner.py` wires them).

    runs = runner.runs
    run = await runs.start(conversation, message, principal=principal)
    with runs.subscribe(cid) as subscriber:
        async for frame in runs.follow(subscriber, cid, after=0, run_id=run.run_id): ...
    outcome = await runs.outcome(cid, run.run_id)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ringlet.agent import AgentStream
from ringlet.context import Channel
from ringlet.events import Event
from ringlet.gates.approval import Approver
from ringlet.loop.steering import Steer
from ringlet.messages import Message
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError
from ringlet.server.http.limits import Limits
from ringlet.server.runs import follow
from ringlet.server.runs.active import ActiveRun, Published, Subscriber
from ringlet.server.runs.driver import RunDriver
from ringlet.server.runs.graphs import GraphRuns
from ringlet.server.runs.here import Here
from ringlet.server.runs.pauses import Pauses
from ringlet.server.runs.starter import Starter
from ringlet.server.runs.streams import Streams
from ringlet.store import Store
from ringlet.store.approval_records import Approvals
from ringlet.store.audit_records import Audit
from ringlet.store.checkpoint_records import Checkpoints
from ringlet.store.continuation_records import Continuations
from ringlet.store.conversation_records import Conversations
from ringlet.store.event_records import EventLog
from ringlet.store.keys import Keys
from ringlet.store.records import Approval, Claim, Conversation, RunRecord
from ringlet.store.request_records import Requests
from ringlet.store.run_records import Runs as RunRecords
from ringlet.store.schedule_records import ConversationSchedules, Schedules
from ringlet.store.tape_records import Tapes
from ringlet.store.trigger_records import Triggers

if TYPE_CHECKING:
    from ringlet.server.catalog import Catalog
    from ringlet.server.http.settings import ServerSettings


@dataclass(frozen=True, eq=False)
class Records:
    """The stored records the protocols and firing read and write, repository by repository."""

    conversations: Conversations
    runs: RunRecords
    events: EventLog
    approvals: Approvals
    checkpoints: Checkpoints
    requests: Requests
    """Idempotency keys' stored responses (`http/idempotency.py`)."""
    keys: Keys
    triggers: Triggers
    schedules: Schedules
    tapes: Tapes
    audit: Audit
    continuations: Continuations
    """Transcripts of `/v1` runs stopped on client tool calls."""

    @classmethod
    def of(cls, store: Store) -> Records:
        return cls(store.conversations, store.runs, store.events, store.approvals, store.checkpoints, store.requests,
                   store.keys, store.triggers, store.schedules, store.tapes, store.audit,
                   store.continuations)


@dataclass(frozen=True)
class Outcome:
    """How a run stands or ended (`Runs.outcome`)."""

    record: RunRecord
    answer: Message | None
    """The last assistant message the run stored (None: none yet, or it ended without one)."""


class Runs:
    """Starts, follows, cancels and decides this server's runs."""

    def __init__(self, records: Records, catalog: Catalog, settings: ServerSettings, here: Here, starter: Starter,
                 driver: RunDriver, pauses: Pauses, graphs: GraphRuns, streams: Streams) -> None:
        self.records, self.catalog, self.settings = records, catalog, settings
        self._here, self._starter, self._driver = here, starter, driver
        self._pauses, self._graphs, self._streams = pauses, graphs, streams

    # -- this process's runs ------------------------------------------------------------------------------

    @property
    def active(self) -> Mapping[str, ActiveRun]:
        """The runs active in this process, by conversation id."""
        return self._here.active

    @property
    def here(self) -> Here:
        """This process's runs, for what holds a run in this process itself (a direct tool call: `held`,
        `waiters`, its lease)."""
        return self._here

    @property
    def limits(self) -> Limits:
        return self._here.limits

    @property
    def closing(self) -> bool:
        """Whether this process is shutting down (it starts nothing more)."""
        return self._here.closing

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[None]:
        """Run `work` in the background (failures are logged); the server's shutdown waits for it."""
        return self._here.spawn(work)

    # -- starting -----------------------------------------------------------------------------------------

    async def start(self, conversation: Conversation, prompt: Message | Sequence[Message], *, principal: Principal,
                    channel: Channel = "chat", overrides: dict[str, Any] | None = None, wait_turn: bool = False,
                    run_id: str | None = None, approver: Approver | None = None,
                    claim: Claim | None = None) -> ActiveRun:
        """Store the message(s) and start a run on them (`Starter.start`: 409 while the conversation has an
        active run, unless `wait_turn`; 429 past the key's active runs; 503 while shutting down)."""
        return await self._starter.start(conversation, prompt, principal=principal, channel=channel,
                                         overrides=overrides, wait_turn=wait_turn, run_id=run_id,
                                         approver=approver, claim=claim)

    async def fork(self, forked: Conversation, prompt: Message | Sequence[Message], *, principal: Principal,
                   overrides: dict[str, Any] | None = None) -> ActiveRun:
        """Start the run of a conversation just forked for it (a conversation fork, a graph checkpoint's): when
        the run cannot start (a limit, storage, a bad override), the fork is deleted too and the error raised,
        so that the client may try again with nothing left behind."""
        try:
            return await self.start(forked, prompt, principal=principal, overrides=overrides)
        except BaseException:
            await self.records.conversations.delete(forked.id)
            raise

    async def start_unstored(self, agent: str, stream: AgentStream, *, principal: Principal,
                             realm: str) -> ActiveRun:
        """Drive a run with no conversation (`/v1` without one): its events go only to `run.listener`."""
        return await self._starter.start_unstored(agent, stream, principal=principal, realm=realm)

    def approver(self, agent: str, realm: str) -> Approver:
        """How a run that is not stored waits for its people (`Streams.approver`)."""
        return self._streams.approver(agent, realm)

    def schedule_book(self, cid: str, agent: str, realm: str, org_id: str | None, user_id: str | None,
                      key_id: str | None) -> ConversationSchedules:
        return self._streams.schedule_book(cid, agent, realm, org_id, user_id, key_id)

    @property
    def conversations_only(self) -> bool:
        """Whether every run needs a stored conversation (runs execute elsewhere: `/v1` keeps a transient one)."""
        return self._here.executor.conversations_only

    # -- following ----------------------------------------------------------------------------------------

    def subscribe(self, cid: str) -> contextlib.AbstractContextManager[Subscriber]:
        """Subscribe to the conversation's live events (before reading the store: no event is missed)."""
        run = self._here.active.get(cid)
        return self._here.hub.subscribe(cid, base=None if run is None else run.base)

    def follow(self, subscriber: Subscriber, cid: str, *, after: int, run_id: str | None = None,
               backlog: bool = True) -> AsyncIterator[bytes]:
        """SSE frames of the conversation's events after `after` (of one run, ending with its `message_end`,
        when `run_id` is given), stored then live, with pings when idle (`follow.py`)."""
        return follow.follow(self, subscriber, cid, after=after, run_id=run_id, backlog=backlog)

    def items(self, subscriber: Subscriber, cid: str, *, after: int, run_id: str | None = None,
              backlog: bool = True) -> AsyncIterator[Published | None]:
        """The events `follow` sends, as they are (None: a ping is due)."""
        return follow.items(self, subscriber, cid, after=after, run_id=run_id, backlog=backlog)

    def backlog(self, cid: str, run_id: str) -> list[Published] | None:
        """The events of `run_id` so far when it is this process's active run (else None: read the store)."""
        return self._driver.backlog(cid, run_id)

    async def outcome(self, cid: str, run_id: str) -> Outcome:
        """How run `run_id` of conversation `cid` stands or ended: its record and its answer (the last assistant
        message it stored, if any). 404 `run_not_found` when it was never stored."""
        record = await self.records.runs.get(run_id)
        if record is None:
            raise ApiError(404, "run_not_found", f"no run {run_id!r}")
        messages = await self.records.conversations.load_messages(cid, limit=200)
        answer = next((m for m in reversed(messages) if m.run_id == run_id and m.role == "assistant"), None)
        return Outcome(record, answer)

    async def queued(self, run_id: str) -> bool:
        """Whether the run waits for a slot, executing nowhere yet."""
        return await self._here.executor.queued(run_id)

    async def emit(self, cid: str, event: Event, run: ActiveRun | None = None) -> int:
        """Store an event in the conversation's log, then send it to its streams (and to the active `run`'s
        backlog, when it concerns that run)."""
        return await self._driver.emit(cid, event, run)

    async def steer(self, run_id: str, steer: Steer) -> bool:
        """Send the working run `run_id` a user message, taken at its next round boundary wherever it executes
        (`Executor.steer`); False when it cannot take one."""
        run = next((r for r in self._here.active.values() if r.run_id == run_id), None)
        return await self._here.executor.steer(run, run_id, steer)

    # -- stopping -----------------------------------------------------------------------------------------

    async def cancel(self, cid: str) -> str | None:
        """Cancel the conversation's run, active or paused (a paused run's approvals are cancelled); it still
        ends with `message_end`. Its run id, or None when it has none."""
        return self._starter.cancel(cid) or await self._pauses.cancel_paused(cid)

    async def cancel_paused(self, cid: str) -> str | None:
        """Cancel the conversation's paused run only; its run id, or None."""
        return await self._pauses.cancel_paused(cid)

    async def cancel_elsewhere(self, run_id: str) -> None:
        """Cancel a run executing in another process (a paused run that went on there)."""
        await self._here.executor.cancel(run_id)

    def stop(self, run: ActiveRun) -> None:
        """Cancel `run` (one this caller started, e.g. with no conversation)."""
        self._starter.stop(run)

    # -- people -------------------------------------------------------------------------------------------

    async def decide(self, record: Approval, *, approved: bool, note: str | None, decided_by: str,
                     resume: bool = True) -> dict[str, Any]:
        """Decide an approval (the first decision wins: 409 otherwise) and resume its run."""
        return await self._pauses.decide(record, approved=approved, note=note, decided_by=decided_by, resume=resume)

    async def answer(self, record: Approval, answer: Any, *, answered_by: str) -> dict[str, Any]:
        """Answer a question (422 when the answer does not fit, 409 when answered) and resume its run."""
        return await self._pauses.answer(record, answer, answered_by=answered_by)

    async def resume(self, run_id: str) -> bool:
        """Resume a paused run with the decisions made so far; False when there is nothing to apply yet."""
        return await self._pauses.resume(run_id)

    async def expire_due(self) -> int:
        """Expire the approvals past their deadline (their runs go on); how many."""
        return await self._pauses.expire_due()

    async def resume_graph(self, record: RunRecord, *, force: bool = False) -> dict[str, Any]:
        """Resume an interrupted graph run from its last checkpoint (`GraphRuns.resume_interrupted`)."""
        return await self._graphs.resume_interrupted(record, force=force)


def runs_of(request: Any) -> Runs:
    """The runs service of the app serving `request`."""
    return request.app.state.ringlet.runs
