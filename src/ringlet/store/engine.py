"""`Db`: the engine plus how this process writes to it.

SQLite allows one writer at a time; two pooled connections that both start writing make one of them
sleep in SQLite's busy handler (in steps of up to 100 ms). So on SQLite this process's write
transactions take turns on an asyncio lock, which costs nothing when idle and turns contention into a
short queue. Reads never wait for it (WAL lets them run beside the writer). PostgreSQL needs no lock.

On a SQLite file every other statement runs in this thread, on a plain (synchronous) SQLAlchemy
connection (`Inline`): a statement of the store takes ~0.1 ms of CPU so, against ~1.2 ms through aiosqlite,
whose thread round trips (several per statement) cost more than SQLite's work. WAL readers never wait,
and this process's writers take turns on the lock above, so a statement here waits only for another
process writing the same file (the busy timeout). The event log is the hot path (every token is an event,
stored before it is sent): a batch of events is written by `write_sqlite()`, one hop to a dedicated
thread that owns a plain `sqlite3` connection and runs the whole transaction there, so a large batch and
the WAL checkpoints it triggers are paid off the event loop.

On PostgreSQL the statements of a turn (a conversation's creation and read, a run's start, lease and end,
the event log) run in `hot()` / `hot_read()`: on the asyncpg connection of a connection from SQLAlchemy's
pool (`driver()`), through `Driven`, which serves the same calls without SQLAlchemy's execution (see
`driven.py`). Everywhere else, `hot()` is `begin()` and `hot_read()` is `connect()`. Every other statement
goes through SQLAlchemy, on the same pool.

Storage that fails (a full disk, a read-only file system, a lock held past the busy timeout: see
`storage_error`) is remembered in `failure` until a write commits again with room to spare (`probe()`
checks without waiting for traffic): the server reports itself unready meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, CursorResult, Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.base import Executable

from ringlet.store.driven import Driven

T = TypeVar("T")

_SQLITE_STORAGE = ("SQLITE_FULL", "SQLITE_READONLY", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR",
                   "SQLITE_CANTOPEN")
_SQLITE_MESSAGES = ("database or disk is full", "readonly database", "database is locked", "disk i/o error",
                    "unable to open database")
_POSTGRES_STORAGE = ("53100", "53200", "53300", "25006", "55P03", "57P01", "57P02", "57P03", "58030")
"""disk full, out of memory, too many connections, read-only transaction, lock not available, shutdowns,
I/O error (PostgreSQL SQLSTATE codes); class 08 (connection exceptions) counts too."""
SPARE_BYTES = 1 << 20
"""Free space a SQLite file's file system needs before storage counts as back after a failure."""


def storage_error(exc: BaseException) -> str | None:
    """What is wrong with the storage when `exc` (or what it wraps) says it cannot take writes now — a full
    disk, a read-only database, a lock held past the busy timeout, a lost connection — else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = getattr(current, "sqlite_errorname", None)
        if isinstance(current, sqlite3.Error) and (
                (isinstance(name, str) and name.startswith(_SQLITE_STORAGE))
                or any(m in str(current).lower() for m in _SQLITE_MESSAGES)):
            return str(current)
        state = getattr(current, "sqlstate", None)
        if isinstance(state, str) and (state in _POSTGRES_STORAGE or state.startswith("08")):
            return str(current)
        if isinstance(current, OSError) and not isinstance(current, FileNotFoundError):
            return str(current) or type(current).__name__
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return None


class Inline:
    """The calls the store makes on an `AsyncConnection`, served at once by a synchronous connection to a
    SQLite file (see the module)."""

    def __init__(self, connection: Connection) -> None:
        self.sync_connection = connection
        self.dialect: Dialect = connection.dialect

    async def execute(self, statement: Executable, parameters: Any = None) -> CursorResult[*tuple[Any, ...]]:
        return self.sync_connection.execute(statement, parameters)

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> CursorResult[*tuple[Any, ...]]:
        return self.sync_connection.exec_driver_sql(statement, parameters)

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(self.sync_connection, *args)

    @property
    def sqlite(self) -> sqlite3.Connection:
        """The plain `sqlite3` connection under it, in the same transaction."""
        raw = self.sync_connection.connection.driver_connection
        assert isinstance(raw, sqlite3.Connection)
        return raw


Conn = AsyncConnection | Inline
"""A connection of `Db.begin()` / `Db.connect()`."""
HotConn = Conn | Driven
"""A connection of `Db.hot()` / `Db.hot_read()`: the calls of a turn's statements only (`driven.Rows`)."""


def sqlite_pragmas(connection: Any, _record: Any) -> None:
    """WAL lets readers and the writer work at once (a stream reading never blocks a run writing), and
    with WAL `synchronous=NORMAL` still survives a killed process: only power loss can drop the last
    commits. Waiting writers retry for up to 10 s instead of failing at once.

    Switching a fresh file to WAL needs it alone, and SQLite answers "database is locked" at once, without
    its busy handler, when two processes opening it together both hold it shared: that switch is retried
    here for the same 10 s."""
    cursor = connection.cursor()
    try:
        cursor.execute("PRAGMA busy_timeout=10000")
        deadline = time.monotonic() + 10
        while True:
            try:
                cursor.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        for pragma in ("synchronous=NORMAL", "foreign_keys=ON"):
            cursor.execute(f"PRAGMA {pragma}")
    finally:
        cursor.close()


