"""The run's DBOS workflow (`ringlet.run`): one run from its first round to its end, through every pause, in
whichever process DBOS hands it to (`engine.py` says how runs become workflows and what a step is). It adopts
the run into this process's run machinery (`Starter.adopt`), drives it with the one driver
(`RunDriver.drive`), and waits for people on DBOS messages."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from dbos import DBOS
from sqlalchemy import func, select

from ringlet.agent.settings import overrides_of
from ringlet.agent.subagents import Lineage
from ringlet.durable import DurableSteps
from ringlet.gates.approval import NEVER, ApprovalDecision, epoch
from ringlet.loop import RunState
from ringlet.messages import Message
from ringlet.server.durable.attempts import Logged, retraction
from ringlet.server.durable.dbos import outside
from ringlet.server.durable.reconcile import close_interrupted
from ringlet.server.durable.steers import DurableInbox, Steering, attach
from ringlet.server.http.auth import Principal
from ringlet.server.runs.active import ActiveRun
from ringlet.store.records import RunRecord
from ringlet.store.schema import events

if TYPE_CHECKING:
    from ringlet.server.runs.runner import Runner

log = logging.getLogger("ringlet.server")


class Engine(Protocol):
    """What the workflow needs of this process's engine (`engine.Engine`)."""

    steering: Steering

    def executing(self, run_id: str, *, busy: bool) -> None: ...

    def freed(self, agent: str) -> None: ...


class Process:
    runner: Runner | None = None
    """The Runner of this process: it executes the workflows DBOS hands this process."""
    engine: Engine | None = None
    """This process's engine (open)."""


# -- the workflow -----------------------------------------------------------------------------------------


@DBOS.workflow(name="ringlet.run")
async def run_workflow(spec: dict[str, Any]) -> str:
    """One run, from its first round to its end, through every pause."""
    runner = Process.runner
    if runner is None:
        raise RuntimeError("this process has no ringlet server to run workflows")
    if Process.engine is not None:  # a drain waits for it from now on (before it is adopted as a run too)
        Process.engine.executing(spec["run_id"], busy=True)
    try:
        return await _execute(runner, spec)
    except Exception:  # it could not even start (its agent is gone, its storage failed): close it
        log.exception("run %s failed on the engine", spec["run_id"])
        try:
            return await _closed(runner, spec["run_id"])
        finally:  # started here and taken here, it has no watcher to release it
            if (run := runner.here.active.get(spec["conversation_id"])) is not None and run.run_id == spec["run_id"]:
                runner.driver.release(run)
    finally:
        if Process.engine is not None:  # its slot is free: a run waiting for it under a limit starts now
            Process.engine.executing(spec["run_id"], busy=False)
            Process.engine.steering.close(spec["run_id"])
            if not spec.get("lineage"):
                Process.engine.freed(spec["agent"])


async def _closed(runner: Runner, run_id: str) -> str:
    """Close a run that cannot go on the way a dead process's run is closed (`reconcile.close_interrupted`)."""
    row = next((r for r in await runner.store.runs.working() if r.id == run_id), None)
    if row is not None:
        await close_interrupted(runner.driver, row)
    return "failed"


async def _execute(runner: Runner, spec: dict[str, Any]) -> str:
    run_id, cid, agent = spec["run_id"], spec["conversation_id"], spec["agent"]
    lease = runner.here.lease_until()
    inbox = Process.engine.steering.open(run_id) if Process.engine is not None else DurableInbox()
    incoming = [Message.validate(m) for m in spec["incoming"]]
    before = incoming[0].id if incoming else None
    # started here and executed by no other process yet: nothing is logged, and its history is read with
    # the lease, in one transaction
    history = await runner.store.runs.take(run_id, runner.here.owner, lease, conversation_id=cid, before=before)
    if history is not None:
        logged = Logged.of([])
    else:
        await runner.store.runs.claim(run_id, runner.here.owner, lease, expired_before="9999")
        logged = await _logged(runner, cid, run_id)
        await outside(inbox.recall(run_id))  # it receives its steers where the earlier execution did
        history = await runner.store.conversations.load_messages(cid, before=before) if before else []
    if logged.replay and spec.get("kind") == "graph" and not await runner.graphs.replayable(agent, run_id):
        return await _closed(runner, run_id)
    steps = DurableSteps(run_id)
    # executed again: its earlier events are in the log, not in what this process publishes (so a parent
    # here follows this child from the log: `RunDriver.backlog`)
    first = _first_stream(runner, spec, incoming, history, steps)
    stream, applied, resumed = attach(first, inbox), (), bool(logged.replay)
    while True:
        run = runner.starter.adopt(run_id, cid, agent, stream, resumed=resumed, applied=applied)
        run.replay, run.driver = logged.replay, asyncio.current_task()
        steps.sending = _retracting(runner, run, logged)
        await runner.driver.drive(run, stream)  # cancelled when this process stops (`Engine.close`): not ended
        if not getattr(stream, "paused", False):
            return str(getattr(stream.result, "status", "failed"))
        if Process.engine is not None:  # waiting for people: no drain waits for it (it goes on elsewhere)
            Process.engine.executing(run_id, busy=False)
        stream, applied = await _decided(runner, run_id, stream, steps)
        attach(stream, inbox)
        if Process.engine is not None:
            Process.engine.executing(run_id, busy=True)
        if spec.get("lineage") and hasattr(stream, "run"):  # a durable sub-agent goes on at its place
            stream.run.ctx.lineage = Lineage.of(spec["lineage"])
        resumed = True


