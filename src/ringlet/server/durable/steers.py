"""Steers of durable runs: DBOS messages to the run's workflow, whichever process sent them.

    API process                                   worker executing run r
    DBOS.send(r, steer, topic="steer")  ──────►   (stored in DBOS's notifications, durable)
    NOTIFY ringlet_steer r              ──────►   its inbox is `heard` (an attribute: no query)
                                                  at the next round boundary: DBOS.recv(topic="steer",
                                                  timeout 0) until none is left, each one recorded

A run nobody steers costs nothing per round: the boundary reads one attribute. Only a run that was sent a
steer receives (`recv`), so the workflow's recorded operations differ from run to run; an execution DBOS
runs again (its worker died) must receive at the same boundaries as the first, or its steps would no longer
line up with their records. So before it executes again, the inbox reads which boundaries received
(`recall`: the workflow's recorded steps, read once, outside it): a boundary is named by the number of model
requests made before it, and a recorded `DBOS.recv` after the n-th model step and before the next belongs to
boundary n. Past the recorded part it listens again, and it listens at once (a steer sent while the dead
worker had not taken it yet is received at the first boundary).

A steer sent while the run waited in its queue is heard by every process; the one that executes the run
later finds it in `Steering.early`."""

from __future__ import annotations

import logging
from typing import Any

from dbos import DBOS
from sqlalchemy import text

from ringlet.loop.steering import Steer
from ringlet.store.engine import Db

log = logging.getLogger("ringlet.server")

TOPIC = "steer"
CHANNEL = "ringlet_steer"
EARLY_MAX = 4096


class DurableInbox:
    """A durable run's inbox (`ringlet.loop.steering.Inbox`): its workflow's DBOS messages on topic `steer`."""

    __slots__ = ("heard", "recorded", "replayed")

    def __init__(self) -> None:
        self.heard = False
        """A steer was sent to the run since its last boundary (told by NOTIFY; or unknown, after a crash)."""
        self.replayed: dict[int, int] = {}
        """An execution run again: boundary → how many recorded receives it made there."""
        self.recorded = 0
        """An execution run again: the model steps the earlier execution recorded (its boundaries past
        `recorded` are new)."""

    @property
    def pending(self) -> bool:
        return self.heard or bool(self.replayed)

    async def take(self, requests: int) -> list[Steer]:
        replayed = self.replayed.pop(requests, None) is not None
        if requests < self.recorded and not replayed:
            return []  # a boundary the earlier execution passed without receiving: so does this one
        if requests >= self.recorded:  # a boundary of its own
            if not (self.heard or replayed):
                return []
            self.heard = False  # a steer sent from now on is heard again, for the next boundary
        taken: list[Steer] = []
        while (data := await DBOS.recv_async(TOPIC, timeout_seconds=0)) is not None:
            try:
                taken.append(Steer.from_json(data))
            except Exception:  # a message that is not a steer is dropped, not the run
                log.warning("dropped a malformed steer message: %r", data)
        return taken

    async def recall(self, run_id: str) -> None:
        """Before the workflow executes (not first in this process): where an earlier execution received
        steers (read outside the workflow, so the reading is not a step of it). A first execution (nothing
        recorded: started by another process) listens only when told."""
        steps: list[Any] = await DBOS.list_workflow_steps_async(run_id, load_output=False)
        models = 0
        for step in sorted(steps, key=lambda s: s["function_id"]):
            name = str(step["function_name"])
            if name.startswith("model "):
                models += 1
            elif name == "DBOS.recv":
                self.replayed[models] = self.replayed.get(models, 0) + 1
        self.recorded = models
        self.heard = self.heard or bool(steps)  # executed before: a steer its worker heard may wait untaken


class Steering:
    """The steers this process hears (`CHANNEL`) for the durable runs it executes."""

    def __init__(self) -> None:
        self.inboxes: dict[str, DurableInbox] = {}
        self.early: set[str] = set()
        """Runs sent a steer while they executed nowhere here (yet): an execution that starts here listens."""

    def open(self, run_id: str) -> DurableInbox:
        inbox = self.inboxes.get(run_id) or DurableInbox()
        self.inboxes[run_id] = inbox
        if run_id in self.early:
            self.early.discard(run_id)
            inbox.heard = True
        return inbox

    def close(self, run_id: str) -> None:
        self.inboxes.pop(run_id, None)
        self.early.discard(run_id)

    def heard(self, run_id: str) -> None:
        inbox = self.inboxes.get(run_id)
        if inbox is not None:
            inbox.heard = True
            return
        if len(self.early) >= EARLY_MAX:  # runs that executed elsewhere: forgotten in bulk
            self.early.clear()
        self.early.add(run_id)


def attach(stream: Any, inbox: DurableInbox) -> Any:
    """A loop run's stream takes its steers from `inbox` (a graph run's takes none)."""
    run = getattr(stream, "run", None)
    if run is not None and hasattr(run, "inbox"):
        run.inbox = inbox
    return stream


async def send(db: Db, run_id: str, steer: Steer) -> None:
    """Send a steer to the run's workflow, wherever it executes (or will): a DBOS message, kept until the run
    receives it, and a NOTIFY, which marks its inbox in the process executing it."""
    await DBOS.send_async(run_id, steer.to_json(), topic=TOPIC)
    async with db.begin() as conn:
        await conn.execute(text("SELECT pg_notify(:channel, :run)"), {"channel": CHANNEL, "run": run_id})
