"""The live feed of other processes' events (`server/durable/feed.py`): two stores on one PostgreSQL database stand
for two server processes; what one appends reaches the other's hub in order, once, even across a dropped
LISTEN connection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import text

from ringlet.errors import ConfigError
from ringlet.server.durable.feed import Feed, _carried_events, _Track, _unwatched, dsn
from ringlet.server.runs.active import Hub, Published, Subscriber
from ringlet.server.runs.follow import items
from ringlet.store import Store
from ringlet.store.event_records import INLINE_BYTES

WAIT_S = 10


@pytest.fixture
async def stores(postgres_url: str) -> AsyncIterator[tuple[Store, Store]]:
    """Process A (the one whose streams watch) and process B (the one whose runs write)."""
    a, b = await Store.open(postgres_url), await Store.open(postgres_url)
    assert a.origin != b.origin
    yield a, b
    await a.close()
    await b.close()


@pytest.fixture
async def opened() -> AsyncIterator[Callable[[Feed], Awaitable[Feed]]]:
    feeds: list[Feed] = []

    async def start(feed: Feed) -> Feed:
        feeds.append(feed)
        await feed.start()
        assert feed.connected
        return feed

    yield start
    for feed in feeds:
        await feed.close()


async def take(subscriber: Subscriber, n: int) -> list[Published]:
    """The next `n` items of the subscriber's queue, waiting for each (the test fails past WAIT_S)."""
    async with asyncio.timeout(WAIT_S):
        return [await subscriber.queue.get() for _ in range(n)]


def reads(store: Store) -> list[tuple[str, int]]:
    """Record the store's event reads, as (conversation id, after): one conversation's, and each range of a
    read of several (`spans`)."""
    calls: list[tuple[str, int]] = []
    real, real_spans = store.events.after, store.events.spans

    async def recorded(conversation_id: str, after: int = 0, limit: int = 1000,
                       run_id: str | None = None) -> list[tuple[int, str, dict[str, Any]]]:
        calls.append((conversation_id, after))
        return await real(conversation_id, after, limit, run_id)

    async def spans(wanted: Sequence[tuple[str, int, int]]) -> list[tuple[str, int, str, dict[str, Any]]]:
        calls.extend((cid, after) for cid, after, _ in wanted)
        return await real_spans(wanted)

    store.events.after = recorded  # type: ignore[method-assign]
    store.events.spans = spans  # type: ignore[method-assign]
    return calls


def delta(n: int) -> tuple[str, dict[str, Any]]:
    return "content_delta", {"run_id": "r_b", "delta": f"tok{n} ✓", "message_id": "m_1"}


def big(n: int) -> tuple[str, dict[str, Any]]:
    """An event too large for a notification to carry: the feed reads it from the store."""
    return "content_delta", {"run_id": "r_b", "delta": f"tok{n} " + "✓" * INLINE_BYTES, "message_id": "m_1"}


def test_the_store_url_becomes_a_plain_dsn() -> None:
    assert dsn("postgresql+asyncpg://u:pw@127.0.0.1:5433/db?ssl=require") == \
        "postgresql://u:pw@127.0.0.1:5433/db?sslmode=require"
    assert dsn("postgresql+asyncpg://u@h/db") == "postgresql://u@h/db"


def test_a_notification_of_an_unwatched_conversation_is_let_go_unparsed() -> None:
    watched = {"c_1": _Track()}
    assert _unwatched('{"c":"c_2","i":3,"n":1,"o":"x","e":[["t",{}]]}', watched)
    assert not _unwatched('{"c":"c_1","i":3,"n":1,"o":"x"}', watched)
    assert not _unwatched('{"i":3,"c":"c_2"}', watched)  # not the store's shape: parsed, to be sure
    assert not _unwatched('{"c":"c_\\"2"}', watched)


def test_only_well_formed_carried_events_are_taken() -> None:
    """Anything but `count` `[type, payload]` pairs is read from the store instead."""
    assert _carried_events([["a", {}], ["b", {"x": 1}]], 2) == [["a", {}], ["b", {"x": 1}]]
    assert _carried_events(None, 1) is None
    assert _carried_events([["a", {}]], 2) is None
    assert _carried_events([["a", {}, 3]], 1) is None
    assert _carried_events([[1, {}]], 1) is None
    assert _carried_events([["a", []]], 1) is None
    assert _carried_events({"a": {}}, 1) is None


