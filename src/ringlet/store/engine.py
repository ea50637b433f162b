"""`Db`: the engine plus how this process writes to it.

SQLite allows one writer at a time; two pooled connections that both start writing make one of them
sleep in SQLite's busy handler (in steps of up to 100 ms). So on SQLite this process's write
transactions take turns on an asyncio lock, which costs nothing when idle and turns contention into a
short queue. Reads never wait for it (WAL lets them run beside the writer). PostgreSQL needs no lock.

The event log is the hot path (every token is an event, stored before it is sent). On SQLite a batch
of events is written by `write_sqlite()`: one hop to a dedicated thread that owns a plain `sqlite3`
connection and runs the whole transaction there, instead of a thread round trip per statement.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

T = TypeVar("T")


class Db:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        sqlite = engine.dialect.name == "sqlite"
        self._write_turn = asyncio.Lock() if sqlite else None
        database = engine.url.database if sqlite else None
        self.sqlite_file = database if database and database != ":memory:" else None
        self._executor: ThreadPoolExecutor | None = None
        self._local = threading.local()

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction (committed on success, rolled back on error)."""
        if self._write_turn is None:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with self._write_turn, self.engine.begin() as conn:
            yield conn

    def connect(self) -> AsyncConnection:
        """A connection for reads."""
        return self.engine.connect()

    async def write_sqlite(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work(connection)` as one write transaction on the SQLite writer thread."""
        assert self._write_turn is not None, "only for SQLite"
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ringlet-sqlite-writer")
        async with self._write_turn:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._transaction, work)

    def _transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = sqlite3.connect(self.sqlite_file or "", isolation_level=None)
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=10000"):
                conn.execute(f"PRAGMA {pragma}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = work(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def close(self) -> None:
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(executor, self._close_local)
            executor.shutdown(wait=True)

    def _close_local(self) -> None:
        conn: Any = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
