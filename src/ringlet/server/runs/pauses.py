"""Runs paused for people (`gates.md` §4.6): deciding approvals and answering questions (the first decision
wins), and resuming the run with them in whichever process this is (on the engine, its workflow waits for a
wake-up wherever it is); approvals that expire; and the in-memory waits of runs that are not stored (a
`/v1` run without a conversation, a sub-agent's in-call questions). A resumed run goes on as a run of the
key that caused it: it waits its turn among that key's active runs."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import asdict
from typing import Any, cast

from ringlet._ids import now
from ringlet.gates.approval import ApprovalDecision
from ringlet.loop import RunState
from ringlet.server.http.errors import ApiError
from ringlet.server.runs.graphs import GraphRuns, Relaunch, checked_answer
from ringlet.server.runs.here import Here
from ringlet.server.runs.streams import Streams
from ringlet.store import Store
from ringlet.store.records import Approval, RunRecord

log = logging.getLogger("ringlet.server")


class Pauses:
    """Decisions, answers and the resumption of paused runs."""

    def __init__(self, store: Store, here: Here, streams: Streams, graphs: GraphRuns, relaunch: Relaunch) -> None:
        self.store, self.here, self.streams, self.graphs, self.relaunch = store, here, streams, graphs, relaunch
        self._timers: set[asyncio.Task[None]] = set()

    def close(self) -> None:
        """Stop the expiry timers (the durable sweep in `upkeep` covers what they would have done)."""
        for timer in list(self._timers):
            timer.cancel()

    async def resume(self, run_id: str) -> bool:
        """Resume a paused run with the decisions that have arrived, in whichever process this is. False
        when there is nothing to apply yet, or another process holds the run."""
        if self.here.closing or not await self._decided(run_id):
            return False  # nothing to apply: the run stays paused, untouched (its status never flickers)
        key = await self.store.runs.key(run_id)  # it goes on as a run of the key that caused it
        if key is not None and self.here.limits.runs.busy(key, run_id):  # the decision stands (never a 429):
            self.here.spawn(self._resume_in_turn(run_id, key))  # the run waits its turn among the key's
            return True
        if key is not None:
            self.here.limits.runs.hold(key, run_id)
        return await self._go_on(run_id, counted=key is not None)

    async def _resume_in_turn(self, run_id: str, key: str) -> None:
        await self.here.limits.runs.acquire(key, run_id)
        await self._go_on(run_id, counted=True)

    async def _go_on(self, run_id: str, *, counted: bool) -> bool:
        """Resume a decided run; `counted`: holding its key's place, released when it ends or pauses again."""
        if await self.here.executor.wake(run_id, follow=counted):  # its execution waits for the wake-up,
            return True  # wherever it is (a durable run's workflow); followed here while it runs
        self.here.resuming.add(run_id)  # taken and alive: upkeep must not close it while it starts again
        try:
            resumed = await self._resume(run_id)
        finally:
            self.here.resuming.discard(run_id)
        if not resumed:
            self.here.limits.runs.release(run_id)
        return resumed

    async def _resume(self, run_id: str) -> bool:
        row = await self.store.runs.take_paused(run_id, self.here.owner, self.here.lease_until())
        if row is None:
            return False
        cid, decisions = row.conversation_id, {}
        starting = self.here.active.get(cid) if cid else None
        if starting is not None and starting.run_id != run_id:  # a message that will find the run paused
            await starting.done.wait()
        try:
            stream, decisions = await self._continuation(row)
        except Exception:
            log.exception("could not resume run %s; it stays paused", run_id)
            stream = None
        if stream is None or cid is None or cid in self.here.active:  # paused runs belong to conversations
            await self.store.runs.pause_again(run_id)
            return False
        await self.store.conversations.set_status(cid, "running")
        self.relaunch(run_id, cid, row.agent, stream, applied=tuple(decisions))
        return True

    async def _continuation(self, row: RunRecord) -> tuple[Any, dict[str, ApprovalDecision]]:
        """The stream that continues a paused run (`row`, taken), or None while there is nothing to apply,
        with the decisions it applies by tool-call id. A graph run goes on from its checkpoint instead."""
        if row.kind == "graph":
            return await self.graphs.continuation(row), {}
        decisions = await self._decisions(row.id, RunState.from_json(json.dumps(row.state)))
        return (self.streams.resumed(row, decisions) if decisions else None), decisions

    async def continuation_of(self, run_id: str) -> dict[str, Any] | None:
        """A durable paused run's continuation, taking the run (`engine.py` records it as a step): its row
        and the decisions to apply (a graph run: its answers, `GraphRuns.answers`) as JSON, or None while
        nothing is decided."""
        if not await self._decided(run_id):
            return None
        store, owner, until = self.store, self.here.owner, self.here.lease_until()
        row = await store.runs.take_paused(run_id, owner, until) or await store.runs.retake(run_id, owner, until)
        if row is None:  # (`retake`: an execution of this workflow that died in this step had taken it)
            return None
        if row.kind == "graph":  # a graph run goes on with its question's answer
            taken = await self.graphs.answers(row)
        else:
            decisions = await self._decisions(run_id, RunState.from_json(json.dumps(row.state)), durable=True)
            taken = {"decisions": {k: asdict(d) for k, d in decisions.items()}} if decisions else None
        if taken is None:
            await self.store.runs.pause_again(run_id)
            return None
        if row.conversation_id is not None:
            await self.store.conversations.set_status(row.conversation_id, "running")
        return {"row": row.to_json(), **taken}

    async def _decided(self, run_id: str) -> bool:
        """Whether a call the paused run waits for has a decision (read only, before taking the run)."""
        awaiting: dict[str, Any] = ((await self.store.runs.state(run_id)) or {}).get("awaiting") or {}
        return any(r.tool_call_id in awaiting and r.status != "pending"
                   for r in await self.store.approvals.list(run_id=run_id))

    async def _decisions(self, run_id: str, state: RunState, *, durable: bool = False) -> dict[str, ApprovalDecision]:
        """The decisions to resume with, by tool-call id. An approved call moves to `executing` first, so
        it runs at most once; one found `executing` already was interrupted by a stopped process. A durable
        run's calls are steps that run at most once by themselves, and only its workflow applies its
        decisions: one found `executing` was marked by an execution of this step that died before the call
        began, so it is still `approved`."""
        records = {r.tool_call_id: r for r in await self.store.approvals.list(run_id=run_id)
                   if r.tool_call_id in state.awaiting}
        moved = await self.store.approvals.mark_executing([r.approval_id for r in records.values()
                                                 if r.status == "approved"])
        out: dict[str, ApprovalDecision] = {}
        for call_id, r in records.items():
            status = "approved" if durable and r.status == "executing" else r.status
            if (status == "approved" and r.approval_id not in moved and not durable) or status == "pending":
                continue  # another process is applying it, or nobody has decided yet
            if status in ("approved", "denied", "expired", "cancelled", "executing", "answered"):
                out[call_id] = ApprovalDecision(status, r.decided_by or "system", r.note,
                                                r.decided_at or now(), answer=r.answer)
        return out

    async def decide(self, record: Approval, *, approved: bool, note: str | None,
                     decided_by: str, resume: bool = True) -> dict[str, Any]:
        """Decide one approval (the first decision wins) and resume its run. 409 when it was decided
        already or has expired."""
        approval_id, when = record.approval_id, now()
        ok = await self.store.approvals.decide(approval_id, status="approved" if approved else "denied",
                                              decided_by=decided_by, note=note, when=when)
        current = await self.store.approvals.get(approval_id) or record
        if not ok:
            if current.status in ("pending", "expired"):
                await self.expire_due()
                raise ApiError(409, "approval_expired", f"approval {approval_id} expired at "
                               f"{current.expires_at}; the call was denied", details={"status": "expired"})
            if resume:  # a retry whose first try stored the decision and died before waking the run: wake it
                await self.resume(record.run_id)
            raise ApiError(409, "approval_already_decided", f"approval {approval_id} is already "
                           f"{current.status} (by {current.decided_by})",
                           details={"status": current.status, "decided_by": current.decided_by,
                                    "decided_at": current.decided_at})
        waiter = self.here.waiters.pop(approval_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(ApprovalDecision("approved" if approved else "denied", decided_by, note, when))
        elif resume and not await self.resume(record.run_id):
            await self.here.executor.decided(approval_id)  # a process waiting for it in memory (a sub-agent's) hears
        return {"approval_id": approval_id, "status": "approved" if approved else "denied",
                "decided_by": decided_by, "decided_at": when}

    async def answer(self, record: Approval, answer: Any, *, answered_by: str) -> dict[str, Any]:
        """Answer one question (checked against it: 422 when it does not fit) and resume its run. 409 when
        it was answered already (or has expired, or was cancelled)."""
        try:
            value, freeform = checked_answer(record.question or {}, answer)
        except ValueError as exc:
            raise ApiError(422, "validation_error", str(exc), details={"question_id": record.approval_id}) \
                from None
        question_id, when, given = record.approval_id, now(), {"answer": value, "freeform": freeform}
        if not await self.store.approvals.decide(question_id, status="answered", decided_by=answered_by,
                                                       note=None, when=when, answer=given):
            current = await self.store.approvals.get(question_id) or record
            if current.status == "pending":  # past its deadline: expire it now
                await self.expire_due()
            else:  # answered by a try that died before waking the run: wake it (nothing, if it goes on)
                await self.resume(record.run_id)
            raise ApiError(409, "question_already_answered", f"question {question_id} is "
                           f"{'expired' if current.status == 'pending' else current.status}",
                           details={"status": current.status, "answered_by": current.decided_by})
        waiter = self.here.waiters.pop(question_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(ApprovalDecision("answered", answered_by, answer=given, decided_at=when))
        elif not await self.resume(record.run_id):
            await self.here.executor.decided(question_id)
        return {"question_id": question_id, "status": "answered"}

    async def heard(self, approval_id: str) -> None:
        """Another process recorded a decision one of this process's in-memory waiters waits for."""
        waiter = self.here.waiters.get(approval_id)
        record = await self.store.approvals.get(approval_id) if waiter is not None else None
        if record is None or record.status == "pending" or waiter is None or waiter.done():
            return
        self.here.waiters.pop(approval_id, None)
        waiter.set_result(ApprovalDecision(cast(Any, record.status), record.decided_by or "system", record.note,
                                           record.decided_at or now(), answer=record.answer))

    async def wake_decided(self, before: str) -> int:
        """Resume the paused runs holding a decision made before `before`: the process that stored it died
        before waking its run (a run that cannot go on with it yet is left as it is). How many went on."""
        woken = 0
        for run_id in await self.store.runs.decided_paused(before):
            woken += await self.resume(run_id)
        return woken

    async def expire_due(self) -> int:
        """Expire every pending approval past its deadline and resume the runs they held; how many."""
        due = await self.store.approvals.expire(now())
        for run_id in dict.fromkeys(r.run_id for r in due):
            await self.resume(run_id)
        return len(due)

    def expire_at(self, deadline: float) -> None:
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
        run_id = await self.store.runs.paused_of(conversation_id)
        if run_id is None:
            return None
        await self.store.approvals.cancel(run_id)
        await self.resume(run_id)
        return run_id
