"""DBOS in this process: launched once (`launch`), shared by what needs it (the engine's runs, firing), and
stopped by the last `shutdown`. Fires are enqueued on the `ringlet-fires` queue every process listens on.

Queued work starts when it is enqueued, not at the next poll: whoever enqueues asks the processes that
execute that queue to `take` it now (this process at once; the others by `WAKE_CHANNEL`, `engine.Engine`).
`take` is DBOS's own dequeue (what its queue thread does at each poll: claim under the queue's limits, in one
partition or in each, then execute), so the queues' limits, claims and recovery are DBOS's as before; each
queue's poll is only the safety net for a wake-up lost (a dropped `LISTEN` connection) and for delayed work
coming due.

DBOS has no public call for that dequeue, so `take` uses its private API (`PRIVATE`), as do
`engine.Engine.hand_on` (`DBOS._recover_pending_workflows`: DBOS offers recovery of another executor's
workflows only through its admin server) and `ringlet.evals.durable` (`dbos._dbos._dbos_global_instance`:
DBOS has no public "is it set up?"). The version is pinned exactly (pyproject.toml), and tests/test_dbos.py
names each of them, failing with what moved when an upgrade breaks one."""

# pyright: reportPrivateUsage=false
# (DBOS's private API: each symbol listed in `PRIVATE`, the version pinned, tests/test_dbos.py names each one)
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import uuid
from collections.abc import Callable, Coroutine, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from dbos import DBOS, DBOSConfig, Queue
from dbos._core import execute_dequeued_workflow  # private: `PRIVATE`
from dbos._dbos import _get_dbos_instance  # private: `PRIVATE`
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ringlet import __version__
from ringlet.durable import log_through_logging
from ringlet.errors import ConfigError
from ringlet.server.http.settings import ServerSettings

T = TypeVar("T")
log = logging.getLogger("ringlet.server")
FIRES = "ringlet-fires"
"""The queue every fire's workflow is enqueued on; every process executes fires."""
INTERNAL_POLL_S = 60.0
"""How often DBOS's internal queue is polled (its default: every second, a claim query each time). ringlet
enqueues every workflow on a queue of its own (runs, fires), and DBOS's recovery puts a workflow back on its
own queue, so nothing of ringlet's waits there: the poll is slowed to this. DBOS has no public setting for
it (`PRIVATE`)."""
FIRE_POLL_S = 1.0
"""How often the fires queue is polled where nothing wakes it: each poll is how a cron slot, a schedule's
wake-up or a webhook fire enqueued meanwhile starts."""
WOKEN_FIRE_POLL_S = 10.0
"""How often it is polled where the database wakes it (`wake_fires`): the poll is only the safety net for a
notification lost with its connection."""
WAKE_CHANNEL = "ringlet_queued"
"""Notified (the queue's name) when work was enqueued that the process enqueuing it did not take: every
process that executes that queue takes it now (`engine.Engine`)."""


async def outside(work: Coroutine[Any, Any, T]) -> T:
    """Await `work` outside any workflow: what it does with DBOS (enqueue, cancel, start a run that is a
    workflow of its own) is not a step of the workflow awaiting it."""
    return await asyncio.get_running_loop().create_task(work, context=contextvars.Context())


# -- DBOS in this process ------------------------------------------------------------------------------------


class Dbos:
    """DBOS in this process: launched once, shared by what needs it (the engine, firing)."""

    url: str | None = None
    users = 0
    firings: list[Any] = []
    """The open `Firing`s; fires execute with the first (a process has one, tests may have more)."""
    ready: asyncio.Event | None = None
    """Set once a `Firing` opened: fires that arrive before wait for it; once none is open again (the
    process stops), fires that arrive stay pending (for a process that goes on)."""
    loop: asyncio.AbstractEventLoop | None = None
    """The event loop DBOS was launched in (its workflows run there)."""
    listen: frozenset[str] | None = None
    """The only queues this process executes (None: every one)."""
    queues: dict[str, Queue] = {}
    """The queues registered here (`register`), by name."""
    partitioned: set[str] = set()
    """The queues with a limit per partition (`partition_concurrency`): every workflow enqueued there names its
    partition, and a take claims in one partition (or in each, one after the other)."""
    takes: dict[tuple[str, str | None], asyncio.Task[list[str]]] = {}
    """Per queue (and partition), the `take` that waits for its turn: a take asked meanwhile is that one."""
    turns: dict[tuple[str, str | None], asyncio.Lock] = {}
    """Per queue (and partition), the lock that has its takes go one at a time."""
    expected: dict[str, bool] = {}
    """Workflows this process enqueued and asks about (`claims`): whether a take here claimed each."""
    room: dict[str, int] = {}
    """Per queue with a `worker_concurrency`, how many of its workflows this process executes at once."""
    full: set[str] = set()
    """The queues whose last take here claimed all this process had room for: more may wait there, to be
    taken as this process's runs end (`engine.Engine.freed`)."""