async def _logged(runner: Runner, cid: str, run_id: str) -> Logged:
    """What the run has logged already (by an execution that died). A replay of the run yields those
    events again; they are not stored or sent twice."""
    e = events.c
    first = select(func.min(e.id)).where(e.conversation_id == cid, e.run_id == run_id).scalar_subquery()
    async with runner.store.db.connect() as conn:
        rows = await conn.execute(select(e.type, e.payload).where(e.conversation_id == cid, e.id >= first)
                                  .order_by(e.id))
        return Logged.of([(kind, payload) for kind, payload in rows])


def _retracting(runner: Runner, run: ActiveRun, logged: Logged) -> Callable[[str | None], Awaitable[None]]:
    """Before a model request is sent for real (or a graph node that is one step runs again): close what the
    dead execution streamed there (`attempts.retraction`), stored and sent before the new attempt's events."""

    async def retract(node_id: str | None) -> None:
        if run.replay:
            for event in retraction(run, logged.open_calls, node_id):
                await runner.driver.emit(run.conversation_id, event, run)

    return retract


def _first_stream(runner: Runner, spec: dict[str, Any], incoming: list[Message], history: list[Message],
                  steps: DurableSteps | None) -> Any:
    cid = spec["conversation_id"]
    given = spec["principal"]
    principal = Principal(key_id=given["key_id"], user_id=given["user_id"], org_id=given["org_id"],
                          roles=tuple(given["roles"]), scopes=frozenset(), agents=None,
                          realms=None if given["realms"] is None else frozenset(given["realms"]))
    approver = runner.streams.approver(spec["agent"], spec["realm"]) if spec.get("deny") else None
    overrides = overrides_of(spec.get("overrides"))
    lineage = Lineage.of(spec["lineage"]) if spec.get("lineage") else None  # a sub-agent's (`child_runs`)
    return runner.streams.new(spec["agent"], incoming, history, cid=cid, realm=spec["realm"],
                             principal=principal, channel=spec["channel"], run_id=spec["run_id"],
                             request_id=spec.get("request_id"), approver=approver, overrides=overrides, steps=steps,
                             lineage=lineage)


async def _decided(runner: Runner, run_id: str, paused: Any, steps: DurableSteps) -> tuple[Any, tuple[str, ...]]:
    """Wait (holding no step) until decisions (a graph run: answers) for the `paused` run arrive or its
    requests expire; the stream that continues it, and the calls whose decisions it applies."""
    state: RunState | None = getattr(paused, "state", None)  # a loop run's: its requests' expiry
    while True:
        taken = await DBOS.run_step_async({"name": "ringlet.continuation"}, runner.pauses.continuation_of, run_id)
        if taken is not None:
            break
        pending = {r.tool_call_id for r in await runner.store.approvals.list(run_id=run_id, status="pending")}
        deadlines = [epoch(p.request.expires_at) for call_id, p in (state.awaiting.items() if state else ())
                     if p.request.expires_at != NEVER and call_id in pending]  # (a decided one never expires:
        wait_s = max(0.0, min(deadlines) - time.time()) + 0.05 if deadlines else 24 * 3600.0  # no busy loop)
        if await DBOS.recv_async("decision", timeout_seconds=wait_s) is None and deadlines:  # past the earliest
            await outside(runner.pauses.expire_due())  # deadline: expired requests are decided now
    if "decisions" not in taken:
        return await runner.graphs.continued(RunRecord.from_json(taken["row"]), taken, paused=paused, steps=steps), ()
    decisions = {k: ApprovalDecision(**v) for k, v in taken["decisions"].items()}
    return runner.streams.resumed(RunRecord.from_json(taken["row"]), decisions, steps=steps), tuple(decisions)
