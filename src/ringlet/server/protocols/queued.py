"""A message that waits for a working run to end (`mode: "queue"`, or a steer the run may not take): a DBOS
workflow on the fires queue (`ringlet-fires`), enqueued before the 202 answers, so the message survives the
process that took it.

    POST …/messages {mode}  ──►  enqueue `ringlet.queued_message` (its plan: the message, the run it waits
                                 for, the steer it may have been taken as, the next run's id)  ──►  202
    any process (or the next one on the SQLite file)  ──►  the workflow: once the run has ended, unless it
                                 took the steer, start the next run with the message (a step, under the
                                 plan's run id: an execution again starts no second one)

It waits the way a fire does (`firing.fires`): a recorded `recv` with a growing timeout, cut short when this
process sees the conversation's run end. On PostgreSQL the engine's DBOS holds it, and a dead worker's
workflows are handed on (`engine.Engine.hand_on`); on SQLite, DBOS for firing (a system database beside the
store's file), whose next process recovers it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, TypedDict

from dbos import DBOS, SetWorkflowID
from sqlalchemy.exc import IntegrityError

from ringlet.messages import Message
from ringlet.server.durable.dbos import FIRES, Dbos, outside
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError
from ringlet.server.runs.service import Records, Runs

log = logging.getLogger("ringlet.server")
WAITED = ("working", "input_required")
"""Statuses of the run a queued message waits for (a paused run may still take the steer after its pause)."""


class QueuedMessage(TypedDict):
    """What the workflow records (JSON): the message, the run it waits for, and the run it starts."""

    workflow_id: str
    conversation_id: str
    run_id: str
    """The next run's id (the 202's, for a queued message)."""
    after: str
    """The run it waits for."""
    steer_id: str | None
    """Set when it was steered into `after`: nothing starts if that run took it."""
    message: dict[str, Any]
    overrides: dict[str, Any] | None
    principal: dict[str, Any]


def plan(conversation_id: str, run_id: str, after: str, steer_id: str | None, prompt: Message,
         overrides: dict[str, Any] | None, principal: Principal) -> QueuedMessage:
    p = principal
    return QueuedMessage(workflow_id=f"ringlet-queued-{run_id}", conversation_id=conversation_id, run_id=run_id,
                         after=after, steer_id=steer_id, message=prompt.model_dump(mode="json"),
                         overrides=overrides or None,
                         principal={"key_id": p.key_id, "user_id": p.user_id, "org_id": p.org_id,
                                    "roles": list(p.roles), "scopes": sorted(p.scopes),
                                    "realms": None if p.realms is None else sorted(p.realms),
                                    "agents": None if p.agents is None else sorted(p.agents)})


async def enqueue(queued: QueuedMessage) -> None:
    """Store the workflow (before the 202): from now on some process starts the next run for it."""

    async def put() -> None:
        with SetWorkflowID(queued["workflow_id"]):
            await DBOS.enqueue_workflow_async(FIRES, queued_message, queued)

    await outside(put())


@DBOS.workflow(name="ringlet.queued_message")
async def queued_message(queued: QueuedMessage) -> str:
    """Start the next run once `after` has ended (unless it took the steer): `started`, `taken`, `gone` or
    `failed`."""
    firing = await _firing()
    with firing.tracked():
        attempt = 0
        while True:
            if firing.runs.closing:
                raise asyncio.CancelledError  # stopping: it stays pending and goes on later
            try:
                outcome = await DBOS.run_step_async({"name": "ringlet.start"}, _step, queued)
            except Exception:  # its agent is gone, say: recorded, so an execution again ends the same way
                log.exception("the message queued in conversation %s could not start its run",
                              queued["conversation_id"])
                return "failed"
            if outcome != "busy":
                return outcome
            await firing.turn(queued, attempt)  # the fires' wait: `conversation_id` and `workflow_id` it reads
            attempt += 1


async def _firing() -> Any:
    """This process's firing (`firing.fires.Firing`), once it is open."""
    while not Dbos.firings:
        if Dbos.ready is None or Dbos.ready.is_set():
            raise asyncio.CancelledError  # stopping: it stays pending, for a process that goes on
        await Dbos.ready.wait()
    return Dbos.firings[0]


async def _step(queued: QueuedMessage) -> str:
    firing = await _firing()
    return await outside(start(firing.runs, queued))  # a durable run is a workflow of its own, not a child


async def start(runs: Runs, queued: QueuedMessage) -> str:
    """Start the next run now, if it is time: `started` (now, or by an execution that died), `taken` (the
    run took the steer), `busy` (a run works: wait) or `gone` (the conversation was deleted)."""
    cid, store = queued["conversation_id"], runs.records
    if await store.runs.get(queued["run_id"]) is not None:
        return "started"
    waited = await store.runs.get(queued["after"])
    if waited is not None and waited.status in WAITED:
        return "busy"
    if queued["steer_id"] is not None and await took(store, cid, queued["after"], queued["steer_id"]):
        return "taken"
    conversation = await store.conversations.get(cid)
    if conversation is None:
        log.warning("a message queued in conversation %s was dropped: the conversation is gone", cid)
        return "gone"
    given = queued["principal"]
    principal = Principal(key_id=given["key_id"], user_id=given["user_id"], org_id=given["org_id"],
                          roles=tuple(given["roles"]), scopes=frozenset(given["scopes"]),
                          realms=None if given["realms"] is None else frozenset(given["realms"]),
                          agents=None if given["agents"] is None else frozenset(given["agents"]))
    try:
        await runs.start(conversation, Message.validate(queued["message"]), principal=principal, wait_turn=True,
                           overrides=queued["overrides"], run_id=queued["run_id"])
    except ApiError as exc:
        if exc.code == "unavailable" and runs.closing:
            raise asyncio.CancelledError from None  # stopping: it stays pending and goes on later
        if exc.code in ("run_in_progress", "unavailable"):  # another run took the turn first; storage failing
            return "busy"
        raise
    except IntegrityError:  # its run id is taken: an execution of this workflow that died started it
        if await store.runs.get(queued["run_id"]) is None:
            raise
    return "started"


async def took(store: Records, cid: str, run_id: str, steer_id: str) -> bool:
    """Whether run `run_id` took the steer `steer_id` (its stored `steer_taken`)."""
    after = 0
    while rows := await store.events.after(cid, after, limit=1000, run_id=run_id):
        if any(kind == "steer_taken" and payload.get("steer_id") == steer_id for _, kind, payload in rows):
            return True
        after = rows[-1][0]
    return False
