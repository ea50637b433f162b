"""A private PostgreSQL server for the tests: initdb into a temporary folder, listen on a loopback port.
Each test process (each pytest-xdist worker) starts its own. `fresh_database` copies TEMPLATE, a database
with ringlet's tables and DBOS's system tables made once per server, so a test starts on an empty, migrated
database of its own.

It uses Debian's PostgreSQL binaries (`.ci/run` installs them when missing). As root, the server runs as
the `postgres` user, since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import asyncpg

TEMPLATE = "ringlet_template"


def _binary(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed; `bash .ci/run` installs it "
                           "(apt-get install postgresql)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yields an asyncpg SQLAlchemy URL of a fresh database; stops the server afterwards."""
    folder = tempfile.mkdtemp(prefix="ringlet-pg-")
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = os.path.join(folder, "data"), _free_port()
    subprocess.run([*as_user, _binary("initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"],
                   check=True, capture_output=True)
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run([*as_user, _binary("pg_ctl"), "-D", data, "-o", options, "-l", os.path.join(folder, "log"),
                    "-w", "start"], check=True, capture_output=True)  # -w: returns once it accepts connections
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, _binary("pg_ctl"), "-D", data, "-m", "immediate", "stop"], check=False,
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


def make_template(server_url: str) -> None:
    """Create TEMPLATE on the server of `server_url`: ringlet's store migrated, DBOS's system tables made
    (`dbos migrate`, as a deployment does), no connection left open (a template must have none)."""
    url = server_url.rsplit("/", 1)[0] + f"/{TEMPLATE}"
    with ThreadPoolExecutor(1) as thread:  # an event loop of its own: a test's loop may be running here
        thread.submit(asyncio.run, _migrated(server_url, url)).result()
    subprocess.run([str(Path(sys.executable).with_name("dbos")), "migrate", "--sys-db-url", _dsn(url)], check=True,
                   capture_output=True)


async def _migrated(server_url: str, url: str) -> None:
    from ringlet.store import Store

    admin = await asyncpg.connect(_dsn(server_url))
    try:
        await admin.execute(f"CREATE DATABASE {TEMPLATE}")
    finally:
        await admin.close()
    store = await Store.open(url)
    await store.close()


@asynccontextmanager
async def fresh_database(server_url: str, *, empty: bool = False) -> AsyncIterator[str]:
    """A new database copied from TEMPLATE on the server of `server_url` (its URL), dropped afterwards;
    `empty`: with no tables at all (for a process that makes its own, e.g. an older release's)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(_dsn(server_url))
    try:
        await admin.execute(f"CREATE DATABASE {name}" if empty else f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        yield server_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()
