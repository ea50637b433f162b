"""A private PostgreSQL server for the tests: initdb into a temporary folder, listen on a loopback port.

It uses Debian's PostgreSQL binaries (`.ci/run` installs them when missing). As root, the server runs as
the `postgres` user, since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


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
