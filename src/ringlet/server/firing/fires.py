"""What starts runs by itself: cron triggers, agents' schedules and webhook fires, as DBOS workflows.

Every server process runs DBOS (`launch`): on PostgreSQL with the engine, the engine's (`engine.Engine`,
its system database the store's); otherwise DBOS only for firing, its system database a file beside the
store's SQLite file (`<db file>.dbos.sqlite`; runs still execute in process). A fire is a workflow on the
`ringlet-fires` queue, so it is stored before anything says it was accepted, it survives its process, and
it executes once however many processes there are:

- a cron trigger is a DBOS schedule (`triggers.py`): every process's DBOS scheduler enqueues a slot's
  workflow under one id (`sched-<name>-<time>`), so each slot fires once;
- an agent's schedule is a chain of delayed workflows, one per wake-up (`schedules.py`): each claims its
  slot in the store (a compare-and-set), enqueues the next wake-up, then fires;
- a webhook fire is enqueued by the request that accepts it, before its 202 (`triggers.py`).

A fire that runs hands a `Plan` to `deliver`, which starts the run with an id derived from the fire's
workflow id (`fire_run_id`), in a step: a fire executed again (its process died) finds its run and starts
no second one. While the conversation has another run (in this process or another, or paused for a human)
the fire waits its turn durably: a recorded `recv` with a growing timeout, cut short when this process sees
the conversation's run end (`Firing.turn`), so a fire waiting when its process dies waits on elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, cast

from dbos import DBOS, DBOSClient, SetEnqueueOptions, SetWorkflowID, StepOptions
from sqlalchemy.exc import IntegrityError

from ringlet._ids import derived_id
from ringlet.context import Channel
from ringlet.messages import Message
from ringlet.server.durable.dbos import FIRES, Dbos, launch, outside, shutdown
from ringlet.server.http.auth import Principal
from ringlet.server.http.errors import ApiError

if TYPE_CHECKING:
    from ringlet.server.runs.service import Runs
    from ringlet.store import Store

log = logging.getLogger("ringlet.server")
T = TypeVar("T")
LOCAL_EXECUTOR = "ringlet-local"
"""The DBOS executor id of a process firing over SQLite: the next process on that file recovers the fires
it left unfinished."""
BUSY = ("running", "input_required")
"""Conversation statuses of a run that a fire waits for."""
TURN = "turn"
WAIT_MAX_S = 60.0
"""The longest a fire waits for its turn between two tries when nothing tells it the conversation is free."""
ACTIVE = ("PENDING", "ENQUEUED", "DELAYED")
Restore = Callable[["Firing"], Awaitable[None]]
"""What runs once DBOS fires here (`Firing.open`): the cron triggers' schedules, the schedules' wake-ups."""
CLAIM: StepOptions = {"name": "ringlet.claim", "retries_allowed": True, "max_attempts": 6, "interval_seconds": 1.0,
                      "backoff_rate": 2.0}
"""A fire's claim, a step tried again for about a minute when it fails (the storage is away): claims are
idempotent, and a wake-up whose claim fails for good breaks its schedule's chain until the next start."""


class Plan(TypedDict):
    """A fire that runs, as its workflow records it (JSON): the run to start, and as whom."""

    workflow_id: str
    run_id: str
    conversation_id: str
    text: str
    metadata: dict[str, Any]
    """The message's metadata (`source`: the channel, and the trigger's or schedule's ids)."""
    channel: str
    principal: dict[str, Any]
    """`key_id`, `user_id`, `org_id`, `realm` and `agent` of whom the run runs as."""


def fire_run_id(workflow_id: str) -> str:
    """The id of the run a fire starts, derived from the fire's workflow id, so an execution of the fire again
    (its process died) starts no second one."""
    return derived_id("r", workflow_id)


def _pending(path: str) -> bool:
    """Whether DBOS's system database file `path` (if any) holds a fire that has not ended."""
    if not os.path.exists(path):
        return False
    try:
        client = DBOSClient(system_database_url=f"sqlite:///{path}")
    except Exception as exc:  # not DBOS's, or broken: launching DBOS says what is wrong with it
        log.warning("could not read DBOS's system database %s (%s); launching DBOS", path, exc)
        return True
    try:
        return bool(client.list_workflows(status=list(ACTIVE), limit=1, load_input=False, load_output=False))
    finally:
        client.destroy()


def principal_of(plan: Plan) -> Principal:
    given = plan["principal"]
    return Principal(key_id=given["key_id"], user_id=given["user_id"], org_id=given["org_id"], roles=(),
                     scopes=frozenset({"chat"}), realms=frozenset({given["realm"]}),
                     agents=frozenset({given["agent"]}))


async def current() -> Firing:
    """This process's firing, once it is open (a fire dequeued before waits for it)."""
    while not Dbos.firings:
        if Dbos.ready is None or Dbos.ready.is_set():
            raise asyncio.CancelledError  # stopping: the fire stays pending, for a process that goes on
        await Dbos.ready.wait()
    return cast(Firing, Dbos.firings[0])


