"""A message sent while a run works (`POST …/messages` with `mode`): steered into it, or queued after it.

    mode: "steer"   the working run takes it at its next round boundary (`steer_queued` now, `steer_taken`
                    then), wherever it executes (`Executor.steer`); a run that has no round left ends
                    without it, and the message starts the next run, so nothing is lost
    mode: "queue"   it starts the next run once the working one has ended
    (none)          409 `run_in_progress`, as always

Both answer 202 at once; the conversation's event stream shows the rest. With no run working, either mode
starts a run as a message without one does. What waits for the working run's end is a DBOS workflow
(`queued`), stored before the 202: whichever process is left (or the next one, on SQLite) starts the next
run for it, unless the run took the steer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ringlet._ids import new_id, now
from ringlet.events import SteerQueuedEvent
from ringlet.loop.steering import Steer
from ringlet.messages import Message
from ringlet.server.catalog import HostedGraph
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError
from ringlet.server.protocols import queued
from ringlet.server.runs.service import Runs
from ringlet.store.records import Conversation


async def working_run(runs: Runs, conversation: Conversation) -> str | None:
    """The id of the conversation's working run, in this process or another; None when none works (a paused
    run does not: a message to it answers its question, or is refused as usual)."""
    active = runs.active.get(conversation.id)
    if active is not None and not active.released:
        return active.run_id
    rows = await runs.records.runs.list(conversation_id=conversation.id, status="working", limit=1)
    return rows[0].id if rows else None


async def send(runs: Runs, conversation: Conversation, principal: Principal, prompt: Message,
               mode: str, overrides: dict[str, Any] | None = None, *,
               up: Callable[[], Awaitable[object]]) -> dict[str, Any] | None:
    """Steer `prompt` into the working run, or queue it after it; None when no run works (start one).
    `overrides` (and a graph's variables) are the next run's, when the message starts one; a steer joins the
    working run as it is. `up`: brings up what runs the waiting workflow (`Firing.up`: on SQLite, DBOS is
    launched only once something fires), awaited only when a run works."""
    cid = conversation.id
    run_id = await working_run(runs, conversation)
    if run_id is None:
        return None
    await up()
    if mode == "steer":
        if isinstance(runs.catalog.get(conversation.agent), HostedGraph):
            raise ApiError(409, "run_in_progress", f"conversation {cid} runs a graph, which cannot be steered; "
                           "send the message with `mode: \"queue\"` to run it next", details={"run_id": run_id})
        steer, active, next_id = Steer(new_id("st"), prompt), runs.active.get(cid), new_id("r")
        # stored first (the next run, unless the run takes it), told, and only then handed to the run: its
        # `steer_queued` comes before its `steer_taken`, which the run may send at once
        await queued.enqueue(queued.plan(cid, next_id, run_id, steer.steer_id, prompt, overrides, principal))
        await runs.emit(cid, SteerQueuedEvent(run_id=run_id, ts=now(), steer_id=steer.steer_id,
                                              message_id=prompt.id, text=prompt.text), active)
        if await runs.steer(run_id, steer):
            return {"mode": "steer", "run_id": run_id, "steer_id": steer.steer_id, "message_id": prompt.id,
                    "next_run_id": next_id}
        return {"mode": "queue", "run_id": next_id, "steer_id": None, "message_id": prompt.id,  # no round left
                "next_run_id": next_id}
    next_id = new_id("r")  # queued
    await queued.enqueue(queued.plan(cid, next_id, run_id, None, prompt, overrides, principal))
    return {"mode": "queue", "run_id": next_id, "steer_id": None, "message_id": prompt.id, "next_run_id": next_id}
