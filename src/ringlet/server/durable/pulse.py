"""A process's heartbeat and where DBOS keeps its state: the beat is a thread of its own with its own connection,
so that a busy event loop never makes a live worker look dead (`Engine._beating` looks for the dead ones)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ringlet._ids import now
from ringlet.store.worker_records import BEAT_AND_LOOK

log = logging.getLogger("ringlet.server")


def pulse(url: str, worker_id: str, role: str, every_s: float, stop: threading.Event, *, silent_s: float,
          heard: Callable[[dict[str, bool]], None]) -> None:
    """This worker's heartbeat (a thread): at once, then every `every_s` seconds. Each beat also looks at the
    other workers in the same statement (`worker_records.BEAT_AND_LOOK`), and `heard` gets them: each one, and
    whether it has been silent for `silent_s` (so the dead are looked for at each beat, at no cost of its own)."""
    import psycopg

    connection: Any = None
    started = now()
    while True:
        try:
            if connection is None or connection.closed:
                connection = psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(every_s * 5)))
            rows = connection.execute(BEAT_AND_LOOK, (worker_id, role, started, worker_id, silent_s)).fetchall()
            heard({worker: bool(quiet) for worker, quiet in rows})
        except Exception as exc:  # the database is away: the next beat tries again
            log.warning("heartbeat failed: %s", exc)
            connection = None
        if stop.wait(every_s):
            break
    if connection is not None:
        connection.close()


def engine_url(store: Any) -> str:
    """DBOS's system database by default: the store's PostgreSQL database (DBOS keeps to its `dbos` schema)."""
    return store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
