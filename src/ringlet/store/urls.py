"""Database URLs as users write them: `sqlite:///FILE`, `postgresql://…` and `postgres://…` take the async
drivers (aiosqlite, asyncpg) that the store runs on; a URL that cannot work is a ConfigError saying why."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from ringlet.errors import ConfigError

_DRIVERS = {"sqlite": "aiosqlite", "postgresql": "asyncpg"}
"""The async driver each backend gets when a URL names none."""
_SYNC_DRIVERS = frozenset({"pysqlite", "pysqlcipher", "psycopg2", "psycopg2cffi", "pg8000"})


def database_url(url: str) -> URL:
    """A database URL with an async driver: `sqlite:///FILE` becomes `sqlite+aiosqlite:///FILE`, and
    `postgresql://…` or `postgres://…` becomes `postgresql+asyncpg://…` (a libpq `sslmode=` becomes
    asyncpg's `ssl=`). A URL that names its driver keeps it. Anything but SQLite or PostgreSQL is a
    ConfigError."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"database URL {url!r} is not a URL; use sqlite:///FILE or "
                          "postgresql://USER@HOST/DB") from None
    backend, _, driver = parsed.drivername.partition("+")
    backend = "postgresql" if backend == "postgres" else backend
    if backend not in _DRIVERS:
        raise ConfigError(f"database URL {shown(parsed)!r}: ringlet stores its data in SQLite or PostgreSQL; "
                          "use sqlite:///FILE or postgresql://USER@HOST/DB")
    if driver in _SYNC_DRIVERS:
        raise ConfigError(f"database URL {shown(parsed)!r}: {driver} is not an async driver; leave the driver "
                          f"out ({backend}://…) and ringlet uses {_DRIVERS[backend]}")
    parsed = parsed.set(drivername=f"{backend}+{driver or _DRIVERS[backend]}")
    if backend == "sqlite" and parsed.database and parsed.database.startswith("~"):
        parsed = parsed.set(database=os.path.expanduser(parsed.database))
    if parsed.drivername == "postgresql+asyncpg" and "sslmode" in parsed.query:
        query = dict(parsed.query)
        query["ssl"] = query.pop("sslmode")
        parsed = parsed.set(query=query)
    return parsed


def shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def make_folder(url: URL) -> None:
    """A SQLite file's folder is created on first use."""
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:" \
            and not url.database.startswith("file:"):
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
