"""DBOS in this process: launched once (`launch`), shared by what needs it (the engine's runs, firing), and
stopped by the last `shutdown`. Fires are enqueued on the `ringlet-fires` queue every process listens on."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from dbos import DBOS, DBOSConfig

from ringlet import __version__
from ringlet.errors import ConfigError
from ringlet.server.http.settings import ServerSettings

T = TypeVar("T")
FIRES = "ringlet-fires"
"""The queue every fire's workflow is enqueued on; every process executes fires."""


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
                          "scheduler_polling_interval_sec": settings.cron_refresh_s}
    if url.startswith("sqlite"):  # no LISTEN/NOTIFY: waits for a message poll this often
        config["notification_listener_polling_interval_sec"] = 0.1
    if idle_timeout_s is not None:
        config["sys_db_idle_transaction_timeout_sec"] = idle_timeout_s
    try:
        DBOS(config=config)
        if listen is not None:
            DBOS.listen_queues(list(listen))
        DBOS.launch()
    except BaseException:  # its database is away, say: no half-launched DBOS stays behind
        DBOS.destroy(workflow_completion_timeout_sec=0)
        raise
    Dbos.url, Dbos.users, Dbos.ready, Dbos.loop = url, 1, asyncio.Event(), asyncio.get_running_loop()
    await DBOS.register_queue_async(FIRES, polling_interval_sec=settings.fire_poll_s)


def shutdown() -> None:
    """Release DBOS (one `launch`); the last release stops it. Fires in progress here stay pending: they go
    on after a restart (SQLite) or on another process (the engine's recovery)."""
    Dbos.users -= 1
    if Dbos.users > 0:
        return
    Dbos.url, Dbos.users, Dbos.ready, Dbos.loop = None, 0, None, None
    DBOS.destroy(workflow_completion_timeout_sec=0)
    with contextlib.suppress(RuntimeError):  # DBOS made its (now stopped) pool this loop's `to_thread` pool
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())
