"""SSE responses (`server-contract.md` §4.1): framing, the response that sends them from the request's own
task, and the rules every stream keeps (what a run's stream holds, and how it replays, is `runs.follow`).

Each stream response counts as one open stream of the request's key from when it is made until it has
ended (the client left included); past `max_streams_per_key` it is refused with 429 before it starts.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ringlet.server.http.errors import ApiError
from ringlet.server.http.limits import Slot, hold_stream
from ringlet.server.http.settings import ServerSettings

RETRY_MS = 3000
SEND_TIMEOUT_S = 60.0
"""A client that takes no bytes for this long (its socket buffer full) is let go."""
PING = b"event: ping\ndata: {}\n\n"
_OPEN: weakref.WeakSet[Stream] = weakref.WeakSet()
log = logging.getLogger("ringlet.server")


def encode(event: str, data: str, id: str | None = None, retry: int | None = None) -> bytes:
    """One SSE frame (`data` split at line breaks, as the format requires)."""
    head = f"id: {id}\n" if id is not None else ""
    if retry is not None:
        head += f"retry: {retry}\n"
    lines = data.splitlines() or [""]
    return f"{head}event: {event}\n{''.join(f'data: {line}{chr(10)}' for line in lines)}\n".encode()


def keyed(settings: ServerSettings, keys: Any, key_id: str, ended: bytes) -> dict[str, Any]:
    """`still_valid` and `every` for a stream that ends with the frame `ended` once its key is revoked or
    expires: the key is read again from `keys` (the store's) every `auth_recheck_s`, so a revocation in any
    process counts. Nothing in development mode (no keys)."""
    if settings.auth_mode == "none":
        return {}

    async def still_valid() -> bytes | None:
        return None if await keys.get(key_id) is not None else ended

    return {"still_valid": still_valid, "every": settings.auth_recheck_s}


def response(events: AsyncIterable[bytes], slot: Slot | None = None, *,
             still_valid: Callable[[], Awaitable[bytes | None]] | None = None, every: float = 0.0,
             headers: dict[str, str] | None = None, on_left: Callable[[], object] | None = None) -> Stream:
    """The SSE response of `events`, held as an open stream of the request's key (`slot`, when one was
    taken beforehand): 429 `rate_limited` when the key has the most open streams it may. With
    `still_valid`, every `every` seconds it is asked whether the stream may go on: None yes, else the
    last frame to send. `headers` are added to the response's; `on_left` is called when the client
    leaves before the stream's end (not when the key is revoked or the server stops)."""
    return Stream(events, slot=slot or hold_stream(), still_valid=still_valid, every=every, on_left=on_left,
                  headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})


def chunks(body: AsyncIterable[str], *, refused: Callable[[], object] | None = None,
           still_valid: Callable[[], Awaitable[bytes | None]] | None = None, every: float = 0.0) -> Stream:
    """A plain `text/event-stream` of ready-made lines (the OpenAI-compatible stream), counted and rechecked
    like `response()`. `refused` runs when the stream is refused (429), e.g. to stop the run it would follow."""
    try:
        held = hold_stream()
    except ApiError:
        if refused is not None:
            refused()
        raise
    return Stream(_utf8(body), slot=held, headers={"Cache-Control": "no-cache"}, still_valid=still_valid,
                  every=every)


async def _utf8(body: AsyncIterable[str]) -> AsyncIterator[bytes]:
    async for text in body:
        yield text.encode()


def open_streams() -> int:
    """How many streams are open in this process (`/metrics`)."""
    return len(_OPEN)


def close_all() -> None:
    """End every open stream in this process as if its source had ended (the server is stopping)."""
    for stream in list(_OPEN):
        stream.stop("shutdown")


class Stream(Response):
    """A `text/event-stream` response sent from the request's own task. One task per stream watches for
    the client leaving; a timer (no task between checks) asks `still_valid`. Leaving, a revoked key and
    `close_all` end the send loop by cancelling it; the slot is released once sent, however it ended."""

    media_type = "text/event-stream"
    slot: Slot | None = None

    def __init__(self, frames: AsyncIterable[bytes], *, headers: dict[str, str], slot: Slot | None = None,
                 still_valid: Callable[[], Awaitable[bytes | None]] | None = None, every: float = 0.0,
                 on_left: Callable[[], object] | None = None) -> None:
        self.status_code, self.background, self.slot, self.on_left = 200, None, slot, on_left
        self.init_headers(headers)  # no body: no Content-Length
        self.frames, self.still_valid, self.every = frames, still_valid, every
        self._task: asyncio.Task[object] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._why: Literal["left", "revoked", "shutdown"] | None = None
        self._last: bytes | None = None
        self._checking: asyncio.Task[None] | None = None  # held: a running check is not collected

    def stop(self, why: Literal["left", "revoked", "shutdown"]) -> None:
        if self._why is None and self._task is not None:
            self._why = why
            self._task.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            if scope.get("method") != "HEAD":
                await self._stream(receive, send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (OSError, TimeoutError):  # the client is gone, or took nothing for SEND_TIMEOUT_S
            if self.on_left is not None:
                self.on_left()
        finally:
            aclose = getattr(self.frames, "aclose", None)
            if aclose is not None:
                await aclose()
            if self.slot is not None:
                self.slot.release()
                self.slot = None

    def __del__(self) -> None:  # a response dropped unsent (an error after it was made) frees its slot too
        if self.slot is not None:  # (cheaper than a weakref.finalize per stream: ~2% of a conversation's CPU)
            self.slot.release()

    async def _stream(self, receive: Receive, send: Send) -> None:
        task = self._task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        watcher = loop.create_task(_left(receive))
        watcher.add_done_callback(lambda done: done.cancelled() or self.stop("left"))
        if self.still_valid is not None:
            self._timer = loop.call_later(self.every, self._recheck)
        _OPEN.add(self)
        try:
            async for frame in self.frames:
                async with asyncio.timeout(SEND_TIMEOUT_S):
                    await send({"type": "http.response.body", "body": frame, "more_body": True})
        except asyncio.CancelledError:
            if self._why is None or task.uncancel() > 0:
                raise  # cancelled from outside: not this stream's own ending
            if self._why == "left":
                raise OSError("the client left") from None
            if self._last is not None:
                await send({"type": "http.response.body", "body": self._last, "more_body": True})
        finally:
            self._task = None  # ended: `stop` has nothing left to cancel
            _OPEN.discard(self)
            watcher.cancel()
            if self._timer is not None:
                self._timer.cancel()

    def _recheck(self) -> None:
        async def check() -> None:
            assert self.still_valid is not None
            try:
                self._last = await self.still_valid()
            except Exception:  # e.g. the store unreachable for a moment: the stream goes on, checked again
                log.exception("could not recheck a stream's key")
            if self._last is not None:
                self.stop("revoked")
            elif self._task is not None:
                self._timer = asyncio.get_running_loop().call_later(self.every, self._recheck)

        self._checking = asyncio.get_running_loop().create_task(check())


async def _left(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
