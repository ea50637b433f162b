"""Other processes' events, live: several servers share one PostgreSQL store, and a stream in this
process must see the events of a run that another process drives.

Every transaction that appends events notifies `EVENTS_CHANNEL` at commit, once per conversation of the
batch, with the batch's range of that conversation's ids (`{"c", "i", "n", "o"}`: events `i-n+1 … i`,
written by the store whose origin is `o`; see `ringlet.store`). `Feed` holds one dedicated connection that
LISTENs, and for each conversation a stream of this process follows (`Hub.watcher`) it reads the
notified ranges from the store and publishes them into the `Hub`, built as `RunDriver.publish` builds them.
A conversation's ids are reserved under a lock on its row and committed in that order, so its
notifications arrive in id order; one worker per conversation reads them in turn, notifications that
come while it reads join its next read (one query for a burst of them), and it publishes each id once,
in order (`delivered`). Ranges of this process's own store are not read: its runs published them.

Why that leaves no gap: a stream subscribes before it reads the store, so an event committed before that
read is in what it reads, and one committed after was notified while the conversation was watched, so
the feed delivers it (a stream skips ids it has already sent, `sse.items`).

When the connection drops, the notifications sent meanwhile are lost. The feed reconnects with backoff,
LISTENs again, then reads each watched conversation from the last id it knows to be covered (`seen`: the
last id notified, or the conversation's `last_event_id` read when its first stream came — a committed
value, so every later commit is notified) to the end of its log. A stream that knows such a value already
(the one its run read as it was stored, `ActiveRun.base`) hands it over instead of that read: committed
before the stream subscribed, it is no later than the one the read would give, so the catch-up reads no
less (the streams skip what they sent). When the feed knows no such id (the conversation began to be
watched while it was not listening, or before that read completed), it cannot tell where the streams are,
so it publishes the conversation's first `maxsize + 1` stored events at once: a stream skips those it has
sent and sends the next ones in order, and, if the conversation has more, its queue overflows, so it then
reads the rest from the store itself (`Subscriber.lagging`). No gap either way.

Limits: a reconnection's catch-up also republishes this process's own events written while the feed was
away (the streams skip them); and two processes appending to one conversation at the same moment (which
one run per conversation makes rare) may hand a stream a higher id before a lower one, which it then skips.
Failures are logged and retried; they never reach the server.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL, make_url

from ringlet.errors import ConfigError
from ringlet.server.runs.active import Hub, Published
from ringlet.store import EVENTS_CHANNEL, Store

__all__ = ["Feed", "dsn"]

log = logging.getLogger("ringlet.server")
PAGE = 2000
_LIBPQ_SSL = {"true": "require", "false": "disable"}


def dsn(url: str | URL) -> str:
    """The plain DSN `asyncpg.connect` takes for the store's SQLAlchemy URL (`postgresql+asyncpg://…`):
    the driver goes, and the `ssl=` that `database_url` made of a libpq `sslmode=` goes back."""
    parsed = make_url(url) if isinstance(url, str) else url
    query = dict(parsed.query)
    if "ssl" in query:
        ssl = query.pop("ssl")
        value = ssl[-1] if isinstance(ssl, tuple) else ssl
        query["sslmode"] = _LIBPQ_SSL.get(value.lower(), value)
    return parsed.set(drivername="postgresql", query=query).render_as_string(hide_password=False)


@dataclass(slots=True)
class _Base:
    """Read the conversation's last committed id, as `base`, if still listening on connection `epoch`."""

    epoch: int


@dataclass(slots=True)
class _Read:
    """Publish the events after `after` up to `upto` (None: to the end of the log, a catch-up made on
    connection `epoch`; `burst`: the conversation's first `maxsize + 1` events instead, at once)."""

    after: int
    upto: int | None = None
    epoch: int = 0
    burst: bool = False


@dataclass(eq=False)
class _Track:
    """The feed's view of one watched conversation."""

    epoch: int | None = None
    """The connection whose notifications `seen` and `base` account for (None: none yet)."""
    base: int = 0
    seen: int = 0
    """The last id of the ranges notified (or read by a catch-up): the ids up to it are published, about
    to be, or this process's own."""
    delivered: int = 0
    """The last id published."""
    jobs: deque[_Base | _Read] = field(default_factory=deque[_Base | _Read])
    worker: asyncio.Task[None] | None = None


