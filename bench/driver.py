"""The driver beneath the store, on PostgreSQL: the CPU a hot statement costs through today's path
(SQLAlchemy's async engine over asyncpg) against the same SQL on asyncpg itself, prepared once.

Starts a private PostgreSQL server (the tests', `tests/postgres.py`), makes a migrated store with a few
conversations, then times, in this process's CPU (`time.process_time`), three units of a turn:

- `append`: one event batch (three deltas of one conversation) in one transaction, as the writer commits it
  (`EventLog.append_batch`: the ids reserved and the notification queued, then the events inserted);
- `read`: one conversation read by id (`Conversations.get`, transaction 2 of a turn);
- `turn` (through the store only): the store's calls of one turn, from the conversation to the run's end;
- `one`: `SELECT 1` on a pooled connection, as the store reads (SQLAlchemy wraps it in `BEGIN … ROLLBACK`):
  the cost of the path alone.

Each unit runs three ways: through the store as it is, `borrowed` (a connection checked out of SQLAlchemy's
pool, the statements run on its asyncpg connection) and on an asyncpg pool of its own. Each runs `--count`
times in a row, `--runs` times alternating the ways; the medians are printed, in µs of CPU (and of wall
time) per unit.

Run: `.venv/bin/python bench/driver.py [--count 2000] [--runs 5]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import asyncpg as postgresql_asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from ringlet._ids import new_id, now
from ringlet.messages import Message
from ringlet.store import Store
from ringlet.store import statements as hot
from ringlet.store.event_records import EVENTS_CHANNEL

_PG = postgresql_asyncpg.dialect()
_RESERVE = hot.RESERVE_EVENTS.compile(dialect=_PG).string  # the store's own statements, as asyncpg runs them
_READ = hot.CONVERSATION.compile(dialect=_PG).string
_INSERT = ("INSERT INTO events (conversation_id, id, run_id, type, payload, created_at) "
           "SELECT * FROM unnest($1::varchar[], $2::integer[], $3::varchar[], $4::varchar[], $5::json[], "
           "$6::varchar[])")
"""The events of a batch, one array per column (as the store sends them since the driver took its turn)."""
_ONE = text("SELECT 1")
_READ = "SELECT * FROM conversations WHERE id = $1 AND deleted_at IS NULL"


def _deltas(run_id: str) -> list[tuple[str, dict[str, object]]]:
    return [("content_delta", {"run_id": run_id, "ts": now(), "message_id": "m_1", "text": f"token {i} "})
            for i in range(3)]


async def _timed(unit: Callable[[], Awaitable[object]], count: int) -> tuple[float, float]:
    """(µs of CPU, µs of wall) per call of `unit`, over `count` calls in a row."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        await unit()
    return ((time.process_time() - cpu) / count * 1e6, (time.perf_counter() - wall) / count * 1e6)


