"""Other processes' events, live: several servers share one PostgreSQL store, and a stream in this
process must see the events of a run that another process drives.

Every transaction that appends events notifies `EVENTS_CHANNEL` at commit, once per conversation of the
batch, with the batch's range of that conversation's ids (`{"c", "i", "n", "o"}`: events `i-n+1 … i`,
written by the store whose origin is `o`), and the events themselves (`e`) when they are small enough (see
`ringlet.store.event_records`). `Feed` holds one dedicated connection that LISTENs, and for each
conversation a stream of this process follows (`Hub.watcher`) it publishes the notified events into the
`Hub`, built as `RunDriver.publish` builds them: those a notification carries at once, the others read
from the store. One reader serves every watched conversation: each of its rounds reads, in one query, the
next range of every conversation that has one (`EventLog.spans`), so following N runs executed elsewhere
costs a query per burst of notifications, not per stream, and none while the events fit in them.
A conversation's ids are reserved under a lock on its row and committed in that order, so its
notifications arrive in id order; each conversation's jobs run in turn, notifications that come while
one is read join its next job (one read for a burst of them), and it publishes each id once, in order
(`delivered`). Ranges of this process's own store are not published: its runs published them.

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
from typing import Any, cast

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
    events: list[Any] | None = None
    """The events after `after` up to `upto`, as `[type, payload]` pairs, when the notifications carried
    them (nothing to read then)."""


Head = tuple[str, "_Track", "_Base | _Read"]
"""A conversation's next job in a round of the reader: (conversation id, its track, the job)."""


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
    busy: bool = False
    """One of its jobs is in the reader's hands."""

    def queue(self, after: int, last: int, events: list[Any] | None) -> bool:
        """Queue the publishing of ids `after` (excluded) to `last`, with their `events` when carried (None:
        read them), joined to the job still to run when it ends at `after`; False when a catch-up still to
        run reads to the end of the log anyway."""
        pending = self.jobs[-1] if self.jobs else None
        if isinstance(pending, _Read) and pending.upto is None:
            return False
        if isinstance(pending, _Read) and pending.upto == after and (pending.events is None) == (events is None):
            pending.upto = last
            if pending.events is not None and events is not None:
                pending.events += events
        else:
            self.jobs.append(_Read(after, last, events=events))
        return True


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
        self._reader: asyncio.Task[None] | None = None
        self._tried = asyncio.Event()
        self._wake = asyncio.Event()
        """Set when a job is queued: the reader has work."""
        self._idle = asyncio.Event()
        """Set while the reader has nothing queued nor in hand (`settled`)."""
        self._idle.set()

    def on(self, channel: str, heard: Callable[[str], None]) -> None:
        """Also hand every notification on `channel` (its payload) to `heard`, on the feed's connection (so
        with its reconnection); call before `start()`. Notifications sent while it reconnects are lost."""
        self._signals[channel] = heard

    async def start(self) -> None:
        if self._task is not None:
            return
        self.hub.watcher = self._watching
        self._reader = asyncio.create_task(self._reading(), name="ringlet-feed-reader")
        self._task = asyncio.create_task(self._listen(), name="ringlet-feed")
        await self._tried.wait()

    async def close(self) -> None:
        if self.hub.watcher == self._watching:
            self.hub.watcher = None
        tasks = [t for t in (self._task, self._reader) if t is not None]
        self._task, self._reader, self._tracks = None, None, {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.connected = False

    async def settled(self) -> None:
        """Return once every job queued so far has been done (what was notified is published)."""
        await self._idle.wait()

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
        for track in self._tracks.values():
            if track.epoch == self._epoch - 1:
                track.jobs.append(_Read(max(track.seen, track.base), epoch=self._epoch))
            else:
                track.jobs.append(_Read(0, epoch=self._epoch, burst=True))
        self._kick()

    # -- notifications -------------------------------------------------------------------------------------

    def _watching(self, cid: str, watched: bool, base: int | None = None) -> None:
        """`Hub.watcher`: follow a conversation from its first stream on, forget it after its last. A `base`
        its stream knew (committed before it subscribed) stands for the read of it (see the module)."""
        if not watched:
            self._tracks.pop(cid, None)  # the reader sees it is forgotten and drops its jobs
            return
        track = self._tracks[cid] = _Track()
        if self.connected and base is not None:
            track.base, track.epoch = base, self._epoch
        elif self.connected:
            track.jobs.append(_Base(self._epoch))
            self._kick()

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if not self.connected or _unwatched(payload, self._tracks):
            return  # (still starting to listen: the catch-ups `_resume` queues read past it)
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
        events = _carried_events(note.get("e"), count)
        if events is not None:
            events = events[count - (last - after):]  # those not notified before
        if events is not None and not track.jobs and not track.busy:
            self._carried(cid, track, last, events)  # nothing before it waits: published at once
            return
        if track.queue(after, last, events):
            self._kick()

    # -- reading and publishing ----------------------------------------------------------------------------

    def _kick(self) -> None:
        self._idle.clear()
        self._wake.set()

    async def _reading(self) -> None:
        """The reader: rounds while any conversation has a job; a round's failed jobs are tried again."""
        failures = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            while heads := self._heads():
                failed = await self._round(heads)
                for _cid, track, _job in heads:
                    track.busy = False
                for _cid, track, job in failed:
                    track.jobs.appendleft(job)
                if not failed:
                    failures = 0
                    continue
                failures += 1
                delay = min(self.backoff_s[0] * 2 ** failures, self.backoff_s[1])
                log.warning("live feed: could not read the events of %d conversation(s); retrying in %.1f s",
                            len(failed), delay)
                await asyncio.sleep(delay)
            if not self._wake.is_set():
                self._idle.set()

    def _heads(self) -> list[Head]:
        """Each conversation's next job that needs the store; the jobs before it whose events the
        notifications carried are published on the way."""
        heads: list[Head] = []
        for cid, track in self._tracks.items():
            while track.jobs:
                job = track.jobs.popleft()
                if isinstance(job, _Read) and job.events is not None and job.upto is not None:
                    self._carried(cid, track, job.upto, job.events)
                    continue
                heads.append((cid, track, job))
                track.busy = True
                break
        return heads

    async def _round(self, heads: list[Head]) -> list[Head]:
        """Run one job per conversation: every `_Base` in one query, every notified range in one query,
        each catch-up on its own. Returns the jobs that failed (logged)."""
        bases: list[Head] = []
        spans: list[Head] = []
        catch_ups: list[Head] = []
        for head in heads:
            job = head[2]
            (bases if isinstance(job, _Base) else spans if job.upto is not None else catch_ups).append(head)
        failed: list[Head] = []
        for group, run in ((bases, self._bases), (spans, self._spans)):
            if group:
                try:
                    await run(group)
                except Exception as exc:
                    log.warning("live feed: a read failed: %s", exc)
                    failed += group
        for head in catch_ups:
            try:
                await self._catch_up(*head)
            except Exception as exc:
                log.warning("live feed: could not catch up with conversation %s: %s", head[0], exc)
                failed.append(head)
        return failed

    def _carried(self, cid: str, track: _Track, upto: int, events: list[Any]) -> None:
        """Publish the events a notification carried: ids `upto - len(events) + 1 … upto`."""
        first = upto - len(events) + 1
        for offset, (kind, payload) in enumerate(events):
            if first + offset > track.delivered:
                self.hub.publish(cid, Published.of(first + offset, kind, payload))
        track.delivered = max(track.delivered, upto)

    async def _bases(self, bases: list[Head]) -> None:
        last = await self.store.events.last_ids([cid for cid, _, _ in bases])
        for cid, track, job in bases:
            if job.epoch == self._epoch and self.connected:
                track.base, track.epoch = last.get(cid, 0), job.epoch

    async def _spans(self, spans: list[Head]) -> None:
        wanted = [(cid, track, max(job.after, track.delivered), job.upto or 0) for cid, track, job in spans
                  if isinstance(job, _Read)]
        todo = [(cid, after, upto) for cid, _, after, upto in wanted if after < upto]
        rows = await self.store.events.spans(todo) if todo else []
        tracks = {cid: track for cid, track, _, _ in wanted}
        for cid, event_id, kind, payload in rows:
            track = tracks[cid]
            if self._tracks.get(cid) is track and event_id > track.delivered:
                self.hub.publish(cid, Published.of(event_id, kind, payload))
                track.delivered = event_id

    async def _catch_up(self, cid: str, track: _Track, job: _Base | _Read) -> None:
        """A catch-up after a reconnection (`job.upto` is None): to the end of the log, or a burst."""
        assert isinstance(job, _Read)
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


def _carried_events(carried: Any, count: int) -> list[Any] | None:
    """The `[type, payload]` pairs a notification of `count` events carried, or None when it carried none (or
    something else: they are read from the store then)."""
    if not isinstance(carried, list):
        return None
    events = cast(list[Any], carried)
    if len(events) != count or not all(isinstance(e, list) and len(cast(list[Any], e)) == 2
                                       and isinstance(e[0], str) and isinstance(e[1], dict) for e in events):
        return None
    return events


def _unwatched(payload: str, tracks: dict[str, _Track]) -> bool:
    """Whether a notification is of a conversation not watched here, told from its head (`{"c":"<id>",…`,
    as the store writes it) without parsing the events it carries; False when unsure."""
    if not payload.startswith('{"c":"'):
        return False
    end = payload.find('"', 6)
    cid = payload[6:end]
    return end > 0 and "\\" not in cid and cid not in tracks


def _relay(heard: Callable[[str], None]) -> Callable[[object, int, str, str], None]:
    """An asyncpg notification listener (`(connection, pid, channel, payload)`) handing `payload` to `heard`."""

    def listener(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        heard(payload)

    return listener