class Feed:
    """Publishes other processes' events of the conversations watched here into `hub` (see the module).
    `await start()` begins listening (it returns after the first attempt; it keeps trying in the
    background), `await close()` stops."""

    def __init__(self, store: Store, hub: Hub, *, url: str | URL | None = None, origin: str | None = None,
                 keepalive_s: float = 10.0, backoff_s: tuple[float, float] = (0.1, 5.0)) -> None:
        if url is None and store.engine.dialect.name != "postgresql":
            raise ConfigError("the live feed of other processes' events needs a PostgreSQL store")
        self.store, self.hub = store, hub
        self.dsn = dsn(url if url is not None else store.engine.url)
        self.origin = store.origin if origin is None else origin
        self.keepalive_s, self.backoff_s = keepalive_s, backoff_s
        self.connected = False
        self._epoch = 0
        """How many times the feed has started listening: the current connection's number."""
        self._tracks: dict[str, _Track] = {}
        self._signals: dict[str, Callable[[str], None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._tried = asyncio.Event()

    def on(self, channel: str, heard: Callable[[str], None]) -> None:
        """Also hand every notification on `channel` (its payload) to `heard`, on the feed's connection (so
        with its reconnection); call before `start()`. Notifications sent while it reconnects are lost."""
        self._signals[channel] = heard

    async def start(self) -> None:
        if self._task is not None:
            return
        self.hub.watcher = self._watching
        self._task = asyncio.create_task(self._listen(), name="ringlet-feed")
        await self._tried.wait()

    async def close(self) -> None:
        if self.hub.watcher == self._watching:
            self.hub.watcher = None
        tasks = [t for t in (self._task, *(track.worker for track in self._tracks.values())) if t is not None]
        self._task, self._tracks = None, {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.connected = False

    # -- the connection ------------------------------------------------------------------------------------

    async def _connect(self) -> Any:
        asyncpg: Any = importlib.import_module("asyncpg")  # (it ships no types)
        return await asyncpg.connect(self.dsn, timeout=10, server_settings={
            "application_name": f"ringlet-feed {self.origin}"[:63]})

    async def _listen(self) -> None:
        """Listen, and listen again whenever the connection drops: at once, then with growing pauses."""
        delay = self.backoff_s[0]
        while True:
            lost = asyncio.Event()
            conn = await self._listening(lost)
            if conn is None:
                self._tried.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_s[1])
                continue
            delay = self.backoff_s[0]
            try:
                self._resume()
                self._tried.set()
                await self._alive(conn, lost)
            finally:
                self.connected = False
                conn.terminate()
            log.warning("live feed: lost its connection; listening again")

    async def _listening(self, lost: asyncio.Event) -> Any:
        """A new connection that listens on `EVENTS_CHANNEL` and sets `lost` when it closes; None (logged)
        when there is none to be had now."""

        def closed(_conn: object) -> None:
            lost.set()

        conn = None
        try:
            conn = await self._connect()
            conn.add_termination_listener(closed)
            await conn.add_listener(EVENTS_CHANNEL, self._notified)
            for channel, heard in self._signals.items():
                await conn.add_listener(channel, _relay(heard))
        except BaseException as exc:
            if conn is not None:
                conn.terminate()
            if not isinstance(exc, Exception):
                raise
            log.warning("live feed: cannot listen for other processes' events (%s); trying again", exc)
            return None
        return conn

    async def _alive(self, conn: Any, lost: asyncio.Event) -> None:
        """Return once the connection is lost (closed, or silent past `keepalive_s`)."""
        while not lost.is_set():
            try:
                async with asyncio.timeout(self.keepalive_s):
                    await lost.wait()
            except TimeoutError:
                try:
                    async with asyncio.timeout(self.keepalive_s):
                        await conn.fetchval("SELECT 1")
                except Exception:
                    return

    def _resume(self) -> None:
        """Listening on a new connection: queue a catch-up for every watched conversation (it reads past
        the notifications that came before this, which `_notified` let go)."""
        self._epoch += 1
        self.connected = True
        for cid, track in self._tracks.items():
            if track.epoch == self._epoch - 1:
                track.jobs.append(_Read(max(track.seen, track.base), epoch=self._epoch))
            else:
                track.jobs.append(_Read(0, epoch=self._epoch, burst=True))
            self._kick(cid, track)

    # -- notifications -------------------------------------------------------------------------------------

    def _watching(self, cid: str, watched: bool, base: int | None = None) -> None:
        """`Hub.watcher`: follow a conversation from its first stream on, forget it after its last. A `base`
        its stream knew (committed before it subscribed) stands for the read of it (see the module)."""
        if not watched:
            self._tracks.pop(cid, None)  # its worker sees it is forgotten and stops
            return
        track = self._tracks[cid] = _Track()
        if self.connected and base is not None:
            track.base, track.epoch = base, self._epoch
        elif self.connected:
            track.jobs.append(_Base(self._epoch))
            self._kick(cid, track)

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if not self.connected:
            return  # still starting to listen: the catch-ups `_resume` queues read past it
        try:
            note = json.loads(payload)
            cid, last, count, origin = note["c"], int(note["i"]), int(note["n"]), note["o"]
        except (ValueError, KeyError, TypeError):
            log.warning("live feed: a notification it cannot read: %.200r", payload)
            return
        track = self._tracks.get(cid)
        if track is None or last <= track.seen:
            return
        after, track.seen = max(last - count, track.seen), last
        if origin == self.origin:
            return  # this process's own events: its runs published them
        pending = track.jobs[-1] if track.jobs else None
        if isinstance(pending, _Read) and pending.upto is None:
            return  # a catch-up still to run reads to the end of the log
        if isinstance(pending, _Read) and pending.upto == after:
            pending.upto = last  # joins the read still to run
        else:
            track.jobs.append(_Read(after, last))
        self._kick(cid, track)

    # -- reading and publishing ----------------------------------------------------------------------------

    def _kick(self, cid: str, track: _Track) -> None:
        if track.worker is None or track.worker.done():
            track.worker = asyncio.create_task(self._work(cid, track), name=f"ringlet-feed {cid}")

    async def _work(self, cid: str, track: _Track) -> None:
        """Run the conversation's jobs in order, one at a time; a failed one is tried again."""
        failures = 0
        while track.jobs and self._tracks.get(cid) is track:
            job = track.jobs.popleft()
            try:
                await self._run(cid, track, job)
            except Exception as exc:
                track.jobs.appendleft(job)
                failures += 1
                delay = min(self.backoff_s[0] * 2 ** failures, self.backoff_s[1])
                log.warning("live feed: could not read the events of conversation %s (%s); retrying in %.1f s",
                            cid, exc, delay)
                await asyncio.sleep(delay)
            else:
                failures = 0

    async def _run(self, cid: str, track: _Track, job: _Base | _Read) -> None:
        if isinstance(job, _Base):
            last, _ = await self.store.events.marks(cid)
            if job.epoch == self._epoch and self.connected:
                track.base, track.epoch = last, job.epoch
            return
        if job.upto is not None:
            await self._publish(cid, track, max(job.after, track.delivered), job.upto)
            return
        if job.burst:
            last, pruned = await self.store.events.marks(cid)
            await self._publish(cid, track, pruned, min(last, pruned + self.hub.maxsize + 1), again=True)
            track.delivered = read = max(track.delivered, last)  # the rest: the streams read it themselves
        else:
            read = await self._publish(cid, track, job.after, None)
        track.seen = max(track.seen, read)
        if job.epoch == self._epoch:
            track.epoch = job.epoch

    async def _publish(self, cid: str, track: _Track, after: int, upto: int | None, *, again: bool = False) -> int:
        """Publish the stored events after `after` (up to `upto`) not yet published (`again`: those too, in
        one go per page); returns the last id read."""
        page, read = max(PAGE, self.hub.maxsize + 1), after
        while upto is None or after < upto:
            limit = page if upto is None else min(page, upto - after)
            rows = await self.store.events.after(cid, after, limit=limit)
            if self._tracks.get(cid) is not track:
                break
            for event_id, kind, payload in rows:
                if upto is not None and event_id > upto:
                    break
                if again or event_id > track.delivered:
                    self.hub.publish(cid, Published.of(event_id, kind, payload))
                    track.delivered = max(track.delivered, event_id)
                read = event_id
            if len(rows) < limit:
                break
            after = rows[-1][0]
        return read



def _relay(heard: Callable[[str], None]) -> Callable[[object, int, str, str], None]:
    """An asyncpg notification listener (`(connection, pid, channel, payload)`) handing `payload` to `heard`."""

    def listener(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        heard(payload)

    return listener