async def launch(url: str, *, executor_id: str, settings: ServerSettings, listen: Sequence[str] | None = None,
                 idle_timeout_s: float | None = None) -> None:
    """Launch DBOS on the system database `url` in this event loop (the workflows it hands this process run
    here), with the fires queue; `listen`: the only queues this process executes (default: every one).
    DBOS launched on `url` already is shared (`shutdown` once per `launch`)."""
    if Dbos.url is not None and Dbos.loop is not asyncio.get_running_loop():  # left by a loop that ended
        Dbos.users, Dbos.firings = 1, []  # (a server whose startup failed): its DBOS goes
        shutdown()
    if Dbos.url is not None:
        if Dbos.url != url:
            raise ConfigError("DBOS runs once per process, on one system database; this process already "
                              "uses another one")
        Dbos.users += 1
        return
    config: DBOSConfig = {"name": "ringlet", "system_database_url": url, "executor_id": executor_id,
                          "application_version": __version__, "log_level": "WARNING",
                          "scheduler_polling_interval_sec": settings.cron_refresh_s,
                          # no round trip (a transaction of its own) before each use of a pooled connection:
                          # a connection found dead fails its statement, and DBOS's calls retry on a new one
                          "db_engine_kwargs": {"pool_pre_ping": False},
                          # its notifier thread wakes this often to send what was written meanwhile (default
                          # 0.01 s: a hundred wake-ups a second in an idle process)
                          "notification_coalesce_sec": 0.05}
    if url.startswith("sqlite"):  # no LISTEN/NOTIFY: waits for a message poll this often
        config["notification_listener_polling_interval_sec"] = 0.1
    if idle_timeout_s is not None:
        config["sys_db_idle_transaction_timeout_sec"] = idle_timeout_s
    try:
        log_through_logging()
        DBOS(config=config)
        if listen is not None:
            DBOS.listen_queues(list(listen))
        _get_dbos_instance()._registry.get_internal_queue()._polling_interval_sec = INTERNAL_POLL_S
        DBOS.launch()
    except BaseException:  # its database is away, say: no half-launched DBOS stays behind
        DBOS.destroy(workflow_completion_timeout_sec=0)
        raise
    Dbos.url, Dbos.users, Dbos.ready, Dbos.loop = url, 1, asyncio.Event(), asyncio.get_running_loop()
    Dbos.listen, Dbos.queues, Dbos.takes, Dbos.turns = None if listen is None else frozenset(listen), {}, {}, {}
    Dbos.expected, Dbos.room, Dbos.full = {}, {}, set()
    Dbos.partitioned = set()
    await register(FIRES, polling_interval_sec=settings.fire_poll_s or FIRE_POLL_S)


WAKE_FIRES = [
    "SELECT pg_advisory_xact_lock(hashtext('ringlet_fire_queued'))",  # one process installs it at a time
    "CREATE OR REPLACE FUNCTION dbos.ringlet_fire_queued() RETURNS trigger LANGUAGE plpgsql AS "
    f"$$ BEGIN PERFORM pg_notify('{WAKE_CHANNEL}', NEW.queue_name); RETURN NULL; END $$",
    "DROP TRIGGER IF EXISTS ringlet_fire_queued ON dbos.workflow_status",
    "CREATE TRIGGER ringlet_fire_queued AFTER INSERT OR UPDATE OF status ON dbos.workflow_status FOR EACH ROW "
    f"WHEN (NEW.status = 'ENQUEUED' AND NEW.queue_name = '{FIRES}') EXECUTE FUNCTION dbos.ringlet_fire_queued()"]
