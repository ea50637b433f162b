"""Sub-agents as durable runs of their own, on the engine (issue 18; `builtin-tools-and-subagents.md` §6).

On the engine (`engine.py`) a spawn call (`subagents.spawn`: one step of its parent's workflow) does not
pump its child in process: `DurableChildren.run_child` makes the child a `ringlet.run` workflow of its
own, which any worker executes, with ids derived from the parent run's id and the call's
(`DurableChildren.ids`):

- it creates the child's conversation (hidden, as `Children.opened` does), stores its run and enqueues its
  workflow, unless that workflow exists: a spawn call executed again (its worker died) re-attaches to the
  child it started, wherever that runs, and starts nothing;
- it follows the child's conversation (`Hub` and `sse.items`: the store, then live, from any process) and
  forwards each of the child's events into the parent's stream, tagged (`ChildRun.forward`); the clock
  stops while the child waits for a human (`ChildRun.clocked`). A parent executed again forwards the
  child's events from the start (also when the call's result is replayed from its record:
  `replay_child`), and those its dead execution logged are not logged again (`ActiveRun.replay`);
- the child pauses for its humans like any durable run (its workflow waits on a DBOS message). Its
  requests are moved under the parent's conversation as they are forwarded (the outermost parent's, in the
  end), so they are listed and decided there; a decision wakes the child's workflow (`Pauses.resume`);
- at the child's `message_end` the call's result is read from the store (its run record, final state and
  transcript; `ChildRun.result_of`). The child's usage is added to the parent's and recorded with the
  call's step, so a replayed step adds it again (`engine._tool_step`, `subagents.replayed`);
- when its time is up, or its parent is cancelled, the child is cancelled wherever it runs (`Engine.cancel`,
  told again until it stops; a paused child has its requests cancelled) and its closing events are still
  forwarded, for at most `CLOSING_S`. A parent handed on (its process stops) leaves its child running: it
  re-attaches to it from another worker.

The concurrency slots (`Lineage.slots`) are held in the parent's process while it waits for its child, so
`max_concurrent_agents` caps the children per parent process (a durable child's own children get slots in
the process executing it). A waiting parent holds its worker's queue slot, also while its child waits for
a human.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from dbos import DBOS, SetWorkflowID
from sqlalchemy import update

from ringlet._ids import replayable
from ringlet.agent.subagents import ChildIds, ChildRun, Lineage, tagged
from ringlet.context import RunContext
from ringlet.events import (
    ApprovalRequiredEvent,
    BaseEvent,
    ErrorEvent,
    MessageEndEvent,
    QuestionEvent,
    StatusEvent,
    event_adapter,
)
from ringlet.gates.approval import AutoDeny
from ringlet.messages import Message
from ringlet.server.durable.dbos import outside
from ringlet.server.durable.engine import CHILDREN, Engine
from ringlet.server.durable.reconcile import close_interrupted
from ringlet.server.durable.workflow import run_workflow
from ringlet.server.runs.active import ActiveRun
from ringlet.server.runs.follow import PAGE
from ringlet.server.runs.spec import spec_of
from ringlet.server.runs.tracks import Children
from ringlet.store.schema import approvals
from ringlet.tools.base import Returned
from ringlet.usage import Usage

if TYPE_CHECKING:
    from ringlet.server.runs.active import Subscriber
    from ringlet.server.runs.runner import Runner

log = logging.getLogger("ringlet.server")
CLOSING_S = 10.0
"""How long a cancelled child's closing events are waited for (it may be queued behind busy workers)."""
RETELL_S = 0.5
"""How often, at most, a child told to stop is told again while its events still come."""