async def test_a_sqlite_store_has_no_feed(tmp_path: Any) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 'r.db'}")
    with pytest.raises(ConfigError, match="PostgreSQL"):
        Feed(store, Hub())
    await store.close()


async def test_other_process_events_arrive_in_order_once(stores: tuple[Store, Store], opened: Any) -> None:
    a, b = stores
    hub = Hub()
    calls = reads(a)
    await opened(Feed(a, hub))
    cid = (await b.conversations.create(agent="x")).id
    unwatched = (await b.conversations.create(agent="x")).id
    with hub.subscribe(cid) as subscriber:
        assert hub.watched(cid)
        assert not hub.watched(unwatched)
        await b.events.append_batch([(cid, *delta(0))])
        await b.events.append_batch([(cid, *delta(1)), (unwatched, *delta(0)), (cid, *delta(2))])  # one batch
        await asyncio.gather(*(b.events.append_batch([(cid, *delta(n)), (cid, *delta(n + 100))])
                               for n in range(3, 23)))  # concurrent batches: notifications coalesce
        await b.runs.create("r_b", agent="x", conversation_id=cid)
        await b.runs.finish("r_b", status="completed", finish_reason="end_turn", in_tokens=1, out_tokens=1,
                           cost_usd=None, conversation_id=cid,
                           events=[(cid, "status", {"run_id": "r_b", "state": "completed"}),
                                   (cid, "message_end", {"run_id": "r_b", "agent_path": ["x", "y"]})])
        got = await take(subscriber, 45)
        assert [item.id for item in got] == list(range(1, 46))
        stored = await b.events.after(cid, 0)
        assert [(i.id, i.type, i.run_id, i.data, i.nested) for i in got] == [
            (i, kind, payload.get("run_id"), json.dumps(payload, ensure_ascii=False, separators=(",", ":")),
             "agent_path" in payload) for i, kind, payload in stored]
        assert got[-1].nested
        assert not got[0].nested
        await b.events.append_batch([(cid, *delta(99))])  # nothing was published twice: the next one is 46
        assert [item.id for item in await take(subscriber, 1)] == [46]
        assert subscriber.queue.empty()
    assert not hub.watched(cid)
    assert calls == []  # the notifications carried every event: nothing was read


async def test_notifications_during_a_read_join_the_next_read(stores: tuple[Store, Store], opened: Any) -> None:
    """One read at a time: what is notified meanwhile is read next, in one query for every conversation (events
    too large for their notifications), in order with the events the notifications carried."""
    a, b = stores
    hub = Hub()
    calls, reading, release = reads(a), asyncio.Event(), asyncio.Event()
    real = a.events.spans

    async def held(wanted: Sequence[tuple[str, int, int]]) -> list[tuple[str, int, str, dict[str, Any]]]:
        if any(c == cid for c, _, _ in wanted):
            reading.set()
            await release.wait()
        return await real(wanted)

    a.events.spans = held  # type: ignore[method-assign]
    await opened(Feed(a, hub))
    cid, other, third = [(await b.conversations.create(agent="x")).id for _ in range(3)]
    with hub.subscribe(cid) as subscriber, hub.subscribe(other) as marker, hub.subscribe(third) as on_third:
        await b.events.append_batch([(cid, *big(0))])
        async with asyncio.timeout(WAIT_S):
            await reading.wait()  # the feed reads the first event, and that read waits
        for n in range(1, 10):
            await b.events.append_batch([(cid, *big(n))])
        await b.events.append_batch([(cid, *delta(10)), (third, *big(0))])
        await b.events.append_batch([(cid, *big(11)), (third, *big(1)), (third, *delta(2))])
        await b.events.append_batch([(other, *delta(0))])
        await take(marker, 1)  # notified after the others: the feed has taken them all, while its read waits
        release.set()
        got = await take(subscriber, 12)
        assert [item.id for item in got] == list(range(1, 13))
        assert [json.loads(item.data)["delta"].split()[0] for item in got] == [f"tok{n}" for n in range(12)]
        assert [item.id for item in await take(on_third, 3)] == [1, 2, 3]
        assert subscriber.queue.empty()
        assert on_third.queue.empty()
    assert calls == [(cid, 0), (cid, 1), (third, 0), (cid, 11)]  # one query for both, then the rest of cid's