class Db:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        sqlite = engine.dialect.name == "sqlite"
        self._write_turn = asyncio.Lock() if sqlite else None
        database = engine.url.database if sqlite else None
        self.sqlite_file = database if database and database != ":memory:" else None
        self.postgresql = engine.dialect.name == "postgresql" and engine.dialect.driver == "asyncpg"
        """PostgreSQL (through asyncpg): the hot statements run on the driver (`driver()`)."""
        self._inline = None
        if self.sqlite_file is not None:  # an unbounded pool: a connection is never waited for in the loop
            self._inline = create_engine(engine.url.set(drivername="sqlite+pysqlite"), pool_size=8, max_overflow=-1,
                                         connect_args={"check_same_thread": False})
            event.listen(self._inline, "connect", sqlite_pragmas)
        self._executor: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self.failure: str | None = None
        """Why writes fail (`storage_error`), from a failed write until one commits again with room to spare."""

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[Conn]:
        """A write transaction (committed on success, rolled back on error)."""
        try:
            if self._write_turn is None:
                async with self.engine.begin() as conn:
                    yield conn
            elif self._inline is None:
                async with self._write_turn, self.engine.begin() as conn:
                    yield conn
            else:
                async with self._write_turn:
                    with self._inline.begin() as inline:
                        yield Inline(inline)
        except Exception as exc:
            self._failed(exc)
            raise
        self._committed()

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Conn]:
        """A connection for reads."""
        if self._inline is None:
            async with self.engine.connect() as conn:
                yield conn
        else:
            with self._inline.connect() as inline:
                yield Inline(inline)

    @asynccontextmanager
    async def driver(self) -> AsyncIterator[Any]:
        """PostgreSQL: a pooled connection's asyncpg connection (for `Driven`); the caller opens its
        transaction (`.transaction()`) when it writes. A connection that a failure closed is replaced."""
        async with self.engine.connect() as conn:
            fairy = await conn.get_raw_connection()
            pg: Any = fairy.driver_connection
            try:
                yield pg
            except BaseException as exc:
                if isinstance(exc, Exception):
                    self._failed(exc)
                if pg.is_closed():
                    await conn.invalidate(exc if isinstance(exc, Exception) else None)
                raise
        self._committed()

    @asynccontextmanager
    async def hot(self) -> AsyncIterator[HotConn]:
        """A write transaction for a turn's statements (`statements.py`): on PostgreSQL on the driver."""
        if not self.postgresql:
            async with self.begin() as conn:
                yield conn
            return
        async with self.driver() as pg, pg.transaction():
            yield Driven(pg)

    @asynccontextmanager
    async def hot_read(self) -> AsyncIterator[HotConn]:
        """A connection for a turn's reads (`statements.py`): on PostgreSQL on the driver."""
        if not self.postgresql:
            async with self.connect() as conn:
                yield conn
            return
        async with self.driver() as pg:
            yield Driven(pg)

    async def write_sqlite(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work(connection)` as one write transaction on the SQLite writer thread."""
        assert self._write_turn is not None, "only for SQLite"
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ringlet-sqlite-writer")
        async with self._write_turn:
            try:
                result = await asyncio.get_running_loop().run_in_executor(self._executor, self._transaction, work)
            except Exception as exc:
                self._failed(exc)
                raise
        self._committed()
        return result

    async def probe(self) -> bool:
        """After a storage failure, try a real write (and, for a SQLite file, look for room to spare):
        whether storage takes writes again (`failure` is then None)."""
        if self.failure is None:
            return True
        from sqlalchemy import func, select, update

        from ringlet.store.schema import schema_version as table

        try:
            async with self.begin() as conn:  # rewrites a row: a commit that needs the disk
                await conn.execute(update(table).where(table.c.version == select(func.max(table.c.version))
                                                       .scalar_subquery()).values(applied_at=table.c.applied_at))
        except Exception as exc:
            if storage_error(exc) is None:
                raise
        return self.failure is None

    def _failed(self, exc: BaseException) -> None:
        reason = storage_error(exc)
        if reason is not None:
            self.failure = reason

    def _committed(self) -> None:
        if self.failure is not None and self._room():
            self.failure = None

    def _room(self) -> bool:
        """Whether a SQLite file's file system has room to spare (always, for other databases)."""
        if self.sqlite_file is None:
            return True
        try:
            info = os.statvfs(os.path.dirname(os.path.abspath(self.sqlite_file)))
        except OSError:
            return True
        return info.f_bavail * info.f_frsize >= SPARE_BYTES

    def _transaction(self, work: Callable[[sqlite3.Connection], T]) -> T:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = sqlite3.connect(self.sqlite_file or "", isolation_level=None, timeout=10)
            for pragma in ("busy_timeout=10000", "journal_mode=WAL", "synchronous=NORMAL"):  # wait, then lock
                conn.execute(f"PRAGMA {pragma}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = work(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # a failed COMMIT (a full disk) leaves it open; SQLite may have ended it
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        return result

    async def close(self) -> None:
        if self._inline is not None:
            self._inline.dispose()
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(executor, self._close_local)
            executor.shutdown(wait=True)

    def _close_local(self) -> None:
        conn: Any = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
