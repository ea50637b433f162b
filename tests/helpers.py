"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from ringlet import Agent
from ringlet.events import Event


async def collect(agent: Agent, prompt: Any = "go", **options: Any) -> tuple[list[Event], Any]:
    """Run to the end; return every event and the RunResult."""
    stream = agent.stream(prompt, **options)
    events = [e async for e in stream]
    return events, stream.result


def types(events: Sequence[Event]) -> list[str]:
    return [e.type for e in events]


def of_type(events: Sequence[Event], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 60.0) -> None:
    """Wait until `check()` holds (stored state that something in the background changes): it is read again
    every 50 ms; TimeoutError after `seconds`.

    Only for state no event tells of: rows written by other processes (the crash tests' runs and fires,
    read from PostgreSQL, whose own notifications are the code under test), what DBOS's scheduler and
    queue threads record (cron fires, claims, skipped slots), and a runner's private queue. Where the
    test can see the moment itself (an SSE event, a subprocess's line, a model or tool called in this
    process, an asyncio.Event), wait on that instead."""
    async with asyncio.timeout(seconds):
        for _ in itertools.count():
            if await check():
                return
            await asyncio.sleep(0.05)


class Heard(logging.Handler):
    """The log records (of any logger, from any thread) whose message holds `text`, counted as they are
    emitted: `await until(n)` returns once `n` have been."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.count = text, 0
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self._loop.call_soon_threadsafe(self._bump)

    def _bump(self) -> None:
        self.count += 1
        self._changed.set()

    async def until(self, n: int) -> None:
        while self.count < n:
            self._changed.clear()
            await self._changed.wait()


@contextlib.contextmanager
def heard(text: str) -> Iterator[Heard]:
    """Count the log records holding `text` while the block runs (a `Heard` on the root logger)."""
    handler = Heard(text)
    logging.getLogger().addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger().removeHandler(handler)
