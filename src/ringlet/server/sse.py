"""The SSE streams of `server-contract.md` §4: framing, pings, replay with no gap and no duplicate.

A stream subscribes to the conversation before it reads the store, so every event is either in what it
reads from the store or in its queue (events are stored before they are published). It sends each id
once, in order, skipping what it has already sent; when its queue overflowed it reads the rest from the
store again. A ping (no id, never stored) goes out whenever nothing else was sent for the ping interval.
An event that could not be stored (id 0: the end of a run whose storage failed) is sent once, without
an id, so a client's `Last-Event-ID` only ever names stored events.

Each stream response counts as one open stream of the request's key from when it is made until it has
ended (the client left included); past `max_streams_per_key` it is refused with 429 before it starts.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ringlet.server.active import Published, Subscriber
from ringlet.server.errors import ApiError
from ringlet.server.limits import Slot, hold_stream
from ringlet.server.runs import Runner

RETRY_MS = 3000
PAGE = 2000
_R = TypeVar("_R", bound="_Counted | _CountedChunks")


def response(events: AsyncIterator[ServerSentEvent], slot: Slot | None = None) -> EventSourceResponse:
    """The SSE response of `events`, held as an open stream of the request's key (`slot`, when one was
    taken beforehand): 429 `rate_limited` when the key has the most open streams it may."""
    held = slot or hold_stream()
    return _held(_Counted(events, ping=0, send_timeout=60, headers={"Cache-Control": "no-cache",
                                                                    "X-Accel-Buffering": "no"}), held)


def chunks(body: AsyncIterable[str], *, refused: Callable[[], object] | None = None) -> StreamingResponse:
    """A plain `text/event-stream` of ready-made lines (the OpenAI-compatible stream), counted like
    `response()`. `refused` runs when the stream is refused (429), e.g. to stop the run it would follow."""
    try:
        held = hold_stream()
    except ApiError:
        if refused is not None:
            refused()
        raise
    return _held(_CountedChunks(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}), held)


class _Counted(EventSourceResponse):
    """Releases its stream slot once sent, however it ended (`_held` also releases it if never sent)."""

    slot: Slot | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.slot is not None:
                self.slot.release()


class _CountedChunks(StreamingResponse):
    slot: Slot | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.slot is not None:
                self.slot.release()


def _held(response: _R, slot: Slot | None) -> _R:
    response.slot = slot
    if slot is not None:  # a response dropped unsent (an error after it was made) frees its slot too
        weakref.finalize(response, slot.release)
    return response


def frame(item: Published | None, retry: int | None = None) -> ServerSentEvent:
    """An event's frame (None: a ping, which has no id; nor has an event that was not stored)."""
    if item is None:
        return ServerSentEvent(data="{}", event="ping", retry=retry)
    return ServerSentEvent(data=item.data, event=item.type, id=str(item.id) if item.id else None, retry=retry)


async def _stored(runner: Runner, cid: str, after: int, run_id: str | None) -> list[Published]:
    """Events after `after`: an active run's from memory, anything else from the store."""
    if run_id is not None and (held := runner.backlog(cid, run_id)) is not None:
        return [item for item in held if item.id > after or not item.id]
    out: list[Published] = []
    while True:  # page through the log: a replay has no gap however long it is
        rows = await runner.store.events_after(cid, after, limit=PAGE, run_id=run_id)
        out += [Published.of(i, kind, payload) for i, kind, payload in rows]
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
    unstored: set[Published] = set()
    pending = await _stored(runner, cid, after, run_id) if backlog else []
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
