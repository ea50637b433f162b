"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
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
