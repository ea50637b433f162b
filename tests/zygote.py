"""A fork server for the tests' `ringlet` processes: `python tests/zygote.py FD` imports what a `ringlet serve`
or `ringlet worker` imports, once, then forks a child per request, which runs `python -m ringlet ARGS`.

A crash test starts three to five `ringlet` processes, and each spent ~1.4 of its ~2 s of start-up CPU
importing (FastAPI, DBOS, SQLAlchemy, the protocol SDKs, ringlet itself). Over the suite that was a third of
its CPU, on machines where the suite's CPU is its wall time. A forked child is still a real process of its own
(its pid, signals, exit status, stdio, environment and working folder are the request's), so a test kills it
as it killed a `python -m ringlet`; only the imports are shared, as a pre-loading server shares them. The one
difference, a module reading the environment when imported, is kept out of ringlet (`tests/test_zygote.py`).
`tests/processes.py` is the client: each test process (xdist worker) starts one fork server when it first
needs one.

Protocol, over the SOCK_SEQPACKET socket FD: a request is a JSON `{"args", "env", "cwd"}` carrying three file
descriptors (the child's stdin, stdout and stderr); the answer is `{"started": pid}`; later, when a child ends,
`{"ended": pid, "status": waitstatus}`. When the socket closes (the test process ended), every child still
running is killed and the server exits."""

from __future__ import annotations

import gc
import importlib
import json
import os
import pkgutil
import runpy
import select
import signal
import socket
import sys
import threading
from typing import Any

PACKAGES = ("ringlet.cli", "ringlet.server")
"""Every module of these is imported, and these modules of the server's dependencies, which it imports late:"""
LATE = ("uvloop", "uvicorn.loops.auto", "uvicorn.protocols.http.auto", "uvicorn.protocols.websockets.auto",
        "uvicorn.lifespan.on", "httpx", "asyncpg", "aiosqlite", "psycopg", "sqlalchemy.dialects.postgresql.asyncpg",
        "sqlalchemy.dialects.postgresql.psycopg", "sqlalchemy.dialects.sqlite.aiosqlite", "dbos._sys_db_sqlite",
        "dbos._sys_db_postgres")


def modules() -> list[str]:
    """What the fork server imports: every module of `PACKAGES`, then `LATE`."""
    names: list[str] = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        names += [name, *(m.name for m in pkgutil.walk_packages(package.__path__, f"{name}."))]
    return [*names, *LATE]


def preload() -> None:
    for name in modules():
        importlib.import_module(name)
    if threading.active_count() != 1:  # forking a process with threads copies locks that threads hold
        raise RuntimeError(f"the imports started threads: {threading.enumerate()}")
    gc.freeze()  # the imported objects stay shared with the children (copy-on-write) instead of being scanned


def serve(control: socket.socket) -> dict[str, Any]:
    """Fork a child per request until the socket closes; returns, in a child only, its request."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to the wake-up pipe
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([control, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(control, children)
        if control not in ready:
            continue
        data, fds, _, _ = socket.recv_fds(control, 1 << 20, 3)
        if not data:  # the test process ended
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            sys.exit(0)
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (wake_r, wake_w):
                os.close(fd)
            control.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            return json.loads(data)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        control.send(json.dumps({"started": pid}).encode())


def _reap(control: socket.socket, children: set[int]) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        children.discard(pid)
        control.send(json.dumps({"ended": pid, "status": status}).encode())


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    preload()
    sys.stdout.flush()
    sys.stderr.flush()
    request = serve(control)  # from here on, a child
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = ["ringlet", *request["args"]]
    sys.path[0] = request["cwd"]  # as `-m` puts it
    runpy.run_module("ringlet", run_name="__main__", alter_sys=True)  # as `python -m ringlet ARGS`


if __name__ == "__main__":
    main()