# -- firing --------------------------------------------------------------------------------------------------


def dbos_file(store_file: str) -> str:
    """The file beside a SQLite store where DBOS keeps its fires."""
    return f"{store_file}.dbos.sqlite"


class Firing:
    """The fires of one server process; `clock` is the time fires are judged by (late or not, when the
    next wake-up is due): tests pass a controllable one."""

    def __init__(self, runs: Runs, store: Store, clock: Callable[[], float] = time.time, *,
                 shared: bool = False) -> None:
        self.runs, self.store, self.clock, self.shared = runs, store, clock, shared
        """`store`: where DBOS keeps fires beside it (`_system_database`); records are read through `runs`."""
        """`shared`: DBOS is launched by the runs' executor (durable runs), whose system database holds fires too."""
        self.tasks: set[asyncio.Task[Any]] = set()
        """The fires executing here: stopped (left pending) when this process stops."""
        self._own = self._closed = False
        self._folder: str | None = None
        self._up: asyncio.Task[None] | None = None
        self._restores: tuple[Restore, ...] = ()

    async def open(self, *restores: Restore) -> None:
        """Fire from now on. DBOS is launched (unless the engine has: SQLite, a system database beside the
        store's file) and `restores` run at once when anything may fire: always beside the engine or on
        PostgreSQL; on SQLite, when a trigger or an active schedule exists or a fire waits from before a
        restart. Otherwise DBOS stays down (an idle process spends nothing on its threads) until the first
        trigger, schedule or fire needs it (`up`)."""
        self._restores = restores
        if self.shared or self.store.engine.dialect.name != "sqlite" or await self._needed():
            await self.up()

    async def up(self) -> None:
        """DBOS launched for firing in this process, the fires it is handed taken, the restores done: once,
        for whoever asks first (a trigger made, a schedule woken, a webhook fired); the others wait for it."""
        if self._closed:
            raise ApiError(503, "unavailable", "the server is stopping; send it again to a server that runs")
        if self._up is None or (self._up.done() and self._up.exception() is not None):  # (failed: try again)
            self._up = asyncio.get_running_loop().create_task(self._launch(), name="ringlet-firing-up",
                                                              context=contextvars.Context())
        await asyncio.shield(self._up)

    @property
    def launched(self) -> bool:
        """Whether DBOS fires here (`up` done)."""
        return self._up is not None and self._up.done() and self._up.exception() is None

    async def _launch(self) -> None:
        if not self.shared and not self._own:  # (launched by a try whose restores failed: kept)
            url, executor = self._system_database()
            await launch(url, executor_id=executor, settings=self.runs.settings)
            self._own = True
        if self not in Dbos.firings:
            Dbos.firings.append(self)
        assert Dbos.ready is not None, "DBOS is launched"
        Dbos.ready.set()
        for restore in self._restores:
            await restore(self)

    async def _needed(self) -> bool:
        """Whether anything fires on this SQLite store: a trigger, an active schedule, or a fire pending in
        DBOS's file from before a restart (read with DBOS's client, without launching it)."""
        records = self.runs.records
        if await records.triggers.list() or await records.schedules.list(status="active"):
            return True
        path = self.store.db.sqlite_file
        return path is not None and await asyncio.to_thread(_pending, dbos_file(path))

    def _system_database(self) -> tuple[str, str]:
        """Where DBOS keeps fires when runs do not need it, and this process's executor id there."""
        store, settings = self.store, self.runs.settings
        if store.engine.dialect.name == "postgresql":
            url = settings.engine_url or store.engine.url.set(drivername="postgresql").render_as_string(
                hide_password=False)
            return url, self.runs.here.owner
        path = store.db.sqlite_file
        if path is None:  # an in-memory store: its fires live as long as it does
            self._folder = tempfile.mkdtemp(prefix="ringlet-dbos-")
            return f"sqlite:///{self._folder}/dbos.sqlite", LOCAL_EXECUTOR
        return f"sqlite:///{dbos_file(path)}", LOCAL_EXECUTOR

    async def stop(self) -> None:
        """Stop executing fires: the ones in progress stay pending (not ended) and go on later."""
        if self in Dbos.firings:
            Dbos.firings.remove(self)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def close(self) -> None:
        """Stop DBOS when this process launched it for firing (the engine stops its own)."""
        self._closed = True
        if self._up is not None:  # a launch under way ends first (its DBOS is stopped just below)
            await asyncio.gather(self._up, return_exceptions=True)
        await self.stop()
        self.runs.records.schedules.wake = None  # set by `schedules.watch`
        if self._own:
            self._own = False
            shutdown()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    @contextlib.contextmanager
    def tracked(self) -> Iterator[None]:
        """Around a fire's workflow body: stopped with this process's firing."""
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            yield
        finally:
            self.tasks.discard(task)

    # -- DBOS, outside any workflow ------------------------------------------------------------------------

    async def enqueue(self, workflow_id: str, workflow: Callable[..., Any], *args: Any,
                      at: float | None = None) -> None:
        """Enqueue `workflow(*args)` on the fires queue as `workflow_id`, to start at `at` (epoch seconds by
        `clock`; None: now); nothing when a workflow of that id exists already."""
        delay = 0.0 if at is None else max(0.0, at - self.clock())

        async def enqueue() -> None:
            with SetWorkflowID(workflow_id), (SetEnqueueOptions(delay_seconds=delay) if delay > 0
                                              else contextlib.nullcontext()):
                await DBOS.enqueue_workflow_async(FIRES, workflow, *args)

        await outside(enqueue())

    async def cancel(self, workflow_id: str) -> None:
        """Cancel a fire's workflow that has not finished (none: nothing happens)."""
        await outside(DBOS.cancel_workflow_async(workflow_id))

    async def running(self, workflow_id: str) -> bool:
        """Whether a fire has not finished: its workflow still waits (for its time or its conversation's
        turn), or the run it started has not ended (it works, or waits for a human)."""
        status = await outside(DBOS.get_workflow_status_async(workflow_id))
        if status is not None and status.status in ACTIVE:
            return True
        run = await self.runs.records.runs.get(fire_run_id(workflow_id))
        return run is not None and run.status in ("working", "input_required")

    # -- starting a fire's run --------------------------------------------------------------------------------

    async def start(self, plan: Plan) -> str:
        """Start the fire's run (a step): `started` (now, or by an execution of this fire that died), `busy`
        (its conversation has another run: wait for the turn) or `gone` (the conversation was deleted)."""
        return await outside(self._start(plan))  # a durable run is a workflow of its own, not a child

    async def _start(self, plan: Plan) -> str:
        runs, cid = self.runs, plan["conversation_id"]
        if await runs.records.runs.get(plan["run_id"]) is not None:
            return "started"
        conversation = await runs.records.conversations.get(cid)
        if conversation is None:
            removed = await runs.records.schedules.remove_conversation(cid)
            log.warning("fire %s dropped: conversation %s is gone (%d schedule(s) of it removed)",
                        plan["workflow_id"], cid, removed)
            return "gone"
        if cid in runs.active or conversation.status in BUSY:
            return "busy"
        prompt, channel = Message.user(plan["text"], **plan["metadata"]), cast(Channel, plan["channel"])
        try:  # `wait_turn`: not held to its key's active runs (no other run is active here: checked above)
            await runs.start(conversation, prompt, principal=principal_of(plan), channel=channel,
                               run_id=plan["run_id"], wait_turn=True)
        except ApiError as exc:
            if exc.code == "unavailable" and runs.closing:
                raise asyncio.CancelledError from None  # stopping: the fire stays pending and goes on later
            if exc.code in ("run_in_progress", "unavailable"):  # another process's run; storage failing
                return "busy"
            raise
        except IntegrityError:  # its run id is taken: an execution of this fire that died started it
            if await runs.records.runs.get(plan["run_id"]) is None:
                raise
        return "started"

    async def turn(self, plan: Plan, attempt: int) -> None:
        """Wait for the conversation's turn (in the workflow: a recorded wait, which an execution replaying
        it does not wait again): until this process sees the conversation's run end, or the timeout."""
        nudge = asyncio.get_running_loop().create_task(self._nudge(plan), context=contextvars.Context())
        try:
            await DBOS.recv_async(TURN, timeout_seconds=min(WAIT_MAX_S, 0.25 * 2 ** attempt))
        finally:
            nudge.cancel()

    async def _nudge(self, plan: Plan) -> None:
        runs, cid = self.runs, plan["conversation_id"]
        try:
            with runs.subscribe(cid) as subscriber:  # on PostgreSQL, other processes' events too
                run = runs.active.get(cid)
                if run is not None:
                    await run.done.wait()
                else:
                    conversation = await runs.records.conversations.get(cid)
                    if conversation is not None and conversation.status in BUSY:
                        while (await subscriber.queue.get()).type != "message_end":
                            pass
            await DBOS.send_async(plan["workflow_id"], True, topic=TURN)
        except Exception as exc:  # the timeout tries again
            log.debug("fire %s: no nudge (%s)", plan["workflow_id"], exc)


async def deliver(firing: Firing, plan: Plan) -> str:
    """Start a fire's run once its conversation is free (in the fire's workflow): `started`, `gone` or
    `failed`."""
    attempt = 0
    while True:
        if firing.runs.closing:
            raise asyncio.CancelledError  # stopping: the fire stays pending and goes on later
        try:
            outcome = await DBOS.run_step_async({"name": "ringlet.start"}, firing.start, plan)
        except Exception:  # its agent is gone, say: recorded, so an execution again ends the same way
            log.exception("fire %s could not start its run", plan["workflow_id"])
            return "failed"
        if outcome != "busy":
            return outcome
        await firing.turn(plan, attempt)
        attempt += 1
