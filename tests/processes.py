"""`ringlet` subprocesses for the crash tests: started with a command line, ready once a line says so."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
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
                          heard: Callable[[bytes], None] | None = None) -> AsyncIterator[asyncio.subprocess.Process]:
    """`python -m ringlet ARGS` with `env` added; yields once its stderr has printed a line holding `ready`,
    keeps reading its stderr (into `log`, when given; each line to `heard`, when given) so it never blocks on a
    full pipe, kills it at the end."""
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "ringlet", *args, env={**os.environ, **env},
                                                   stderr=asyncio.subprocess.PIPE)
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