async def test_own_events_are_not_read_back(stores: tuple[Store, Store], opened: Any) -> None:
    """Events this process's store wrote were published by its own runs: its feed does not fetch them."""
    a, b = stores
    hub = Hub()
    calls = reads(a)
    await opened(Feed(a, hub))
    cid = (await a.conversations.create(agent="x")).id
    with hub.subscribe(cid) as subscriber:
        await a.events.append_batch([(cid, *delta(0)), (cid, *delta(1))])  # own: ids 1, 2
        await a.events.append(cid, SimpleNamespace(type="status", model_dump=lambda: {"run_id": "r_a"}))  # 3
        await b.events.append_batch([(cid, *delta(2))])  # another process's: id 4
        assert [item.id for item in await take(subscriber, 1)] == [4]
        assert subscriber.queue.empty()
    assert calls == []  # its notification carried it


async def test_a_dropped_connection_is_caught_up(stores: tuple[Store, Store], opened: Any) -> None:
    """The LISTEN connection is terminated server-side; events written before it is back are delivered
    once it is: from the last id known for a conversation that had events or was watched idle, and from
    the store (the stream catching up itself) for one whose stream began while the feed was away."""
    a, b = stores
    hub = Hub(maxsize=8)
    feed = Feed(a, hub)
    connect, gate, reconnecting = feed._connect, asyncio.Event(), asyncio.Event()

    async def gated() -> Any:
        if feed._epoch:  # every connection after the first waits for the gate
            reconnecting.set()
            await gate.wait()
        return await connect()

    feed._connect = gated  # type: ignore[method-assign]
    busy, idle, late = [(await b.conversations.create(agent="x")).id for _ in range(3)]
    await b.events.append_batch([(c, *delta(n)) for n in range(30) for c in (idle, late)])  # before it listens
    await opened(feed)
    with hub.subscribe(busy) as on_busy, hub.subscribe(idle) as on_idle:
        await b.events.append_batch([(busy, *delta(0)), (busy, *delta(1))])
        assert [item.id for item in await take(on_busy, 2)] == [1, 2]
        async with asyncio.timeout(WAIT_S):  # the idle conversation's last id is known
            await feed.settled()
        async with b.engine.begin() as conn:
            killed = (await conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                              "WHERE application_name = :name"),
                                         {"name": f"ringlet-feed {a.origin}"})).scalars().all()
        assert killed == [True]
        async with asyncio.timeout(WAIT_S):
            await reconnecting.wait()
        assert not feed.connected
        with hub.subscribe(late) as on_late:
            runs = SimpleNamespace(records=a, settings=SimpleNamespace(ping_interval_s=WAIT_S),
                                   backlog=lambda *_: None)
            start = (await a.events.marks(late))[0]
            stream = items(runs, on_late, late, after=start, backlog=False)  # type: ignore[arg-type]
            following = asyncio.create_task(_first(stream, 20))
            await b.events.append_batch([(busy, *delta(n)) for n in range(2, 7)]  # while the feed is away
                                  + [(idle, *delta(n)) for n in range(3)] + [(late, *delta(n)) for n in range(20)])
            gate.set()
            assert [item.id for item in await take(on_busy, 5)] == [3, 4, 5, 6, 7]
            assert [item.id for item in await take(on_idle, 3)] == [31, 32, 33]
            async with asyncio.timeout(WAIT_S):
                assert await following == list(range(31, 51))  # its stream read them from the store
        assert feed.connected
        await b.events.append_batch([(busy, *delta(9))])  # live again, and nothing was published twice
        assert [item.id for item in await take(on_busy, 1)] == [8]
        assert on_busy.queue.empty()
        assert on_idle.queue.empty()