class Units:
    """Each unit three ways: through the store (SQLAlchemy), `borrowed` (a connection from SQLAlchemy's pool,
    the statements on its asyncpg connection), and on an asyncpg pool of its own."""

    def __init__(self, store: Store, raw: asyncpg.Pool, cid: str) -> None:
        self.store, self.raw, self.cid = store, raw, cid

    async def _append_on(self, conn: Any) -> None:
        batch = _deltas("r_1")
        text = json.dumps([[kind, payload] for kind, payload in batch], separators=(",", ":"))
        async with conn.transaction():
            [row] = await conn.fetch(_RESERVE, [self.cid], [len(batch)], [text], EVENTS_CHANNEL, '""')
            first = row[1] - len(batch) + 1
            await conn.execute(_INSERT, [self.cid] * len(batch), list(range(first, row[1] + 1)),
                               [p["run_id"] for _, p in batch], [k for k, _ in batch],
                               [json.dumps(p) for _, p in batch], [now()] * len(batch))

    async def _borrowed(self, work: Callable[[Any], Awaitable[object]]) -> None:
        async with self.store.engine.connect() as c:
            await work((await c.get_raw_connection()).driver_connection)

    async def _own(self, work: Callable[[Any], Awaitable[object]]) -> None:
        async with self.raw.acquire() as conn:
            await work(conn)

    async def append_store(self) -> None:
        await self.store.events.append_batch([(self.cid, kind, payload) for kind, payload in _deltas("r_1")])

    async def append_borrowed(self) -> None:
        await self._borrowed(self._append_on)

    async def append_asyncpg(self) -> None:
        await self._own(self._append_on)

    async def read_store(self) -> None:
        assert await self.store.conversations.get(self.cid) is not None

    async def read_borrowed(self) -> None:
        await self._borrowed(lambda conn: conn.fetchrow(_READ, self.cid))

    async def read_asyncpg(self) -> None:
        await self._own(lambda conn: conn.fetchrow(_READ, self.cid))

    async def one_store(self) -> None:
        async with self.store.db.connect() as conn:
            await conn.execute(_ONE)

    async def one_borrowed(self) -> None:
        await self._borrowed(lambda conn: conn.fetchval("SELECT 1"))

    async def one_asyncpg(self) -> None:
        await self._own(lambda conn: conn.fetchval("SELECT 1"))


WAYS = ("store", "borrowed", "asyncpg")


async def turn(store: Store) -> None:
    """The store's calls of one turn, as a durable run makes them: the conversation, the run and its prompt,
    the lease and the history, two event batches, the run's end with its answer and last events."""
    cid = (await store.conversations.create(agent="bench")).id
    run_id = new_id("r")
    prompt = Message.user("hello")
    await store.runs.create(run_id, agent="bench", conversation_id=cid, incoming=[prompt], lease_owner="o",
                            lease_expires_at="9999")
    assert await store.runs.take(run_id, "o", "9999", conversation_id=cid, before=prompt.id) == []
    for _ in range(2):
        await store.events.append_batch([(cid, kind, payload) for kind, payload in _deltas(run_id)])
    answer = Message.assistant("hi", run_id=run_id)
    await store.runs.finish(run_id, status="completed", finish_reason="end_turn", in_tokens=5, out_tokens=2,
                            cost_usd=None, conversation_id=cid, new=[answer], conversation_status="idle",
                            events=[(cid, "message_end", {"run_id": run_id, "ts": now()})])


async def bench(url: str, count: int, runs: int) -> None:
    store = await Store.open(url)
    raw = await asyncpg.create_pool(url.replace("postgresql+asyncpg://", "postgresql://"), min_size=1, max_size=2)
    try:
        units = Units(store, raw, (await store.conversations.create(agent="bench")).id)
        for name in ("append", "read", "one"):  # warm: statements prepared, pools filled
            for way in WAYS:
                await _timed(getattr(units, f"{name}_{way}"), 50)
        print(f"µs of CPU per unit (wall in brackets), medians of {runs} runs of {count}")
        print(f"{'unit':<8}" + "".join(f"{way:>18}" for way in WAYS))
        for name in ("append", "read", "one"):
            timings: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
            for _ in range(runs):
                for way in WAYS:
                    timings[way].append(await _timed(getattr(units, f"{name}_{way}"), count))
            cells = [f"{statistics.median(t[0] for t in timings[way]):.0f} "
                     f"({statistics.median(t[1] for t in timings[way]):.0f})" for way in WAYS]
            print(f"{name:<8}" + "".join(f"{c:>18}" for c in cells))
        timings = [await _timed(lambda: turn(store), max(count // 10, 1)) for _ in range(runs)]
        print(f"a turn's store calls (`turn`): {statistics.median(t[0] for t in timings):.0f} µs of CPU "
              f"({statistics.median(t[1] for t in timings):.0f} wall), median of {runs} runs of {max(count // 10, 1)}")
    finally:
        await raw.close()
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from postgres import postgres_server

    with postgres_server() as url:
        asyncio.run(bench(url, args.count, args.runs))


if __name__ == "__main__":
    main()