"""A trigger on DBOS's workflows (PostgreSQL): a fire enqueued, or made due (a schedule's wake-up, DBOS's
background job), or put back in its queue (recovery) is announced on `WAKE_CHANNEL`, in the transaction
that enqueues it, so every process takes it at once, however it got there: DBOS's scheduler enqueues the
cron slots in its own thread, and neither it nor its background jobs tell anyone. `wake_fires` installs it."""
WAKE_INSTALLED = ("SELECT count(*) FROM pg_trigger WHERE tgname = 'ringlet_fire_queued' "
                  "AND tgrelid = 'dbos.workflow_status'::regclass")


async def wake_fires(db: Any) -> bool:
    """Install `WAKE_FIRES` in DBOS's system database, the store's PostgreSQL database `db` (a `Db`), once
    DBOS made its tables; whether it is there (a process that cannot make it, say without the right to,
    keeps polling the fires queue every `FIRE_POLL_S`)."""
    try:
        async with db.begin() as conn:
            if not (await conn.execute(text(WAKE_INSTALLED))).scalar():
                for statement in WAKE_FIRES:
                    await conn.execute(text(statement))
    except Exception as exc:
        log.warning("fires are polled every %s s: could not install their wake-up trigger (%s)", FIRE_POLL_S, exc)
        return False
    return True


async def register(name: str, **options: Any) -> None:
    """Register queue `name` (`DBOS.register_queue_async`'s options; every process registers the same)."""
    Dbos.queues[name] = await DBOS.register_queue_async(name, **options)
    if options.get("worker_concurrency") is not None:
        Dbos.room[name] = options["worker_concurrency"]
    if options.get("partition_concurrency") is not None:
        Dbos.partitioned.add(name)
    else:
        Dbos.partitioned.discard(name)


async def take(name: str, partition: str | None = None) -> list[str]:
    """Claim what waits in queue `name` for this process, within the queue's limits, and start it now rather
    than at the queue's next poll: DBOS's own dequeue, as its queue thread does at each poll. In a partitioned
    queue, what waits in `partition` (None: in each partition). The ids of the workflows it started (none
    when this process does not execute that queue). Takes of a queue go one at a time, and a take asked while
    another waits for its turn is that one (a burst of asks costs two). The take itself is a task of its own:
    one who asked it and stopped waiting (cancelled) leaves it to go on for the others."""
    queue = Dbos.queues.get(name)
    if queue is None or (Dbos.listen is not None and name not in Dbos.listen):
        return []
    scope = (name, partition if name in Dbos.partitioned else None)
    if (shared := Dbos.takes.get(scope)) is None:  # in no workflow's context (a take asked from inside a
        shared = Dbos.takes[scope] = asyncio.get_running_loop().create_task(  # run's is no step of it)
            _take(scope, queue), name=f"ringlet-take-{name}", context=contextvars.Context())
    return await asyncio.shield(shared)


async def _take(scope: tuple[str, str | None], queue: Queue) -> list[str]:
    try:
        async with Dbos.turns.setdefault(scope, asyncio.Lock()):
            _drop(scope)  # from now on, an ask needs the next take
            try:
                ids = await asyncio.get_running_loop().run_in_executor(None, _claim_outside, queue, scope)
            except Exception as exc:  # the database is away, say: the queue's poll takes it later
                log.warning("could not take from queue %s: %s", scope[0], exc)
                return []
            for workflow_id in ids:
                if workflow_id in Dbos.expected:
                    Dbos.expected[workflow_id] = True
            return ids
    finally:  # (stopped before its turn, as DBOS shuts down: the next ask takes anew)
        _drop(scope)


@contextlib.contextmanager
def claims(workflow_id: str) -> Generator[Callable[[], bool]]:
    """Within the block, note whether a `take` in this process claims workflow `workflow_id`; yields the
    question. Enqueue it and take inside the block: the take that claims it may be an earlier one, already
    claiming when it was enqueued (takes of a queue go one at a time, so that one ends before the next)."""
    Dbos.expected[workflow_id] = False
    try:
        yield lambda: Dbos.expected.get(workflow_id, False)
    finally:
        Dbos.expected.pop(workflow_id, None)


def _drop(scope: tuple[str, str | None]) -> None:
    if Dbos.takes.get(scope) is asyncio.current_task():
        del Dbos.takes[scope]


def _claim_outside(queue: Queue, scope: tuple[str, str | None]) -> list[str]:
    return contextvars.Context().run(_claim, queue, scope)


