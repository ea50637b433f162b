"""Group commit for the event log: events from every run of the process share transactions.

Each event must be stored before it is sent, so the commit is on every token's path. One writer task
takes whatever is queued (up to `max_batch`), appends it in one transaction and wakes the waiters, so a
thousand streaming runs cost a few commits per millisecond rather than a thousand. With a `window_s`,
events appended with `linger` (a streamed answer's tokens) wait until that long after the previous commit
began and share one commit (one appended with `lead`, a run's first event, waits that long from its append,
so the events right behind it share its commit); any other event, or `hurry()`, has what is queued written at once. On
PostgreSQL, where every commit is a round trip and a WAL flush, that turns an answer's twenty token
commits into a handful, for at most `window_s` more latency per token and none for anything else.

A batch that fails is written again one event at a time (one bad event must not fail the others),
unless the storage itself failed (`engine.storage_error`: a full disk, a lock past its timeout): then
every waiter gets that error at once, so each run can end and tell its clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from ringlet import telemetry
from ringlet.store.engine import storage_error

if TYPE_CHECKING:
    from ringlet.store import Store

log = logging.getLogger("ringlet.store")

Item = tuple[str, str, dict[str, Any], "asyncio.Future[int]", bool]
"""(conversation id, type, payload, its id once stored, whether it leads: waits a whole window)"""


class EventWriter:
    def __init__(self, store: Store, *, max_batch: int = 512, window_s: float = 0.0) -> None:
        self.store = store
        self.max_batch, self.window_s = max_batch, window_s
        self._began = float("-inf")
        """When the last commit began (the event loop's clock)."""
        self._hurry = asyncio.Event()
        """Set when what is queued must not wait for the window."""
        self._queue: asyncio.Queue[Item | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def append(self, conversation_id: str, kind: str, payload: dict[str, Any], *, linger: bool = False,
                     lead: bool = False) -> int:
        """Store one event and return its id once its transaction has committed; `linger`: it may wait for the
        commit window (an answer's token), else it is written at once with what is queued; `lead` (a run's
        `message_start`): it lingers a whole window even after a quiet spell, so the events right behind it
        (its status) share its commit."""
        return await self.put(conversation_id, kind, payload, linger=linger, lead=lead)

    def put(self, conversation_id: str, kind: str, payload: dict[str, Any], *, linger: bool = False,
            lead: bool = False) -> asyncio.Future[int]:
        """`append` without waiting: the event is queued now, behind those appended before it; its id comes
        with the future."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((conversation_id, kind, payload, future, lead))
        if not (linger or lead):
            self._hurry.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="ringlet-event-writer")
        return future

    def hurry(self) -> None:
        """Write what is queued now, without waiting for the window (someone waits for it)."""
        self._hurry.set()

    async def close(self) -> None:
        """Write what is queued, then stop."""
        if self._task is not None and not self._task.done():
            self._queue.put_nowait(None)
            await self._task

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            if first is None:
                return
            now = asyncio.get_running_loop().time()
            wait = self.window_s if first[4] else self._began + self.window_s - now
            if wait > 0 and not self._hurry.is_set():  # what comes meanwhile shares this commit
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), wait)
            self._hurry.clear()
            self._began = asyncio.get_running_loop().time()
            batch = [first]
            while len(batch) < self.max_batch and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    await self._write(batch)
                    return
                batch.append(item)
            await self._write(batch)

    async def _write(self, batch: list[Item]) -> None:
        began = time.perf_counter()
        try:
            ids = await self.store.events.append_batch([(cid, kind, payload) for cid, kind, payload, _, _ in batch])
        except Exception as exc:
            if (reason := storage_error(exc)) is not None:
                log.warning("could not store %d event(s): %s", len(batch), reason)
                for item in batch:  # an error of its own for each waiter, caused by the storage's
                    failure = RuntimeError(f"the event could not be stored: {reason}")
                    failure.__cause__ = exc
                    _settle(item[3], exc=failure)
                return
            if len(batch) == 1:
                log.exception("could not store a %s event of conversation %s", batch[0][1], batch[0][0])
                _settle(batch[0][3], exc=RuntimeError("the event could not be stored"))
                return
            for item in batch:  # one bad event must not fail the others: write them one by one
                await self._write([item])
            return
        if telemetry.active():
            telemetry.emit("ringlet.events.write", {"seconds": time.perf_counter() - began, "events": len(batch)})
        for (_, _, _, future, _), event_id in zip(batch, ids, strict=True):
            _settle(future, event_id)


def _settle(future: asyncio.Future[int], event_id: int = 0, *, exc: BaseException | None = None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(event_id)
    else:
        future.set_exception(exc)