class DurableChildren(Children):
    """The engine's `child_host`: each sub-agent a durable run of its own (`subagents.DurableHost`)."""

    def __init__(self, runner: Runner, engine: Engine) -> None:
        super().__init__(runner.store)
        self.runner, self.engine = runner, engine

    def hosts(self, agent: str) -> bool:
        """Any worker builds the child from its name: this server must host its agent (one found elsewhere,
        `catalog.sub_agents_of`, runs in process as before)."""
        return agent in self.runner.catalog.hosted

    def ids(self, ctx: RunContext) -> ChildIds:
        """The child's run, conversation and message ids: a durable run's (`replayable`) keyed by the parent
        run's id and the call's, so a parent executed again on any worker finds its child."""
        seam = replayable(f"{ctx.run_id}:{ctx.tool_call_id}")
        return ChildIds(seam.new_id("r"), seam.new_id("c"), seam.new_id("m"))

    async def run_child(self, run: ChildRun, message: Message, timeout_s: float) -> Returned:
        child = _Followed(self, run)
        if await self.store.conversations.get(child.cid) is None:
            await self.opened(run.ctx, child.agent, run.realm, child.cid)
        with self.runner.here.hub.subscribe(child.cid) as subscriber:  # before it starts: no event is missed
            timed_out = await child.follow(subscriber, message, timeout_s)
        return run.result_of(timed_out, await child.ended())

    async def replay_child(self, ctx: RunContext, lineage: Lineage) -> None:
        """Forward the events the child of this call logged again (its call's result is replayed): the
        parent's driver logs those an execution that died did not (`ActiveRun.replay`)."""
        ids, after = self.ids(ctx), 0
        while ctx.emit is not None:  # the log as it is: a child the call gave up on may never end
            rows = await self.store.events.after(ids.conversation_id, after, limit=PAGE, run_id=ids.run_id)
            for _, _, payload in rows:
                ctx.emit(tagged(event_adapter.validate_python(payload), lineage, ctx.run_id))
            if len(rows) < PAGE:
                return
            after = rows[-1][0]


@dataclass(frozen=True)
class _Ended:
    """How a durable child ended, as `ChildRun.result_of` reads a `RunResult`."""

    run_id: str
    output: str
    status: str
    finish_reason: str | None
    usage: Usage
    error: dict[str, Any] | None