async def test_a_base_a_stream_knew_stands_for_the_read(stores: tuple[Store, Store], opened: Any) -> None:
    """A stream subscribing with the conversation's last id as its run read it when stored (`ActiveRun.base`,
    committed before it subscribed) costs the feed no read of its own; after a dropped connection, the catch-up
    reads from there (no less than from an id read later: the ones between come again, the streams skip them)."""
    a, b = stores
    hub = Hub(maxsize=8)
    feed = Feed(a, hub)
    connect, gate, reconnecting = feed._connect, asyncio.Event(), asyncio.Event()

    async def gated() -> Any:
        if feed._epoch:
            reconnecting.set()
            await gate.wait()
        return await connect()

    feed._connect = gated  # type: ignore[method-assign]
    reads: list[Any] = []
    marks, last_ids = a.events.marks, a.events.last_ids

    async def counted_marks(conversation_id: str) -> tuple[int, int]:
        reads.append(conversation_id)
        return await marks(conversation_id)

    async def counted_last_ids(conversation_ids: list[str]) -> dict[str, int]:
        reads.append(conversation_ids)
        return await last_ids(conversation_ids)

    a.events.marks = counted_marks  # type: ignore[method-assign]
    a.events.last_ids = counted_last_ids  # type: ignore[method-assign]
    cid = (await b.conversations.create(agent="x")).id
    await b.events.append_batch([(cid, *delta(n)) for n in range(3)])  # ids 1-3: the run's base is 3
    await b.events.append_batch([(cid, *delta(3))])  # id 4, before the stream subscribes
    await opened(feed)
    with hub.subscribe(cid, base=3) as subscriber:
        assert not feed._tracks[cid].jobs  # nothing to read
        async with b.engine.begin() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name "
                                    "= :name"), {"name": f"ringlet-feed {a.origin}"})
        async with asyncio.timeout(WAIT_S):
            await reconnecting.wait()
        await b.events.append_batch([(cid, *delta(n)) for n in range(4, 6)])  # ids 5, 6 while the feed is away
        gate.set()
        assert [item.id for item in await take(subscriber, 3)] == [4, 5, 6]
    assert reads == []


async def _first(stream: AsyncIterator[Published | None], n: int) -> list[int]:
    """The ids of the first `n` events a stream sends."""
    ids: list[int] = []
    async for item in stream:
        if item is not None:
            ids.append(item.id)
            if len(ids) == n:
                break
    await stream.aclose()  # type: ignore[attr-defined]
    return ids


async def test_a_stream_on_one_server_follows_a_run_on_another(postgres_url: str) -> None:
    """Two servers on one database: a run in B, a conversation's stream in A, live through A's feed."""
    import httpx
    from httpx_sse import aconnect_sse

    from ringlet import Agent
    from ringlet.server import ServerSettings, create_app
    from ringlet.testing import FunctionModel
    from serving import serving

    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(_request: Any) -> AsyncIterator[str]:
        yield "thinking"
        entered.set()
        await release.wait()
        yield " done"

    a, b = await Store.open(postgres_url), await Store.open(postgres_url)
    settings = ServerSettings(ping_interval_s=0.2, engine="local")  # runs execute where they start
    app_a = create_app(settings, store=a, agents=[Agent(FunctionModel(slow), name="slow")])
    app_b = create_app(settings, store=b, agents=[Agent(FunctionModel(slow), name="slow")])
    key, _ = await a.keys.create("admin", scopes=["chat", "admin"])
    auth = {"Authorization": f"Bearer {key}"}
    try:
        async with serving(app_a) as url_a, serving(app_b) as url_b, \
                httpx.AsyncClient(base_url=url_a, headers=auth, timeout=30) as on_a, \
                httpx.AsyncClient(base_url=url_b, headers=auth, timeout=30) as on_b:
            assert (await on_a.get("/healthz")).status_code == 200  # A has started: its runner exists
            feed = Feed(a, app_a.state.ringlet.runner.here.hub)
            await feed.start()
            try:
                cid = (await on_b.post("/api/v1/chat/conversations", json={"agent": "slow"})).json()["id"]
                run = asyncio.create_task(on_b.post(f"/api/v1/chat/conversations/{cid}/messages",
                                                    json={"content": "go"}, headers={"Accept": "application/json"}))
                async with asyncio.timeout(WAIT_S):
                    await entered.wait()  # B's run is under way, its first events stored
                seen = []
                async with asyncio.timeout(WAIT_S), \
                        aconnect_sse(on_a, "GET", f"/api/v1/chat/conversations/{cid}/events?last_event_id=0") as source:
                    async for event in source.aiter_sse():
                        if event.event == "ping":
                            continue
                        seen.append(event)
                        if event.event == "content_delta" and "thinking" in event.data:
                            release.set()  # the rest is written by B after A's stream is live
                        if event.event == "message_end":
                            break
                assert (await run).status_code == 200
            finally:
                await feed.close()
        ids = [int(event.id) for event in seen]
        assert ids == list(range(1, len(ids) + 1))
        assert [json.loads(e.data)["delta"] for e in seen if e.event == "content_delta"] == ["thinking", " done"]
        assert json.loads(seen[-1].data)["finish_reason"] == "end_turn"
    finally:
        await a.close()
        await b.close()
