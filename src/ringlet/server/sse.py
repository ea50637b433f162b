"""The SSE streams of `server-contract.md` §4: framing, pings, replay with no gap and no duplicate.

A stream subscribes to the conversation before it reads the store, so every event is either in what it
reads from the store or in its queue (events are stored before they are published). It sends each id
once, in order, skipping what it has already sent; when its queue overflowed it reads the rest from the
store again. A ping (no id, never stored) goes out whenever nothing else was sent for the ping interval.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent

from ringlet.server.runs import Published, Runner, Subscriber

RETRY_MS = 3000
PAGE = 2000


def response(events: AsyncIterator[ServerSentEvent]) -> EventSourceResponse:
    return EventSourceResponse(events, ping=0, send_timeout=60, headers={"Cache-Control": "no-cache",
                                                                         "X-Accel-Buffering": "no"})


def frame(item: Published | None, retry: int | None = None) -> ServerSentEvent:
    """An event's frame (None: a ping, which has no id)."""
    if item is None:
        return ServerSentEvent(data="{}", event="ping", retry=retry)
    return ServerSentEvent(data=item.data, event=item.type, id=str(item.id), retry=retry)


async def _stored(runner: Runner, cid: str, after: int, run_id: str | None) -> list[Published]:
    """Events after `after`: an active run's from memory, anything else from the store."""
    if run_id is not None and (held := runner.backlog(cid, run_id)) is not None:
        return [item for item in held if item.id > after]
    out: list[Published] = []
    while True:  # page through the log: a replay has no gap however long it is
        rows = await runner.store.events_after(cid, after, limit=PAGE, run_id=run_id)
        out += [Published(i, kind, payload.get("run_id"), json.dumps(payload, ensure_ascii=False,
                                                                     separators=(",", ":")), "agent_path" in payload)
                for i, kind, payload in rows]
        if len(rows) < PAGE:
            return out
        after = rows[-1][0]


async def follow(runner: Runner, subscriber: Subscriber, cid: str, *, after: int, run_id: str | None = None,
                 backlog: bool = True) -> AsyncIterator[ServerSentEvent]:
    """The SSE frames of `items()`, with pings when idle; the first frame carries `retry`."""
    retry: int | None = RETRY_MS
    async for item in items(runner, subscriber, cid, after=after, run_id=run_id, backlog=backlog):
        yield frame(item, retry)
        retry = None


async def items(runner: Runner, subscriber: Subscriber, cid: str, *, after: int, run_id: str | None = None,
                backlog: bool = True) -> AsyncIterator[Published | None]:
    """Events of the conversation (of one run when `run_id` is given) with id > `after`, stored then live,
    and None whenever nothing was sent for the ping interval. With a `run_id` it ends after that run's
    `message_end`."""
    last, interval = after, runner.settings.ping_interval_s
    pending = await _stored(runner, cid, after, run_id) if backlog else []
    while True:
        for item in pending:
            if item.id <= last or (run_id is not None and item.run_id != run_id):
                continue
            last = item.id
            yield item
            if run_id is not None and item.type == "message_end" and not item.nested:
                return
        if subscriber.lagging:  # the queue overflowed: what it missed is in the store
            while not subscriber.queue.empty():
                subscriber.queue.get_nowait()
            subscriber.lagging = False
            pending = await _stored(runner, cid, last, run_id)
            continue
        try:
            async with asyncio.timeout(interval):
                pending = [await subscriber.queue.get()]
        except TimeoutError:
            pending = []
            yield None
            continue
        while not subscriber.queue.empty():
            pending.append(subscriber.queue.get_nowait())
