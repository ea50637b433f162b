"""A message sent while a run works (`POST …/messages` with `mode`): steered into it, or queued after it.

    mode: "steer"   the working run takes it at its next round boundary (`steer_queued` now, `steer_taken`
                    then), wherever it executes (`Executor.steer`); a run that has no round left ends
                    without it, and the message starts the next run, so nothing is lost
    mode: "queue"   it starts the next run once the working one has ended
    (none)          409 `run_in_progress`, as always

Both answer 202 at once; the conversation's event stream shows the rest. With no run working, either mode
starts a run as a message without one does. What waits for the working run's end is a task of this process
(`later`): it follows the run's events (stored, then live), wherever the run executes. It is not among the
work the server waits for when it stops (a run executing elsewhere may go on for long): a message still
waiting then is dropped, and logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine
from typing import Any

from ringlet._ids import new_id, now
from ringlet.events import SteerQueuedEvent
from ringlet.loop.steering import Steer
from ringlet.messages import Message
from ringlet.server.catalog import HostedGraph
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError
from ringlet.server.runs.service import Runs
from ringlet.store.records import Conversation

log = logging.getLogger("ringlet.server")
TRIES = 100
"""How many runs in a row a queued message waits behind before it gives up (each one ends first)."""


async def working_run(runs: Runs, conversation: Conversation) -> str | None:
    """The id of the conversation's working run, in this process or another; None when none works (a paused
    run does not: a message to it answers its question, or is refused as usual)."""
    active = runs.active.get(conversation.id)
    if active is not None and not active.released:
        return active.run_id
    rows = await runs.records.runs.list(conversation_id=conversation.id, status="working", limit=1)
    return rows[0].id if rows else None


async def send(runs: Runs, conversation: Conversation, principal: Principal, prompt: Message,
               mode: str, overrides: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Steer `prompt` into the working run, or queue it after it; None when no run works (start one).
    `overrides` (and a graph's variables) are the next run's, when the message starts one; a steer joins the
    working run as it is."""
    cid = conversation.id
    run_id = await working_run(runs, conversation)
    if run_id is None:
        return None
    if mode == "steer":
        if isinstance(runs.catalog.get(conversation.agent), HostedGraph):
            raise ApiError(409, "run_in_progress", f"conversation {cid} runs a graph, which cannot be steered; "
                           "send the message with `mode: \"queue\"` to run it next", details={"run_id": run_id})
        steer, active = Steer(new_id("st"), prompt), runs.active.get(cid)
        if await runs.steer(run_id, steer):
            await runs.emit(cid, SteerQueuedEvent(run_id=run_id, ts=now(), steer_id=steer.steer_id,
                                                    message_id=prompt.id, text=prompt.text), active)
            later(after(runs, conversation, principal, prompt, run_id, steer.steer_id, overrides=overrides))
            return {"mode": "steer", "run_id": run_id, "steer_id": steer.steer_id, "message_id": prompt.id}
    next_id = new_id("r")  # queued (or a steer its run could no longer take)
    later(after(runs, conversation, principal, prompt, run_id, None, next_id, overrides=overrides))
    return {"mode": "queue", "run_id": next_id, "steer_id": None, "message_id": prompt.id}


_WAITING: set[asyncio.Task[None]] = set()


def later(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` in the background (held here; failures and drops are logged)."""
    task = asyncio.create_task(work)
    _WAITING.add(task)
    task.add_done_callback(_done)


def _done(task: asyncio.Task[None]) -> None:
    _WAITING.discard(task)
    if task.cancelled():
        log.warning("the server stopped before a run ended: a message queued after it was dropped")
    elif (exc := task.exception()) is not None:
        log.error("a message queued after a run could not start its run", exc_info=exc)


async def after(runs: Runs, conversation: Conversation, principal: Principal, prompt: Message,
                run_id: str | None, steer_id: str | None, next_id: str | None = None, *,
                overrides: dict[str, Any] | None = None) -> None:
    """Once the run `run_id` has ended: unless it took the steer `steer_id`, `prompt` starts the next run."""
    for _ in range(TRIES):
        if run_id is not None and await _took(runs, conversation.id, run_id, steer_id):
            return  # the run took it
        try:
            await runs.start(conversation, prompt, principal=principal, wait_turn=True, overrides=overrides,
                               run_id=next_id or new_id("r"))
        except ApiError as exc:  # another run took the turn first (in another process): wait for it too
            if exc.code != "run_in_progress":
                raise  # the server stops (503), or the agent or its key is gone: logged
            run_id, steer_id = await working_run(runs, conversation), None
        else:
            return
    log.warning("a message queued in conversation %s waited behind %d runs and was dropped", conversation.id, TRIES)


async def _took(runs: Runs, cid: str, run_id: str, steer_id: str | None) -> bool:
    """Follow the run's events from its first until it takes the steer (True) or ends (False)."""
    with runs.subscribe(cid) as subscriber:
        async for item in runs.items(subscriber, cid, after=0, run_id=run_id):
            if item is not None and steer_id is not None and item.type == "steer_taken" and \
                    json.loads(item.data).get("steer_id") == steer_id:
                return True
    return False
