"""A conversation's events as a stream follows them (`server-contract.md` §4.3): stored, then live, with no
gap and no duplicate.

A stream subscribes to the conversation before it reads the store, so every event is either in what it
reads from the store or in its queue (events are stored before they are published). It sends each id
once, in order, skipping what it has already sent; when its queue overflowed it reads the rest from the
store again. A ping (no id, never stored) goes out whenever nothing else was sent for the ping interval.
An event that could not be stored (id 0: the end of a run whose storage failed) is sent once, without
an id, so a client's `Last-Event-ID` only ever names stored events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from ringlet.server.http.settings import ServerSettings
from ringlet.server.http.sse import PING, RETRY_MS, encode
from ringlet.server.runs.active import Published, Subscriber
from ringlet.store.event_records import EventLog

PAGE = 2000


class _Records(Protocol):
    @property
    def events(self) -> EventLog: ...


class Runs(Protocol):
    """What following needs of the runs service (`service.Runs`): the event log, an active run's backlog, and
    the ping interval."""

    @property
    def records(self) -> _Records: ...

    @property
    def settings(self) -> ServerSettings: ...

    def backlog(self, cid: str, run_id: str) -> list[Published] | None: ...


def frame(item: Published | None, retry: int | None = None) -> bytes:
    """An event's frame (None: a ping, which has no id; nor has an event that was not stored)."""
    if item is None:
        return PING if retry is None else encode("ping", "{}", retry=retry)
    return encode(item.type, item.data, str(item.id) if item.id else None, retry)


async def _stored(runs: Runs, cid: str, after: int, run_id: str | None) -> list[Published]:
    """Events after `after`: an active run's from memory, anything else from the store."""
    if run_id is not None and (held := runs.backlog(cid, run_id)) is not None:
        return [item for item in held if item.id > after or not item.id]
    out: list[Published] = []
    while True:  # page through the log: a replay has no gap however long it is
        rows = await runs.records.events.after(cid, after, limit=PAGE, run_id=run_id)
        out += [Published.of(i, kind, payload) for i, kind, payload in rows]
        if len(rows) < PAGE:
            return out
        after = rows[-1][0]


async def follow(runs: Runs, subscriber: Subscriber, cid: str, *, after: int, run_id: str | None = None,
                 backlog: bool = True) -> AsyncIterator[bytes]:
    """The SSE frames of `items()`, with pings when idle; the first frame carries `retry`."""
    retry: int | None = RETRY_MS
    async for item in items(runs, subscriber, cid, after=after, run_id=run_id, backlog=backlog):
        yield frame(item, retry)
        retry = None


async def items(runs: Runs, subscriber: Subscriber, cid: str, *, after: int, run_id: str | None = None,
                backlog: bool = True) -> AsyncIterator[Published | None]:
    """Events of the conversation (of one run when `run_id` is given) with id > `after`, stored then live,
    and None whenever nothing was sent for the ping interval. With a `run_id` it ends after that run's
    `message_end`."""
    last, interval = after, runs.settings.ping_interval_s
    unstored: set[Published] = set()
    pending = await _stored(runs, cid, after, run_id) if backlog else []
    while True:
        for item in pending:
            if (run_id is not None and item.run_id != run_id) or (item.id <= last if item.id else item in unstored):
                continue
            if item.id:
                last = item.id
            else:
                unstored.add(item)
            yield item
            if run_id is not None and item.type == "message_end" and not item.nested:
                return
        if subscriber.lagging:  # the queue overflowed: what it missed is in the store
            while not subscriber.queue.empty():
                subscriber.queue.get_nowait()
            subscriber.lagging = False
            pending = await _stored(runs, cid, last, run_id)
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