class _Followed:
    """One durable child as its parent's call sees it: started (or found), followed, stopped."""

    def __init__(self, host: DurableChildren, run: ChildRun) -> None:
        assert run.ids is not None, "a durable child has derived ids"
        self.runner, self.engine, self.run, self.ids = host.runner, host.engine, run, run.ids
        self.cid, self.agent = self.ids.conversation_id, run.lineage.path[-1]
        self.inbox: asyncio.Queue[BaseEvent | None] = asyncio.Queue()
        self.end: MessageEndEvent | None = None
        self.error: dict[str, Any] | None = None
        self.paused = False
        self.stopping: float | None = None
        """When the child was last told to stop (the event loop's clock); None: it was not."""

    async def start(self, message: Message) -> None:
        """Store the child's run and queue its workflow, unless it exists (the call is executed again)."""
        ids, run, store = self.ids, self.run, self.runner.store
        if await outside(DBOS.get_workflow_status_async(ids.run_id)) is not None:
            return  # started by an execution of this call that died: re-attached
        record = await store.runs.get(ids.run_id)
        if record is not None and record.status != "working":
            return  # its starter died before queueing it, and it was closed: its end is in its log
        kind = run.child.kind
        if record is None:
            await store.runs.create(ids.run_id, agent=self.agent, conversation_id=self.cid,
                                    parent_run_id=run.ctx.run_id, kind=kind, lease_owner=self.runner.here.owner,
                                    lease_expires_at=self.runner.here.lease_until(), incoming=[message],
                                    realm=run.realm)
        ctx = run.ctx
        principal = SimpleNamespace(key_id="", user_id=ctx.user_id, org_id=ctx.org_id, roles=ctx.roles,
                                    realms=ctx.realms)
        spec = spec_of(ActiveRun(ids.run_id, self.cid, self.agent), run.realm, [message],
                       principal=principal, channel="sub_agent", overrides=None, request_id=ctx.request_id,
                       deny=isinstance(ctx.child_approver, AutoDeny), kind=kind)
        spec["lineage"] = run.lineage.as_json()
        await outside(_enqueue(ids.run_id, spec))  # an existing workflow id is not started again
        # whichever worker hears first takes it, not always the parent's: one worker's death then rarely takes both
        await self.engine.announce(CHILDREN)

    async def follow(self, subscriber: Subscriber, message: Message, budget: float) -> bool:
        """Start the child (unless it exists) and forward its events until it ends; True when its time ran
        out (it was told to stop)."""
        pump = asyncio.create_task(self._pump(subscriber), name=f"ringlet-child-{self.ids.run_id}")
        try:
            await self.start(message)
            return await self.run.clocked(self.inbox, budget, self.stop)
        except asyncio.CancelledError:
            if not self._handed_on():  # the parent was cancelled: so is the child (and its children)
                await self.stop()
                while (event := await self.inbox.get()) is not None:  # its closing events
                    self.run.forward(event)
            raise
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            if self.stopping is not None and self.end is None:
                await asyncio.shield(self._abandon())

    async def _pump(self, subscriber: Subscriber) -> None:
        ids, runner = self.ids, self.runner
        try:
            async for item in runner.runs.items(subscriber, self.cid, after=0, run_id=ids.run_id):
                if item is None:
                    continue
                event: BaseEvent = event_adapter.validate_json(item.data)
                await self._seen(event)
                self.inbox.put_nowait(event)
        except Exception:
            log.exception("lost track of sub-agent run %s", ids.run_id)
        finally:
            self.inbox.put_nowait(None)

    async def _seen(self, event: BaseEvent) -> None:
        """Note what the child's event says before it is forwarded: its requests move under the parent's
        conversation (so they are decided there), its end and error are kept, a stopped child is told again."""
        if isinstance(event, ApprovalRequiredEvent | QuestionEvent):
            await self._rehome(event.approval_id if isinstance(event, ApprovalRequiredEvent) else event.question_id)
        if event.agent_path is not None:  # a grandchild's: its own parent follows it
            return
        if isinstance(event, MessageEndEvent):
            self.end = event
        elif isinstance(event, ErrorEvent):
            self.error = {"code": event.code, "message": event.message}
        elif isinstance(event, StatusEvent):
            self.paused = event.state == "input_required"
        told = self.stopping
        if told is not None and self.end is None and \
                (self.paused or asyncio.get_running_loop().time() - told >= RETELL_S):
            await self._tell()  # it started, went on or paused after it was told

    async def _rehome(self, approval_id: str) -> None:
        parent = self.run.ctx.conversation_id
        if parent is None:
            return
        async with self.runner.store.db.begin() as conn:
            await conn.execute(update(approvals).where(approvals.c.approval_id == approval_id)
                               .values(conversation_id=parent))

    async def stop(self) -> None:
        """Cancel the child wherever it runs; its end (or `CLOSING_S`) ends the following."""
        if self.stopping is not None:
            return
        asyncio.get_running_loop().call_later(CLOSING_S, self.inbox.put_nowait, None)
        await self._tell()

    async def _tell(self) -> None:
        runner = self.runner
        self.stopping = asyncio.get_running_loop().time()
        try:
            await self.engine.cancel(self.ids.run_id)
            if self.paused:  # it waits for a human: its requests are cancelled, and it ends
                await runner.pauses.cancel_paused(self.cid)
        except Exception:
            log.exception("could not cancel sub-agent run %s", self.ids.run_id)

    def _handed_on(self) -> bool:
        """Whether the parent stops here only to go on elsewhere (this process shuts down)."""
        ctx, runner = self.run.ctx, self.runner
        parent = runner.here.active.get(ctx.conversation_id or "")
        return runner.here.closing or (parent is not None and parent.run_id == ctx.run_id and parent.handover)

    async def _abandon(self) -> None:
        """A child told to stop that did not end in time: no worker may start it any more, and a run no
        worker took is closed here."""
        run_id, runner = self.ids.run_id, self.runner
        try:
            await outside(DBOS.cancel_workflow_async(run_id))
            row = next((r for r in await runner.store.runs.working() if r.id == run_id), None)
            if row is not None and row.lease_owner == runner.here.owner and self.cid not in runner.here.active:
                await close_interrupted(runner.driver, row)
        except Exception:
            log.exception("could not abandon sub-agent run %s", run_id)

    async def ended(self) -> _Ended | None:
        """How the child ended, read from the store; None when it has not (it was abandoned)."""
        if self.end is None:
            return None
        store, run_id = self.runner.store, self.ids.run_id
        record = await store.runs.get(run_id)
        state = await store.runs.state(run_id) or {}
        given = record.usage if record is not None else None  # the record's totals; the state's request count
        kept: dict[str, Any] = state["usage"] if isinstance(state.get("usage"), dict) else {}
        usage = Usage(in_tokens=given.in_tokens if given else 0, out_tokens=given.out_tokens if given else 0,
                      cost_usd=given.cost_usd if given else None, requests=int(kept.get("requests") or 0),
                      estimated=bool(kept.get("estimated")))
        transcript = await store.conversations.load_messages(self.cid)
        final = next((m for m in reversed(transcript) if m.role == "assistant"), None)
        return _Ended(run_id, final.text if final is not None and not final.tool_calls else "",
                      record.status if record else "failed",
                      (record.finish_reason if record else None) or self.end.finish_reason,
                      usage, self.error)


async def _enqueue(run_id: str, spec: dict[str, Any]) -> None:
    with SetWorkflowID(run_id):
        await DBOS.enqueue_workflow_async(CHILDREN, run_workflow, spec)  # its parent holds a run slot