PRIVATE = ("dbos._core.execute_dequeued_workflow", "dbos._dbos._get_dbos_instance",
           "DBOS._sys_db.start_queued_workflows", "DBOS._sys_db.get_queue_partitions",
           "DBOS._sys_db.get_workflow_statuses", "DBOS._sys_db.get_workflow_status",
           "DBOS._sys_db.is_lock_conflict", "DBOS._sys_db.is_serialization_conflict",
           "DBOS._active_workflows_set.count_for_queue", "DBOS._active_workflows_set.count_for_partition",
           "DBOS.background_thread_stop_events", "DBOS._registry.get_internal_queue")
"""DBOS's private API that `take` (and `stop_taking`, and `launch`: `INTERNAL_POLL_S`) use (`DBOS.…`: its
instance's), each named by tests/test_dbos.py."""


def _claim(queue: Queue, scope: tuple[str, str | None]) -> list[str]:
    dbos = _get_dbos_instance()
    name, partition = scope
    if name in Dbos.partitioned and partition is None:  # each partition with work, in turn (as DBOS's poll)
        return [i for key in dbos._sys_db.get_queue_partitions(name) for i in _claim(queue, (name, key))]
    owner = str(uuid.uuid4())
    active = dbos._active_workflows_set
    load = active.count_for_queue(name)
    try:
        ids, _ = dbos._sys_db.start_queued_workflows(
            queue, DBOS.executor_id, DBOS.application_version, partition, load,
            0 if partition is None else active.count_for_partition(name, partition), owner_xid=owner)
    except DBAPIError as exc:
        if dbos._sys_db.is_lock_conflict(exc) or dbos._sys_db.is_serialization_conflict(exc):
            return []  # another process claims from this queue right now: it takes them
        raise
    if name in Dbos.room and partition is None:  # (its workflows not yet started count from the next take)
        if load + len(ids) >= Dbos.room[name]:
            Dbos.full.add(name)
        else:
            Dbos.full.discard(name)
    if ids:
        statuses = {status["workflow_uuid"]: status for status in dbos._sys_db.get_workflow_statuses(ids)}
        for workflow_id in ids:
            try:
                status = statuses.get(workflow_id) or dbos._sys_db.get_workflow_status(workflow_id)
                if status is not None:  # (deleted meanwhile: nothing to start)
                    execute_dequeued_workflow(dbos, status, owner)
            except Exception:
                log.exception("could not start workflow %s", workflow_id)
    return ids


def stop_taking() -> None:
    """Take no more work from any queue in this process (it drains, `Engine.drain`): neither by `take` nor by
    DBOS's own threads (its queues' polls, and its scheduler: the other processes enqueue the cron slots).
    What executes here goes on. DBOS has no public call for it; this is the first thing `DBOS.destroy` does."""
    Dbos.listen = frozenset()
    if Dbos.url is not None:
        for event in _get_dbos_instance().background_thread_stop_events:
            event.set()


WORKFLOWS = ["ringlet.run", "ringlet.permit", "ringlet.cron", "ringlet.webhook", "ringlet.schedule"]
"""The workflows ringlet's processes run: the ones `forget` deletes (not those of a program sharing DBOS)."""
ENDED = ["SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"]


async def forget(before: float, *, batch: int = 1000) -> int:
    """Delete DBOS's records (status, input, output, steps) of ringlet's workflows that ended before `before`
    (epoch seconds), in batches; how many. Nothing else refers to them then: a run's own record, events and
    transcript are ringlet's, kept or pruned on their own."""
    cutoff = datetime.fromtimestamp(before, UTC).isoformat()
    deleted = 0
    while True:
        ended = await DBOS.list_workflows_async(status=ENDED, name=WORKFLOWS, completed_before=cutoff, limit=batch,
                                                load_input=False, load_output=False)
        if ended:
            await DBOS.delete_workflows_async([w.workflow_id for w in ended])
            deleted += len(ended)
        if len(ended) < batch:
            return deleted


def shutdown() -> None:
    """Release DBOS (one `launch`); the last release stops it. Fires in progress here stay pending: they go
    on after a restart (SQLite) or on another process (the engine's recovery)."""
    Dbos.users -= 1
    if Dbos.users > 0:
        return
    Dbos.url, Dbos.users, Dbos.ready, Dbos.loop, Dbos.queues, Dbos.partitioned = None, 0, None, None, {}, set()
    DBOS.destroy(workflow_completion_timeout_sec=0)
    with contextlib.suppress(RuntimeError):  # DBOS made its (now stopped) pool this loop's `to_thread` pool
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())
