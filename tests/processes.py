"""`ringlet` subprocesses for the crash tests: started with a command line, ready once a line says so.

They are forked by this test process's fork server (`tests/zygote.py`), which imported what they import once:
each is still a process of its own, killed, stopped and waited for as a `python -m ringlet` would be."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@asynccontextmanager
async def ringlet_process(args: list[str], ready: bytes, env: dict[str, str], log: Path | None = None,
                          heard: Callable[[bytes], None] | None = None, *,
                          forked: bool = True) -> AsyncIterator[Forked | asyncio.subprocess.Process]:
    """`python -m ringlet ARGS` with `env` added, forked by the fork server (`forked=False`, or another
    `PYTHONPATH`: executed, as a deployment starts it); yields once its stderr has printed a line holding
    `ready`, keeps reading its stderr (into `log`, when given; each line to `heard`, when given) so it never
    blocks on a full pipe, kills it at the end."""
    forked = forked and env.get("PYTHONPATH", os.environ.get("PYTHONPATH")) == os.environ.get("PYTHONPATH")
    env = {**os.environ, **env}  # (another PYTHONPATH, another release's code: the fork server has not imported it)
    process = await Forked.start(args, env) if forked else await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ringlet", *args, env=env, stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    drain: asyncio.Task[None] | None = None
    try:  # killed however this ends, a start cancelled before its ready line included (`start_all`)
        async with asyncio.timeout(60):
            while ready not in (line := await process.stderr.readline()):
                assert line, f"ringlet {args[0]} exited before it was ready"
        drain = asyncio.create_task(_copy(process.stderr, log, heard))
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        if drain is not None:
            drain.cancel()
        if isinstance(process, Forked):
            process.close()


async def start_all(stack: AsyncExitStack, processes: Sequence[AbstractAsyncContextManager[T]]) -> list[T]:
    """Enter `processes` (`ringlet_process`es) at once, left with `stack`: their start-ups (imports, DBOS's
    launch) overlap instead of queueing; if one fails, the others are stopped."""
    async with asyncio.TaskGroup() as group:
        started = [group.create_task(stack.enter_async_context(p)) for p in processes]
    return [task.result() for task in started]


async def _copy(stream: asyncio.StreamReader, path: Path | None, heard: Callable[[bytes], None] | None) -> None:
    if path is None and heard is None:
        while await stream.read(65536):
            pass
        return
    with path.open("ab") if path is not None else Path(os.devnull).open("wb") as out:  # noqa: ASYNC230 - as before
        while line := await stream.readline():
            out.write(line)
            out.flush()
            if heard is not None:
                heard(line)


class ForkServer:
    """This test process's `tests/zygote.py`: forks `ringlet` processes on request, tells when they end."""

    _mine: ForkServer | None = None
    _creating = threading.Lock()

    @classmethod
    def mine(cls) -> ForkServer:
        with cls._creating:
            if cls._mine is None:
                cls._mine = cls()
            return cls._mine

    def __init__(self) -> None:
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server = Path(__file__).with_name("zygote.py")
        self._server = subprocess.Popen([sys.executable, str(server), str(there.fileno())], pass_fds=[there.fileno()])
        there.close()
        self._socket, self._asking = here, threading.Lock()
        self._started: queue.Queue[int] = queue.Queue()
        self._ends: dict[int, concurrent.futures.Future[int]] = {}
        self._ends_lock = threading.Lock()
        threading.Thread(target=self._listen, name="fork-server", daemon=True).start()

    def fork(self, args: list[str], env: dict[str, str], stderr: int) -> tuple[int, concurrent.futures.Future[int]]:
        """A child running `ringlet ARGS` with exactly `env`, this process's stdin and stdout, and `stderr`;
        its pid, and the future of its exit code (negative: the signal that ended it)."""
        request = json.dumps({"args": args, "env": env, "cwd": os.getcwd()}).encode()
        with self._asking:  # the answer to a request is the next "started"
            socket.send_fds(self._socket, [request], [0, 1, stderr])
            pid = self._started.get(timeout=120)  # the first answer waits for the server's imports
        return pid, self._end(pid)

    def _end(self, pid: int) -> concurrent.futures.Future[int]:
        with self._ends_lock:
            return self._ends.setdefault(pid, concurrent.futures.Future())

    def _listen(self) -> None:
        while data := self._socket.recv(4096):
            message = json.loads(data)
            if "started" in message:
                self._started.put(message["started"])
            else:
                self._end(message["ended"]).set_result(os.waitstatus_to_exitcode(message["status"]))


class Forked:
    """A forked `ringlet` process, with what the tests use of `asyncio.subprocess.Process`."""

    def __init__(self, pid: int, end: concurrent.futures.Future[int], stderr: asyncio.StreamReader,
                 transport: asyncio.BaseTransport) -> None:
        self.pid, self.stderr, self._end, self._transport = pid, stderr, end, transport

    @classmethod
    async def start(cls, args: list[str], env: dict[str, str]) -> Forked:
        read, write = os.pipe()
        try:
            pid, end = await asyncio.to_thread(ForkServer.mine().fork, args, env, write)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        stderr = asyncio.StreamReader(limit=2**16)
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stderr), os.fdopen(read, "rb", 0))
        return cls(pid, end, stderr, transport)

    @property
    def returncode(self) -> int | None:
        return self._end.result() if self._end.done() else None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    async def wait(self) -> int:
        return await asyncio.wrap_future(self._end)

    def close(self) -> None:
        self._transport.close()
